"""The codec's residual add with a conv bias (kernels/residual.py) against its PyTorch
reference (Triton interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.residual import add_residual, residual_reference, self_check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 3, 5), (64, 12, 4), (2, 16, 1500)])
def test_matches_reference(shape, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    x, y = (torch.randn(*shape, generator=g).to(DEVICE, dtype) for _ in range(2))
    bias = torch.randn(shape[1], generator=g).to(DEVICE, dtype)
    out = add_residual(x, y, bias)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert rel(out, residual_reference(x, y, bias)) < (1e-6 if dtype == torch.float32 else 8e-3)
    assert rel(out, x + y + bias[:, None]) < (1e-6 if dtype == torch.float32 else 8e-3)


def test_time_major_in_time_major_out():
    from kernels.layout import as_layout, time_major

    x, y = (as_layout(torch.randn(3, 40, 70, device=DEVICE), "time-major") for _ in range(2))
    bias = torch.randn(40, device=DEVICE)
    out = add_residual(x, y, bias)
    assert time_major(out) and rel(out, x + y + bias[:, None]) < 1e-6
    mixed = add_residual(x, y.contiguous(), bias)  # mixed layouts: x's wins
    assert time_major(mixed) and rel(mixed, out) < 1e-6


def test_strided_inputs():
    big = torch.randn(2, 4, 300, device=DEVICE)
    x, y = big[:, :, :120], big[:, :, 150:270]
    bias = torch.randn(4, device=DEVICE)
    assert rel(add_residual(x, y, bias), x + y + bias[:, None]) < 1e-6


def test_bad_inputs_are_refused():
    x = torch.randn(2, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="bias"):
        add_residual(x, x, torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match="alike"):
        add_residual(x, x[:, :, :4], torch.ones(4, device=DEVICE))


def test_self_check_passes():
    assert self_check(DEVICE, torch.bfloat16) is None
