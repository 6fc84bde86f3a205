"""The fused SwiGLU activation kernel against its PyTorch reference (Triton interpreter
on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.swiglu import swiglu, swiglu_reference, self_check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2 if DEVICE == "cpu" else 4e-3}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 2 * 64), (3, 1, 2 * 1500), (2, 5, 2 * 7)])  # past one block, odd widths
def test_matches_reference(shape, dtype):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(shape[-1])) * 4).to(DEVICE, dtype)
    out, want = swiglu(x), swiglu_reference(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert rel(out, want) < TOL[dtype]


def test_gate_and_up_halves_are_not_swapped():
    hidden = 8
    x = torch.zeros(1, 2 * hidden, device=DEVICE)
    x[0, :hidden] = 10.0  # gate: silu(10) ~ 10
    x[0, hidden:] = torch.arange(hidden, dtype=torch.float32)  # up
    assert torch.allclose(swiglu(x)[0], 10 * torch.sigmoid(torch.tensor(10.0, device=DEVICE)) * x[0, hidden:], rtol=1e-5)


def test_odd_width_is_refused():
    with pytest.raises(ValueError, match="2H"):
        swiglu(torch.randn(2, 7, device=DEVICE))


def test_self_check_passes_at_a_model_width():
    assert self_check(DEVICE, torch.bfloat16, 768) is None
