"""Codec training steps per second, on random audio, for the decoder and Snake variants:
the release config with Snake1d's PyTorch ops, the same with the fused Snake
(kernels/snake_train.py), and the "istft" decoder (scripts/voice/codec-istft.json). The
same batch as codec_train (32 x 2 s), the phone head off (it needs the data's phones),
so the figures are the reconstruction step alone; compare them within one run.

    python3 scripts/voice/train_step_bench.py [--device cuda] [--steps 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.codec.config import CodecConfig  # noqa: E402
from engine.train.codec_losses import ReconstructionLoss  # noqa: E402
from engine.train.codec_train import CodecTrainConfig, build, loss_terms  # noqa: E402
from engine.train.presets import VOICE_CODEC  # noqa: E402


def variants() -> dict[str, tuple[CodecConfig, CodecTrainConfig]]:
    istft = CodecConfig.from_json((ROOT / "scripts/voice/codec-istft.json").read_text())
    base = CodecTrainConfig(phone_weight=0.0)
    return {
        "dac": (VOICE_CODEC, base),
        "dac+fused_snake": (VOICE_CODEC, dataclasses.replace(base, fused_snake=True)),
        "istft": (istft, base),
    }


def steps_per_s(config: CodecConfig, cfg: CodecTrainConfig, device: str, batch: int, seconds: float,
                steps: int, warmup: int = 2) -> dict:
    trainer = build(config, device, cfg).train()
    losses = ReconstructionLoss(config.sample_rate).to(device)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    length = int(seconds * config.sample_rate) // config.hop_length * config.hop_length
    x = torch.randn(batch, length, device=device) * 0.1
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        terms = loss_terms(trainer, losses, x)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()
    sync()
    per_s = steps / (time.perf_counter() - t0)
    out = {"steps_per_s": round(per_s, 2), "parameters_m": round(sum(p.numel() for p in trainer.codec.parameters()) / 1e6, 2)}
    if device.startswith("cuda"):
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--only", help="comma-separated variant names")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # as codec_train does on a GPU
    report = {"device": a.device, "batch": a.batch, "seconds": a.seconds, "steps": a.steps, "variants": {}}
    for name, (config, cfg) in variants().items():
        if a.only and name not in a.only.split(","):
            continue
        report["variants"][name] = steps_per_s(config, cfg, a.device, a.batch, a.seconds, a.steps)
        print(name, json.dumps(report["variants"][name]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
