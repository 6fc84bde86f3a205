"""Fine-tune the default voice's fast transformer so that its greedy residual draws survive
FP8: the loss asks the FP8 forward (the slow transformer's FP8 output in, the fast blocks'
weights and activations rounded as the FP8 path rounds them, straight-through gradients)
to keep the bf16-side argmax ahead by a margin, and the bf16 side to stay close to the
original model's distribution (KL), so the voice stays the voice.

    PYTHONPATH=. python scripts/voice/run-2026-12-06/fp8_margin.py --codes codes.npz --out runs/fp8m \\
        --minutes 10 --margin 1.0

Only the fast blocks train (sharpen.py's `trainable`); the head and the norms stay frozen.
The gate after: `python -m latency_bench.fp8_agreement --model runs/fp8m/voice --device cpu`.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharpen import export, fast_inputs, fast_logits, trainable  # noqa: E402

from engine.bundle import load_bundle  # noqa: E402
from engine.quant import quantize_model_  # noqa: E402
from engine.train.lm_data import CodeSet, SequenceBuilder, SequenceConfig, batches, collate  # noqa: E402
from kernels.fp8_quant import dequantize_act, dequantize_weight, quantize_act_reference, quantize_weight  # noqa: E402


def _fake_act(x: torch.Tensor) -> torch.Tensor:
    """x rounded through 1 x 128 e4m3 groups (the FP8 path's activations), gradient straight through."""
    x2 = x.reshape(-1, x.shape[-1])
    q = dequantize_act(*quantize_act_reference(x2.detach().float())).to(x.dtype).view_as(x)
    return x + (q - x).detach()


def _fake_weight(w: torch.Tensor) -> torch.Tensor:
    q = dequantize_weight(*quantize_weight(w.detach().float())).to(w.dtype)
    return w + (q - w).detach()


@contextmanager
def fp8_rounding(layers: torch.nn.Module):
    """Every nn.Linear under `layers` computes with FP8-rounded weights and inputs."""
    linears = [m for m in layers.modules() if isinstance(m, torch.nn.Linear)]
    saved = [m.forward for m in linears]
    for m in linears:
        m.forward = (lambda mod: lambda x: F.linear(_fake_act(x), _fake_weight(mod.weight), mod.bias))(m)
    try:
        yield
    finally:
        for m, f in zip(linears, saved):
            m.forward = f


def margin_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logit[target] - the largest other logit, per row."""
    top = logits.gather(-1, target[..., None])[..., 0]
    other = logits.scatter(-1, target[..., None], float("-inf")).amax(-1)
    return top - other


def figures(model, fp8_slow, seqs, original) -> dict:
    out: dict[str, float] = {}
    with torch.no_grad():
        for i in range(0, len(seqs), 8):
            batch = collate(seqs[i : i + 8])
            clean_in, codes = fast_inputs(model, batch)
            fp8_in, _ = fast_inputs(fp8_slow, batch)
            clean = fast_logits(model, clean_in, codes, 0.0)
            with fp8_rounding(model.fast_layers):
                noisy = fast_logits(model, fp8_in, codes, 0.0)
            orig = fast_logits(model, clean_in, codes, 0.0, original)
            a = clean.argmax(-1)
            w = len(seqs[i : i + 8]) / len(seqs)
            rows = {"fp8_same_argmax": (noisy.argmax(-1) == a).float().mean(),
                    "fp8_margin_below_0.5": (margin_of(noisy, a) < 0.5).float().mean(),
                    "same_argmax_as_original": (a == orig.argmax(-1)).float().mean(),
                    "kl_to_original": F.kl_div(clean.log_softmax(-1), orig.log_softmax(-1), log_target=True,
                                               reduction="none").sum(-1).mean(),
                    "data_loss": F.cross_entropy(clean.transpose(1, 2), codes[:, 1:])}
            for k, v in rows.items():
                out[k] = out.get(k, 0.0) + float(v) * w
    return {f"test_{k}": round(v, 4) for k, v in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("engine/assets/default"))
    p.add_argument("--codes", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--margin", type=float, default=1.0, help="logit units the FP8 side must keep the argmax ahead by")
    p.add_argument("--kl-weight", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--held-out", type=int, default=16)
    a = p.parse_args(argv)

    torch.manual_seed(0)
    bundle = load_bundle(str(a.model), device="cpu", dtype=torch.float32)
    model = bundle.model.train()
    fp8_slow = quantize_model_(copy.deepcopy(model), kernel=False).eval()  # only its slow side is used
    original = copy.deepcopy(model.fast_layers).eval().requires_grad_(False)
    params = trainable(model)
    data = CodeSet.load(a.codes)
    cfg = SequenceConfig(max_tokens=model.config.max_seq_len)
    stream = batches(SequenceBuilder(data, bundle.tokenizer, model.config, cfg, "train", seed=0), a.batch_tokens)
    test = SequenceBuilder(data, bundle.tokenizer, model.config, cfg, "test", seed=1234)
    test_seqs = [test.sample() for _ in range(a.held_out)]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / "log.jsonl").open("w")

    def write(row):
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(json.dumps(row), file=sys.stderr, flush=True)

    write({"step": 0, **figures(model, fp8_slow, test_seqs, original)})
    step, deadline = 0, time.perf_counter() + a.minutes * 60
    while time.perf_counter() < deadline:
        batch = next(stream)
        clean_in, codes = fast_inputs(model, batch)
        fp8_in, _ = fast_inputs(fp8_slow, batch)
        with torch.no_grad():
            orig = fast_logits(model, clean_in, codes, 0.0, original)
        clean = fast_logits(model, clean_in, codes, 0.0)
        with fp8_rounding(model.fast_layers):
            noisy = fast_logits(model, fp8_in, codes, 0.0)
        target = clean.argmax(-1).detach()
        hinge = F.relu(a.margin - margin_of(noisy, target)).mean() + F.relu(a.margin - margin_of(clean, target)).mean()
        kl = F.kl_div(clean.log_softmax(-1), orig.log_softmax(-1), log_target=True, reduction="none").sum(-1).mean()
        loss = hinge + a.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % a.eval_every == 0:
            write({"step": step, "hinge": round(float(hinge), 4), "kl": round(float(kl), 4),
                   **figures(model, fp8_slow, test_seqs, original)})
    write({"step": step, "exported": str(a.out / "voice"), "bytes": export(model, a.model, a.out / "voice")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
