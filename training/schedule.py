"""Learning-rate schedule over wall-clock time: linear warmup (steps), then cosine decay
over the planned training minutes of all calls together (the GPU session works in calls of
10 minutes whose step rate is not known in advance, so the schedule is set in minutes and
ends exactly when the budget does). The minutes already trained travel in the checkpoint.

Or over steps (`--total-steps N`, a plan of N steps from the step it starts at, saved in
the checkpoint too): where the step rate is not steady, minutes end the cosine after
another number of steps than the same plan ran elsewhere. Measured: the 2026-12-05 codec
fine-tune ran at 0.85 steps/s alone on the CPU machine and at 0.08 beside other work, so
its 60-minute cosine would have been 2,900 steps or ~290."""

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


def plan_steps(saved: dict, total_steps: int | None, step: int) -> tuple[int, int] | None:
    """The (first step, steps) plan a run's schedule counts in, or None (minutes). A
    `total_steps` given starts a plan at `step`, unless the checkpoint's plan has that many
    steps already (a resumed call continues it, from its first step); none given, a saved
    plan continues."""
    saved_plan = saved.get("plan_steps")
    if total_steps is not None and total_steps < 1:
        raise ValueError(f"a schedule of {total_steps} steps")
    if total_steps is None or (saved_plan and saved_plan[1] == total_steps):
        return tuple(saved_plan) if saved_plan else None
    return (step, total_steps)


class Clock:
    """Minutes trained so far (this call + earlier ones) against the planned total, or the
    steps of a step plan (see the module docstring)."""

    def __init__(self, total_minutes: float, trained_minutes: float = 0.0,
                 steps: tuple[int, int] | None = None) -> None:
        self.total, self.before, self.start = total_minutes, trained_minutes, time.perf_counter()
        self.steps = steps  # (first step, steps) of a step plan; None: minutes

    def progress_at(self, step: int) -> float:
        """The schedule's progress at optimizer step `step` (0..1 over the plan)."""
        if self.steps is not None:
            first, steps = self.steps
            return (step - first) / steps
        return self.progress

    def state(self) -> dict:
        """What a checkpoint keeps for the next call's Clock."""
        return {"trained_minutes": self.minutes, "total_minutes": self.total,
                "plan_steps": list(self.steps) if self.steps else None}

    @property
    def minutes(self) -> float:
        return self.before + (time.perf_counter() - self.start) / 60

    @property
    def progress(self) -> float:
        return self.minutes / max(self.total, 1e-9)

    def spent(self, step: int = 0) -> str | None:
        """Why a resumed run would train at the schedule's floor the whole call (its planned
        minutes, or steps, already trained), else None. Measured: two codec arms resumed with
        a total below their state's minutes ran a 7-minute call at 1/10 of their lr without a word."""
        if self.steps is not None:
            first, steps = self.steps
            if step < first + steps:
                return None
            return (f"the schedule's {steps} planned steps from step {first} are done (step {step}): this run stays "
                    f"at the floor learning rate; another --total-steps starts a new plan here")
        if self.before < self.total:
            return None
        return (f"the schedule's {self.total:.1f} planned minutes are already trained ({self.before:.1f}): this run "
                f"stays at the floor learning rate; a --total-minutes above {self.before:.1f} gives it a cycle")

    def warn_if_spent(self, step: int = 0) -> None:
        """Say `spent()` on stderr, when there is something to say (the trainers call it
        once, at the start of a run)."""
        if (why := self.spent(step)) is not None:
            print(f"warning: {why}", file=sys.stderr, flush=True)
