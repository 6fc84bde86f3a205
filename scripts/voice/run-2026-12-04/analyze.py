"""Cloning trials of engine.train.evaluate, broken down (2026-12-04): accuracy by the
reference's total duration, and the confusion matrix (reference speaker x nearest).

    .venv/bin/python scripts/voice/run-2026-12-04/analyze.py --data .carry/voice/audio \
        scripts/voice/run-2026-12-04/cloning180-S0.json [more.json ...]

A report without `reference_seconds` (made before the option existed) gets them from
clone_references(held, trials, min_reference_seconds), the same deterministic selection.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from engine.train.evaluate import HeldOut, clone_references  # noqa: E402
from engine.train.presets import SAMPLE_RATE  # noqa: E402

EDGES = (0.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, float("inf"))


def analyze(report: dict, held: HeldOut | None) -> dict:
    c = report.get("model", report)["cloning"]
    pairs = np.array(c["reference_vs_nearest"])
    n = len(pairs)
    seconds = c.get("reference_seconds")
    if seconds is None:
        trials = clone_references(held, n, c.get("min_reference_seconds", 0.0))
        seconds = [sum(it.audio.size for it in refs) / held.rate for refs, _ in trials]
    seconds = np.array(seconds)
    hit = pairs[:, 0] == pairs[:, 1]
    buckets = []
    for lo, hi in zip(EDGES[:-1], EDGES[1:]):
        m = (seconds >= lo) & (seconds < hi)
        if m.any():
            buckets.append({"seconds": f"{lo:g}-{hi:g}", "trials": int(m.sum()), "hits": int(hit[m].sum()),
                            "accuracy": round(float(hit[m].mean()), 4)})
    speakers = sorted(set(pairs[:, 0].tolist()))
    cols = speakers + ([-1] if (pairs[:, 1] == -1).any() else [])
    confusion = {int(s): {int(t): int(((pairs[:, 0] == s) & (pairs[:, 1] == t)).sum()) for t in cols} for s in speakers}
    return {"trials": n, "hits": int(hit.sum()), "accuracy": round(float(hit.mean()), 4),
            "min_reference_seconds": c.get("min_reference_seconds", 0.0),
            "reference_seconds_median": round(float(np.median(seconds)), 3),
            "by_reference_seconds": buckets, "confusion_reference_x_nearest": confusion,
            "per_60": [int(hit[i:i + 60].sum()) for i in range(0, n, 60)]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--data", type=Path, action="append", required=True)
    args = p.parse_args()
    held = HeldOut.load(args.data, SAMPLE_RATE)
    out = {str(r): analyze(json.loads(r.read_text()), held) for r in args.reports}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
