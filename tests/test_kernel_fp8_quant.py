"""FP8 quantization kernels (activations, fused SwiGLU) against their PyTorch references,
and the load-time weight quantization (Triton interpreter on the CPU, compiled on a GPU).

Scales are powers of two, so kernel and reference round the same fp32 values: codes and
scales must match bit for bit (under the interpreter through the kernels' fp32 rounding,
on a GPU through the hardware cast: the `gpu` test)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.fp8_quant import (
    E4M3_MAX, FP8, GROUP, dequantize_act, dequantize_weight, pow2_scale, quantize_act,
    quantize_act_reference, quantize_weight, swiglu_quant, swiglu_quant_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 100), (3, 300), (17, 1000), (64, 128), (2, 7)]  # K < 128, K % 128 != 0, one full group


def activations(m, k, dtype, seed=0):
    """Rows whose magnitude spans 1e-3..1e3 along K, so groups get very different scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, k)
    return x.to(DEVICE, dtype)


def assert_same_codes(q, s, q_ref, s_ref):
    assert q.dtype == FP8 and q.shape == q_ref.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == s_ref.shape and s.is_contiguous()
    assert torch.equal(s, s_ref)
    assert torch.equal(q.float(), q_ref.float())  # as values: the interpreter writes -0 as +0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k", SHAPES)
def test_quantize_act_matches_reference(m, k, dtype):
    x = activations(m, k, dtype)
    assert_same_codes(*quantize_act(x), *quantize_act_reference(x))


@pytest.mark.parametrize("m, k", SHAPES)
def test_quantize_act_error_is_within_half_an_e4m3_step(m, k):
    x = activations(m, k, torch.float32)
    q, s = quantize_act(x)
    assert s.shape == (m, -(-k // GROUP))
    # normals keep 3 mantissa bits (error <= 2^-4 relative); subnormals step by 2^-9 * scale
    bound = x.abs() * 2.0 ** -4 + s.repeat_interleave(GROUP, 1)[:, :k] * 2.0 ** -10
    assert ((dequantize_act(q, s) - x).abs() <= bound).all()


def test_scales_are_powers_of_two_that_fill_the_top_binade():
    x = activations(5, 384, torch.float32, seed=1)
    q, s = quantize_act(x)
    mant = s.view(torch.int32) & 0x7FFFFF
    assert (mant == 0).all()
    group_max = q.float().abs().view(5, 3, GROUP).amax(-1)
    assert (group_max >= E4M3_MAX / 2).all() and (group_max <= E4M3_MAX).all()  # amax / scale in (224, 448]


def test_zero_group_and_the_pow2_boundary():
    x = torch.zeros(2, 256, device=DEVICE)
    x[1, 0] = 448.0  # e4m3's largest value: scale 1
    x[1, 128] = 448.0
    x[1, 129] = -448.5  # just past it: scale 2
    q, s = quantize_act(x)
    assert (q[0].float() == 0).all() and (s[0] > 0).all() and torch.isfinite(s).all()
    assert s[1].tolist() == [1.0, 2.0] and q[1, 0].float() == 448.0
    assert pow2_scale(torch.tensor([448.0, 448.5, 224.0, 0.0])).tolist() == [1.0, 2.0, 0.5, 2.0 ** -72]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m, h", [(1, 100), (3, 300), (17, 256), (64, 130)])
def test_swiglu_quant_matches_reference(m, h, dtype):
    g = torch.Generator().manual_seed(m + h)
    gu = (3 * torch.randn(m, 2 * h, generator=g)).to(DEVICE, dtype)  # a fused w1/w3 output
    gate, up = gu[:, :h], gu[:, h:]  # strided views, row stride 2H
    q, s = swiglu_quant(gate, up)
    q_ref, s_ref = swiglu_quant_reference(gate, up)
    # silu's exp may differ by an ulp from PyTorch's: a code may sit one e4m3 step apart
    # where the product lands on a rounding midpoint, and a scale a binade apart where a
    # group's amax lands on a power-of-two boundary (both ~never on random data)
    assert (s == s_ref).float().mean() > 0.99
    assert (q.float() == q_ref.float()).float().mean() > 0.995
    h_exact = F.silu(gate.float()) * up.float()
    err = (dequantize_act(q, s) - h_exact).norm() / h_exact.norm()
    assert err < 0.04, err


def test_activation_launchers_check_inputs():
    x = activations(4, 256, torch.bfloat16)
    with pytest.raises(ValueError, match="unit stride"):
        quantize_act(x.t().contiguous().t())
    with pytest.raises(ValueError, match="2-D"):
        quantize_act(x[None])
    with pytest.raises(TypeError, match="bf16, fp16 or fp32"):
        quantize_act(x.to(torch.float64))
    with pytest.raises(ValueError, match="differ"):
        swiglu_quant(x, x[:, :128])


@pytest.mark.parametrize("n, k", [(200, 300), (128, 256), (64, 100), (300, 1000)])
def test_quantize_weight_layout_and_error(n, k):
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g) * 0.02
    q, s = quantize_weight(w)
    nb, kb = -(-n // GROUP), -(-k // GROUP)
    assert q.dtype == FP8 and q.shape == (n, k) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (nb, kb) and s.stride() == (kb, 1)
    wd = dequantize_weight(q, s)
    assert ((wd - w).abs() <= w.abs() * 2.0 ** -4 + s.max() * 2.0 ** -10).all()
    assert (wd - w).norm() / w.norm() < 0.03


def test_weight_blocks_are_scaled_by_their_own_elements():
    """Partial edge blocks take their scale from their valid elements; each block is its own."""
    w = torch.full((200, 300), 1.0)
    w[128:, :] = 1000.0  # second row of blocks (72 valid rows)
    w[:128, 256:] = 0.001  # last column of blocks (44 valid columns)
    _, s = quantize_weight(w)
    assert s.tolist() == [
        [pow2_scale(torch.tensor(1.0)).item()] * 2 + [pow2_scale(torch.tensor(0.001)).item()],
        [pow2_scale(torch.tensor(1000.0)).item()] * 3,
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_hardware_cast_matches_reference_exactly(dtype):
    """On the GPU the kernels use the hardware's RNE saturating cast, not the fp32 rounding."""
    x = activations(64, 9728, dtype)
    assert_same_codes(*quantize_act(x), *quantize_act_reference(x))
    gu = activations(64, 2 * 9728, dtype)
    q, s = swiglu_quant(gu[:, :9728], gu[:, 9728:])
    q_ref, s_ref = swiglu_quant_reference(gu[:, :9728], gu[:, 9728:])
    assert (q.float() == q_ref.float()).float().mean() > 0.999


@pytest.mark.parametrize("m, k", [(1, 512), (5, 300), (17, 1024)])
def test_m_major_scales_are_the_same_values_in_cublas_layout(m, k):
    """cuBLAS's 1 x 128 block scaling reads activation scales M-major (strides (1, M));
    the quantize kernels write that layout directly, the same values as row-major."""
    x = torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    for quantize in (lambda mm: quantize_act(x[:, :k], m_major_scales=mm),
                     lambda mm: swiglu_quant(x[:, :k], x[:, k:], m_major_scales=mm)):
        q, s = quantize(False)
        q_mm, s_mm = quantize(True)
        assert torch.equal(q_mm.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s_mm, s)
        assert s.is_contiguous() and s_mm.shape == s.shape
        if m > 1:
            assert s_mm.stride() == (1, m)
