"""How often FP8 greedy decoding gives the bf16 frames, over many inputs (issue 7's gate,
tests/test_quant.py, asks for one fixed input; this shows how much that one input says),
and the greedy decoding loop that gate and this report share.

    python -m latency_bench.fp8_agreement [--model default] [--device cpu] [--frames 5] [--inputs 16]
        [--weights-only] [--ceiling]

For each input (the gate's fixed sentence, then held-out plain sentences): greedy frames
of the bf16 model, then of the same model with every transformer linear layer in FP8
(`quantize_model_`; on a CPU the PyTorch references, which compute what the kernels do),
and whether all frames, and the semantic tokens alone, came out identical. Prints the head
logits' relative error per input.

Two diagnoses of where a difference comes from:
- `--weights-only`: instead of FP8, every transformer weight rounded through the
  block-scaled e4m3 layout and back, activations unquantized (what the weights' rounding
  alone does; not a mode the service runs);
- `--ceiling`: first the same count for the model in fp32 against bf16, i.e. how often
  greedy decoding survives a numerical change no larger than bf16's own rounding;
- `--fp8-grid-baseline`: the bf16 baseline's weights rounded through the block-scaled e4m3
  layout first (a checkpoint shipped on the FP8 grid), so FP8 differs from it by the
  activations' quantization alone (default voice, CPU, 2026-12-05: 6/16 inputs, semantic
  tokens 13/16, head logits still 0.013-0.021 off: the activations alone break the gate);
The sampling heads' logits are fp32 (engine/linear.py head_logits) since
2026-12-04; before, they were rounded to bf16, and on the default voice the gate's input
broke at an exact bf16 tie (frame 1's first residual draw; `--margins` below). With the
fast head's logits in fp32 (then a diagnosis, `--fp32-fast-logits`) that input kept all 5
frames under FP8 on the CPU, and 5/16 inputs did (3/16 with bf16 logits).
- `--margins`: for the gate's input, every greedy codebook draw of the bf16 run: its top-2
  logit margin, FP8's largest logit shift there, and both argmaxes (on the default voice,
  2026-12-03: frame 1's first residual draw is an exact tie in bf16, margin 0, while FP8
  moves those logits by up to 0.44; the draws before it have margins of 0.125-1.56
  against FP8 shifts of 0.25-0.47).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from engine.bundle import load_bundle
from engine.kv_cache import FastCache, KVCache
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kernel_plan import KernelPlan
from engine.quant import is_quantized, quantize_model_
from engine.sampling import SamplingParams, SamplingTensors
# the default voice's held-out plain sentences (a checkout's training/ data, read as a file:
# latency_bench imports nothing of training)
PLAIN_SENTENCES = Path(__file__).resolve().parent.parent / "training" / "plain_sentences.txt"

GATE_TEXT = "Hello, this is a fixed reference input for the gate."


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error of a against b (Frobenius norms, fp32)."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def greedy_run(bundle, n_frames: int, text: str = GATE_TEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames [1 + C, n] and the first slow head's logits of greedy decoding (eager; FP8
    layers through their kernels on a GPU, as served)."""
    model, c, dev = bundle.model, bundle.config, bundle.device
    plan = KernelPlan(fp8=dev.type == "cuda" and is_quantized(model))
    prompt = bundle.prompts.full(None, text).to(dev)
    kv = KVCache.allocate(c, 1, prompt.shape[1] + n_frames + 1, dev, bundle.dtype)
    fast = FastCache.allocate(c, 1, dev, bundle.dtype)
    params = SamplingTensors.from_params([SamplingParams(temperature=0.0, allow_end=False)], dev)
    window = new_window(1, c.sampling_window, c.num_codebooks, dev)
    frame_index = torch.zeros(1, dtype=torch.long, device=dev)
    head, fast_in = model.prefill(prompt, 0, 0, kv, plan)
    frames = [sample_frame(model, fast, head, fast_in, params, window, frame_index, plan)]
    pos = prompt.shape[1]
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    while len(frames) < n_frames:
        push_window(window, frames[-1][:, 1:])
        position = torch.full((1,), pos, dtype=torch.long, device=dev)
        frames.append(decode_frame(model, kv, fast, frames[-1], slot, position, pos + 1, params, window, frame_index,
                                   plan))
        pos += 1
    return torch.cat(frames).T.cpu(), head.float().cpu()


@torch.no_grad()
def round_weights_through_fp8_(model) -> None:
    """Every transformer linear weight (w1 and w3 stacked first, as FP8 quantizes them)
    quantized to block-scaled e4m3 and dequantized back into its own dtype, in place."""
    from kernels.fp8_quant import dequantize_weight, quantize_weight

    for block in [*model.layers, *model.fast_layers]:
        block.feed_forward.fuse_gate_up_()
        for linear in (m for m in block.modules() if isinstance(m, torch.nn.Linear)):
            w = linear.weight
            w.copy_(dequantize_weight(*quantize_weight(w.detach())).to(w.dtype))


