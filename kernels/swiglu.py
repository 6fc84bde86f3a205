"""The MLP's activation, silu(gate) * up, in one launch from the fused gate/up projection.

    gate_up  [..., 2H]   the gate (w1) columns, then the up (w3) columns (engine/layers.py
                         FeedForward's w13 output)
    -> out   [..., H]    silu(gate) * up

In PyTorch this is a split (two strided views), a SiLU and a product: two launches per
MLP, 152 in a decode step at the s2-pro shape (0.21 ms at batch 1 on an H200; at batch
64 the strided views fall back to the slow non-vectorized elementwise kernel), plus a
[batch, H] intermediate through memory. Here one program per (row, block of columns).

Roundings are PyTorch's: silu(gate) rounded to the model dtype, then the product rounded.
(The FP8 path fuses the same activation into its quantization instead:
kernels/fp8_quant.py.) `swiglu_reference` is the same function in plain PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.pdl import launch_args, pdl_wait
from kernels.selfcheck import mismatch

BLOCK = 1024


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, stride_x, stride_o, hidden, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + hidden + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)  # silu's own rounding
    tl.store(out_ptr + row * stride_o + offs, (act * up.to(tl.float32)).to(gate.dtype), mask=mask)


def _check(gate_up: Tensor) -> int:
    if gate_up.ndim < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up must be [..., 2H], got {list(gate_up.shape)}")
    if not gate_up.dtype.is_floating_point:
        raise ValueError(f"gate_up must be a float tensor, got {gate_up.dtype}")
    return gate_up.shape[-1] // 2


def swiglu(gate_up: Tensor, *, pdl: bool = False) -> Tensor:
    """See the module docstring. `pdl`: kernels/pdl.py."""
    hidden = _check(gate_up)
    x = gate_up.reshape(-1, 2 * hidden)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], hidden, device=x.device, dtype=x.dtype)
    if x.shape[0]:
        _swiglu_kernel[(x.shape[0], triton.cdiv(hidden, BLOCK))](
            x, out, x.stride(0), out.stride(0), hidden, BLOCK=BLOCK, num_warps=4, **launch_args(pdl),
        )
    return out.view(*gate_up.shape[:-1], hidden)


def swiglu_reference(gate_up: Tensor) -> Tensor:
    """The same function in plain PyTorch."""
    gate, up = gate_up.split(_check(gate_up), dim=-1)
    return torch.nn.functional.silu(gate) * up


def self_check(device: torch.device | str, dtype: torch.dtype, hidden: int, *, pdl: bool = False) -> str | None:
    """Compile and run once at the model's MLP width against the reference: None if they
    agree, else why not (the caller keeps the PyTorch path)."""
    try:
        x = (torch.randn(3, 2 * hidden, generator=torch.Generator().manual_seed(0)) * 3).to(device, dtype)
        got, want = swiglu(x, pdl=pdl), swiglu_reference(x)
        return mismatch("swiglu", got, want, dtype)
    except Exception as e:  # a compile failure included
        return f"swiglu: {type(e).__name__}: {e}"
