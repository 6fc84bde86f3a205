"""Summarize the engine's per-turn timing log (`--log-timing`) read from stdin.

Each line: "turn N: say->prefill A ms, prefill B ms, prefill->audio C ms". Prints
p50 / p90 / max of each part over consecutive groups of lines, by default the load
sweep's c=1,16,64 levels with three turns per connection (3, 48 and 192 turns, in log
order), to show where a turn's time to first audio goes.
usage: grep "turn " server-engine.log | python3 scripts/turn_timing.py [GROUP_SIZES]
"""

import re
import statistics
import sys

PATTERN = re.compile(r"say->prefill ([\d.]+) ms, prefill ([\d.]+) ms, prefill->audio ([\d.]+) ms")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "3,48,192").split(",")]
    rows = [tuple(map(float, m.groups())) for line in sys.stdin if (m := PATTERN.search(line))]
    start = 0
    for size in sizes + [len(rows)]:
        group = rows[start : start + size]
        if not group:
            break
        print(f"turns {start + 1}-{start + len(group)}:")
        for i, name in enumerate(("say->prefill", "prefill", "prefill->audio")):
            xs = [r[i] for r in group]
            print(f"  {name:15} p50 {statistics.median(xs):8.1f}  p90 {pct(xs, 0.9):8.1f}  max {max(xs):8.1f} ms")
        start += len(group)


if __name__ == "__main__":
    main()
