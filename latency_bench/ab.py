"""`python -m latency_bench.ab BASE CURRENT`: two load results side by side.

The acceptance run of a change (`BASE_TREE=... bash scripts/gpu_check.sh load`) measures the
tree before it and the tree after it on one machine, one after the other; this prints, per
concurrency level both have, frames/s over all streams and TTFA p50 / p99 of each, and
current / base. A level run more than once (`--concurrency 64,64`) counts by the median of
its runs, as in the gate.

    python -m latency_bench.ab out/gpu/base-load.json out/gpu/load.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def level_figures(results: dict, run: str = "engine") -> dict[int, dict[str, float]]:
    """Per concurrency: frames/s, TTFA p50 and p99 in ms, each the median over the level's runs."""
    runs = results["runs"]
    levels = runs[run] if run in runs else next(iter(runs.values()))
    by_c: dict[int, list[dict]] = {}
    for lv in levels:
        by_c.setdefault(lv["concurrency"], []).append(lv)

    def median(values: list) -> float:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    return {c: {"frames/s": median([lv["frames_per_s"] for lv in lvs]),
                "TTFA p50": median([lv["ttfa_s"]["p50"] and 1000 * lv["ttfa_s"]["p50"] for lv in lvs]),
                "TTFA p99": median([lv["ttfa_s"]["p99"] and 1000 * lv["ttfa_s"]["p99"] for lv in lvs])}
            for c, lvs in sorted(by_c.items())}


def side_by_side(base: dict, current: dict, run: str = "engine") -> str:
    b, c = level_figures(base, run), level_figures(current, run)
    lines = [f"{'c':>4} {'figure':>9} {'base':>9} {'current':>9} {'cur/base':>8}"]
    for level in sorted(set(b) & set(c)):
        for name in ("frames/s", "TTFA p50", "TTFA p99"):
            x, y = b[level][name], c[level][name]
            ratio = y / x if x else float("nan")
            lines.append(f"{level:>4} {name:>9} {x:>9.1f} {y:>9.1f} {ratio:>7.2f}x")
    lines.append("(frames/s over all streams, higher is better; TTFA in ms, lower is better)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base")
    p.add_argument("current")
    p.add_argument("--run", default="engine", help="which run of each results file (engine | naive | service)")
    a = p.parse_args(argv)
    base, current = (json.loads(Path(f).read_text()) for f in (a.base, a.current))
    print(side_by_side(base, current, a.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
