"""Where a worker thread's time goes: host seconds per phase, summed since start.

Each worker thread (decode, prefill, codec) owns one `Phases` and switches it at the
points where its work changes (one `perf_counter` call per switch), so every second of
the thread's life is counted in exactly one phase. Other threads read the sums without a
lock: the state is one tuple, replaced whole at each switch. `Engine.stats()` publishes them, /metrics
exports them as counters, and `latency_bench` turns two scrapes into the shares of a
load level (why a step at 64 connections takes longer in the service than alone).
"""

from __future__ import annotations

import time


class Phases:
    def __init__(self, *names: str) -> None:
        if not names or len(set(names)) != len(names):
            raise ValueError(f"phases need distinct names, got {names}")
        self.names = names
        self._index = {name: i for i, name in enumerate(names)}
        # (seconds per phase, the phase now, since when): replaced whole at each switch,
        # so a reader on another thread always sees one consistent state
        self._state: tuple[tuple[float, ...], int, float] = ((0.0,) * len(names), 0, time.perf_counter())

    def to(self, phase: str) -> None:
        """The thread enters `phase`: the time since the last switch goes to the one it leaves."""
        now = time.perf_counter()
        totals, current, since = self._state
        if current != (i := self._index[phase]):
            totals = totals[:current] + (totals[current] + now - since,) + totals[current + 1:]
            self._state = (totals, i, now)

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per phase so far, the phase the thread is in now counted up to now."""
        totals, current, since = self._state
        now = time.perf_counter()
        return {name: s + (now - since if i == current else 0.0) for i, (name, s) in enumerate(zip(self.names, totals))}

    def snapshot(self, prefix: str) -> dict[str, float]:
        """{f"{prefix}_{phase}_seconds": seconds} for stats()."""
        return {f"{prefix}_{name}_seconds": round(s, 6) for name, s in self.seconds.items()}
