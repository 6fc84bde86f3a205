"""Attention over the paged KV state, in three modes, with the metadata each needs.

KV layout, per layer: a pool of pages [pages, P, K, Dh] (position-major inside a page, like
flash-attn's paged KV cache), and a page table [rows, max_pages] int32 shared by every
layer: row r's position p lives at page table[r, p // P], offset p % P (engine/kv_cache.py,
engine/pages.py). Streams of one voice point at the same pages for its prompt. An FP8
cache (`--kv-quant fp8`) is uint8 [pages, P, K, Dh + 16], e4m3 codes and a scale per
(position, head) (kernels/kv_fp8.py): new keys and values are packed where they are
written and unpacked where the PyTorch paths read them; the Triton kernels read the
codes directly. Writes go to flat positions page * P + offset of the pool.

- prefill: one stream (row `slot`) appends S positions starting at `start`.
- decode: B streams append one position each, stream b at (slots[b], positions[b]).
- fast: the fast transformer's per-frame scratch; row b of the batch, step `step` of
  the frame (the fast KV restarts every frame).

Decode attention has two implementations behind one switch (the plan's `attention`): the
plain-PyTorch reference (a gather of the batch's pages and a length mask over `kv_len`
positions), and the Triton kernel of kernels/decode_attention.py, which reads each row
through its page table only up to its own length (the GPU default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernel_plan import REFERENCE, KernelPlan
from kernels.decode_attention import decode_attention
from kernels.fast_attention import fast_attention
from kernels.kv_fp8 import is_packed, load_form, store_form
from kernels.kv_fp8_store import store_kv_fp8
from kernels.prefill_attention import prefill_attention


@dataclass(frozen=True, slots=True)
class PrefillMeta:
    slot: int  # page-table row of the stream
    start: int  # position of the first new token
    page_table: Tensor  # [rows, max_pages] int32
    plan: KernelPlan = REFERENCE


@dataclass(frozen=True, slots=True)
class BatchPrefillMeta:
    """Several streams each append their own number of positions (right-padded to S)."""

    slots: Tensor  # [B] int64 page-table rows
    starts: Tensor  # [B] int64 position of each stream's first new token
    lengths: Tensor  # [B] int64 real (unpadded) new tokens per stream
    kv_len: int  # attend over positions [0, kv_len); >= every start + length
    page_table: Tensor  # [rows, max_pages] int32
    # plan.attention: the Triton kernels read each query's row up to its own position, so
    # nothing depends on the host's lengths and the prefill can be captured in a CUDA
    # graph; plan.blocked_prefill: a block of a stream's new positions per program reading
    # each key block once for all of them (kernels/prefill_attention.py; bf16 / fp32
    # caches), else one decode query per position (the FP8 cache's path). Padded
    # positions write to the scratch page.
    plan: KernelPlan = REFERENCE


@dataclass(frozen=True, slots=True)
class DecodeMeta:
    slots: Tensor  # [B] int64, page-table row of each stream
    positions: Tensor  # [B] int64, position of each stream's new token
    kv_len: int  # attend over positions [0, kv_len); must exceed every positions[b]
    page_table: Tensor  # [rows, max_pages] int32
    # [B] int64, where each new position is written: page * P + offset (made once per step)
    flat: Tensor
    plan: KernelPlan = REFERENCE  # attention: the Triton kernel (reads each row to its length)
    # positions + 1, the kernel's per-row lengths: made once per step, not once per layer
    lengths: Tensor | None = None
    # the word-timestamp readout (engine/alignment.py AlignProbe): the selected layers add
    # their heads' attention over each row's text to its output; None: no readout
    align: object | None = None


@dataclass(frozen=True, slots=True)
class FastMeta:
    step: int  # 0 = slow hidden state, i = code i-1 (i < num_codebooks)
    plan: KernelPlan = REFERENCE  # step: attention through kernels/fast_attention.py


def flat_positions(page_table: Tensor, page_size: int, slots: Tensor, positions: Tensor) -> Tensor:
    """Where positions [...] of rows slots [...] live in the pool, as page * P + offset."""
    return page_table[slots, positions // page_size].long() * page_size + positions % page_size


def gather_rows(cache: Tensor, page_table: Tensor, slots: Tensor, length: int) -> Tensor:
    """The first `length` positions of rows `slots` ([B]), as a contiguous [B, length, K, Dh]."""
    page_size = cache.shape[1]
    pages = page_table[slots, : -(-length // page_size)].long()  # [B, n]
    return cache[pages].flatten(1, 2)[:, :length]


AttentionMeta = PrefillMeta | BatchPrefillMeta | DecodeMeta | FastMeta


def attend(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta
) -> Tensor:
    """q: [B, S, H, Dh]; k, v: [B, S, K, Dh] for the new positions. Writes k, v into the
    cache and returns the attention output [B, S, H, Dh]."""
    if isinstance(meta, DecodeMeta):
        return _decode(q, k, v, k_cache, v_cache, meta)
    if isinstance(meta, PrefillMeta):
        return _prefill(q, k, v, k_cache, v_cache, meta)
    if isinstance(meta, BatchPrefillMeta):
        return _prefill_batch(q, k, v, k_cache, v_cache, meta)
    return _fast(q, k, v, k_cache, v_cache, meta)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    # q: [B, S, H, Dh], k/v: [B, L, K, Dh] -> [B, S, H, Dh]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, is_causal=causal, enable_gqa=True,
    )
    return out.transpose(1, 2)


def _prefill(q, k, v, k_cache, v_cache, meta: PrefillMeta) -> Tensor:
    s, start = q.shape[1], meta.start
    end = start + s
    if end > meta.page_table.shape[1] * k_cache.shape[1]:
        raise ValueError(f"prefill to position {end} exceeds the page table's {meta.page_table.shape[1]} pages")
    slot = torch.tensor([meta.slot], device=q.device)
    flat = flat_positions(meta.page_table, k_cache.shape[1], slot, torch.arange(start, end, device=q.device))
    _write_rows(k_cache, flat, k[0], meta.plan)
    _write_rows(v_cache, flat, v[0], meta.plan)
    keys = load_form(gather_rows(k_cache, meta.page_table, slot, end), q.dtype)
    values = load_form(gather_rows(v_cache, meta.page_table, slot, end), q.dtype)
    if start == 0:
        return _sdpa(q, keys, values, None, causal=True)
    # query i sits at position start + i and sees keys 0..start + i
    q_pos = torch.arange(start, end, device=q.device)[:, None]
    mask = torch.arange(end, device=q.device)[None, :] <= q_pos
    return _sdpa(q, keys, values, mask)


def _prefill_batch(q, k, v, k_cache, v_cache, meta: BatchPrefillMeta) -> Tensor:
    b, s = q.shape[:2]
    page_size = k_cache.shape[1]
    j = torch.arange(s, device=q.device)
    valid = j[None, :] < meta.lengths[:, None]  # [B, S]
    pos = meta.starts[:, None] + j[None, :]  # [B, S]
    # padded positions go to the scratch page (page 0), each to its own offset
    at = flat_positions(meta.page_table, page_size, meta.slots[:, None], pos.clamp(max=meta.page_table.shape[1] * page_size - 1))
    flat = torch.where(valid, at, pos % page_size).flatten()
    _write_rows(k_cache, flat, k.flatten(0, 1), meta.plan)
    _write_rows(v_cache, flat, v.flatten(0, 1), meta.plan)
    plan = meta.plan
    if plan.attention and plan.blocked_prefill and not is_packed(k_cache):
        # padded positions' outputs are zeros
        return prefill_attention(q, k_cache, v_cache, meta.page_table, meta.slots, meta.starts, meta.lengths,
                                 max_length=meta.kv_len, pdl=plan.pdl)
    if plan.attention:
        # query (b, j) is a decode query of row slots[b] with length pos + 1: it sees the
        # keys up to its own position, this segment's included (written just above).
        # Padded queries read position 0 of their row.
        q_rows = meta.slots.repeat_interleave(s)
        q_lengths = torch.where(valid, pos + 1, 1).flatten()
        out = decode_attention(q.flatten(0, 1), k_cache, v_cache, meta.page_table, q_rows, q_lengths,
                               max_length=meta.kv_len, pdl=plan.pdl)
        return out.view(q.shape)
    keys = load_form(gather_rows(k_cache, meta.page_table, meta.slots, meta.kv_len), q.dtype)  # [B, kv_len, K, Dh]
    values = load_form(gather_rows(v_cache, meta.page_table, meta.slots, meta.kv_len), q.dtype)
    key_pos = torch.arange(meta.kv_len, device=q.device)
    mask = key_pos[None, None, :] <= pos[:, :, None]  # [B, S, kv_len]
    # padded queries attend to position 0 only (their output is never used; no NaN rows)
    mask = torch.where(valid[:, :, None], mask, key_pos[None, None, :] == 0)
    return _sdpa(q, keys, values, mask[:, None])


def _write_rows(cache: Tensor, flat: Tensor, x: Tensor, plan: KernelPlan) -> None:
    """x [N, K, Dh] into the pool's flat positions `flat` (page * P + offset). A packed
    FP8 cache on a GPU is written by one Triton launch (kernels/kv_fp8_store.py), not the
    ~10 of packing in PyTorch."""
    if cache.is_cuda and is_packed(cache):
        store_kv_fp8(x, cache, flat, pdl=plan.pdl)
        return
    cache.view(-1, *cache.shape[2:]).index_copy_(0, flat, store_form(x, cache))


def _decode(q, k, v, k_cache, v_cache, meta: DecodeMeta) -> Tensor:
    _write_rows(k_cache, meta.flat, k[:, 0], meta.plan)
    _write_rows(v_cache, meta.flat, v[:, 0], meta.plan)
    return decode_cached(q, k_cache, v_cache, meta)


def decode_cached(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: DecodeMeta) -> Tensor:
    """Decode attention over caches that already hold the new position. q: [B, 1, H, Dh]."""
    if meta.plan.attention:
        lengths = meta.lengths if meta.lengths is not None else meta.positions + 1
        out = decode_attention(q[:, 0], k_cache, v_cache, meta.page_table, meta.slots, lengths,
                               max_length=meta.kv_len, pdl=meta.plan.pdl)
        return out[:, None]
    keys = load_form(gather_rows(k_cache, meta.page_table, meta.slots, meta.kv_len), q.dtype)  # [B, kv_len, K, Dh]
    values = load_form(gather_rows(v_cache, meta.page_table, meta.slots, meta.kv_len), q.dtype)
    key_pos = torch.arange(meta.kv_len, device=q.device)
    mask = (key_pos[None, :] <= meta.positions[:, None])[:, None, None, :]  # [B, 1, 1, kv_len]
    return _sdpa(q, keys, values, mask)


def _fast(q, k, v, k_cache, v_cache, meta: FastMeta) -> Tensor:
    write_fast_kv(k, v, k_cache, v_cache, meta.step)
    return fast_cached(q, k_cache, v_cache, meta)


def write_fast_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, step: int) -> None:
    """k, v: [B, 1, K, Dh] into rows 0..B-1 of the fast cache at position `step`."""
    b = k.shape[0]
    k_cache[:b, step] = k[:, 0]
    v_cache[:b, step] = v[:, 0]


def fast_cached(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: FastMeta) -> Tensor:
    """Fast-transformer attention over caches that already hold step `meta.step`.
    q: [B, 1, H, Dh]."""
    b, step = q.shape[0], meta.step
    if meta.plan.step:
        return fast_attention(q[:, 0], k_cache, v_cache, step, pdl=meta.plan.pdl)[:, None]
    return _sdpa(q, k_cache[:b, : step + 1], v_cache[:b, : step + 1], None)
