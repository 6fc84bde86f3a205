"""The residual add and the RMSNorm after it, in one launch.

    x        [..., D]   the residual stream
    delta    [..., D]   what a sublayer adds to it (attention or MLP output), or None
    weight   [D]        the norm's scale
    -> (s, n)           s = x + delta (the new residual stream), n = rms_norm(s) * weight

Every transformer block adds twice and norms twice, and each add feeds the next norm; in
a decode step at the s2-pro shape that is 153 adds and 162 norms (76 block passes), each
its own launch of a few microseconds on a [batch, 2560] tensor (latency_bench
profile_step: 0.65 ms of norms + 0.21 ms of adds at batch 1 on an H200). Here they are
one launch per pair: one program per row reads x and delta once, writes the sum, and
norms it from registers.

Roundings are PyTorch's: the sum is rounded to the model dtype (as a bf16 add is), then
normed in fp32 with the weight rounded to the model dtype, and rounded once.
`add_rms_norm_reference` is the same function in plain PyTorch.

`quantize=True` also writes n as FP8 e4m3 codes with one power-of-two scale per 1 x 128
group (kernels/fp8_quant.py's layout and arithmetic, from n's rounded values: the codes
and scales are bit for bit quantize_act(n)'s), for an FP8 linear layer that reads n next
(engine/quant.py): its GEMM then takes codes, with no quantize launch before it and no
quantization in its K loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.fp8_quant import quantize_act_reference
from kernels.fp8_scale import FP8
from kernels.pdl import launch_args, pdl_wait
from kernels.selfcheck import mismatch


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, s_ptr, n_ptr,
    stride_x, stride_d, stride_s, stride_n,
    dim, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False, q_ptr=None, qs_ptr=None, QUANT: tl.constexpr = False, SOFT_ROUND: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_DELTA:
        d = tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(dtype)  # the add's own rounding
        tl.store(s_ptr + row * stride_s + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / dim + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(dtype).to(tl.float32)
    n = (xf * rstd * w).to(dtype)
    tl.store(n_ptr + row * stride_n + offs, n, mask=mask)
    if QUANT:  # n's 1 x 128 groups as e4m3 codes + scales (zeros past dim: no effect on an amax)
        groups = tl.reshape(n.to(tl.float32), (BLOCK // 128, 128))
        scale, inv = scale_and_inverse(tl.max(tl.abs(groups), axis=1))
        codes = tl.reshape(to_e4m3(groups * inv[:, None], SOFT_ROUND), (BLOCK,))
        kb = (dim + 127) // 128
        tl.store(q_ptr + row * dim + offs, codes, mask=mask)
        tl.store(qs_ptr + row * kb + tl.arange(0, BLOCK // 128), scale, mask=tl.arange(0, BLOCK // 128) < kb)


def _rows(t: Tensor, dim: int) -> Tensor:
    """[..., D] -> [M, D] with a unit inner stride (a view where possible)."""
    t = t.reshape(-1, dim)
    return t if t.stride(1) == 1 else t.contiguous()


def _check(x: Tensor, delta: Tensor | None, weight: Tensor) -> int:
    dim = x.shape[-1]
    if weight.shape != (dim,):
        raise ValueError(f"weight must be [{dim}], got {list(weight.shape)}")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype or delta.device != x.device):
        raise ValueError(f"delta must match x ({x.dtype} {list(x.shape)}), got {delta.dtype} {list(delta.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x must be a float tensor, got {x.dtype}")
    return dim


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float, quantize: bool = False, *,
                 pdl: bool = False):
    """See the module docstring. delta None: the norm alone (s is x itself). Returns (s, n),
    or with `quantize` (s, n, (codes [M, D] e4m3, scales [M, cdiv(D, 128)] fp32)) with M the
    rows of x's leading dimensions. `pdl`: kernels/pdl.py."""
    dim = _check(x, delta, weight)
    xr = _rows(x, dim)
    dr = _rows(delta, dim) if delta is not None else xr
    s = torch.empty_like(xr) if delta is not None else xr
    n = torch.empty_like(xr)
    block = triton.next_power_of_2(dim)
    quant = {}
    if quantize:
        block = max(block, 128)  # whole groups
        codes = torch.empty(xr.shape[0], dim, device=x.device, dtype=FP8)
        scales = torch.empty(xr.shape[0], triton.cdiv(dim, 128), device=x.device, dtype=torch.float32)
        quant = dict(q_ptr=codes, qs_ptr=scales, QUANT=True, SOFT_ROUND=interpreting())
    if xr.shape[0]:
        _add_rms_norm_kernel[(xr.shape[0],)](
            xr, dr, weight, s, n,
            xr.stride(0), dr.stride(0), s.stride(0), n.stride(0),
            dim, eps,
            HAS_DELTA=delta is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)), **quant,
            **launch_args(pdl),
        )
    if quantize:
        return s.view(x.shape), n.view(x.shape), (codes, scales)
    return s.view(x.shape), n.view(x.shape)


def add_rms_norm_reference(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The same function in plain PyTorch."""
    _check(x, delta, weight)
    s = x + delta if delta is not None else x
    n = torch.nn.functional.rms_norm(s.float(), (s.shape[-1],), weight.to(s.dtype).float(), eps).to(s.dtype)
    return s, n


def self_check(device: torch.device | str, dtype: torch.dtype, dim: int, eps: float, *, pdl: bool = False) -> str | None:
    """Compile and run once at the model's width against the reference: None if they
    agree, else why not (the caller keeps the PyTorch path)."""
    try:
        g = torch.Generator().manual_seed(0)
        x, d = (torch.randn(3, dim, generator=g).to(device, dtype) for _ in range(2))
        w = (torch.rand(dim, generator=g) + 0.5).to(device, dtype)
        for delta in (d, None):
            got, want = add_rms_norm(x, delta, w, eps, pdl=pdl), add_rms_norm_reference(x, delta, w, eps)
            for name, a, r in zip(("sum", "norm"), got, want):
                if why := mismatch(f"add_rms_norm's {name}", a, r, dtype):
                    return why
        # the FP8 layers' variant: its codes and scales must be quantize_act's of its norm
        _, n, (codes, scales) = add_rms_norm(x, d, w, eps, quantize=True, pdl=pdl)
        want_codes, want_scales = quantize_act_reference(n)
        if not (torch.equal(scales, want_scales) and torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))):
            return "add_rms_norm's FP8 codes differ from quantize_act's of its norm"
        return None
    except Exception as e:  # a compile failure included
        return f"add_rms_norm: {type(e).__name__}: {e}"
