"""Cascade decode attention: each shared voice prefix attended once for all the streams
of the batch that read it (shared-prefix attention, as in FlashInfer's cascade or
Hydragen), the rest of each stream's positions by the decode kernel.

The same function as kernels/decode_attention.py with `prefix_rows` / `prefix_lens`
(and the same reference, `decode_attention_reference`): stream b attends over positions
[0, min(prefix_lens[b], lengths[b])) of row prefix_rows[b] and the rest of its length of
its own row slots[b]. What changes is who reads the prefix. With shared reads alone every
stream still runs its own programs over the prefix: the voice prompt's bytes come from L2
instead of HBM, but once per stream, each in a 16-row dot of which 4 rows are queries
(on an H100, 1.10-1.13x for attention alone at batch 64, contexts 700/1000, 340 shared
positions). Here the query rows of all the streams of a query block that read the same
prefix row are stacked into one dot (16 streams x 4 heads = 64 rows at the S2-Pro
shape), so each prefix key and value is read once per (query block, KV head).

Three launches, no host sync and no data-dependent shape (CUDA-graph safe):
1. `_prefix_attention_kernel`, grid (query blocks, KV heads, prefix splits): query block
   j holds streams [j S, j S + S) in batch order. Streams whose prefix reaches the
   program's split and that name the same prefix row form a group; the program makes one
   pass per group present in its block (the first stream of the group in the block leads
   it: 1-2 passes in practice) over its split of that row's positions, each query row
   masked to its own stream's min(prefix length, length). The rows keep one online
   softmax across the passes (a pass masks every row of other groups, which leaves
   their sums exactly as they were), and the program writes each stream's partial
   output and log-sum-exp once, into split own_splits + s of the partial buffer.
   (A program per pass, or a pass loop that kept its own state and stores, held more
   registers: the sm90 compile spilled.)
2. decode_attention.py's split kernel with CASCADE: stream b's positions
   [min(prefix_lens[b], lengths[b]), lengths[b]) of its own row only, in splits that start
   there.
3. decode_attention.py's combine, which reads prefix split s of stream b only where
   s * prefix split < prefix_lens[b]: exactly the splits pass 1 wrote for b. The rest of
   the buffer (streams without a prefix, splits past a prefix) is never written and
   never read, so nothing of an earlier call can leak in. Splits past every prefix (the
   count is fixed by max_length) cost one program each that reads three small vectors
   and returns, like the decode kernel's splits past a length.

Groups come from prefix_rows alone (the runner points a voice's streams at the first
one of them in the batch: engine/runner.py `_stage_prefixes`), so the leader need not be
in the batch and members may have different prefix lengths; the caller's contract is
decode_attention's: row prefix_rows[b]'s first prefix_lens[b] positions are stream b's
and stay so for the call.

Numerics: the prefix and the own part are split where decode_attention does not split,
so the output is not bit for bit decode_attention's; it is the reference's within the
same tolerances. A stream's output does not depend on the other streams of its batch
(each query row's dot, softmax and merge are its own; key blocks past a row's prefix are
fully masked for it and leave its sums exactly as they were), so at one launch choice a
stream gives the same bits alone in its group as with others.

bf16 / fp16 / fp32 caches and packed FP8 ones (kernels/kv_fp8.py), read as the decode
kernel reads them: e4m3 codes to fp16, key scales on the scores, value scales on the
values in registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.decode_attention import (
    block_scores, checked_args, combine, dot_queries, online_softmax_step, own_launch, split_pass,
)
from kernels.pdl import launch_args, pdl_wait


@dataclass(frozen=True, slots=True)
class PrefixLaunch:
    streams: int  # streams per query block (x the head group: the dot's rows)
    split: int  # prefix positions per program
    block: int  # positions per inner step
    num_warps: int = 4
    num_stages: int = 2


# 64 query rows (16 S2-Pro streams x 4 heads); 128-position splits: a 340-position voice
# prompt spreads over 3 splits x 8 KV heads x (its streams / 16) programs. Compiled for
# sm90 on a CPU (kernels/sm90.py --attention, triton 3.6, S2-Pro heads): 4 warps and
# 32-position blocks keep every register (bf16 cache 219 a thread, FP8 255, no spill:
# two programs fit an SM); 64-position blocks spilled the FP8 variant, 8 warps take 181 /
# 240 but one program an SM. Timed on an H100 (2026-12-06, batch 64, 340-position prompt,
# latency_bench/RESULTS.md): 0.84-1.11x the shared reads' time alone, the step 1.00-1.01x;
# this launch was not swept.
PREFIX_ROWS = 64
PREFIX_SPLIT = 128
PREFIX_BLOCK = 32


def prefix_launch(group: int) -> PrefixLaunch:
    """The prefix kernel's default launch for a head group of `group` query heads."""
    return PrefixLaunch(max(1, PREFIX_ROWS // group), PREFIX_SPLIT, PREFIX_BLOCK)


@triton.jit
def _prefix_attention_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, lengths_ptr, prefix_rows_ptr, prefix_lens_ptr, part_ptr, lse_ptr,
    batch,
    stride_qb, stride_qh,
    stride_kr, stride_kl, stride_kk,
    stride_vr, stride_vl, stride_vk,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    scale,
    GROUP: tl.constexpr, STREAMS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
    SPLIT_SIZE: tl.constexpr, BLOCK: tl.constexpr, DOT_FP32: tl.constexpr, KV_FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    # KV_FP8: as in decode_attention.py's split kernel (e4m3 views, fp32 views for the scales)
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start = split * SPLIT_SIZE

    # the dot's rows: (stream, query head) pairs, the GROUP heads of this KV head per stream
    # (rows, lengths and positions fit int32: half the registers of the int64 they are stored in)
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    stream = q_block * STREAMS + offs_r // GROUP
    heads = kv_head * GROUP + offs_r % GROUP
    live = (offs_r < STREAMS * GROUP) & (stream < batch)
    row_r = tl.load(prefix_rows_ptr + stream, mask=live, other=-1).to(tl.int32)
    plen_r = tl.load(prefix_lens_ptr + stream, mask=live, other=0).to(tl.int32)
    cut_r = tl.minimum(plen_r, tl.load(lengths_ptr + stream, mask=live, other=0).to(tl.int32))  # prefix positions a row sees
    # the rows whose split this is: the combine reads split s of a stream iff s * SPLIT_SIZE < its prefix length
    mine = live & (start < plen_r)

    if tl.max(mine.to(tl.int32)) > 0:
        # the block's streams: a stream leads a pass if no earlier stream of the block reads
        # the same prefix row (the pass then takes every row of the block that does)
        offs_s = tl.arange(0, STREAMS)
        in_batch = q_block * STREAMS + offs_s < batch
        rows_s = tl.load(prefix_rows_ptr + q_block * STREAMS + offs_s, mask=in_batch, other=-1).to(tl.int32)
        has_s = tl.load(prefix_lens_ptr + q_block * STREAMS + offs_s, mask=in_batch, other=0) > start
        earlier = (rows_s[:, None] == rows_s[None, :]) & has_s[None, :] & (offs_s[None, :] < offs_s[:, None])
        leads_s = has_s & (tl.sum(earlier.to(tl.int32), axis=1) == 0)  # [STREAMS]

        q = tl.load(q_ptr + stream[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mine[:, None], other=0.0)
        q = dot_queries(q, DOT_FP32, KV_FP8)
        # one online softmax per row across the passes: a pass masks every row outside its
        # group, which leaves that row's m, l and acc exactly as they were
        m = tl.full([ROWS], float("-inf"), tl.float32)
        l = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
        for j in range(STREAMS):  # one pass per prefix row of the block (a fixed trip count: graph safe)
            if tl.sum(tl.where((offs_s == j) & leads_s, 1, 0)) > 0:
                prefix_row = tl.sum(tl.where(offs_s == j, rows_s, 0))
                limit = tl.where(mine & (row_r == prefix_row), cut_r, 0)  # [ROWS]: positions each row sees
                end = tl.minimum(start + SPLIT_SIZE, tl.max(limit))
                row_at = prefix_row.to(tl.int64)  # a row's offset can pass 2^31 elements in a large cache
                k_row = k_ptr + row_at * stride_kr + kv_head * stride_kk
                v_row = v_ptr + row_at * stride_vr + kv_head * stride_vk
                if KV_FP8:
                    ks_row = ks_ptr + (row_at * stride_kr + kv_head * stride_kk + HEAD_DIM) // 4
                    vs_row = vs_ptr + (row_at * stride_vr + kv_head * stride_vk + HEAD_DIM) // 4
                # a loop bound loaded from memory (prefill_attention.py: the compiler pipelines it)
                for n0 in range(start, end, BLOCK):
                    offs_n = n0 + tl.arange(0, BLOCK)
                    in_split = offs_n < end
                    k = tl.load(k_row + offs_n[:, None] * stride_kl + offs_d[None, :], mask=in_split[:, None], other=0.0)
                    v = tl.load(v_row + offs_n[:, None] * stride_vl + offs_d[None, :], mask=in_split[:, None], other=0.0)
                    k_scale, v_scale = 1.0, 1.0  # FP8 caches only: each position's scales
                    if KV_FP8:
                        k_scale = tl.load(ks_row + offs_n * (stride_kl // 4), mask=in_split, other=0.0)
                        v_scale = tl.load(vs_row + offs_n * (stride_vl // 4), mask=in_split, other=0.0)
                    scores, v = block_scores(q, k, v, k_scale, v_scale, scale, DOT_FP32, KV_FP8)  # [ROWS, BLOCK]
                    scores = tl.where(offs_n[None, :] < limit[:, None], scores, float("-inf"))
                    m, l, acc = online_softmax_step(m, l, acc, scores, v, DOT_FP32)
        empty = l == 0.0  # a stream whose length ends before this split
        out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l)[:, None])
        lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l)))
        tl.store(part_ptr + stream[:, None] * stride_pb + heads[:, None] * stride_ph + split * stride_ps
                 + offs_d[None, :], out, mask=mine[:, None])
        tl.store(lse_ptr + stream * stride_lb + heads * stride_lh + split, lse, mask=mine)


def cascade_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, lengths: Tensor, prefix_rows: Tensor,
    prefix_lens: Tensor, max_length: int | None = None, split: int | None = None, block: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, prefix: PrefixLaunch | None = None,
) -> Tensor:
    """decode_attention(q, k_cache, v_cache, slots, lengths, max_length, prefix_rows=...,
    prefix_lens=...) with each prefix row's positions attended once per query block
    (module docstring). `split`, `block`, `num_warps`, `num_stages`: the own part's
    launch (decode_attention's, `launch_choice` by default); `prefix`: the prefix
    kernel's (`prefix_launch` by default). `max_length` fixes both split counts."""
    if prefix_rows is None or prefix_lens is None:
        raise ValueError("cascade attention needs prefix_rows and prefix_lens")
    caches = checked_args(q, k_cache, v_cache, slots, lengths, prefix_rows, prefix_lens)
    fp8, k_arg, v_arg, k_scales, v_scales = caches
    b, h, d = q.shape
    kv_heads = k_cache.shape[2]
    group = h // kv_heads
    own = own_launch(b, kv_heads, fp8, split, block, num_warps, num_stages)
    pre = prefix or prefix_launch(group)
    if pre.streams & (pre.streams - 1) or pre.block < 16 or pre.block & (pre.block - 1) or pre.split % pre.block:
        raise ValueError(f"prefix launch {pre}: streams a power of two, block a power of two >= 16 dividing split")
    length = max_length or k_cache.shape[1]
    own_splits, prefix_splits = triton.cdiv(length, own.split), triton.cdiv(length, pre.split)
    part = torch.empty(b, h, own_splits + prefix_splits, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, h, own_splits + prefix_splits, device=q.device, dtype=torch.float32)
    pre_part, pre_lse = part[:, :, own_splits:], lse[:, :, own_splits:]
    _prefix_attention_kernel[(triton.cdiv(b, pre.streams), kv_heads, prefix_splits)](
        q, k_arg, v_arg, k_scales, v_scales, lengths, prefix_rows, prefix_lens, pre_part, pre_lse,
        b,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        pre_part.stride(0), pre_part.stride(1), pre_part.stride(2),
        pre_lse.stride(0), pre_lse.stride(1),
        d ** -0.5,
        GROUP=group, STREAMS=pre.streams, ROWS=max(16, pre.streams * group), HEAD_DIM=d, SPLIT_SIZE=pre.split,
        BLOCK=pre.block,
        # fp32 inputs, and the interpreter (whose bf16 tl.dot is wrong), dot in fp32
        DOT_FP32=q.dtype == torch.float32 or not q.is_cuda, KV_FP8=fp8,
        num_warps=pre.num_warps, num_stages=pre.num_stages, **launch_args(),
    )
    split_pass(q, k_cache, v_cache, caches, slots, lengths, prefix_rows, prefix_lens,
               part[:, :, :own_splits], lse[:, :, :own_splits], own, cascade=True)
    return combine(part, lse, q.dtype, prefix_lens, own_splits, pre.split)
