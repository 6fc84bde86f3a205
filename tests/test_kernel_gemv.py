"""kernels/gemv.py (the small-batch linear layer) against its PyTorch reference over odd
shapes, its launcher's checks, and the engine's use of it (engine/linear.py): the
same greedy frames with and without it. CPU under the Triton interpreter; GPU-marked
tests at the S2-Pro shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernel_plan import GEMV_MAX_ROWS, KernelPlan, gemv_shapes, head_shapes
from kernels.fp8_gemm import fp8_linear_reference
from kernels.fp8_quant import quantize_weight
from kernels.gemv import MAX_M, GemvConfig, gemv, gemv_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32: summation order only; bf16: one output rounding (the interpreter also truncates
# fp32 -> bf16, kernels/FP8_NOTES.md)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SMALL = GemvConfig(block_n=8, block_k=128, num_warps=4, num_stages=1)  # several tiles at test sizes


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def operands(m: int, n: int, k: int, dtype, fp8: bool, swiglu: bool = False, seed: int = 0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(m, 2 * k if swiglu else k, generator=g, device=DEVICE).to(dtype)
    w = torch.randn(n, k, generator=g, device=DEVICE) / k**0.5
    if fp8:
        return (x, *quantize_weight(w))
    return x, w.to(dtype), None


def test_the_engine_routes_no_more_rows_than_the_kernel_takes():
    assert 1 <= GEMV_MAX_ROWS <= MAX_M


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "e4m3"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 300), (3, 24, 256), (4, 130, 384), (2, 8, 128)])
def test_matches_the_reference_over_odd_shapes(m, n, k, fp8, dtype):
    """N and K off the tiles (masked edges), K off the 128-wide scale groups, a partial
    scale block, with and without a bias and the SwiGLU."""
    for swiglu in (False, True):
        x, w, s = operands(m, n, k, dtype, fp8, swiglu)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        got = gemv(x, w, s, bias, swiglu=swiglu, config=SMALL)
        assert got.shape == (m, n) and got.dtype == dtype
        assert rel_err(got, gemv_reference(x, w, s, bias, swiglu=swiglu)) < TOL[dtype]


def test_plain_weights_compute_the_linear_layer():
    """Not only the reference: F.linear, and F.linear after kernels/swiglu.py's function."""
    x, w, _ = operands(3, 72, 320, torch.float32, False, swiglu=True)
    gate, up = x.chunk(2, dim=-1)
    want = F.linear(F.silu(gate) * up, w)
    assert rel_err(gemv(x, w, swiglu=True, config=SMALL), want) < 1e-5
    assert rel_err(gemv(x[:, :320].contiguous(), w, config=SMALL), F.linear(x[:, :320], w)) < 1e-5


@pytest.mark.parametrize("swiglu", [False, True])
def test_fp8_weights_compute_what_the_fp8_gemm_computes(swiglu):
    """Activations quantized in the kernel as fp8_linear quantizes them: the same function
    as the FP8 path's GEMM at larger batches (sums in another order only)."""
    x, w, s = operands(4, 136, 384, torch.float32, True, swiglu)
    want = fp8_linear_reference(x, w, s, swiglu=swiglu)
    assert rel_err(gemv(x, w, s, swiglu=swiglu, config=SMALL), want) < 1e-5
    # unquantized activations compute another function (W8A16): the flag is not a no-op
    assert rel_err(gemv(x, w, s, swiglu=swiglu, quantize_x=False, config=SMALL), want) > 1e-3


