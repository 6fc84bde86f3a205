"""How often FP8 greedy decoding gives the bf16 frames, over many inputs (issue 7's gate
asks for one fixed input; this shows how much that one input says).

    python scripts/fp8_greedy_agreement.py [--model default] [--device cpu] [--frames 5] [--inputs 16]

For each input (the gate's fixed sentence, then held-out plain sentences): greedy frames
of the bf16 model, then of the same model with every transformer linear layer in FP8
(`quantize_model_`; on a CPU the PyTorch references, which compute what the kernels do),
and whether all frames, and the semantic tokens alone, came out identical. Prints the head
logits' relative error per input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from engine.bundle import load_bundle  # noqa: E402
from engine.quant import quantize_model_  # noqa: E402
from test_quant import greedy_run, rel  # noqa: E402  (the gate's own decoding loop)

GATE_TEXT = "Hello, this is a fixed reference input for the gate."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--frames", type=int, default=5)
    p.add_argument("--inputs", type=int, default=16)
    args = p.parse_args()
    plain = [line for line in (ROOT / "engine/train/plain_sentences.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    texts = [GATE_TEXT, *plain][: args.inputs]
    torch.set_grad_enabled(False)
    bundle = load_bundle(args.model, args.device, torch.bfloat16)
    bf16 = [greedy_run(bundle, args.frames, t) for t in texts]
    quantize_model_(bundle.model, kernel=bundle.device.type == "cuda")
    frames_equal = semantic_equal = 0
    for text, (want, want_logits) in zip(texts, bf16):
        got, logits = greedy_run(bundle, args.frames, text)
        frames_equal += torch.equal(got, want)
        semantic_equal += torch.equal(got[0], want[0])
        print(f"frames equal {torch.equal(got, want)!s:5}  semantic equal {torch.equal(got[0], want[0])!s:5}  "
              f"head logits rel. error {rel(logits, want_logits):.4f}  {text[:48]}")
    print(f"{args.model} on {args.device}, {args.frames} frames: all frames identical for {frames_equal}/{len(texts)} "
          f"inputs, the semantic tokens for {semantic_equal}/{len(texts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
