"""The codec's Snake activation, x + sin^2(alpha x) / alpha per channel, in one pass.

    x      [B, C, T]   any strides
    alpha  [C]         per-channel frequency (Snake1d.alpha, flattened)
    bias   [C] or None the bias of the conv that made x, added first: snake(x + bias)
    -> out [B, C, T]   in x's layout (kernels/layout.py), contiguous or time-major

(A conv's bias is a pass of its own after cuDNN's conv, a slow broadcast add: measured on
an H200, s2-pro codec, batch 64 x 1 frame, 39 of them took 0.6 of a call's 5.1 ms. The
streaming decoder runs its convs without bias and adds it in the pass that follows.)

In PyTorch it is five full passes over the activation (alpha x, sin, square, times
1 / alpha, plus x), each reading and writing the whole [B, C, T] tensor; the codec's
decoder runs it twice per residual unit at every upsampling stage, on its largest
tensors (96 to 1536 channels at up to 44.1 kHz). Here one read and one write, the math
in fp32 and rounded once (PyTorch in bf16 rounds after every op, so the two differ by
a few bf16 ulps). The 1e-9 keeps alpha = 0 finite, as upstream.
`snake_reference` is the same function in plain PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.layout import as_layout, empty_as, tile
from kernels.selfcheck import mismatch

@triton.jit
def _snake_kernel(x_ptr, a_ptr, bias_ptr, out_ptr, sx_b, sx_c, sx_t, so_b, so_c, so_t, rows, channels, length,
                  ROWS: tl.constexpr, BLOCK: tl.constexpr, BIAS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # rows b * C + c
    t = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    real = r < rows
    mask = real[:, None] & (t < length)
    b = r // channels
    c = r % channels
    x = tl.load(x_ptr + (b * sx_b + c * sx_c)[:, None] + t * sx_t, mask=mask, other=0.0)
    alpha = tl.load(a_ptr + c, mask=real, other=1.0).to(tl.float32)[:, None]
    xf = x.to(tl.float32)
    if BIAS:
        xf += tl.load(bias_ptr + c, mask=real, other=0.0).to(tl.float32)[:, None]
    s = tl.sin(alpha * xf)
    tl.store(out_ptr + (b * so_b + c * so_c)[:, None] + t * so_t, (xf + s * s / (alpha + 1e-9)).to(x.dtype),
             mask=mask)


def _check(x: Tensor, alpha: Tensor, bias: Tensor | None = None) -> None:
    if x.ndim != 3 or alpha.shape != (x.shape[1],) or (bias is not None and bias.shape != alpha.shape):
        raise ValueError(f"x must be [B, C, T] and alpha (and bias) [C], got {list(x.shape)} and {list(alpha.shape)}"
                         + ("" if bias is None else f" ({list(bias.shape)})"))
    if not x.dtype.is_floating_point or x.device != alpha.device or (bias is not None and bias.device != x.device):
        raise ValueError(f"x must be a float tensor on alpha's (and bias') device, got {x.dtype} on {x.device}")


def snake(x: Tensor, alpha: Tensor, bias: Tensor | None = None) -> Tensor:
    """See the module docstring."""
    _check(x, alpha, bias)
    b, c, t = x.shape
    out = empty_as(x, (b, c, t))
    if out.numel():
        rows, block = tile(x, t)
        _snake_kernel[(triton.cdiv(b * c, rows), triton.cdiv(t, block))](
            x, alpha, bias if bias is not None else alpha, out, *x.stride(), *out.stride(), b * c, c, t,
            ROWS=rows, BLOCK=block, BIAS=bias is not None, num_warps=4,
        )
    return out


def snake_reference(x: Tensor, alpha: Tensor, bias: Tensor | None = None) -> Tensor:
    """The same function in plain PyTorch (fp32 math, rounded once)."""
    _check(x, alpha, bias)
    a = alpha.float()[None, :, None]
    xf = x.float() if bias is None else x.float() + bias.float()[None, :, None]
    return (xf + torch.sin(a * xf).pow(2) / (a + 1e-9)).to(x.dtype)


def self_check(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Compile and run against the reference, with and without a bias, in both layouts the
    decoder uses (kernels/layout.py): None if they agree, else why not (the caller keeps
    the PyTorch path)."""
    try:
        g = torch.Generator().manual_seed(0)
        alpha = (torch.rand(24, generator=g) * 2).to(device, dtype)
        bias = torch.randn(24, generator=g).to(device, dtype)
        for layout in ("channel-major", "time-major"):
            x = as_layout((torch.randn(2, 24, 1500, generator=g) * 3).to(device, dtype), layout)
            why = mismatch(f"snake ({layout})", snake(x, alpha), snake_reference(x, alpha), dtype) or mismatch(
                f"snake with a bias ({layout})", snake(x, alpha, bias), snake_reference(x, alpha, bias), dtype)
            if why:
                return why
        return None
    except Exception as e:  # a compile failure included
        return f"snake: {type(e).__name__}: {e}"
