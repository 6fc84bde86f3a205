"""What every kernel's `self_check` compares: a kernel's output against its reference's,
by relative error (the norm of the difference over the reference's norm), within the
tolerance of the dtype."""

from __future__ import annotations

import torch
from torch import Tensor


def mismatch(what: str, got: Tensor, want: Tensor, dtype: torch.dtype, bf16_tol: float = 1e-2) -> str | None:
    """None if got is within tolerance of want (1e-5 in fp32, bf16_tol otherwise), else
    why not, naming `what`."""
    err = ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)).item()
    if err < (1e-5 if dtype == torch.float32 else bf16_tol):
        return None
    return f"{what} differs from the reference by {err:.2e} (relative)"
