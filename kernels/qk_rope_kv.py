"""Decode-step attention inputs in one launch: QK-norm, RoPE and the KV-cache write.

    qkv      [B, (H + 2K) * Dh]   the fused projection of one new position per stream
    q_scale  [Dh], k_scale [Dh]   the QK-norm weights (ignored without QK-norm)
    cos_sin  [B, Dh/2, 2] fp32    each stream's RoPE row (cos, sin of each pair)
    k_cache, v_cache [rows, L, K, Dh]   written at (slots[b], positions[b])
    -> q     [B, H, Dh]           normed and rotated queries

Per head (one program per stream and head): QK-norm in the upstream order (normalize in
fp32, round to the model dtype, scale in the model dtype), then RoPE on interleaved pairs
in fp32, rounded once; keys go straight into the cache, values are copied there. Into a
packed FP8 cache (kernels/kv_fp8.py) each key and value head is written as e4m3 codes and
its power-of-two scale, the bytes `pack_kv` gives.

What it replaces, per slow layer of a decode step (engine/layers.py Attention.qkv +
engine/attention.py _decode): the strided-input copy, the norm, the scale's concat and
multiply, RoPE's cast / complex multiply / cast back, and the two cache writes: 9
launches, 1 here (-288 a step at the s2-pro shape's 36 layers; latency_bench/launch_count);
in the fast transformer (no QK-norm, its per-frame cache): 5 launches, 1 here.

`qk_rope_kv_reference` is the same function in plain PyTorch (kernels import nothing of
engine); tests/test_kernel_qk_rope_kv.py also checks the model's decode step with the
kernel against the model's own PyTorch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.kv_fp8 import TAIL_BYTES, head_dim_of, kernel_args, store_form, unpack_kv
from kernels.pdl import launch_args, pdl_wait


@triton.jit
def _qk_rope_kv_kernel(
    qkv_ptr, qs_ptr, ks_ptr, rope_ptr, slot_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
    stride_xb, stride_rb, stride_qb, stride_qh,
    stride_kr, stride_kl, stride_kk, stride_vr, stride_vl, stride_vk,
    eps, step,
    H: tl.constexpr, KV: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr, PER_ROW: tl.constexpr,
    KV_FP8: tl.constexpr, SOFT_ROUND: tl.constexpr, POS_PER_ROW: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    # KV_FP8: k_ptr / v_ptr are the e4m3 views of packed caches (kernels/kv_fp8.py) and
    # k_scale_ptr / v_scale_ptr their fp32 views: each key and value head is stored as
    # codes plus one power-of-two scale (fp8_quant's rule), at byte 2 * HALF of its slab
    b = tl.program_id(0)
    head = tl.program_id(1)  # 0..H-1 queries, H..H+KV-1 keys, then KV values
    i = tl.arange(0, HALF)
    src = qkv_ptr + b * stride_xb + head * (2 * HALF)
    if PER_ROW:  # decode: each stream's KV row and position (or one position for all)
        slot = tl.load(slot_ptr + b)
        if POS_PER_ROW:
            pos = tl.load(pos_ptr + b)
        else:
            pos = step
    else:  # the fast transformer: row b, position `step` for all
        slot = b
        pos = step
    even = tl.load(src + 2 * i)
    odd = tl.load(src + 2 * i + 1)
    if head >= H + KV:  # a value head: copied as it is (an FP8 cache: quantized)
        at = slot * stride_vr + pos * stride_vl + (head - H - KV) * stride_vk
        if KV_FP8:
            _store_fp8(v_ptr + at, v_scale_ptr + (at + 2 * HALF) // 4, even.to(tl.float32), odd.to(tl.float32), i,
                       SOFT_ROUND)
        else:
            tl.store(v_ptr + at + 2 * i, even)
            tl.store(v_ptr + at + 2 * i + 1, odd)
    else:
        dtype = even.dtype
        xe = even.to(tl.float32)
        xo = odd.to(tl.float32)
        if QK_NORM:
            rstd = 1.0 / tl.sqrt((tl.sum(xe * xe, axis=0) + tl.sum(xo * xo, axis=0)) / (2 * HALF) + eps)
            if head < H:
                we = tl.load(qs_ptr + 2 * i)
                wo = tl.load(qs_ptr + 2 * i + 1)
            else:
                we = tl.load(ks_ptr + 2 * i)
                wo = tl.load(ks_ptr + 2 * i + 1)
            # normalize in fp32, round to the model dtype, scale in it (rounded again)
            xe = ((xe * rstd).to(dtype).to(tl.float32) * we.to(tl.float32)).to(dtype).to(tl.float32)
            xo = ((xo * rstd).to(dtype).to(tl.float32) * wo.to(tl.float32)).to(dtype).to(tl.float32)
        cos = tl.load(rope_ptr + b * stride_rb + 2 * i)
        sin = tl.load(rope_ptr + b * stride_rb + 2 * i + 1)
        ye = (xe * cos - xo * sin).to(dtype)
        yo = (xe * sin + xo * cos).to(dtype)
        if head < H:
            dst = q_ptr + b * stride_qb + head * stride_qh
            tl.store(dst + 2 * i, ye)
            tl.store(dst + 2 * i + 1, yo)
        else:
            at = slot * stride_kr + pos * stride_kl + (head - H) * stride_kk
            if KV_FP8:  # the key as the model dtype rounded it, then quantized
                _store_fp8(k_ptr + at, k_scale_ptr + (at + 2 * HALF) // 4, ye.to(tl.float32), yo.to(tl.float32), i,
                           SOFT_ROUND)
            else:
                tl.store(k_ptr + at + 2 * i, ye)
                tl.store(k_ptr + at + 2 * i + 1, yo)


@triton.jit
def _store_fp8(codes_ptr, scale_ptr, xe, xo, i, SOFT_ROUND: tl.constexpr):
    """One head's even and odd halves (fp32) as e4m3 codes and their power-of-two scale."""
    scale, inv = scale_and_inverse(tl.maximum(tl.max(tl.abs(xe), axis=0), tl.max(tl.abs(xo), axis=0)))
    tl.store(codes_ptr + 2 * i, to_e4m3(xe * inv, SOFT_ROUND))
    tl.store(codes_ptr + 2 * i + 1, to_e4m3(xo * inv, SOFT_ROUND))
    tl.store(scale_ptr, scale)


