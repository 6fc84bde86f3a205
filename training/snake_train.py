"""The codec's Snake activation for training: forward and backward as one pass each.

    y = x + sin^2(a x) / (a + 1e-9)          x [B, C, T], a [C] (Snake1d.alpha)
    dy/dx = 1 + sin(2 a x) * a / (a + 1e-9)
    dy/da = x sin(2 a x) / (a + 1e-9) - sin^2(a x) / (a + 1e-9)^2

In PyTorch's autograd the forward is five passes over the activation (a x, sin, square,
times 1 / a, plus x) and the backward about ten more, each reading and writing a whole
[B, C, T] tensor; the codec trainer runs Snake twice per residual unit on its largest
tensors (up to 24-48 channels x 44,100 samples a row at batch 32). Measured on the CPU
(2026-12-01, `codec_train --profile-steps`), Snake's passes were ~30% of a training step.
Here the forward reads x once and writes y; the backward reads x and the incoming
gradient once and writes the gradient of x, and sums the gradient of a per channel with
one fp32 atomic add per program. The math is in fp32 and rounded once.

`snake_train(x, alpha)` is differentiable in both. Its reference is the inference
kernel's, `kernels.snake.snake_reference`: plain PyTorch ops, so autograd takes its
derivative, which the tests compare with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.snake import _check, snake

BLOCK = 1024  # samples of one row per program (training rows are long: whole clips)


@triton.jit
def _snake_backward_kernel(x_ptr, a_ptr, g_ptr, dx_ptr, da_ptr, channels, length, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # b * C + c, all three tensors contiguous [B, C, T]
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < length
    c = row % channels
    x = tl.load(x_ptr + row * length + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * length + offs, mask=mask, other=0.0).to(tl.float32)
    alpha = tl.load(a_ptr + c).to(tl.float32)
    inv = 1.0 / (alpha + 1e-9)
    s = tl.sin(alpha * x)
    s2 = tl.sin(2.0 * alpha * x)
    dx = g * (1.0 + s2 * alpha * inv)
    tl.store(dx_ptr + row * length + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    da = tl.where(mask, g * (x * s2 * inv - s * s * inv * inv), 0.0)
    tl.atomic_add(da_ptr + c, tl.sum(da, axis=0))


class _SnakeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor) -> Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x, alpha)
        return snake(x, alpha)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, alpha = ctx.saved_tensors
        grad = grad.contiguous()
        b, c, t = x.shape
        dx = torch.empty_like(x)
        da = torch.zeros(c, device=x.device, dtype=torch.float32)
        if x.numel():
            _snake_backward_kernel[(b * c, triton.cdiv(t, BLOCK))](
                x, alpha, grad, dx, da, c, t, BLOCK=BLOCK, num_warps=4,
            )
        return dx, da.to(alpha.dtype)


def snake_train(x: Tensor, alpha: Tensor) -> Tensor:
    """Snake with its gradient in one pass each; x [B, C, T], alpha [C] -> [B, C, T]."""
    _check(x, alpha)
    return _SnakeFunction.apply(x, alpha)
