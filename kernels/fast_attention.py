"""The fast transformer's attention: one new position per row over its frame's few keys.

    q        [B, H, D]        the new position's queries (after RoPE)
    k_cache  [rows, C, K, D]  the per-frame fast KV (engine/kv_cache.py FastCache, one layer)
    v_cache  [rows, C, K, D]
    step     int              row b attends to positions 0..step of row b
    -> out   [B, H, D]

A frame has at most C positions (one per codebook, 10 for S2-Pro), so a KV head's keys
fit in registers: one program per (row, KV head) loads them once for the query heads
that share them, takes a softmax in fp32 and the weighted sum, with no tensor cores and
no split; the warps a program follow the grid (`warps_for`). It replaces PyTorch's
scaled_dot_product_attention, whose flash attention tiles 128 positions for a handful of
keys (40 calls a decode step at the s2-pro shape; latency_bench/profile_step.py).

`fast_attention_reference` is the same function in plain PyTorch (fp32 math).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.pdl import launch_args, pdl_wait
from kernels.selfcheck import mismatch


@triton.jit
def _fast_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    stride_qb, stride_qh, stride_kr, stride_kl, stride_kk, stride_vr, stride_vl, stride_vk,
    stride_ob, stride_oh,
    step, scale,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, POS: tl.constexpr, HEAD_DIM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_n = tl.arange(0, POS)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    real = offs_g < GROUP
    valid = offs_n <= step
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=real[:, None], other=0.0).to(tl.float32)  # [G, D]
    k = tl.load(k_ptr + b * stride_kr + offs_n[:, None] * stride_kl + kv_head * stride_kk + offs_d[None, :],
                mask=valid[:, None], other=0.0).to(tl.float32)  # [POS, D]
    scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, POS]
    scores = tl.where(valid[None, :], scores, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])  # position 0 is always valid: no empty row
    v = tl.load(v_ptr + b * stride_vr + offs_n[:, None] * stride_vl + kv_head * stride_vk + offs_d[None, :],
                mask=valid[:, None], other=0.0).to(tl.float32)
    out = tl.sum(p[:, :, None] * v[None, :, :], axis=1) / tl.sum(p, axis=1)[:, None]  # [G, D]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=real[:, None])


def _check(q: Tensor, k_cache: Tensor, v_cache: Tensor, step: int) -> None:
    b, h, d = q.shape
    rows, length, kv_heads, dk = k_cache.shape
    if v_cache.shape != k_cache.shape or dk != d or b > rows:
        raise ValueError(f"k/v caches {list(k_cache.shape)} / {list(v_cache.shape)} do not fit q {list(q.shape)}")
    if h % kv_heads:
        raise ValueError(f"{h} query heads are not a multiple of {kv_heads} KV heads")
    if d & (d - 1):
        raise ValueError(f"head dim {d} must be a power of two")
    if not isinstance(step, int) or not 0 <= step < length:
        raise ValueError(f"step must be an int in [0, {length}), got {step!r}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the head dim must be contiguous in q and in the caches")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q ({q.dtype}) and the caches ({k_cache.dtype}, {v_cache.dtype}) must share a dtype")


def warps_for(programs: int) -> int:
    """Warps a program for a grid of `programs` (rows x KV heads). Measured on an H100
    (latency_bench.fast_attention_bench, S2-Pro fast heads, 2026-12-06), us a call at 4 / 2 / 1 warps:
    batch 1 3.4 / 3.6 / 3.9, 16 3.6 / 3.9 / 4.5, 32 4.7 / 4.0 / 4.4, 54 7.4 / 5.2 / 4.5,
    64 7.4 / 5.3 / 4.5. Once the grid fills the SMs a few times over, a program's few
    KiB are load latency that more programs a SM hide better than more warps a program."""
    if programs < 256:
        return 4
    return 2 if programs < 400 else 1


def fast_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, step: int, num_warps: int | None = None, *,
                   pdl: bool = False) -> Tensor:
    """See the module docstring. `num_warps`: a launch choice for
    latency_bench.fast_attention_bench (None: `warps_for` the grid). `pdl`: kernels/pdl.py."""
    _check(q, k_cache, v_cache, step)
    b, h, d = q.shape
    out = torch.empty_like(q)
    if b:
        group = h // k_cache.shape[2]
        num_warps = num_warps or warps_for(b * k_cache.shape[2])
        _fast_attention_kernel[(b, k_cache.shape[2])](
            q, k_cache, v_cache, out,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
            step, d ** -0.5,
            GROUP=group, GROUP_PAD=triton.next_power_of_2(group), POS=max(2, triton.next_power_of_2(k_cache.shape[1])),
            HEAD_DIM=d, num_warps=num_warps, **launch_args(pdl),
        )
    return out


def fast_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, step: int) -> Tensor:
    """The same function in plain PyTorch (fp32 math)."""
    _check(q, k_cache, v_cache, step)
    b, h, d = q.shape
    group = h // k_cache.shape[2]
    k = k_cache[:b, : step + 1].float().repeat_interleave(group, dim=2)  # [B, n, H, D]
    v = v_cache[:b, : step + 1].float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bnhd->bhn", q.float(), k) * d ** -0.5
    return torch.einsum("bhn,bnhd->bhd", scores.softmax(-1), v).to(q.dtype)


def self_check(device: torch.device | str, dtype: torch.dtype, n_head: int, kv_heads: int, head_dim: int,
               positions: int, *, pdl: bool = False) -> str | None:
    """Compile and run once at the fast transformer's shapes against the reference, at
    the first and the last step: None if they agree, else why not (the caller keeps the
    PyTorch path)."""
    try:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(3, n_head, head_dim, generator=g).to(device, dtype)
        k, v = (torch.randn(4, positions, kv_heads, head_dim, generator=g).to(device, dtype) for _ in range(2))
        for step in (0, positions - 1):
            got, want = fast_attention(q, k, v, step, pdl=pdl), fast_attention_reference(q, k, v, step)
            if why := mismatch(f"fast_attention at step {step}", got, want, dtype):
                return why
        return None
    except Exception as e:  # a compile failure included
        return f"fast_attention: {type(e).__name__}: {e}"
