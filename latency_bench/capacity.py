"""Capacity: the most concurrent conversations a service carries, and whether a level held.

A level holds when its TTFA p99 is within the bound (DESIGN.md, "Measuring": 150 ms), no
turn's playback ran dry, and no conversation was refused or failed (a conversation the
service turns away is not carried). The search either walks a given ladder until the
first level that fails, or doubles from a start level until one fails and then bisects
between the last level that held and the first that failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable


def verdict(level: dict, ttfa_p99_bound_s: float) -> tuple[bool, str]:
    """(held, why not) of one aggregated level (latency_bench/conv_report.py)."""
    p99 = level["ttfa_s"]["p99"]
    if p99 is None or (isinstance(p99, float) and math.isnan(p99)):
        return False, "no turn was measured"
    if p99 > ttfa_p99_bound_s:
        return False, f"TTFA p99 {1000 * p99:.0f} ms > {1000 * ttfa_p99_bound_s:.0f} ms"
    if level["underruns"]:
        return False, f"{level['underruns']} underrun(s), {level['underrun_ms']:.0f} ms"
    if level["refusals"]:
        return False, f"{level['refusals']} conversation(s) refused"
    if level["errors"]:
        return False, f"{level['errors']} conversation(s) failed: {level['errors_by_code']}"
    return True, ""


@dataclass(slots=True)
class Search:
    """Where a capacity search ended: the last level that held (None: not even the
    first), the first that failed (None: none did), and every level tried, in order."""

    capacity: int | None = None
    failed_at: int | None = None
    tried: list[tuple[int, bool]] = field(default_factory=list)


def search(holds: Callable[[int], bool], levels: list[int] | None = None, start: int = 8, max_level: int = 1024,
           resolution: float = 0.125) -> Search:
    """Raise the level until `holds(level)` is False: along `levels` when given, else by
    doubling from `start` (up to `max_level`), then bisecting until the gap between the
    level that held and the one that failed is at most `resolution` of the first (or 1)."""
    s = Search()

    def trial(level: int) -> bool:
        ok = holds(level)
        s.tried.append((level, ok))
        if ok:
            s.capacity = level if s.capacity is None else max(s.capacity, level)
        else:
            s.failed_at = level if s.failed_at is None else min(s.failed_at, level)
        return ok

    if levels:
        for level in levels:
            if not trial(level):
                break
        return s
    level = start
    while level <= max_level and trial(level):
        level *= 2
    if s.capacity is None or s.failed_at is None:
        return s  # the first level failed, or none up to max_level did
    while s.failed_at - s.capacity > max(1, math.floor(resolution * s.capacity)):
        trial((s.capacity + s.failed_at) // 2)
    return s