def agreement(bundle, texts: list[str], want: list, n_frames: int, label: str, verbose: bool = True) -> tuple[int, int]:
    """(inputs with all frames identical, with the semantic tokens identical) of `bundle`'s
    greedy frames against `want` (greedy_run results of the same texts)."""
    frames_equal = semantic_equal = 0
    for text, (frames, logits) in zip(texts, want):
        got, got_logits = greedy_run(bundle, n_frames, text)
        frames_equal += torch.equal(got, frames)
        semantic_equal += torch.equal(got[0], frames[0])
        if verbose:
            print(f"frames equal {torch.equal(got, frames)!s:5}  semantic equal {torch.equal(got[0], frames[0])!s:5}  "
                  f"head logits rel. error {rel(got_logits, logits):.4f}  {text[:48]}")
    print(f"{label}, {n_frames} frames: all frames identical for {frames_equal}/{len(texts)} inputs, "
          f"the semantic tokens for {semantic_equal}/{len(texts)}")
    return frames_equal, semantic_equal


def draw_margins(model_name: str, device: str, n_frames: int) -> None:
    """See --margins in the module docstring. The codebook logits each greedy draw saw
    (engine/frame.py sample_codebook, the PyTorch path: on a GPU the runs here take it
    too, as greedy_run builds no Runner), bf16 against FP8."""
    import engine.frame as frame

    seen: dict[bool, list[torch.Tensor]] = {}
    for fp8 in (False, True):
        bundle = load_bundle(model_name, device, torch.bfloat16)
        if fp8:
            quantize_model_(bundle.model)
        seen[fp8], draw = [], frame.sample_codebook

        def spy(logits, *args, _draw=draw, _into=seen[fp8], **kwargs):
            _into.append(logits[0].float().cpu())
            return _draw(logits, *args, **kwargs)

        frame.sample_codebook = spy
        try:
            greedy_run(bundle, n_frames)
        finally:
            frame.sample_codebook = draw
    per_frame = len(seen[False]) // n_frames
    for i, (a, b) in enumerate(zip(seen[False], seen[True])):
        top = a.topk(2).values
        print(f"frame {i // per_frame} codebook {i % per_frame + 1}: bf16 top-2 margin {float(top[0] - top[1]):.3f}, "
              f"FP8 shift max {float((b - a).abs().max()):.3f}, argmax bf16 {int(a.argmax())} / FP8 {int(b.argmax())}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--frames", type=int, default=5)
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--weights-only", action="store_true",
                   help="weights rounded through FP8 and back, activations unquantized (a diagnosis)")
    p.add_argument("--ceiling", action="store_true", help="also the fp32 model against bf16")
    p.add_argument("--fp8-grid-baseline", action="store_true",
                   help="the bf16 baseline with its weights rounded through FP8 first (FP8 then differs by its "
                        "activations only)")
    p.add_argument("--margins", action="store_true",
                   help="only: the gate input's codebook draws, bf16 top-2 margins against FP8's logit shifts")
    args = p.parse_args()
    if args.fp8_grid_baseline and args.weights_only:
        p.error("--fp8-grid-baseline with --weights-only compares the same weights: give one")
    with torch.no_grad():  # not torch.set_grad_enabled(False): main() is also called from tests
        return run(args)


def run(args: argparse.Namespace) -> int:
    if args.margins:
        draw_margins(args.model, args.device, args.frames)
        return 0
    plain = [line.strip() for line in PLAIN_SENTENCES.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    texts = [GATE_TEXT, *plain][: args.inputs]
    bundle = load_bundle(args.model, args.device, torch.bfloat16)
    if args.fp8_grid_baseline:
        round_weights_through_fp8_(bundle.model)
    bf16 = [greedy_run(bundle, args.frames, t) for t in texts]
    if args.ceiling:
        agreement(load_bundle(args.model, args.device, torch.float32), texts, bf16, args.frames,
                  f"{args.model} on {args.device}, fp32 against bf16", verbose=False)
    if args.weights_only:
        round_weights_through_fp8_(bundle.model)
        label = "FP8-rounded weights, bf16 activations"
    else:
        quantize_model_(bundle.model)
        label = "FP8"
    against = "bf16 with its weights on the FP8 grid" if args.fp8_grid_baseline else "bf16"
    agreement(bundle, texts, bf16, args.frames, f"{args.model} on {args.device}, {label} against {against}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
