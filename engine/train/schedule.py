"""Learning-rate schedule over wall-clock time: linear warmup (steps), then cosine decay
over the planned training minutes of all calls together (the GPU session works in calls of
10 minutes whose step rate is not known in advance, so the schedule is set in minutes and
ends exactly when the budget does). The minutes already trained travel in the checkpoint."""

from __future__ import annotations

import math
import sys
import time


def lr_at(step: int, progress: float, lr: float, warmup: int, min_ratio: float,
          rewarm_from: int | None = None) -> float:
    """progress: trained minutes / planned minutes (0..1). A resume without optimizer
    moments re-warms over warmup / 3 steps from `rewarm_from`."""
    scale = min(1.0, (step + 1) / warmup)
    if rewarm_from is not None:
        scale = min(scale, (step - rewarm_from + 1) / max(1, warmup // 3))
    progress = min(1.0, max(0.0, progress))
    return lr * scale * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class Clock:
    """Minutes trained so far (this call + earlier ones) against the planned total."""

    def __init__(self, total_minutes: float, trained_minutes: float = 0.0) -> None:
        self.total, self.before, self.start = total_minutes, trained_minutes, time.perf_counter()

    @property
    def minutes(self) -> float:
        return self.before + (time.perf_counter() - self.start) / 60

    @property
    def progress(self) -> float:
        return self.minutes / max(self.total, 1e-9)

    def spent(self) -> str | None:
        """Why a resumed run would train at the schedule's floor the whole call (its planned
        minutes already trained), else None. Measured: two codec arms resumed with a total
        below their state's minutes ran a 7-minute call at 1/10 of their lr without a word."""
        if self.before < self.total:
            return None
        return (f"the schedule's {self.total:.1f} planned minutes are already trained ({self.before:.1f}): this run "
                f"stays at the floor learning rate; a --total-minutes above {self.before:.1f} gives it a cycle")

    def warn_if_spent(self) -> None:
        """Say `spent()` on stderr, when there is something to say (the trainers call it
        once, at the start of a run)."""
        if (why := self.spent()) is not None:
            print(f"warning: {why}", file=sys.stderr, flush=True)