@pytest.mark.parametrize("swiglu", [False, True])
def test_pre_quantized_activations_give_what_quantizing_in_the_kernel_gives(swiglu):
    """x as e4m3 codes + group scales from kernels/fp8_quant.py (one launch before the GEMV)
    is the same arithmetic as quantizing in every program: equal outputs, bit for bit."""
    from kernels.fp8_quant import quantize_act, swiglu_quant

    x, w, s = operands(3, 72, 384, torch.float32, True, swiglu)
    codes, scales = swiglu_quant(x[:, :384], x[:, 384:]) if swiglu else quantize_act(x)
    got = gemv(codes, w, s, x_scale=scales, out_dtype=torch.float32, config=SMALL)
    assert torch.equal(got, gemv(x, w, s, swiglu=swiglu, config=SMALL))
    assert rel_err(got, gemv_reference(codes, w, s, x_scale=scales, out_dtype=torch.float32)) < 1e-5
    assert gemv(codes, w, s, x_scale=scales, config=SMALL).dtype == torch.bfloat16


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "e4m3"])
def test_a_rows_output_does_not_depend_on_its_batch(fp8):
    """Each row is summed by the same programs at every M: bit for bit equal alone."""
    x, w, s = operands(4, 64, 512, torch.float32, fp8)
    batched = gemv(x, w, s)
    for i in range(4):
        assert torch.equal(gemv(x[i : i + 1], w, s), batched[i : i + 1])
    assert torch.equal(gemv(x[1:3], w, s), batched[1:3])


def test_strided_rows_are_read_in_place():
    x, w, _ = operands(3, 16, 256, torch.float32, False)
    wide = torch.zeros(3, 400, device=DEVICE)
    wide[:, 7:263] = x
    assert torch.equal(gemv(wide[:, 7:263], w, config=SMALL), gemv(x, w, config=SMALL))


def test_the_launcher_refuses_what_the_kernel_cannot_take():
    x, w, _ = operands(2, 16, 256, torch.float32, False)
    _, wq, ws = operands(2, 256, 256, torch.float32, True)
    bad = [
        (lambda: gemv(torch.zeros(0, 256, device=DEVICE), w), "rows"),
        (lambda: gemv(torch.zeros(MAX_M + 1, 256, device=DEVICE), w), "rows"),
        (lambda: gemv(x[:, :255], w), "columns"),
        (lambda: gemv(x, w, swiglu=True), "gate"),
        (lambda: gemv(x.t().contiguous().t(), w), "unit stride"),
        (lambda: gemv(x, w.t().contiguous().t()), "contiguous"),
        (lambda: gemv(x, w.bfloat16()), "dtype"),
        (lambda: gemv(x.long(), w), "bf16, fp16 or fp32"),
        (lambda: gemv(x, w, bias=torch.zeros(15, device=DEVICE)), "bias"),
        (lambda: gemv(x, w, quantize_x=True), "e4m3 weights only"),
        (lambda: gemv(x, wq), "block scales"),
        (lambda: gemv(x, wq, ws.double()), "block scales"),
        (lambda: gemv(x, wq, ws[:1]), "block scales"),
        (lambda: gemv(x, wq, ws, config=GemvConfig(block_n=48)), "scale block"),
        (lambda: gemv(x, wq, ws, config=GemvConfig(block_n=8, block_k=64)), "whole 128-wide groups"),
        (lambda: gemv(x, wq, ws, x_scale=torch.ones(2, 2, device=DEVICE)), "e4m3 codes"),
        (lambda: gemv(x.to(torch.float8_e4m3fn), w, x_scale=torch.ones(2, 2, device=DEVICE)), "e4m3 weights"),
        (lambda: gemv(x.to(torch.float8_e4m3fn), wq, ws, x_scale=torch.ones(2, 1, device=DEVICE)), "x's scales"),
        (lambda: gemv(x.to(torch.float8_e4m3fn), wq, ws, x_scale=torch.ones(2, 2, device=DEVICE), quantize_x=True),
         "already quantized"),
        (lambda: gemv(x.to(torch.float8_e4m3fn), wq, ws), "bf16, fp16 or fp32"),
        (lambda: gemv(x, w, out_dtype=torch.int32), "output"),
    ]
    for call, why in bad:
        with pytest.raises(ValueError, match=why):
            call()


def test_a_wrong_scale_layout_is_refused_or_caught():
    """The kernel reads scales row-major without strides (the seed's MXFP8 bug read them
    with another stride): a column-major copy is refused; scale values transposed on a
    square block grid pass every layout check, and the reference parity catches them."""
    x, w, s = operands(2, 256, 256, torch.float32, True)
    s = s * torch.tensor([[1.0, 8.0], [0.125, 2.0]], device=DEVICE)  # every block its own magnitude
    with pytest.raises(ValueError, match="row-major"):
        gemv(x, w, s.t().contiguous().t())
    assert rel_err(gemv(x, w, s.t().contiguous()), gemv_reference(x, w, s)) > 0.3
    assert rel_err(gemv(x, w, s), gemv_reference(x, w, s)) < 1e-5


