"""Prefill attention over a paged KV cache: a block of one stream's new positions per
program (flash-attention forward, causal, grouped-query).

A program takes BLOCK_Q consecutive new positions of one stream and the G query heads of
one KV head (BLOCK_Q x G rows of one tl.dot) and reads each KV block once for all of
them, where a decode query per new position reads the stream's whole KV once per
position (latency_bench/RESULTS.md, 'Cascade decode attention and the blocked prefill
attention').

    q           [B, S, H, D]              the new positions' queries (after RoPE), right-padded
    k_cache     [num_pages, P, K, D]      pages of P positions (kernels/decode_attention.py),
    v_cache     [num_pages, P, K, D]      already holding the new positions
    page_table  [rows, max_pages] int32   row r's position p at page page_table[r, p // P]
    slots       [B] int64                 page-table row of each stream
    starts      [B] int64                 position of each stream's first new query
    lengths     [B] int64                 real new positions of each stream (the rest is padding)
    -> out      [B, S, H, D]              padding positions get zeros

Query j of stream b sits at position starts[b] + j and sees keys 0 .. starts[b] + j of
its page-table row (a segment after a voice prompt starts at the prompt's length and
reads the prompt from its shared pages). A row's output does not depend on the other
rows of its block or on the batch (each row's online softmax runs over the same key
blocks, in order; key blocks past a block's last query are skipped, and a fully masked
block leaves a row's sums exactly as they were), so a stream prefilled alone or in a
batch gets the same bits.

bf16 / fp16 / fp32 caches only: FP8 caches (kernels/kv_fp8.py) keep the decode-kernel
path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.decode_attention import (block_scores, checked_args, checked_max_length, dot_queries,
                                      online_softmax_step, page_positions, stream_kv)
from kernels.pdl import launch_args, pdl_wait

BLOCK_Q = 16  # new positions per program (x the head group: the tl.dot's rows)
BLOCK_N = 64  # key positions per inner step
# Compiled for sm90 on a CPU (triton 3.6, `kernels/sm90.py`'s compile, S2-Pro heads: 64 rows
# x 128): 4 warps spill 112 bytes a thread, 8 warps none (255 registers, 48 KiB shared
# memory). Timed in the engine on an H100 (2026-12-06; launch not swept): 16 segments of
# 40 positions after a 340-position voice 1.59x faster than one decode query a position.
NUM_WARPS = 8


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, slots_ptr, starts_ptr, lengths_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kp, stride_kl, stride_kk,
    stride_vp, stride_vl, stride_vk,
    stride_tr,
    stride_ob, stride_os, stride_oh,
    seq_len, scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_block = tl.program_id(2)
    table_row = table_ptr + tl.load(slots_ptr + b) * stride_tr
    start = tl.load(starts_ptr + b)
    length = tl.load(lengths_ptr + b)
    ROWS: tl.constexpr = BLOCK_Q * GROUP
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    j = q_block * BLOCK_Q + offs_r // GROUP  # each row's new position (index into the segment)
    head = kv_head * GROUP + offs_r % GROUP
    real = j < length
    position = start + j  # [ROWS]: the keys a row sees are 0 .. position
    q = tl.load(q_ptr + b * stride_qb + j[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :],
                mask=real[:, None], other=0.0)
    q = dot_queries(q, DOT_FP32, False)

    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    # keys up to the block's last real query's position (none for a padding-only block)
    end = start + tl.minimum(length, (q_block + 1) * BLOCK_Q)
    end = tl.where(q_block * BLOCK_Q < length, end, 0)
    k_head = k_ptr + kv_head * stride_kk
    v_head = v_ptr + kv_head * stride_vk
    # a loop bound loaded from memory: the compiler pipelines its loads (a fixed trip
    # count with an `if` around the body was not pipelined, sm90 compile with triton 3.6)
    for n0 in range(0, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        in_row = offs_n < end
        page, at = page_positions(table_row, offs_n, in_row, PAGE)  # [BLOCK_N] each
        k_at = page * stride_kp + at * stride_kl
        v_at = page * stride_vp + at * stride_vl
        k = tl.load(k_head + k_at[:, None] + offs_d[None, :], mask=in_row[:, None], other=0.0)
        v = tl.load(v_head + v_at[:, None] + offs_d[None, :], mask=in_row[:, None], other=0.0)
        scores, v = block_scores(q, k, v, 1.0, 1.0, scale, DOT_FP32, False)
        seen = (offs_n[None, :] <= position[:, None]) & in_row[None, :] & real[:, None]
        scores = tl.where(seen, scores, float("-inf"))
        m, l, acc = online_softmax_step(m, l, acc, scores, v, DOT_FP32)

    out = tl.where((l > 0.0)[:, None], acc / tl.where(l > 0.0, l, 1.0)[:, None], 0.0)
    tl.store(out_ptr + b * stride_ob + j[:, None] * stride_os + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(j < seq_len)[:, None])


def prefill_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, slots: Tensor, starts: Tensor,
    lengths: Tensor, max_length: int | None = None, *, pdl: bool = False,
) -> Tensor:
    """Causal attention of each stream's new positions over its pages; see the module
    docstring for shapes. `max_length` (default: what a page-table row addresses, max_pages
    x P) is checked against the page table and changes nothing else: each program's trip
    count comes from its own start and length on the device, so a CUDA graph captured
    once serves any of them. `pdl`: kernels/pdl.py."""
    b, s, h, d = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.dtype == torch.uint8 or v_cache.dtype == torch.uint8:
        raise ValueError("FP8 (packed) caches are read by kernels/decode_attention.py, not here")
    # dtypes, shapes, head group, slots / lengths and strides: decode attention's checks,
    # on the first new position's queries (the same heads and layout as every other's)
    checked_args(q[:, 0], k_cache, v_cache, page_table, slots, lengths)
    if d < 16:
        raise ValueError(f"head dim ({d}) must be >= 16 (tl.dot)")
    if starts.shape != (b,) or starts.dtype != torch.int64:
        raise ValueError("starts must be int64 [batch]")
    group = h // kv_heads
    checked_max_length(max_length, k_cache, page_table)
    out = torch.empty_like(q)
    grid = (b, kv_heads, triton.cdiv(s, BLOCK_Q))
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, page_table, slots, starts, lengths,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        s, d ** -0.5,
        GROUP=group, HEAD_DIM=d, PAGE=k_cache.shape[1], BLOCK_Q=BLOCK_Q, BLOCK_N=BLOCK_N,
        # fp32 inputs, and the interpreter (whose bf16 tl.dot is wrong), dot in fp32
        DOT_FP32=q.dtype == torch.float32 or not q.is_cuda, num_warps=NUM_WARPS, **launch_args(pdl),
    )
    return out


def prefill_attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, slots: Tensor, starts: Tensor,
    lengths: Tensor,
) -> Tensor:
    """The same function in plain PyTorch (fp32 math)."""
    b, s, h, d = q.shape
    group = h // k_cache.shape[2]
    out = torch.zeros_like(q)
    for i in range(b):
        n, a = int(lengths[i]), int(starts[i])
        if n == 0:
            continue
        k, v = (stream_kv(c, page_table, slots[i], a + n).float().repeat_interleave(group, dim=1)
                for c in (k_cache, v_cache))  # [a + n, H, D]
        scores = torch.einsum("shd,nhd->hsn", q[i, :n].float(), k) * d ** -0.5
        seen = torch.arange(a + n)[None, :] <= (a + torch.arange(n))[:, None]  # [n, a + n]
        scores = scores.masked_fill(~seen.to(scores.device)[None], float("-inf"))
        out[i, :n] = torch.einsum("hsn,nhd->shd", scores.softmax(-1), v).to(q.dtype)
    return out
