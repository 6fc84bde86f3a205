"""FP8 e4m3 codes in Triton: the power-of-two group scale and the rounding that every kernel
writing codes shares (fp8_quant, add_rms_norm, the FP8 GEMMs, gemv, qk_rope_kv,
kv_fp8_store). A leaf: it imports nothing of kernels. The rule and its reasons:
kernels/fp8_quant.py; the same rule in PyTorch: kernels/fp8_scale.py.

The Triton interpreter rounds float -> e4m3 casts wrongly for values that round up into the
next binade (~2-6% of random values on triton 3.6), so under it the kernels round in fp32 bit arithmetic first (`round_e4m3`,
SOFT_ROUND) and cast an exact e4m3 value; compiled, they use the hardware's RNE cast.
"""

from __future__ import annotations

import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (the kernels' SOFT_ROUND)."""
    return bool(triton.knobs.runtime.interpret)


@triton.jit
def scale_and_inverse(amax):
    """amax [..] fp32 >= 0 -> (scale, 1 / scale): the smallest power of two with
    amax / scale <= 448, exactly, by exponent arithmetic (no approximate log or divide).
    With amax = (1 + f) 2^E and 448 = 1.75 * 2^8: scale = 2^(E-8) if f <= 0.75, else 2^(E-7)."""
    bits = tl.maximum(amax, 5.421010862427522e-20).to(tl.int32, bitcast=True)  # AMAX_FLOOR = 2^-64
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    e = exp - 8 + (mant > 0x600000).to(tl.int32)  # biased exponent of the scale
    scale = (e << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
    return scale, inv


@triton.jit
def round_e4m3(y):
    """fp32 y with |y| <= 448 -> the nearest e4m3 value (ties to even), still in fp32."""
    bits = y.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1  # keep 3 of the 23 mantissa bits
    normal = ((bits + 0x7FFFF + lsb) & -1048576).to(tl.float32, bitcast=True)
    # below 2^-6 e4m3 is subnormal with a fixed step of 2^-9, the fp32 ulp at 2^14
    a = tl.abs(y)
    sub = (a + 16384.0) - 16384.0
    sub = tl.where(y < 0, -sub, sub)
    return tl.where(a < 0.015625, sub, normal)


@triton.jit
def to_e4m3(y, SOFT_ROUND: tl.constexpr):
    """fp32 y (already divided by its scale) -> e4m3 codes, saturating at +-448."""
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if SOFT_ROUND:
        y = round_e4m3(y)
    return y.to(tl.float8e4nv)
