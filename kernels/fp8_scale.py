"""The FP8 (e4m3) scale rule in plain PyTorch, importable without Triton: the references
of kernels/fp8_quant.py and the FP8 KV cache's packing (kernels/kv_fp8.py, imported by the
engine on any machine) share it. The rule and its reasons: kernels/fp8_quant.py."""

from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0
AMAX_FLOOR = 2.0 ** -64  # an all-zero group's amax (keeps every scale a normal fp32)
FP8 = torch.float8_e4m3fn


def pow2_scale(amax: Tensor) -> Tensor:
    """fp32 amax -> the smallest power of two with amax / scale <= 448, as fp32 (the rule
    of kernels/e4m3.py scale_and_inverse, by the same exponent arithmetic)."""
    bits = amax.float().clamp_min(AMAX_FLOOR).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    return (e << 23).view(torch.float32)
