"""Which exceptions are the GPU's own, as the engine's worker threads tell them apart."""

from __future__ import annotations

import torch


def device_lost(e: BaseException) -> bool:
    """An error of the GPU itself (torch.AcceleratorError: an illegal address, a failed
    launch, ...), not of one stream's input: CUDA's context is usually unusable after it
    (the error is sticky), so every later step would fail one by one. The worker thread
    that hit it stops instead, and the engine reports itself failed (Engine._failed) so a
    supervisor restarts the process. (Out of memory is torch.OutOfMemoryError: not this.)"""
    return isinstance(e, torch.AcceleratorError)
