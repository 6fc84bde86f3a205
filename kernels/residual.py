"""A residual connection with the bias of the conv before it, in one pass:

    x      [B, C, T]   the residual input (any strides)
    y      [B, C, T]   the conv's output without its bias (any strides)
    bias   [C]
    -> out [B, C, T]   x + y + bias, in fp32, rounded once; in x's layout (kernels/layout.py)

The codec decoder's residual units end in a k1 conv added to their input: in PyTorch that
is cuDNN's bias pass then the add, three reads and two writes of the activation; here two
reads and one write (kernels/snake.py says why conv biases move out of the conv).
`residual_reference` is the same function in plain PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.selfcheck import mismatch
from kernels.layout import as_layout, empty_as, tile


@triton.jit
def _residual_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, sx_b, sx_c, sx_t, sy_b, sy_c, sy_t, so_b, so_c, so_t,
                     rows, channels, length, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # rows b * C + c
    t = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    real = r < rows
    mask = real[:, None] & (t < length)
    b = r // channels
    c = r % channels
    x = tl.load(x_ptr + (b * sx_b + c * sx_c)[:, None] + t * sx_t, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + (b * sy_b + c * sy_c)[:, None] + t * sy_t, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + c, mask=real, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + (b * so_b + c * so_c)[:, None] + t * so_t, (x + y + bias).to(out_ptr.dtype.element_ty),
             mask=mask)


def _check(x: Tensor, y: Tensor, bias: Tensor) -> None:
    if x.ndim != 3 or y.shape != x.shape or bias.shape != (x.shape[1],):
        raise ValueError(f"x and y must be [B, C, T] alike and bias [C], got {list(x.shape)}, {list(y.shape)}, "
                         f"{list(bias.shape)}")
    if y.dtype != x.dtype or y.device != x.device or bias.device != x.device:
        raise ValueError("x, y and bias must be on one device, x and y of one dtype")


def add_residual(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    """See the module docstring."""
    _check(x, y, bias)
    b, c, t = x.shape
    out = empty_as(x, (b, c, t))
    if out.numel():
        rows, block = tile(x, t)
        _residual_kernel[(triton.cdiv(b * c, rows), triton.cdiv(t, block))](
            x, y, bias, out, *x.stride(), *y.stride(), *out.stride(), b * c, c, t,
            ROWS=rows, BLOCK=block, num_warps=4,
        )
    return out


def residual_reference(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    """The same function in plain PyTorch (fp32, rounded once)."""
    _check(x, y, bias)
    return (x.float() + y.float() + bias.float()[None, :, None]).to(x.dtype)


def self_check(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Compile and run against the reference in both layouts the decoder uses
    (kernels/layout.py): None if they agree, else why not."""
    try:
        g = torch.Generator().manual_seed(0)
        bias = torch.randn(24, generator=g).to(device, dtype)
        for layout in ("channel-major", "time-major"):
            x, y = (as_layout(torch.randn(2, 24, 1500, generator=g).to(device, dtype), layout) for _ in range(2))
            why = mismatch(f"add_residual ({layout})", add_residual(x, y, bias), residual_reference(x, y, bias), dtype)
            if why:
                return why
        return None
    except Exception as e:  # a compile failure included
        return f"residual: {type(e).__name__}: {e}"
