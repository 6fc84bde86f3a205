"""`python -m latency_bench.gate`: the regression gate against frozen reference numbers.

Fails (exit 1) when, at any concurrency level present in both runs (by default the
reference's c = 1, 16 and 64):
- per-stream decode frames/s (median over turns) dropped by more than 5%, or
- TTFA p50 rose by more than 10%.

A level run more than once in one results file (a load sweep "64,64") is compared by the
median of its runs' figures, on either side: the first run after a server starts has the
longest TTFA tail, and keeping only one of them would let the order decide the verdict.

    python -m latency_bench.gate --reference latency_bench/reference/h200-s2pro/load.json \\
        --current out/gpu/load/results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

MAX_FPS_DROP = 0.05
MAX_TTFA_RISE = 0.10


def levels(results: dict, run: str) -> dict[int, dict]:
    """Per concurrency level: per-stream frames/s p50 and TTFA p50 (seconds), each the
    median over the level's runs (None where a run has none), and how many runs there were."""
    runs = results["runs"]
    name = run if run in runs else next(iter(runs))
    by_level: dict[int, list[dict]] = {}
    for lv in runs[name]:
        by_level.setdefault(lv["concurrency"], []).append(lv)

    def median(values: list) -> float | None:
        return None if any(v is None for v in values) else statistics.median(values)

    return {c: {"fps": median([lv["stream_frames_per_s"]["p50"] for lv in lvs]),
                "ttfa": median([lv["ttfa_s"]["p50"] for lv in lvs]),
                "runs": len(lvs)} for c, lvs in by_level.items()}


def compare(reference: dict, current: dict, run: str = "engine", only: list[int] | None = None) -> list[str]:
    """Returns the failures (empty: the gate passes)."""
    ref, cur = levels(reference, run), levels(current, run)
    common = sorted(set(ref) & set(cur) & set(only or ref))
    if not common:
        return ["no concurrency level in common with the reference"]
    failures = []
    for c in common:
        runs = f" (median of {cur[c]['runs']} runs)" if cur[c]["runs"] > 1 else ""
        r_fps, c_fps = ref[c]["fps"], cur[c]["fps"]
        if r_fps and (c_fps is None or c_fps < r_fps * (1 - MAX_FPS_DROP)):
            failures.append(f"c={c}: per-stream frames/s {c_fps} < {r_fps:.1f} - {MAX_FPS_DROP:.0%}{runs}")
        r_ttfa, c_ttfa = ref[c]["ttfa"], cur[c]["ttfa"]
        if r_ttfa and (c_ttfa is None or c_ttfa > r_ttfa * (1 + MAX_TTFA_RISE)):
            failures.append(f"c={c}: TTFA p50 {1000 * (c_ttfa or 0):.0f} ms > {1000 * r_ttfa:.0f} ms + {MAX_TTFA_RISE:.0%}{runs}")
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", required=True)
    p.add_argument("--current", required=True)
    p.add_argument("--run", default="engine", help="which run of the results to compare (engine | naive | service)")
    p.add_argument("--levels", help="comma-separated levels to check (default: all in common)")
    a = p.parse_args(argv)
    reference = json.loads(Path(a.reference).read_text())
    current = json.loads(Path(a.current).read_text())
    only = [int(x) for x in a.levels.split(",")] if a.levels else None
    failures = compare(reference, current, a.run, only)
    for line in failures:
        print(f"FAIL {line}")
    if not failures:
        print("gate passed: per-stream frames/s within 5% and TTFA p50 within 10% of the reference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
