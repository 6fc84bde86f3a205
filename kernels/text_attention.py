"""Word-timestamp readout (issue 51): selected query heads' attention over each stream's
segment text, read through the paged KV cache inside the decode step.

For row b (page-table row slots[b]) the text is positions [start, start + n) of its KV,
(start, n) = spans[slots[b]] (n = 0: no readout, zeros). For each selected head h of this
layer (KV head h // G) the kernel returns the softmax of the scaled scores q_h . k_t over
those n positions alone (normalized over the text, not the whole context: which text
token the head looks at, whatever else it attends to), zeros past n:

    q         [B, H, D]                  the step's queries (after norm and RoPE)
    k_cache   [num_pages, P, K, D]       this layer's key pages (not FP8-packed)
    page_table [rows, max_pages] int32
    slots     [B] int64
    spans     [rows, 2] int64           (text start, text length <= T) per page-table row
    heads     [S] int64                 the selected query heads
    -> out    [B, S, T] fp32

The work is S x n keys per row, read once for the max and sum and once more for the
probabilities (from L2): a few kilobytes a row, next to the step's whole-context reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.kv_fp8 import load_form
from kernels.pdl import launch_args, pdl_wait
from kernels.selfcheck import mismatch

BLOCK_T = 64


@triton.jit
def _text_scores(q, k_ptr, table_row, start, n, offs, kvh, stride_kp, stride_kpos, stride_kh, offs_d, scale,
                 PAGE: tl.constexpr):
    valid = offs < n
    pos = start + offs
    page = tl.load(table_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
    k = tl.load(k_ptr + page[:, None] * stride_kp + (pos % PAGE)[:, None] * stride_kpos + kvh * stride_kh
                + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    scores = tl.sum(k * q[None, :], axis=1) * scale  # no tl.dot: one query row
    return tl.where(valid, scores, float("-inf")), valid


@triton.jit
def _text_attention_kernel(
    q_ptr, k_ptr, table_ptr, slots_ptr, spans_ptr, heads_ptr, out_ptr,
    stride_qb, stride_qh, stride_kp, stride_kpos, stride_kh, stride_t, stride_sr, stride_ob, stride_os,
    scale, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, T: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.program_id(1)
    pdl_wait(PDL)
    slot = tl.load(slots_ptr + b)
    start = tl.load(spans_ptr + slot * stride_sr)
    n = tl.minimum(tl.load(spans_ptr + slot * stride_sr + 1), T)
    h = tl.load(heads_ptr + s)
    kvh = h // GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
    table_row = table_ptr + slot * stride_t
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)  # fp32 scalars, as the loop makes them
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for t0 in range(0, T, BLOCK):
        offs = t0 + tl.arange(0, BLOCK)
        scores, _ = _text_scores(q, k_ptr, table_row, start, n, offs, kvh, stride_kp, stride_kpos, stride_kh, offs_d,
                                 scale, PAGE)
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(scores - m_safe), axis=0)
        m = m_new
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    inv = 1.0 / tl.where(l > 0, l, 1.0)  # no text: every p below is 0 anyway
    for t0 in range(0, T, BLOCK):
        offs = t0 + tl.arange(0, BLOCK)
        scores, valid = _text_scores(q, k_ptr, table_row, start, n, offs, kvh, stride_kp, stride_kpos, stride_kh,
                                     offs_d, scale, PAGE)
        p = tl.where(valid, tl.exp(scores - m_safe) * inv, 0.0)
        tl.store(out_ptr + b * stride_ob + s * stride_os + offs, p, mask=offs < T)


def text_attention(q: Tensor, k_cache: Tensor, page_table: Tensor, slots: Tensor, spans: Tensor, heads: Tensor,
                   tokens: int, *, pdl: bool = False) -> Tensor:
    """See the module docstring; `tokens` is T (a multiple of 64)."""
    b, h, d = q.shape
    page, kv_heads = k_cache.shape[1:3]
    if k_cache.dtype == torch.uint8 or k_cache.shape[3] != d or h % kv_heads or d & (d - 1) or tokens % BLOCK_T:
        raise ValueError(f"text_attention takes unpacked caches of q's head dim, T a multiple of {BLOCK_T}; got "
                         f"q {tuple(q.shape)}, cache {tuple(k_cache.shape)} {k_cache.dtype}, T {tokens}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or page_table.dtype != torch.int32:
        raise ValueError("the head dim must be contiguous and the page table int32")
    out = torch.empty(b, heads.shape[0], tokens, device=q.device, dtype=torch.float32)
    _text_attention_kernel[(b, heads.shape[0])](
        q, k_cache, page_table, slots, spans, heads, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), page_table.stride(0),
        spans.stride(0), out.stride(0), out.stride(1),
        d ** -0.5, GROUP=h // kv_heads, HEAD_DIM=d, PAGE=page, T=tokens, BLOCK=BLOCK_T, **launch_args(pdl),
    )
    return out


def text_attention_reference(q: Tensor, k_cache: Tensor, page_table: Tensor, slots: Tensor, spans: Tensor,
                             heads: Tensor, tokens: int) -> Tensor:
    """The same in PyTorch, batched and without host syncs (the CPU's path and the FP8
    cache's, which it dequantizes)."""
    b, h, d = q.shape
    page, kv_heads = k_cache.shape[1:3]
    span = spans[slots]  # [B, 2]
    offs = torch.arange(tokens, device=q.device)
    valid = offs[None, :] < span[:, 1:2].clamp(max=tokens)  # [B, T]
    pos = (span[:, :1] + offs[None, :]).clamp(max=page_table.shape[1] * page - 1)
    flat = page_table[slots[:, None], pos // page].long() * page + pos % page
    keys = load_form(k_cache.view(-1, *k_cache.shape[2:])[flat], torch.float32)  # [B, T, K, D]
    keys = keys[:, :, heads // (h // kv_heads)]  # [B, T, S, D]
    scores = torch.einsum("bsd,btsd->bst", q[:, heads].float(), keys) * d ** -0.5
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    # a row without text: all -inf, whose softmax is NaN; zeros instead
    return torch.where(valid[:, None, :], scores.softmax(-1), 0.0)


def self_check(device: torch.device | str, dtype: torch.dtype, n_head: int, n_kv_heads: int, head_dim: int,
               page: int, tokens: int) -> str | None:
    """Compile and run once at the model's attention shape (every head selected, spans that
    cross pages, are cut at `tokens`, or are empty) against the reference: None if they
    agree, else why not (the caller keeps the PyTorch readout)."""
    try:
        g = torch.Generator().manual_seed(0)
        rows, pages = 3, -(-(tokens + 2 * page) // page)
        q = torch.randn(rows, n_head, head_dim, generator=g).to(device, dtype)
        k_cache = (3 * torch.randn(1 + rows * pages, page, n_kv_heads, head_dim, generator=g)).to(device, dtype)
        table = (1 + torch.randperm(rows * pages, generator=g)).view(rows, pages).to(device, torch.int32)
        slots = torch.tensor([2, 0, 1], device=device)
        spans = torch.tensor([[page - 3, tokens + 5], [1, 0], [page + 1, tokens // 2 + 1]], device=device)
        heads = torch.arange(n_head, device=device)
        got = text_attention(q, k_cache, table, slots, spans, heads, tokens)
        want = text_attention_reference(q, k_cache, table, slots, spans, heads, tokens)
        return mismatch("text_attention", got, want, dtype)
    except Exception as e:  # a compile failure included
        return f"text_attention: {type(e).__name__}: {e}"
