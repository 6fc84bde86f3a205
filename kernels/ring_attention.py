"""The streaming codec's window-limited attention over its per-slot ring cache, in one
launch per layer, with the ring update (engine/codec/streaming.py).

    q, k, v   [B, n, H, Dh]    this call's n frames (after RoPE for q and k; unit stride
                               along Dh, any other strides)
    k_cache,  [S, W, H, Dh]    contiguous rings: frame p of slot s lives at row p % W
    v_cache
    slots     long [B]         distinct
    start     long [B]         frames slot b decoded before this call
    -> out    [B, n, H, Dh]    contiguous; afterwards each ring holds the last min(n, W)
                               new frames too

Frame start + i sees the keys of frames (start + i - W, start + i]: the ring's rows (a row
of a frame < 0 is empty) and this call's first i + 1 frames. Scores, softmax and the
weighted sum are fp32, scaled by Dh^-1/2 as `scaled_dot_product_attention` is.

In PyTorch (the decoder's fallback) each layer gathers the slots' rings, concatenates the
new keys and values onto them, runs SDPA with a mask, and scatters the new rows back:
measured on an H200 (s2-pro codec, 8 layers, window 128, batch 64 x 1 frame) those copies
and the attention took ~0.95 of a call's 5.1 ms. Here each (stream, head) program reads
its ring once. Its ring reads all come before its ring writes (the barrier): a new frame
may overwrite a row that an earlier query of the same call still needs.
`ring_attention_reference` is the same function in plain PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.selfcheck import mismatch


@triton.jit
def _ring_attention_kernel(
    q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr, start_ptr, out_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, heads, n, scale,
    WINDOW: tl.constexpr, W_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slots_ptr + b)
    start = tl.load(start_ptr + b)
    i = tl.arange(0, N_BLOCK)  # this call's frames: queries and new keys
    r = tl.arange(0, W_BLOCK)  # ring rows
    d = tl.arange(0, HEAD_DIM)
    new = i < n
    q = tl.load(q_ptr + b * sq_b + i[:, None] * sq_t + h * sq_h + d[None, :], mask=new[:, None], other=0.0)
    k_new = tl.load(k_ptr + b * sk_b + i[:, None] * sk_t + h * sk_h + d[None, :], mask=new[:, None], other=0.0)
    v_new = tl.load(v_ptr + b * sv_b + i[:, None] * sv_t + h * sv_h + d[None, :], mask=new[:, None], other=0.0)
    ring = r < WINDOW
    ring_at = ((slot * WINDOW + r[:, None]) * heads + h) * HEAD_DIM + d[None, :]
    k_ring = tl.load(kc_ptr + ring_at, mask=ring[:, None], other=0.0)
    v_ring = tl.load(vc_ptr + ring_at, mask=ring[:, None], other=0.0)
    if DOT_FP32:
        q, k_new, v_new = q.to(tl.float32), k_new.to(tl.float32), v_new.to(tl.float32)
        k_ring, v_ring = k_ring.to(tl.float32), v_ring.to(tl.float32)

    q_pos = start + i  # [N]
    # ring row r holds frame start - W + ((r - start) mod W) (C-style %, hence + W)
    ring_pos = start - WINDOW + ((r - start) % WINDOW + WINDOW) % WINDOW  # [W]
    seen_ring = ring[None, :] & (ring_pos[None, :] >= 0) & (ring_pos[None, :] > q_pos[:, None] - WINDOW)
    seen_new = new[None, :] & (i[None, :] <= i[:, None]) & (q_pos[None, :] > q_pos[:, None] - WINDOW)
    if DOT_FP32:
        s_ring = tl.dot(q, tl.trans(k_ring), input_precision="ieee")
        s_new = tl.dot(q, tl.trans(k_new), input_precision="ieee")
    else:
        s_ring = tl.dot(q, tl.trans(k_ring))  # bf16 tensor cores, fp32 accumulation
        s_new = tl.dot(q, tl.trans(k_new))
    s_ring = tl.where(seen_ring, s_ring * scale, float("-inf"))
    s_new = tl.where(seen_new, s_new * scale, float("-inf"))
    # a real row sees at least its own key; a padded row may see none (all zeros, never stored)
    m = tl.maximum(tl.max(s_ring, axis=1), tl.max(s_new, axis=1))
    m = tl.where(m == float("-inf"), 0.0, m)
    p_ring = tl.exp(s_ring - m[:, None])
    p_new = tl.exp(s_new - m[:, None])
    total = tl.sum(p_ring, axis=1) + tl.sum(p_new, axis=1)
    if DOT_FP32:
        acc = tl.dot(p_ring, v_ring, input_precision="ieee") + tl.dot(p_new, v_new, input_precision="ieee")
    else:
        acc = tl.dot(p_ring.to(v_ring.dtype), v_ring) + tl.dot(p_new.to(v_new.dtype), v_new)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + ((b * n + i[:, None]) * heads + h) * HEAD_DIM + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=new[:, None])

    tl.debug_barrier()  # every ring read above before any ring write below
    kept = new & (i >= n - WINDOW)  # the last min(n, W) new frames
    row_at = ((slot * WINDOW + (start + i[:, None]) % WINDOW) * heads + h) * HEAD_DIM + d[None, :]
    tl.store(kc_ptr + row_at, k_new.to(kc_ptr.dtype.element_ty), mask=kept[:, None])
    tl.store(vc_ptr + row_at, v_new.to(vc_ptr.dtype.element_ty), mask=kept[:, None])


def _check(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor) -> None:
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be [B, n, H, Dh] alike, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    b, _, h, d = q.shape
    if k_cache.ndim != 4 or k_cache.shape[2:] != (h, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"the caches must be [S, W, {h}, {d}] alike, got {list(k_cache.shape)}, {list(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    if len({t.dtype for t in (q, k, v, k_cache, v_cache)}) != 1 or len({t.device for t in (q, k, v, k_cache, v_cache)}) != 1:
        raise ValueError("q, k, v and the caches must share a dtype and a device")
    for name, t in (("slots", slots), ("start", start)):
        if t.shape != (b,) or t.dtype != torch.long or t.device != q.device:
            raise ValueError(f"{name} must be long [B] = [{b}] on q's device, got {t.dtype} {list(t.shape)}")


def ring_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                   start: Tensor) -> Tensor:
    """See the module docstring."""
    _check(q, k, v, k_cache, v_cache, slots, start)
    b, n, h, d = q.shape
    window = k_cache.shape[1]
    if d < 16 or d & (d - 1):
        raise ValueError(f"the head size must be a power of two >= 16, got {d}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(b, n, h, d, device=q.device, dtype=q.dtype)
    if b and n:
        _ring_attention_kernel[(b, h)](
            q, k, v, k_cache, v_cache, slots, start, out,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), h, n, d ** -0.5,
            WINDOW=window, W_BLOCK=max(16, triton.next_power_of_2(window)), N_BLOCK=max(16, triton.next_power_of_2(n)),
            HEAD_DIM=d, DOT_FP32=q.dtype == torch.float32 or not q.is_cuda, num_warps=4,
        )
    return out


def ring_attention_reference(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                             start: Tensor) -> Tensor:
    """`ring_attention` in plain PyTorch, fp32 (updates the caches the same way)."""
    _check(q, k, v, k_cache, v_cache, slots, start)
    b, n, h, d = q.shape
    window = k_cache.shape[1]
    q_pos = start[:, None] + torch.arange(n, device=q.device)  # [B, n]
    rows = torch.arange(window, device=q.device)
    ring_pos = start[:, None] - window + (rows - start[:, None]) % window  # [B, W]
    key_pos = torch.cat([ring_pos, q_pos], dim=1)  # [B, W + n]
    seen = (key_pos[:, None] <= q_pos[:, :, None]) & (key_pos[:, None] > q_pos[:, :, None] - window)
    seen &= (key_pos >= 0)[:, None]
    keys = torch.cat([k_cache[slots], k], dim=1).float()  # [B, W + n, H, Dh]
    values = torch.cat([v_cache[slots], v], dim=1).float()
    scores = torch.einsum("bihd,bjhd->bhij", q.float(), keys) * d ** -0.5
    scores = scores.masked_fill(~seen[:, None], float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), values)
    kept = torch.arange(max(0, n - window), n, device=q.device)
    k_cache[slots[:, None], (start[:, None] + kept) % window] = k[:, kept]
    v_cache[slots[:, None], (start[:, None] + kept) % window] = v[:, kept]
    return out.to(q.dtype)


def self_check(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Compile and run once against the reference (ring update included): None if they
    agree, else why not (the caller keeps the PyTorch path)."""
    try:
        g = torch.Generator().manual_seed(0)
        slots = torch.tensor([2, 0], device=device)
        start = torch.tensor([5, 40], device=device)
        for n in (1, 3):
            q, k, v = (torch.randn(2, n, 2, 16, generator=g).to(device, dtype) for _ in range(3))
            k_cache, v_cache = (torch.randn(3, 8, 2, 16, generator=g).to(device, dtype) for _ in range(2))
            want_k, want_v = k_cache.clone(), v_cache.clone()
            want = ring_attention_reference(q, k, v, want_k, want_v, slots, start)
            got = ring_attention(q, k, v, k_cache, v_cache, slots, start)
            why = (mismatch("ring_attention", got, want, dtype) or mismatch("its key ring", k_cache, want_k, dtype)
                   or mismatch("its value ring", v_cache, want_v, dtype))
            if why:
                return why
        return None
    except Exception as e:  # a compile failure included
        return f"ring_attention: {type(e).__name__}: {e}"
