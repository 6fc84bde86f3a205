"""Decode attention over a paged KV cache (flash-decoding, split over positions).

One new query position per stream; stream b reads the pages of page-table row `slots[b]`
up to its own length `lengths[b]`, so a batch of streams at different points costs what
their KV actually holds, with no gather copy of the cache and no mask over unused
positions. Grouped-query attention: each program takes one KV head and the G = H / K
query heads that share it.

    q           [B, H, D]                 the new position's queries (after RoPE)
    k_cache     [num_pages, P, K, D]      pages of P positions (P a power of two)
    v_cache     [num_pages, P, K, D]
    page_table  [rows, max_pages] int32   row r's position p lives at page
                                          page_table[r, p // P], offset p % P
    slots       [B] int64                 page-table row of each stream
    lengths     [B] int64                 valid positions of each stream (its new position + 1)
    -> out      [B, H, D]

Shared pages: streams that speak with the same voice hold bit-identical KV for the voice
prompt (~340 positions of an S2-Pro context of 340-1,000). Their page-table rows point at
the same physical pages for the prompt's full pages, so every stream of the batch reads
the same prefix bytes, which the step's concurrent programs then find in L2 instead of
each reading its own copy from HBM. The kernel does not know: a page is an address, and
shared pages are immutable while any row points at them (the engine's contract).

Pass 1 (`_decode_attention_split_kernel`): grid (B, K, splits); each program runs an online
softmax over its split of positions and writes a partial output and its log-sum-exp.
Pass 2 (`_combine_kernel`): grid (B, H); merges the splits. Splits beyond a stream's
length write an empty partial (lse = -inf) and cost one program launch.

The G query heads of a KV head (4 for S2-Pro) are padded to tl.dot's 16-row minimum: the
tensor cores idle on the padding, but the work is memory-bound (every KV byte is read
once per step) and a register-resident broadcast product spilled.

FP8 caches (uint8 [num_pages, P, K, D + 16], kernels/kv_fp8.py) are read as they are: the
e4m3 codes go to fp16 exactly (one conversion instruction per pair), the dots run in
fp16, each key's scale multiplies its scores and each value's scale its values in
registers, so nothing is dequantized through memory and the kernel reads 0.56x the
bytes; with `launch_choice`'s large-batch launch that makes the batch-64 step slightly
faster (latency_bench/RESULTS.md, '`--kv-quant fp8`', measured on the slot-indexed cache).
fp16 holds values up to 65504 and scales down to 2^-24 exactly, far outside what
attention values reach; a head of values all below ~1e-5 would read as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.kv_fp8 import head_dim_of, kernel_args, load_form
from kernels.pdl import launch_args, pdl_wait

# Positions per split and per inner block. 256-position splits keep the grid large enough
# to fill 132 SMs at batch 1 with 8 KV heads and a ~1-2k context (8 x 4-8 programs per
# stream). Scores and the weighted sum use tl.dot with the head group padded to 16 rows:
# the first version's [G, 32, D] fp32 broadcast product spilled registers and took
# 46 us per call at batch 1 and 239 us at batch 64 (context 400, S2-Pro heads, H200,
# latency_bench/profile_step.py), 40% of the step at batch 64.
SPLIT = 256
BLOCK_N = 64


@dataclass(frozen=True, slots=True)
class Launch:
    split: int  # positions per program
    block: int  # positions per inner step
    num_warps: int | None = None  # None: Triton's default
    num_stages: int | None = None


# Where batch x KV heads alone fill the SMs about twice over (132 on an H200), longer splits
# and fewer warps win. Measured with `latency_bench.attention_bench` on an H200 (batch 64,
# context 1000, S2-Pro heads, 2026-12-01, latency_bench/reference/h200-s2pro/
# attention_bench.json): bf16 cache 68.2 us against 76-77 for (256, 64, defaults); FP8
# cache 63.3 us against 93, its default warps left each load's latency exposed. Smaller
# batches keep the short splits (not swept there).
SMALL = Launch(SPLIT, BLOCK_N)
LARGE_BF16 = Launch(512, 32, 2, 2)
LARGE_FP8 = Launch(512, 64, 2, 3)
LARGE_FROM_PROGRAMS = 256


def launch_choice(rows: int, kv_heads: int, fp8: bool) -> Launch:
    """The launch a call of `rows` queries over `kv_heads` KV heads gets by default."""
    if rows * kv_heads < LARGE_FROM_PROGRAMS:
        return SMALL
    return LARGE_FP8 if fp8 else LARGE_BF16


@triton.jit
def dot_queries(q, DOT_FP32: tl.constexpr, KV_FP8: tl.constexpr):
    """Queries in the dtype of the score dots: fp32 for fp32 inputs and the interpreter
    (whose bf16 tl.dot is wrong), fp16 for FP8 caches (e4m3 -> fp16 is one instruction
    per pair), else as stored."""
    if DOT_FP32:
        q = q.to(tl.float32)
    elif KV_FP8:
        q = q.to(tl.float16)
    return q


@triton.jit
def block_scores(q, k, v, k_scale, v_scale, scale, DOT_FP32: tl.constexpr, KV_FP8: tl.constexpr):
    """A key block's scaled scores [R, N] (fp32) and its values as the P V dot takes them.
    FP8 caches: the e4m3 codes go to q's dtype exactly, each value's scale multiplies its
    values and each key's scale its scores (k_scale / v_scale [N]; unused otherwise)."""
    if KV_FP8:
        k = k.to(q.dtype)
        v = v.to(q.dtype) * v_scale[:, None].to(q.dtype)  # the values themselves (exact: powers of two)
    elif DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if DOT_FP32:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))  # bf16 (fp16 for FP8 caches) tensor cores, fp32 accumulation
    scores = scores * scale
    if KV_FP8:
        scores = scores * k_scale[None, :]
    return scores, v


