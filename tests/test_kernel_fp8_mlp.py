"""kernels/fp8_mlp.py, the MLP block's two FP8 GEMMs in one persistent launch: the same
bits as the two launches it replaces (fp8_swiglu_gemm, then fp8_gemm, with the same
tiles and splits), near its PyTorch reference, its counters left zeroed for the next
launch, and its checks (Triton interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_gemm import GemmConfig, _counter_buffers, fp8_gemm, fp8_swiglu_gemm
from kernels.fp8_mlp import fp8_mlp, fp8_mlp_reference, mlp_configs
from kernels.fp8_quant import dequantize_act, interleave_gate_up, quantize_act, quantize_weight

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def block(m, d, h, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g).to(DEVICE, dtype)
    w13, w13_s = quantize_weight(interleave_gate_up(0.05 * torch.randn(2 * h, d, generator=g)).to(DEVICE))
    w2, w2_s = quantize_weight((0.05 * torch.randn(d, h, generator=g)).to(DEVICE))
    return x, w13, w13_s, w2, w2_s


def two_launches(x, w13, w13_s, w2, w2_s, c1, c2, codes=None):
    h_codes, h_scales = fp8_swiglu_gemm(x, w13, w13_s, c1, codes=codes)
    return fp8_gemm(h_codes, h_scales, w2, w2_s, x.dtype, c2)


CASES = [  # (m, d, h, phase-1 config, phase-2 config)
    (1, 256, 256, GemmConfig(16, 256, True), GemmConfig(16, 64, True)),
    (3, 256, 384, GemmConfig(16, 256, True, splits=2), GemmConfig(16, 64, True, splits=3)),  # both split
    (20, 384, 256, GemmConfig(16, 256, True, quantize_in_gemm=False), GemmConfig(16, 128, True, splits=2)),
    (40, 256, 512, GemmConfig(32, 256, False, splits=2), GemmConfig(16, 64, True, splits=2)),  # M tiles 2 and 3
    (33, 384, 384, GemmConfig(64, 256, False), GemmConfig(64, 64, False, splits=3)),  # plain tiles, ragged M
]


@pytest.mark.parametrize("m, d, h, c1, c2", CASES)
def test_one_launch_gives_the_two_launches_bits(m, d, h, c1, c2):
    x, w13, w13_s, w2, w2_s = block(m, d, h)
    y = fp8_mlp(x, w13, w13_s, w2, w2_s, configs=(c1, c2))
    assert y.shape == (m, d) and y.dtype == x.dtype
    assert torch.equal(y, two_launches(x, w13, w13_s, w2, w2_s, c1, c2))
    # the reference sums in another order (and the interpreter truncates to bf16), so a few
    # SwiGLU codes sit one e4m3 step off (fp8_swiglu_gemm's own test allows 5%)
    assert rel(y, fp8_mlp_reference(x, w13, w13_s, w2, w2_s)) < 0.05
    # the work counter, the group counts and the split counters are zero again: a second
    # launch on the stream (or a graph replay) starts from them
    assert all(int(buf.abs().sum()) == 0 for buf in _counter_buffers.values())
    assert torch.equal(fp8_mlp(x, w13, w13_s, w2, w2_s, configs=(c1, c2)), y)


def test_codes_from_the_producer_are_used_as_they_are():
    """x already quantized by the norm before it (kernels/add_rms_norm.py quantize=True):
    the same result as quantizing x here."""
    c1, c2 = GemmConfig(16, 256, True, splits=2), GemmConfig(16, 64, True, splits=2)
    x, w13, w13_s, w2, w2_s = block(5, 256, 256, seed=1)
    codes = quantize_act(x)
    y = fp8_mlp(x, w13, w13_s, w2, w2_s, codes=codes, configs=(c1, c2))
    assert torch.equal(y, two_launches(x, w13, w13_s, w2, w2_s, c1, c2, codes=codes))
    assert torch.equal(y, fp8_mlp(x, w13, w13_s, w2, w2_s, configs=(c1, c2)))


def test_the_default_configs_are_the_tables_pointer_tiles():
    """At the S2-Pro shape the two phases take the launch table's tiles for the SwiGLU GEMM
    (256-row tiles) and for w2; where the table names cuBLAS, the rule's Triton tiles."""
    for m in (1, 16, 54, 64):
        c1, c2 = mlp_configs(m, 2560, 9728, 132)
        assert c1.block_n == 256 and c1.backend == c2.backend == "triton"


def test_shapes_are_checked():
    x, w13, w13_s, w2, w2_s = block(2, 256, 256)
    with pytest.raises(ValueError, match="w13 must be"):
        fp8_mlp(x, w13[:384], w13_s[:3], w2, w2_s)
    with pytest.raises(ValueError, match="w13 must be"):
        fp8_mlp(x, w13, w13_s, w2[:, :128], w2_s[:, :1])
    with pytest.raises(ValueError, match="256-row"):
        fp8_mlp(x, w13, w13_s, w2, w2_s, configs=(GemmConfig(16, 128, True), GemmConfig(16, 64, True)))
    x, w13, w13_s, w2, w2_s = block(2, 256, 384)
    with pytest.raises(ValueError, match="w2_scale"):  # [D / 128, H / 128] read as documented, or refused
        fp8_mlp(x, w13, w13_s, w2, w2_s.t().contiguous())
    with pytest.raises(ValueError, match="w2_scale"):
        fp8_mlp(x, w13, w13_s, w2, w2_s.t().contiguous().t())
    padded = torch.zeros(w2.shape[0], w2.shape[1] + 128, dtype=w2.dtype, device=w2.device)[:, :w2.shape[1]]
    with pytest.raises(ValueError, match="contiguous rows"):  # rows read at the width, not the stride
        fp8_mlp(x, w13, w13_s, padded, w2_s)
    with pytest.raises(TypeError, match="x must be"):
        fp8_mlp(x.to(torch.float8_e4m3fn), w13, w13_s, w2, w2_s)


def test_an_empty_batch_gives_an_empty_output():
    x, w13, w13_s, w2, w2_s = block(2, 256, 256)
    assert fp8_mlp(x[:0], w13, w13_s, w2, w2_s).shape == (0, 256)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="compiled on a GPU")
@pytest.mark.parametrize("m", [1, 16, 54, 64])
def test_gpu_s2_pro_block_gives_the_two_launches_bits_also_replayed_in_a_graph(m):
    """The S2-Pro MLP (2560 -> 2 x 9728 -> 2560) at decode batches with the default
    configs: the two launches' bits, eagerly and from a CUDA graph replayed twice (the
    counters the kernel leaves zeroed are what the next replay starts from)."""
    x, w13, w13_s, w2, w2_s = block(m, 2560, 9728, seed=m)
    c1, c2 = mlp_configs(m, 2560, 9728, torch.cuda.get_device_properties(0).multi_processor_count)
    want = two_launches(x, w13, w13_s, w2, w2_s, c1, c2)
    assert torch.equal(fp8_mlp(x, w13, w13_s, w2, w2_s), want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp8_mlp(x, w13, w13_s, w2, w2_s)  # this stream's counter buffer, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = fp8_mlp(x, w13, w13_s, w2, w2_s)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, want)
    assert rel(dequantize_act(*quantize_act(y)), fp8_mlp_reference(x, w13, w13_s, w2, w2_s)) < 0.05

