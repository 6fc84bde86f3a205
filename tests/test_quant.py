"""FP8 linear layers and `quantize_model_`: which layers are swapped, how close the FP8 model
stays to the original, the Triton path against the reference path, and (GPU) the issue's
correctness gate plus CUDA-graph capture of the FP8 step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from cuda_capture import capture_without_syncs
from engine.bundle import load_bundle
from engine.config import PRESETS
from engine.kernel_plan import REFERENCE, KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.layers import FeedForward
from engine.quant import FP8FeedForward, FP8Linear, is_quantized, quantize_model_
from latency_bench.fp8_agreement import greedy_run, rel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = KernelPlan(fp8=True)  # the FP8 layers through their Triton GEMMs (else their references)
# kernel vs its PyTorch reference on the same quantized operands. Compiled on Hopper, the
# FP8 tensor cores accumulate with fewer bits than fp32 (measured 1.2e-4 on an H200), and
# in the MLP a last-bit difference before the second quantization can move a value to the
# next e4m3 step (measured 2.5e-3); a layout or indexing bug gives > 0.1.
LINEAR_TOL = 1e-3 if DEVICE == "cuda" else 1e-5
MLP_TOL = 1e-2 if DEVICE == "cuda" else 1e-4


@pytest.fixture(scope="module")
def tiny():
    # on the kernels' device: a GPU machine compiles Triton, and compiled kernels cannot
    # read CPU tensors (the interpreter runs only where there is no GPU)
    return load_bundle("tiny", DEVICE, torch.float32)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 100), (2, 5, 300)])  # K < 128 and K % 128 != 0, 2-D and 3-D
def test_fp8_linear_matches_linear(shape, bias):
    lin = nn.Linear(shape[-1], 200, bias=bias).to(DEVICE)
    x = torch.randn(shape, device=DEVICE)
    fp8 = FP8Linear.from_linear(lin)
    y = fp8(x, None, FP8)
    assert y.shape == (*shape[:-1], 200) and y.dtype == x.dtype
    assert rel(y, lin(x)) < 0.08  # e4m3: 3 mantissa bits per operand
    assert rel(fp8(x), y) < LINEAR_TOL  # the PyTorch reference of the same function: same quantized operands


def test_fp8_feed_forward_matches_swiglu():
    ff = FeedForward(200, 300).to(DEVICE)  # hidden not a multiple of 128: a block straddles the w1/w3 seam
    x = torch.randn(2, 3, 200, device=DEVICE)
    fp8 = FP8FeedForward.from_feed_forward(ff)
    y = fp8(x, FP8)
    assert y.shape == x.shape
    assert rel(y, ff(x)) < 0.08
    assert rel(fp8(x), y) < MLP_TOL  # the kernel's silu may also differ from PyTorch's by an ulp


def test_quantize_model_swaps_the_transformer_linears_only(tiny):
    model = quantize_model_(copy.deepcopy(tiny.model))
    for block in [*model.layers, *model.fast_layers]:
        assert isinstance(block.attention.wqkv, FP8Linear) and isinstance(block.attention.wo, FP8Linear)
        assert isinstance(block.feed_forward, FP8FeedForward)
    left = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert left == ["fast_output"]  # the fast sampling head (the slow head is a buffer)
    assert isinstance(model.embeddings, nn.Embedding) and model.head_weight.dtype == torch.float32
    weights = {b.dtype for n, b in model.named_buffers() if n.endswith("weight_q")}
    assert weights == {torch.float8_e4m3fn}
    assert is_quantized(model) and not is_quantized(tiny.model)
    assert quantize_model_(model) is model  # idempotent


def test_quantized_model_stays_close(tiny):
    prompt = tiny.prompts.full(None, "Hello there.").to(DEVICE)
    exact = tiny.model.full_logits(prompt)
    model = quantize_model_(copy.deepcopy(tiny.model))
    # ~5% (every linear of the slow transformer in e4m3, random weights)
    assert rel(model.full_logits(prompt), exact) < 0.1


def test_weights_rounded_through_fp8_are_the_fp8_layers_weights(tiny):
    """fp8_agreement --weights-only: each transformer weight becomes what the FP8 layers
    hold, dequantized (w1 and w3 stacked first, as FP8FeedForward quantizes them), and
    nothing else changes."""
    from kernels.fp8_quant import dequantize_weight
    from latency_bench.fp8_agreement import round_weights_through_fp8_

    rounded = copy.deepcopy(tiny.model)
    round_weights_through_fp8_(rounded)
    quantized = quantize_model_(copy.deepcopy(tiny.model))
    for a, q in zip([*rounded.layers, *rounded.fast_layers], [*quantized.layers, *quantized.fast_layers]):
        pairs = [(a.attention.wqkv, q.attention.wqkv), (a.attention.wo, q.attention.wo),
                 (a.feed_forward.w13, q.feed_forward.w13), (a.feed_forward.w2, q.feed_forward.w2)]
        for linear, fp8 in pairs:
            assert torch.equal(linear.weight, dequantize_weight(fp8.weight_q, fp8.weight_scale).to(linear.weight.dtype))
    assert torch.equal(rounded.fast_output.weight, tiny.model.fast_output.weight)
    assert 0.005 < rel(rounded.layers[0].attention.wqkv.weight, tiny.model.layers[0].attention.wqkv.weight) < 0.08


def test_quantized_decode_step_runs_with_kernels(tiny):
    """The decode-shaped path (M = batch rows, slow step + a fast step) through the kernels
    gives the reference path's logits (prefill on the reference path: the interpreter
    runs one program per row and takes ~0.3 s per launch at M = 68)."""
    model = quantize_model_(copy.deepcopy(tiny.model))
    c = model.config
    kv = KVCache.allocate(c, 3, 128, DEVICE, torch.float32)
    fast = FastCache.allocate(c, 3, DEVICE, torch.float32)
    prompt = tiny.prompts.full(None, "Hi.").to(DEVICE)
    for slot in range(3):
        model.prefill(prompt, slot, 0, kv)
    tokens = prompt[:, -1:].T.repeat(3, 1)  # [3, 1 + C]
    slots, positions = torch.arange(3, device=DEVICE), torch.full((3,), prompt.shape[1], device=DEVICE)

    def step(plan=REFERENCE):
        head, fast_in = model.decode_slow(tokens, slots, positions, prompt.shape[1] + 1, kv, plan)
        model.fast_step(fast_in, 0, fast, plan)
        return head, model.fast_step(model.fast_embeddings(tokens[:, 2]), 1, fast, plan)

    ref_head, ref_fast = step()
    head, fast_logits = step(FP8)
    assert rel(head, ref_head) < 1e-4 and rel(fast_logits, ref_fast) < 1e-4
    served = KernelPlan(fp8=True, step=True)  # and with the blocks' small ops as kernels too, as a GPU serves it
    head, fast_logits = step(served)
    assert rel(head, ref_head) < 1e-4 and rel(fast_logits, ref_fast) < 1e-4
    # there the norms hand wqkv and the MLP their codes (kernels/add_rms_norm.py quantize):
    # the GEMMs take them instead of quantizing x themselves, and every logit is the same
    given = []
    real_forward = FP8Linear.forward

    def spy(self, x, codes=None, plan=REFERENCE, swiglu=False):
        given.append(codes is not None)
        return real_forward(self, x, codes, plan, swiglu)

    FP8Linear.forward = spy
    try:
        with_codes = step(served)
        for block in [*model.layers, *model.fast_layers]:
            block.norms_quantize = False
        without = step(served)
    finally:
        FP8Linear.forward = real_forward
    half = len(given) // 2
    assert any(given[:half]) and not any(given[half:])  # wqkv and w13 took codes; wo and w2 never do
    assert all(torch.equal(a, b) for a, b in zip(with_codes, without))


# --- GPU: the correctness gate, graphs ------------------------------------------

@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason="issue 7's gate fails on the trained default voice too (kernels/FP8_NOTES.md, "
                   "'The gate on the trained default voice'); strict: an FP8 path that passes it fails this mark")
@torch.inference_mode()
def test_gate_greedy_frames_equal_bf16():
    """Issue 7's correctness gate: FP8 greedy decoding gives exactly the bf16 frames for the
    first 5 frames of a fixed input; prints the head logits' relative error.
        pytest -s tests/test_quant.py -k gate

    The gate needs trained weights: random-weight logits are nearly flat (top-2 margin ~0.06
    at the s2-pro shape, logit std ~1) while FP8's head-logit error is ~30% there (CPU,
    reference path: FP8_NOTES.md), so greedy frames of a random preset differ by design:
    it skips when `default` is a random preset. Over many inputs: `python -m
    latency_bench.fp8_agreement`."""
    bundle = load_bundle("default", "cuda", torch.bfloat16)
    if bundle.name in PRESETS:
        pytest.skip("the default model still has random weights (issue 6): the gate needs a trained model")
    frames, logits = greedy_run(bundle, 5)
    quantize_model_(bundle.model)
    fp8_frames, fp8_logits = greedy_run(bundle, 5)
    print(f"\ndefault: head logits relative error {rel(fp8_logits, logits):.4f}; "
          f"frames equal: {torch.equal(fp8_frames, frames)}")
    assert torch.equal(fp8_frames, frames)


@pytest.mark.gpu
@torch.inference_mode()
def test_fp8_layers_capture_in_a_cuda_graph():
    """FP8Linear and FP8FeedForward at the S2-Pro width: their launchers never wait on the
    device, and captured once and replayed on new inputs they give the eager outputs exactly."""
    lin = FP8Linear.from_linear(nn.Linear(2560, 6144, bias=False, device="cuda", dtype=torch.bfloat16))
    ff = FP8FeedForward.from_feed_forward(FeedForward(2560, 9728).to("cuda", torch.bfloat16))
    x = torch.randn(4, 1, 2560, device="cuda", dtype=torch.bfloat16)

    def step():
        return lin(x, None, FP8), ff(x, FP8)

    graph, outs = capture_without_syncs(step)
    x.copy_(torch.randn_like(x))
    graph.replay()
    for got, want in zip(outs, step()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fp8_bundle_speaks_through_the_cli(tmp_path, model="tiny", quant="fp8"):
    """--quant fp8 loads, quantizes every transformer linear and synthesizes a WAV."""
    import subprocess
    import sys

    out = tmp_path / "fp8.wav"
    result = subprocess.run(
        [sys.executable, "-m", "engine", "--text", "Hello.", "--out", str(out), "--model", model,
         "--device", "cpu", "--quant", quant, "--max-frames", "6"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 44  # header + samples
    bundle = load_bundle(model, "cpu", quant=quant)
    assert is_quantized(bundle.model)
    with pytest.raises(ValueError, match="unknown quantization"):
        load_bundle("tiny", "cpu", quant="int4")


def test_margins_report_every_greedy_codebook_draw(capsys):
    """fp8_agreement --margins: one line per codebook draw of the gate input's greedy run,
    whose bf16 argmax is the token greedy decoding took there."""
    from latency_bench.fp8_agreement import draw_margins

    draw_margins("tiny", "cpu", 3)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("frame ")]
    bundle = load_bundle("tiny", "cpu", torch.bfloat16)
    frames, _ = greedy_run(bundle, 3)
    residual = bundle.config.num_codebooks - 1
    assert len(lines) == 3 * residual
    for i, line in enumerate(lines):
        margin = float(line.split("margin ")[1].split(",")[0])
        taken = int(line.split("argmax bf16 ")[1].split(" /")[0])
        assert margin >= 0 and taken == int(frames[2 + i % residual, i // residual]), line


def test_sampling_heads_give_fp32_logits_of_the_bf16_values():
    """Both heads' logits come out in fp32, equal to the fp32 matmul of the model's bf16
    hidden states and weights (engine/linear.py head_logits): never rounded to bf16,
    whose exact ties decided the FP8 gate's first differing draw on the default voice."""
    from engine.linear import head_logits

    bundle = load_bundle("tiny", "cpu", torch.bfloat16)
    model, c = bundle.model, bundle.config
    prompt = bundle.prompts.full(None, "Hello.")
    kv = KVCache.allocate(c, 1, prompt.shape[1] + 1, "cpu", torch.bfloat16)
    head, fast_in = model.prefill(prompt, 0, 0, kv)
    assert head.dtype == torch.float32 and head.shape == (1, c.num_semantic + 1)
    fast = FastCache.allocate(c, 1, "cpu", torch.bfloat16)
    model.fast_step(fast_in, 0, fast)
    x = model.fast_embeddings(torch.tensor([3]))
    logits = model.fast_step(x, 1, fast)
    assert logits.dtype == torch.float32 and logits.shape == (1, c.codebook_size)
    w = torch.randn(7, c.fast_dim, dtype=torch.bfloat16)
    h = torch.randn(2, c.fast_dim, dtype=torch.bfloat16)
    exact = head_logits(h, w)
    assert torch.equal(exact, h.float() @ w.float().T)
    assert not torch.equal(exact, (h @ w.T).float())  # what bf16 logits would have been


def test_agreement_against_a_baseline_on_the_fp8_grid(capsys, monkeypatch):
    """fp8_agreement --fp8-grid-baseline: the count of FP8 against bf16 whose weights are
    already on the FP8 grid (the weights' rounding taken out; the activations' left)."""
    from latency_bench import fp8_agreement

    monkeypatch.setattr("sys.argv", ["fp8_agreement", "--model", "tiny", "--device", "cpu", "--frames", "2",
                                     "--inputs", "2", "--fp8-grid-baseline"])
    assert fp8_agreement.main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "against bf16 with its weights on the FP8 grid, 2 frames" in last and "/2 inputs" in last
    assert torch.is_grad_enabled()  # main() leaves the process's grad mode as it was (later tests train)
    monkeypatch.setattr("sys.argv", ["fp8_agreement", "--model", "tiny", "--fp8-grid-baseline", "--weights-only"])
    with pytest.raises(SystemExit):
        fp8_agreement.main()