@triton.jit
def online_softmax_step(m, l, acc, scores, v, DOT_FP32: tl.constexpr):
    """One key block of an online softmax (flash attention): the block's scores [R, N]
    (-inf where a row must not see a key) and values [N, D] fold into each row's running
    max m [R], sum l [R] and output acc [R, D]; returns the new (m, l, acc). A fully
    masked block leaves a row's m, l and acc exactly as they were (and gives no NaN)."""
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def page_positions(table_row, offs_n, valid, PAGE: tl.constexpr):
    """Positions offs_n [N] of a stream -> (each one's page, int64, and its offset in the
    page), read from the stream's page-table row; masked positions get page 0. int64:
    page x page stride can pass 2^31 (FP8 byte offsets past ~29k pages of 64 positions at
    the S2-Pro heads, 72 KiB a page). One page-table load per position (the same few
    words, from L1; 32 more 4-byte loads a block at the sm90 compile) serves every page
    size against every block size; a scalar load per block where BLOCK divides P would
    save those loads but needs a second code path for P < BLOCK."""
    page = tl.load(table_row + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
    return page, offs_n % PAGE


@triton.jit
def _decode_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, slots_ptr, lengths_ptr, part_ptr, lse_ptr,
    stride_qb, stride_qh,
    stride_kp, stride_kl, stride_kk,
    stride_vp, stride_vl, stride_vk,
    stride_tr,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    scale,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    SPLIT_SIZE: tl.constexpr, BLOCK: tl.constexpr, DOT_FP32: tl.constexpr, KV_FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    # KV_FP8: k_ptr / v_ptr are the e4m3 views of packed caches, ks_ptr / vs_ptr their fp32
    # views (the scale of (page, offset, head) at element HEAD_DIM / 4 of the head's slab;
    # the fp32 view's strides are the byte strides / 4)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + b)
    table_row = table_ptr + tl.load(slots_ptr + b) * stride_tr
    offs_g = tl.arange(0, GROUP_PAD)  # query heads of this KV head, padded to tl.dot's 16 rows
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    real = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=real[:, None], other=0.0)
    q = dot_queries(q, DOT_FP32, KV_FP8)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    start = split * SPLIT_SIZE
    end = tl.minimum(start + SPLIT_SIZE, length)
    k_head = k_ptr + kv_head * stride_kk
    v_head = v_ptr + kv_head * stride_vk
    if KV_FP8:
        ks_head = ks_ptr + (kv_head * stride_kk + HEAD_DIM) // 4
        vs_head = vs_ptr + (kv_head * stride_vk + HEAD_DIM) // 4
    if start < end:  # splits past this stream's length do no work
        # a fixed trip count (masked past `end`): masked lanes read no memory, and the
        # interpreter cannot loop over tensor bounds
        for i in range(0, SPLIT_SIZE // BLOCK):
            offs_n = start + i * BLOCK + tl.arange(0, BLOCK)
            valid = offs_n < end
            page, at = page_positions(table_row, offs_n, valid, PAGE)  # [BLOCK] each
            k_at = page * stride_kp + at * stride_kl
            v_at = page * stride_vp + at * stride_vl
            k = tl.load(k_head + k_at[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
            v = tl.load(v_head + v_at[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
            k_scale, v_scale = 1.0, 1.0  # FP8 caches only: each position's scales
            if KV_FP8:
                k_scale = tl.load(ks_head + page * (stride_kp // 4) + at * (stride_kl // 4), mask=valid, other=0.0)
                v_scale = tl.load(vs_head + page * (stride_vp // 4) + at * (stride_vl // 4), mask=valid, other=0.0)
            scores, v = block_scores(q, k, v, k_scale, v_scale, scale, DOT_FP32, KV_FP8)  # [G_PAD, BLOCK]
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m, l, acc = online_softmax_step(m, l, acc, scores, v, DOT_FP32)

    empty = l == 0.0  # split past this stream's length
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l)[:, None])
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l)))
    tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :], out,
             mask=real[:, None])
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=real)


@triton.jit
def _combine_kernel(
    part_ptr, lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_s < SPLITS
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=in_range, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(in_range, tl.exp(lse - top), 0.0)  # [S]
    parts = tl.load(part_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                    mask=in_range[:, None], other=0.0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, slots: Tensor, lengths: Tensor,
    max_length: int | None = None, block: int | None = None, num_warps: int | None = None,
    num_stages: int | None = None, split: int | None = None, *, pdl: bool = False,
) -> Tensor:
    """Attention of one new position per stream; see the module docstring for shapes.

    `max_length` bounds every length (default: what a page-table row addresses, max_pages
    x P); it fixes the number of splits, so a CUDA graph captured once serves any lengths
    up to it. Packed FP8 caches (uint8 [num_pages, P, K, D + 16]) are read as
    kernels/kv_fp8.py lays them out. `split` (positions per program), `block` (positions
    per inner step, a power of two dividing `split`), `num_warps` and `num_stages` are
    launch choices for latency_bench.attention_bench; left None, `launch_choice` picks
    them (the measured choice for the batch and cache kind). `pdl`: kernels/pdl.py."""
    caches = checked_args(q, k_cache, v_cache, page_table, slots, lengths)
    max_length = checked_max_length(max_length, k_cache, page_table)
    choice = own_launch(q.shape[0], k_cache.shape[2], caches[0], split, block, num_warps, num_stages)
    b, h, d = q.shape
    splits = triton.cdiv(max_length, choice.split)
    part = torch.empty(b, h, splits, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, h, splits, device=q.device, dtype=torch.float32)
    split_pass(q, k_cache, v_cache, caches, page_table, slots, lengths, part, lse, choice, pdl=pdl)
    return combine(part, lse, q.dtype, pdl=pdl)


def checked_args(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, slots: Tensor, lengths: Tensor,
) -> tuple[bool, Tensor, Tensor, Tensor, Tensor]:
    """Raise on arguments the kernels cannot take; -> kv_fp8.kernel_args's (FP8 cache,
    k, v, k scales, v scales), the caches as the kernels read them."""
    b, h, d = q.shape
    caches = kernel_args(k_cache, v_cache)
    fp8 = caches[0]
    if not fp8 and (k_cache.dtype != q.dtype or v_cache.dtype != q.dtype):
        raise ValueError(f"q ({q.dtype}) and the caches ({k_cache.dtype} / {v_cache.dtype}) must share a dtype")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or head_dim_of(k_cache) != d:
        raise ValueError(f"k/v caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit q {tuple(q.shape)}")
    page = k_cache.shape[1]
    if page & (page - 1):
        raise ValueError(f"page size {page} must be a power of two")
    kv_heads = k_cache.shape[2]
    if h % kv_heads:
        raise ValueError(f"{h} query heads are not a multiple of {kv_heads} KV heads")
    group = h // kv_heads
    if group & (group - 1) or d & (d - 1):
        raise ValueError(f"head group ({group}) and head dim ({d}) must be powers of two")
    if page_table.dim() != 2 or page_table.dtype != torch.int32 or not page_table.is_contiguous():
        raise ValueError(f"the page table must be a contiguous int32 [rows, max_pages], got {page_table.dtype} "
                         f"{tuple(page_table.shape)} strides {page_table.stride()}")
    if (slots.shape != (b,) or lengths.shape != (b,) or slots.dtype != torch.int64 or lengths.dtype != torch.int64
            or slots.stride(0) != 1 or lengths.stride(0) != 1):
        raise ValueError("slots and lengths must be contiguous int64 [batch]")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the head dim must be contiguous in q and in the caches")
    return caches


def checked_max_length(max_length: int | None, k_cache: Tensor, page_table: Tensor) -> int:
    """`max_length`, or what a page-table row addresses if None; raises past that."""
    addressed = page_table.shape[1] * k_cache.shape[1]
    if max_length is not None and max_length > addressed:
        raise ValueError(f"max_length {max_length} exceeds what a page-table row addresses "
                         f"({page_table.shape[1]} pages x {k_cache.shape[1]})")
    return max_length or addressed


def own_launch(batch: int, kv_heads: int, fp8: bool, split: int | None = None, block: int | None = None,
               num_warps: int | None = None, num_stages: int | None = None) -> Launch:
    """The split kernel's launch: the choices given, or `launch_choice`'s if none is."""
    if split is None and block is None and num_warps is None and num_stages is None:
        return launch_choice(batch, kv_heads, fp8)
    split, block = split or SPLIT, block or BLOCK_N
    if block < 16 or block & (block - 1) or split % block:
        raise ValueError(f"block {block} must be a power of two >= 16 dividing the split ({split})")
    return Launch(split, block, num_warps, num_stages)


def split_pass(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, caches: tuple, page_table: Tensor, slots: Tensor, lengths: Tensor,
    part: Tensor, lse: Tensor, choice: Launch, *, pdl: bool = False,
) -> None:
    """Pass 1 into part [B, H, splits, D] / lse [B, H, splits]."""
    b, h, d = q.shape
    page, kv_heads = k_cache.shape[1:3]
    fp8, k_arg, v_arg, k_scales, v_scales = caches
    launch = {k: v for k, v in (("num_warps", choice.num_warps), ("num_stages", choice.num_stages)) if v is not None}
    _decode_attention_split_kernel[(b, kv_heads, part.shape[2])](
        q, k_arg, v_arg, k_scales, v_scales, page_table, slots, lengths, part, lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1),
        d ** -0.5,
        GROUP=h // kv_heads, GROUP_PAD=max(16, h // kv_heads), HEAD_DIM=d, PAGE=page, SPLIT_SIZE=choice.split,
        BLOCK=choice.block,
        # fp32 inputs, and the interpreter (whose bf16 tl.dot is wrong), dot in fp32
        DOT_FP32=q.dtype == torch.float32 or not q.is_cuda, KV_FP8=fp8, **launch, **launch_args(pdl),
    )


def combine(part: Tensor, lse: Tensor, dtype: torch.dtype, *, pdl: bool = False) -> Tensor:
    """Pass 2: merge the splits of part / lse into out [B, H, D]."""
    b, h, splits, d = part.shape
    out = torch.empty(b, h, d, device=part.device, dtype=dtype)
    _combine_kernel[(b, h)](
        part, lse, out,
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), HEAD_DIM=d, **launch_args(pdl),
    )
    return out


def stream_kv(cache: Tensor, page_table: Tensor, row, n: int) -> Tensor:
    """Positions [0, n) of page-table row `row`, gathered from its pages: [n, K, D]
    (packed FP8 caches stay packed)."""
    page = cache.shape[1]
    pages = page_table[row, : -(-n // page)].long()
    return cache[pages].flatten(0, 1)[:n]


def decode_attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, slots: Tensor, lengths: Tensor,
) -> Tensor:
    """The same function in plain PyTorch (fp32 math; packed FP8 caches dequantized)."""
    b, h, d = q.shape
    group = h // k_cache.shape[2]
    out = torch.empty_like(q)
    for i in range(b):
        n = int(lengths[i])
        k, v = (load_form(stream_kv(c, page_table, slots[i], n), torch.float32).repeat_interleave(group, dim=1)
                for c in (k_cache, v_cache))  # [n, H, D]
        scores = torch.einsum("hd,nhd->hn", q[i].float(), k) * d ** -0.5
        out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
