"""The fused residual add + RMSNorm kernel against its PyTorch reference (Triton
interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference, self_check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: the interpreter truncates fp32 -> bf16 where the GPU rounds (kernels/FP8_NOTES.md)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2 if DEVICE == "cpu" else 4e-3}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (3, 1, 200), (2, 5, 48), (7, 1000)])  # odd widths are masked
def test_matches_reference(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x, d = (torch.randn(*shape, generator=g).to(DEVICE, dtype) for _ in range(2))
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(DEVICE, dtype)
    s, n = add_rms_norm(x, d, w, 1e-6)
    s_ref, n_ref = add_rms_norm_reference(x, d, w, 1e-6)
    assert s.shape == n.shape == x.shape and s.dtype == n.dtype == dtype
    # the sum is one rounding of an exact fp32 sum on either side
    assert rel(s, s_ref) < (1e-6 if dtype == torch.float32 else 4e-3)
    assert rel(n, n_ref) < TOL[dtype]
    # each row is normed on its own: rows scaled by 10 give the same norms (up to the
    # roundings of the scaled inputs and their sum in bf16)
    _, n10 = add_rms_norm(x * 10, d * 10, w, 1e-6)
    assert rel(n10, n) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_without_delta_is_the_norm_alone_and_returns_x():
    x = torch.randn(4, 96, device=DEVICE)
    w = torch.rand(96, device=DEVICE) + 0.5
    s, n = add_rms_norm(x, None, w, 1e-6)
    assert s.data_ptr() == x.data_ptr()
    want = torch.nn.functional.rms_norm(x, (96,), w, 1e-6)
    assert rel(n, want) < 1e-5


def test_strided_rows_are_read_through_their_stride():
    big = torch.randn(6, 2, 80, device=DEVICE)
    x, d = big[:, 0], big[:, 1]  # rows 160 apart
    w = torch.rand(80, device=DEVICE) + 0.5
    s, n = add_rms_norm(x, d, w, 1e-6)
    s_ref, n_ref = add_rms_norm_reference(x, d, w, 1e-6)
    assert rel(s, s_ref) < 1e-6 and rel(n, n_ref) < 1e-5


def test_bad_inputs_are_refused():
    x = torch.randn(2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm(x, None, torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm(x, torch.randn(2, 8, device=DEVICE), torch.ones(16, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm(x, x.double(), torch.ones(16, device=DEVICE), 1e-6)


def test_self_check_passes_at_a_model_width():
    assert self_check(DEVICE, torch.bfloat16, 256, 1e-6) is None


@pytest.mark.parametrize("dim", [64, 200, 384])  # under one group, ragged, whole groups
def test_quantize_writes_quantize_acts_codes_of_the_norm(dim):
    """quantize=True: n also as e4m3 codes + 1 x 128 scales, bit for bit quantize_act(n)
    (what an FP8 linear layer reading n would have made of it), and s and n unchanged."""
    from kernels.fp8_quant import quantize_act

    g = torch.Generator().manual_seed(3)
    x, d = (torch.randn(2, 3, dim, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    w = (torch.rand(dim, generator=g) + 0.5).to(DEVICE, torch.bfloat16)
    s, n, (codes, scales) = add_rms_norm(x, d, w, 1e-6, quantize=True)
    s0, n0 = add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(s, s0) and torch.equal(n, n0)
    want_codes, want_scales = quantize_act(n.reshape(-1, dim))
    assert codes.shape == (6, dim) and scales.shape == (6, -(-dim // 128))
    assert torch.equal(scales, want_scales)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