def frames_with_and_without_gemv(dtype=torch.float32, steps: int = 4) -> list[list[torch.Tensor]]:
    from engine.bundle import load_bundle
    from engine.runner import Runner
    from engine.sampling import SamplingParams

    out = []
    for on in (False, True):
        bundle = load_bundle("tiny", DEVICE, dtype)
        plan = KernelPlan(attention=DEVICE == "cuda", step=True, gemv=on)
        runner = Runner(bundle, max_running=3, max_len=128, plan=plan, cuda_graphs=False)
        prompt = bundle.prompts.segment("Hello there.")
        frames = []
        for slot in range(3):
            frames.append(runner.prefill_segment(slot, 8 * slot, prompt, SamplingParams(temperature=0.0, seed=slot)))
        for _ in range(steps):
            frames.append(runner.read(runner.launch([0, 1, 2], 64)))
            frames.append(runner.read(runner.launch([1], 64)))  # a batch of one too
        out.append([torch.as_tensor(f) for f in frames])
    return out


def test_the_engine_gives_the_same_greedy_frames_with_the_gemv():
    """Every linear layer of both transformers, the heads and the MLP's down projection
    with its SwiGLU inside, in prefill (more rows: the GEMMs) and decode (1-3 rows)."""
    without, with_gemv = frames_with_and_without_gemv()
    assert len(without) == len(with_gemv)
    for a, b in zip(without, with_gemv):
        assert torch.equal(a, b)


def test_the_plan_routes_every_linear_layer_and_head_of_one_row():
    """The shapes the start-up self-check runs the GEMV at are every layer a one-row step
    routes through it (each block's wqkv, wo, stacked gate/up and down projection, the
    fast input projection), the down projections last, and both heads."""
    from engine.bundle import load_bundle

    model = load_bundle("tiny", "cpu", torch.float32).model
    for block in [*model.layers, *model.fast_layers]:
        block.feed_forward.fuse_gate_up_()
    shapes = gemv_shapes(model)
    downs = {tuple(b.feed_forward.w2.weight.shape) for b in [*model.layers, *model.fast_layers]}
    assert set(shapes[-len(downs):]) == downs
    for block in [*model.layers, *model.fast_layers]:
        for layer in (block.attention.wqkv, block.attention.wo, block.feed_forward.w13):
            assert tuple(layer.weight.shape) in shapes
    assert head_shapes(model) == sorted({tuple(model.head_weight.shape), tuple(model.fast_output.weight.shape)})
    plan = KernelPlan(gemv=True)
    assert plan.takes_gemv(torch.zeros(1, 1, 8)) and not plan.takes_gemv(torch.zeros(2, 8))
    assert not KernelPlan().takes_gemv(torch.zeros(1, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
def test_gpu_s2_pro_shapes_match_the_reference(fp8):
    from kernels.gemv import self_check

    shapes = [(6144, 2560), (2560, 4096), (19456, 2560), (4096, 2560), (2560, 9728)]
    assert self_check("cuda", torch.bfloat16, shapes, fp8=fp8) is None


@pytest.mark.gpu
def test_gpu_bf16_gemv_is_cublas_within_rounding():
    x, w, _ = operands(4, 6144, 2560, torch.bfloat16, False)
    assert rel_err(gemv(x, w), F.linear(x, w)) < 4e-3


def test_the_benchmark_runs_and_every_gemv_is_right(tmp_path):
    """latency_bench/gemv_bench.py --smoke (interpreter on a CPU, small shapes): each GEMV
    it times was first checked against gemv_reference (a wrong one is timed as NaN)."""
    import json
    import math

    from latency_bench.gemv_bench import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gemv_bench.json").read_text())["rows"]
    assert {r["m"] for r in rows} == {1, 3} and len(rows) == 4
    for r in rows:
        for name in ("gemv_bf16", "gemv_fp8", "gemv_fp8_prequant", "gemv_fp8_w8a16", "cublas_bf16", "fp8_gemm"):
            assert math.isfinite(r["us"][name]) and r["us"][name] > 0, (r["shape"], name)
