"""A training run's best parameters by a measure taken every log window (the codec's mel
L1 averaged over the window's steps): kept on the host, restored when the run diverges,
and the ones a run ends on when its last window is worse.

Why: a codec run on the H200 (istft decoder, 2026-12-01) reached a window mel of 0.31 at
step ~3,400, then its gradient norm climbed from ~10 to ~120 over 600 steps while the
learning rate decayed, and it ended at step 4,156 with 0.44-0.48: the exported codec was
the diverged one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class BestKeeper:
    # a window measure above best * rollback_ratio restores the best parameters (0: never)
    rollback_ratio: float = 1.3
    # the run ends on the best parameters unless its last window is within this of the best
    end_ratio: float = 1.05
    best: float | None = None
    best_step: int = -1
    rollbacks: int = 0
    _params: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def observe(self, step: int, value: float, module: nn.Module) -> str | None:
        """'best' (a copy of the module's parameters and buffers was kept), 'rollback'
        (they were put back into the module) or None."""
        if self.best is None or value < self.best:
            self.best, self.best_step = value, step
            self._params = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
            return "best"
        if self.rollback_ratio > 0 and value > self.best * self.rollback_ratio:
            self.restore(module)
            self.rollbacks += 1
            return "rollback"
        return None

    def finish(self, value: float | None, module: nn.Module) -> bool:
        """At the end of a run whose last window measured `value`: True when the module
        was set back to the best parameters."""
        if self._params is None or value is None or value <= self.best * self.end_ratio:
            return False
        self.restore(module)
        return True

    def restore(self, module: nn.Module) -> None:
        module.load_state_dict(self._params)
