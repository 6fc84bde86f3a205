"""Linear layers and sampling heads under a kernel plan: a one-row input (a single
stream's decode step) through the GEMV (kernels/gemv.py) when the plan has it, cuBLAS
otherwise; FP8 layers (engine/quant.py) through their block-scaled GEMM at every batch.

The choice branches on shapes and the plan only, so a CUDA graph captured per batch
bucket replays the path it captured. The GEMV is 1.20x faster than cuBLAS at one row and
slower at two (latency_bench/RESULTS.md, "Single-stream GEMV"); FP8 layers stay on their
GEMM so that a stream alone sums its rows as it does batched (kernels/fp8_configs.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernel_plan import REFERENCE, KernelPlan
from kernels.gemv import gemv
from kernels.swiglu import swiglu as swiglu_kernel


def project(layer: nn.Module, x: Tensor, plan: KernelPlan = REFERENCE, codes=None, swiglu: bool = False) -> Tensor:
    """layer(x). `codes`: x already quantized by the norm that made it (FP8 layers only);
    `swiglu`: x is a fused gate/up output [..., 2K] and silu(gate) * up is multiplied."""
    if not isinstance(layer, nn.Linear):  # FP8Linear
        return layer(x, codes, plan, swiglu=swiglu)
    if plan.takes_gemv(x):
        y = gemv(_rows(x), layer.weight, bias=layer.bias, swiglu=swiglu, pdl=plan.pdl)
        return y.view(*x.shape[:-1], layer.weight.shape[0])
    if swiglu:
        x = swiglu_kernel(x, pdl=plan.pdl)
    return F.linear(x, layer.weight, layer.bias)


def _rows(x: Tensor) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# The sampling heads' logits stay in fp32: rounded to bf16, two candidates often tie and
# the draw takes the lower id whatever the model meant ("Head logits in fp32" in RESULTS.md).
LOGITS_DTYPE = torch.float32


def head_logits(x: Tensor, weight: Tensor, plan: KernelPlan = REFERENCE) -> Tensor:
    """x [..., K] @ weight.T [N, K], summed and returned in fp32 (the inputs stay in the
    model's dtype: an fp32 copy of the weights would double their reads)."""
    if plan.takes_gemv(x):
        return gemv(_rows(x), weight, out_dtype=LOGITS_DTYPE, pdl=plan.pdl).view(*x.shape[:-1], weight.shape[0])
    if x.dtype == LOGITS_DTYPE and weight.dtype == LOGITS_DTYPE:
        return F.linear(x, weight)
    if x.is_cuda:
        x2 = x.reshape(-1, x.shape[-1])
        return torch.mm(x2, weight.t(), out_dtype=LOGITS_DTYPE).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x.to(LOGITS_DTYPE), weight.to(LOGITS_DTYPE))