def _check(qkv, q_scale, k_scale, cos_sin, k_cache, v_cache, slots, positions, n_head) -> tuple[int, int, int]:
    """The layouts both implementations take; returns (B, K, Dh)."""
    b = qkv.shape[0]
    rows, length, kv, _ = k_cache.shape
    dh = head_dim_of(k_cache)
    packed = kernel_args(k_cache, v_cache)[0]  # (the layouts checked)
    if qkv.ndim != 2 or qkv.shape[1] != (n_head + 2 * kv) * dh or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be [B, (H + 2K) * Dh] = [{b}, {(n_head + 2 * kv) * dh}] with unit inner stride, "
                         f"got {list(qkv.shape)} strides {qkv.stride()}")
    if v_cache.shape != k_cache.shape or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k and v caches must have one shape and a contiguous head dim")
    if dh & (dh - 1) or dh < 4:
        raise ValueError(f"head dim {dh} must be a power of two >= 4")
    if tuple(cos_sin.shape) != (b, dh // 2, 2) or cos_sin.dtype != torch.float32 or not cos_sin[0].is_contiguous():
        raise ValueError(f"cos_sin must be fp32 [B, Dh/2, 2] = [{b}, {dh // 2}, 2], rows contiguous, "
                         f"got {cos_sin.dtype} {list(cos_sin.shape)}")
    if slots is None:
        if not isinstance(positions, int) or not 0 <= positions < length or b > rows:
            raise ValueError(f"without slots, rows 0..B-1 are written at one int position in [0, {length})")
    elif slots.shape != (b,) or slots.dtype != torch.int64 or (
            isinstance(positions, int) and not 0 <= positions < length) or (
            not isinstance(positions, int) and (positions.shape != (b,) or positions.dtype != torch.int64)):
        raise ValueError(f"slots must be int64 [batch], positions int64 [batch] or an int in [0, {length})")
    if packed and slots is None:
        raise ValueError("packed FP8 caches are the slow transformer's (written per row, with slots)")
    if not packed and qkv.dtype != k_cache.dtype:
        raise ValueError(f"qkv ({qkv.dtype}) and the caches ({k_cache.dtype}) must share a dtype")
    if (q_scale is None) != (k_scale is None) or (q_scale is not None and (q_scale.shape != (dh,) or k_scale.shape != (dh,))):
        raise ValueError(f"q_scale and k_scale must both be [{dh}], or both None")
    return b, kv, dh


def qk_rope_kv(
    qkv: Tensor, q_scale: Tensor | None, k_scale: Tensor | None, cos_sin: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, slots: Tensor | None, positions: Tensor | int, n_head: int, *,
    pdl: bool = False,
) -> Tensor:
    """See the module docstring. q_scale / k_scale None: no QK-norm. slots None: rows
    0..B-1 of the caches, all at the int position `positions` (the fast transformer's
    per-frame cache); slots with an int position: each row `slots[b]` at that position
    (the paged slow cache, viewed as [pages * P, 1, K, Dh] with slots the flat
    positions). Returns q [B, H, Dh]. `pdl`: kernels/pdl.py."""
    b, kv, dh = _check(qkv, q_scale, k_scale, cos_sin, k_cache, v_cache, slots, positions, n_head)
    q = torch.empty(b, n_head, dh, device=qkv.device, dtype=qkv.dtype)
    per_row = slots is not None
    pos_per_row = per_row and not isinstance(positions, int)
    fp8, k_arg, v_arg, k_scales, v_scales = kernel_args(k_cache, v_cache)
    _qk_rope_kv_kernel[(b, n_head + 2 * kv)](
        qkv, q_scale if q_scale is not None else qkv, k_scale if k_scale is not None else qkv,  # unread without QK-norm
        cos_sin, slots if per_row else qkv, positions if pos_per_row else qkv, q, k_arg, v_arg, k_scales, v_scales,
        qkv.stride(0), cos_sin.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        eps, 0 if pos_per_row else positions,
        H=n_head, KV=kv, HALF=dh // 2, QK_NORM=q_scale is not None, PER_ROW=per_row, POS_PER_ROW=pos_per_row,
        KV_FP8=fp8, SOFT_ROUND=fp8 and interpreting(), **launch_args(pdl),
    )
    return q


def qk_rope_kv_reference(
    qkv: Tensor, q_scale: Tensor | None, k_scale: Tensor | None, cos_sin: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, slots: Tensor | None, positions: Tensor | int, n_head: int,
) -> Tensor:
    """The same function in plain PyTorch, with the same roundings (fp32 math, the model
    dtype after the norm, after the scale and after the rotation)."""
    b, kv, dh = _check(qkv, q_scale, k_scale, cos_sin, k_cache, v_cache, slots, positions, n_head)
    qk = qkv[:, : (n_head + kv) * dh].view(b, n_head + kv, dh)
    if q_scale is not None:
        scale = torch.cat([q_scale.expand(n_head, dh), k_scale.expand(kv, dh)])
        qk = torch.nn.functional.rms_norm(qk.float(), (dh,), eps=eps).to(qk.dtype) * scale
    even, odd = qk.float()[..., 0::2], qk.float()[..., 1::2]  # [B, H + K, Dh/2]
    cos, sin = cos_sin[:, None, :, 0], cos_sin[:, None, :, 1]
    qk = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).to(qkv.dtype)
    rows = slots if slots is not None else torch.arange(b, device=qkv.device)
    at = positions if isinstance(positions, Tensor) else torch.full((b,), positions, device=qkv.device)
    k_cache[rows, at] = store_form(qk[:, n_head:], k_cache)
    v_cache[rows, at] = store_form(qkv[:, (n_head + kv) * dh :].view(b, kv, dh), v_cache)
    return qk[:, :n_head].contiguous()


