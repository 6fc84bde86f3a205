"""The FP8 KV cache's layout (kernels/kv_fp8.py) and its allocation (engine/kv_cache.py);
the kernels that write and read it are tested in test_kernel_qk_rope_kv.py and
test_kernel_decode_attention.py, the engine with it in test_engine.py."""

from __future__ import annotations

import pytest
import torch

from engine.bundle import load_bundle
from engine.kv_cache import KVCache
from kernels.fp8_scale import pow2_scale
from kernels.kv_fp8 import head_dim_of, kv_views, load_form, pack_kv, packed_dim, store_form, unpack_kv


def test_pack_then_unpack_is_e4m3_precise_and_exact_on_e4m3_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 2, 128, generator=g, dtype=torch.float32) * torch.logspace(-3, 3, 7)[None, :, None, None]
    p = pack_kv(x)
    assert p.dtype == torch.uint8 and p.shape == (4, 7, 2, 144)
    y = unpack_kv(p, torch.float32)
    # per element at most half an e4m3 step of its head's scale (3 mantissa bits), at any magnitude
    scale = pow2_scale(x.abs().amax(-1))[..., None]
    assert ((y - x).abs() <= torch.maximum(x.abs() / 16, scale / 2 ** 9)).all()
    assert torch.equal(unpack_kv(pack_kv(y), torch.float32), y)  # dequantized values are a fixed point
    # the scale sits in bytes 128..131, fp32: the layout the kernels read
    codes, scales, at = kv_views(p)
    assert at == 32 and torch.equal(scales[..., at], scale[..., 0])
    assert torch.equal(codes[..., :128].float() * scales[..., at : at + 1], y)


def test_zeros_and_slices():
    assert (unpack_kv(torch.zeros(3, 5, 2, 80, dtype=torch.uint8), torch.bfloat16) == 0).all()  # a fresh cache
    assert (unpack_kv(pack_kv(torch.zeros(2, 64)), torch.float32) == 0).all()
    x = torch.randn(5, 9, 2, 64)
    p = pack_kv(x)
    assert torch.equal(unpack_kv(p[1:3, 2:6], torch.float32), unpack_kv(p, torch.float32)[1:3, 2:6])
    assert torch.equal(unpack_kv(p[torch.tensor([4, 0])], torch.float32), unpack_kv(p, torch.float32)[[4, 0]])
    assert head_dim_of(p) == 64 and head_dim_of(x) == 64
    # the model-dtype layout passes through both helpers unchanged (store) / cast (load)
    assert store_form(x, x) is x and torch.equal(load_form(x.bfloat16(), torch.float32), x.bfloat16().float())
    with pytest.raises(ValueError, match="multiple of 16"):
        packed_dim(72)
    with pytest.raises(ValueError, match="not a packed"):
        kv_views(x)


def test_fp8_cache_allocation_and_size():
    config = load_bundle("tiny", "cpu").config
    plain = KVCache.allocate(config, 3, 64, "cpu", torch.bfloat16)
    fp8 = KVCache.allocate(config, 3, 64, "cpu", torch.bfloat16, quant="fp8")
    assert fp8.k.dtype == torch.uint8 and fp8.k.shape[:-1] == plain.k.shape[:-1]
    assert fp8.quant == "fp8" and plain.quant == "none" and head_dim_of(fp8.k) == head_dim_of(plain.k) == config.head_dim
    assert fp8.scratch_row == plain.scratch_row and fp8.max_len == plain.max_len
    per_stream = KVCache.bytes_per_stream(config, 64, torch.bfloat16, "fp8")
    assert per_stream == 2 * config.n_layer * config.n_local_heads * (config.head_dim + 16) * 64
    # a byte per element + 16 per head against bf16's 2 per element: 0.56x at S2-Pro's head dim 128
    hd = config.head_dim
    assert per_stream * 2 * hd == KVCache.bytes_per_stream(config, 64, torch.bfloat16) * (hd + 16)
    with pytest.raises(ValueError, match="KV quantization"):
        KVCache.allocate(config, 3, 64, "cpu", torch.bfloat16, quant="int8")


def test_service_flag():
    from realtime.config import parse_args

    assert parse_args(["--kv-quant", "fp8"]).engine.kv_quant == "fp8"
    assert parse_args([]).engine.kv_quant == "none"
    with pytest.raises(SystemExit):
        parse_args(["--kv-quant", "int4"])


@pytest.mark.parametrize("heads, dh", [(2, 16), (8, 128)])
def test_store_kernel_writes_the_references_bytes(heads, dh):
    """kernels/kv_fp8_store.py (the prefill write; Triton interpreter on the CPU): the
    bytes pack_kv + index_copy_ write, from a strided x, and nothing at other positions."""
    from kernels.kv_fp8_store import store_kv_fp8, store_kv_fp8_reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(1)
    rows, length, n = 3, 20, 9
    qkv = torch.randn(n, 3 * heads, dh, generator=g).to(device, torch.bfloat16) * 3
    x = qkv[:, heads : 2 * heads]  # a strided slice, as the keys of a fused projection are
    x[2] = 0  # an all-zero head: codes 0, the floor's scale
    index = torch.randperm(rows * length, generator=g)[:n].to(device)
    got = torch.zeros(rows, length, heads, packed_dim(dh), dtype=torch.uint8, device=device)
    want = torch.zeros_like(got)
    store_kv_fp8(x, got, index)
    store_kv_fp8_reference(x, want, index)
    assert torch.equal(got, want)
    assert (got.view(-1, heads, packed_dim(dh))[index] != 0).any() and int((got != 0).any(-1).any(-1).sum()) <= n
    with pytest.raises(ValueError, match="index must be int64"):
        store_kv_fp8(x, got, index.int())
    with pytest.raises(ValueError, match="packed FP8"):
        store_kv_fp8(x, got.view(torch.float8_e4m3fn), index)