def self_check(device: torch.device | str, dtype: torch.dtype, n_head: int, kv_heads: int, head_dim: int,
               qk_norm: bool, eps: float = 1e-6, kv_fp8: bool = False, *, pdl: bool = False) -> str | None:
    """Compile and run the kernel once at the serving shapes against the reference; None
    if they agree, else why not (the caller then keeps the PyTorch path). A serving
    process thus never runs a kernel that failed to compile or disagrees on this GPU."""
    try:
        g = torch.Generator().manual_seed(0)
        b, rows, length = 3, 4, 16
        qkv = torch.randn(b, (n_head + 2 * kv_heads) * head_dim, generator=g).to(device, dtype)
        scales = (torch.rand(head_dim, generator=g) + 0.5, torch.rand(head_dim, generator=g) + 0.5)
        qs, ks = (s.to(device, dtype) for s in scales) if qk_norm else (None, None)
        angles = torch.rand(b, head_dim // 2, generator=g) * 6.28
        cos_sin = torch.stack([angles.cos(), angles.sin()], dim=-1).to(device)
        slots, positions = torch.tensor([2, 0, 3], device=device), torch.tensor([5, 0, 15], device=device)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for where in ((slots, positions), (None, 7)):  # decode's addressing, the fast transformer's
            got = [torch.zeros(rows, length, kv_heads, head_dim, device=device, dtype=dtype) for _ in range(2)]
            want = [torch.zeros_like(got[0]) for _ in range(2)]
            q = qk_rope_kv(qkv, qs, ks, cos_sin, eps, *got, *where, n_head, pdl=pdl)
            q_ref = qk_rope_kv_reference(qkv, qs, ks, cos_sin, eps, *want, *where, n_head)
            for name, a, r in (("q", q, q_ref), ("k", got[0], want[0]), ("v", got[1], want[1])):
                err = ((a.float() - r.float()).norm() / r.float().norm()).item()
                if not err < tol:
                    return f"{name} differs from the reference by {err:.2e} (relative, slots={where[0] is not None})"
        if kv_fp8:  # packed FP8 caches (decode's addressing only): values byte for byte, keys to e4m3 precision
            dim = head_dim + TAIL_BYTES
            got = [torch.zeros(rows, length, kv_heads, dim, device=device, dtype=torch.uint8) for _ in range(2)]
            want = [torch.zeros_like(got[0]) for _ in range(2)]
            qk_rope_kv(qkv, qs, ks, cos_sin, eps, *got, slots, positions, n_head, pdl=pdl)
            qk_rope_kv_reference(qkv, qs, ks, cos_sin, eps, *want, slots, positions, n_head)
            if not torch.equal(got[1], want[1]):
                return "FP8 values differ from the reference's bytes"
            k_got, k_want = (unpack_kv(c, torch.float32) for c in (got[0], want[0]))
            err = ((k_got - k_want).norm() / k_want.norm()).item()
            if not err < 0.07:
                return f"FP8 keys differ from the reference by {err:.2e} (relative)"
        return None
    except Exception as e:  # a compile failure included: the PyTorch path stays
        return f"{type(e).__name__}: {e}"
