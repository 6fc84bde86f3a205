"""One token draw per row, in one launch: top-k, top-p, temperature, the Gumbel draw, and
for the semantic token the end-of-speech block and repetition-aware resampling (RAS).

    logits       [B, V]     one head's logits (any float dtype, unit inner stride)
    temperature  [B] fp32, top_p [B] fp32, top_k [B] int64 (1..MAX_TOP_K), seed [B] int64,
    step         [B] int64  the frame index (the noise counter)
    draw         int        the noise slot of this draw (engine/sampling.py RAS_DRAW etc.)
    -> token     [B] int64

The same function as engine/sampling.py's `sample_codebook` / `sample_semantic` without a
repetition penalty (S2 models use none), draw for draw: candidates in descending logit
order (ties by lower id), each dropped once the cumulative probability including it
exceeds top_p or its rank reaches top_k (the first always stays), scores logit /
temperature plus the Gumbel noise of (seed, frame, draw, rank), the argmax wins; greedy
rows (temperature 0) take the top candidate. The noise is made here from the same hash
as `gumbel_noise`, so no noise tensor goes through memory.

In PyTorch a draw is torch.topk (sorting 128 candidates out of 4,096: 29 us on an H200
at batch 1) and ~20 small kernels; 11 draws a frame at the S2 shape came to ~0.65 ms of a
7.3 ms decode step at batch 1 (latency_bench/profile_step.py). Here one program per row
walks the candidates from the top, one max-reduction each, and stops at the first that
top-k or top-p drops (for RAS, once both draws have stopped): a draw costs as many
reductions as it has live candidates, at most MAX_TOP_K.

Differences from the PyTorch path, by design: the cumulative probability is summed in
candidate order in fp32 (torch.cumsum may associate differently, so a candidate within
~1e-7 of the top_p boundary can fall on the other side), and tied logits are ordered by
token id (torch.topk leaves their order unspecified).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.pdl import launch_args, pdl_wait

# noise slots per frame: engine/sampling.py DRAWS_PER_FRAME (kernels import nothing of
# engine; tests/test_kernel_sample.py holds the two equal)
DRAWS_PER_FRAME = 64


@triton.jit
def _hash32(x):
    # engine/sampling.py _hash32: 3 rounds of xorshift-multiply on values < 2**32 (int64)
    for _ in tl.static_range(3):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return (x >> 16) ^ x


@triton.jit
def _gumbel(key, rank):
    bits = _hash32(key ^ _hash32(rank.to(tl.int64)))
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _sample_kernel(
    logits_ptr, temp_ptr, top_p_ptr, top_k_ptr, seed_ptr, step_ptr, allow_end_ptr, ras_ptr, window_ptr, out_ptr,
    stride_l, stride_w, stride_wi,
    vocab, window, draw, ras_draw, end_col,
    ras_temperature, ras_top_p,
    DRAWS: tl.constexpr, WINDOW_PAD: tl.constexpr, BLOCK: tl.constexpr, MAX_K: tl.constexpr, SEMANTIC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * stride_l + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    if SEMANTIC:  # end-of-speech blocked for rows that may not end
        allow_end = tl.load(allow_end_ptr + row) != 0
        x = tl.where((offs == end_col) & (~allow_end), float("-inf"), x)
    top = tl.max(x, axis=0)
    lse = top + tl.log(tl.sum(tl.exp(x - top), axis=0))
    # a sortable int64 per candidate: the logit's order-preserving int32 bits on top, the
    # inverted token id below (ties: lower id first); -inf and padding never get picked
    bits = x.to(tl.int32, bitcast=True)
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)
    keys = tl.where(x > float("-inf"), (ordered << 32) + (BLOCK - 1 - offs), -(2**63))

    temperature = tl.load(temp_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    greedy = temperature <= 0.0
    inv_t = 1.0 / tl.maximum(temperature, 1e-5)
    key = _hash32((seed & 0xFFFFFFFF) ^ _hash32(step * DRAWS + draw))
    ras_key = _hash32((seed & 0xFFFFFFFF) ^ _hash32(step * DRAWS + ras_draw))

    prev = tl.full([], 2**63 - 1, tl.int64)  # above every key
    cum = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_tok = tl.zeros([], tl.int64)
    hot_best = tl.full([], float("-inf"), tl.float32)
    hot_tok = tl.zeros([], tl.int64)
    live = tl.full([], 1, tl.int1)  # the draw still has candidates to look at
    hot_live = (tl.full([], 1, tl.int1) if SEMANTIC else tl.full([], 0, tl.int1)) & ~greedy
    rank = tl.zeros([], tl.int32)
    while (rank < MAX_K) & (live | hot_live):
        cur = tl.max(tl.where(keys < prev, keys, -(2**63)), axis=0)
        prev = cur
        o = (cur >> 32).to(tl.int32)
        val = (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        tok = BLOCK - 1 - (cur & 0xFFFFFFFF)
        cum += tl.exp(val - lse)
        first = rank == 0
        # no candidate left: a vocabulary smaller than top_k ran out, or a row of NaN / -inf
        # logits had none (then the token stays 0, in range: a broken row must not index
        # an embedding out of bounds)
        found = cur > -(2**63)
        in_k = (rank < top_k) & found
        keep = live & found & (first | ((cum <= top_p) & in_k))
        score = val * inv_t + _gumbel(key, rank)
        take = keep & (score > best)
        best = tl.where(take, score, best)
        best_tok = tl.where(take | (first & greedy & found), tok, best_tok)
        live = keep & ~greedy
        if SEMANTIC:  # the RAS redraw: temperature ras_temperature, top_p ras_top_p, same top_k
            hot_keep = hot_live & found & (first | ((cum <= ras_top_p) & in_k))
            hot_score = val / ras_temperature + _gumbel(ras_key, rank)
            hot_take = hot_keep & (hot_score > hot_best)
            hot_best = tl.where(hot_take, hot_score, hot_best)
            hot_tok = tl.where(hot_take, tok, hot_tok)
            hot_live = hot_keep
        rank += 1
    out = best_tok
    if SEMANTIC:  # resample a semantic token that is already in the stream's window
        w = tl.arange(0, WINDOW_PAD)
        recent = tl.load(window_ptr + row * stride_w + w * stride_wi, mask=w < window, other=-1)
        repeated = tl.max(tl.where(recent == best_tok, 1, 0), axis=0) > 0
        use_hot = repeated & (best_tok < end_col) & (tl.load(ras_ptr + row) != 0) & ~greedy
        out = tl.where(use_hot, hot_tok, best_tok)
    tl.store(out_ptr + row, out)


def _check(logits: Tensor, params) -> int:
    b = logits.shape[0]
    if logits.ndim != 2 or logits.stride(1) != 1 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a float [B, V] tensor with unit inner stride, got {logits.dtype} "
                         f"{list(logits.shape)} strides {logits.stride()}")
    for name, dtype in (("temperature", torch.float32), ("top_p", torch.float32), ("top_k", torch.int64),
                        ("seed", torch.int64)):
        t = getattr(params, name)
        if t.shape != (b,) or t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} [{b}], got {t.dtype} {list(t.shape)}")
    return b


def sample_tokens(
    logits: Tensor, params, step: Tensor, draw: int, max_top_k: int,
    semantic: tuple[Tensor, int, int, float, float] | None = None,
) -> Tensor:
    """See the module docstring. params: engine.sampling.SamplingTensors (its rows follow
    logits'). semantic: (window [B, W] int32, end column, RAS draw slot, RAS temperature,
    RAS top_p) for the slow head's draw, whose last column is end-of-speech."""
    b = _check(logits, params)
    if step.shape != (b,) or step.dtype != torch.int64:
        raise ValueError(f"step must be int64 [{b}]")
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if semantic is not None:
        window, end_col, ras_draw, ras_t, ras_p = semantic
        if window.ndim != 2 or window.shape[0] != b or window.dtype != torch.int32:
            raise ValueError(f"the window must be int32 [{b}, W], got {window.dtype} {list(window.shape)}")
        if end_col != logits.shape[1] - 1:
            raise ValueError("end-of-speech must be the last column of the semantic logits")
    else:
        window, end_col, ras_draw, ras_t, ras_p = logits, -1, 0, 1.0, 1.0  # unread
    if b:
        _sample_kernel[(b,)](
            logits, params.temperature, params.top_p, params.top_k, params.seed, step,
            params.allow_end, params.ras, window, out,
            logits.stride(0), window.stride(0), window.stride(1) if semantic is not None else 0,
            logits.shape[1], window.shape[1] if semantic is not None else 0, draw, ras_draw, end_col, ras_t, ras_p,
            DRAWS=DRAWS_PER_FRAME, WINDOW_PAD=triton.next_power_of_2(window.shape[1]) if semantic is not None else 1,
            BLOCK=triton.next_power_of_2(logits.shape[1]), MAX_K=max_top_k, SEMANTIC=semantic is not None,
            num_warps=8 if logits.shape[1] > 2048 else 4, **launch_args(),
        )
    return out


def self_check(device: torch.device | str, vocab: int, semantic_vocab: int, max_top_k: int) -> str | None:
    """Compile and run both draws once at the model's vocabularies against
    engine/sampling.py: None if every draw agrees, else why not (the caller keeps the
    PyTorch path). (kernels import nothing of engine at module level; this check does.)"""
    try:
        from engine.sampling import (
            RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P, SamplingParams, SamplingTensors, frame_gumbel, sample_codebook,
            sample_semantic,
        )

        params = SamplingTensors.from_params(
            [SamplingParams(temperature=t, top_p=p, top_k=k, seed=s) for t, p, k, s in
             ((0.7, 0.7, 30, 1), (0.0, 0.7, 30, 2), (1.0, 1.0, 0, 3))], device)
        g = torch.Generator().manual_seed(0)
        step = torch.tensor([3, 4, 5], device=device)
        noise = frame_gumbel(params, step, 2)
        logits = torch.randn(3, vocab, generator=g).to(device)
        want = sample_codebook(logits, params, torch.full((3, 1), -1, device=device), step, 1, noise[:, 1], False)
        got = sample_tokens(logits, params, step, 1, max_top_k)
        window = torch.full((3, 10), -1, dtype=torch.int32, device=device)
        head = torch.randn(3, semantic_vocab, generator=g).to(device)
        want_s = sample_semantic(head, params, window, step, semantic_vocab - 1, noise[:, 0], noise[:, 2], False)
        got_s = sample_tokens(head, params, step, 0, max_top_k, (window, semantic_vocab - 1, RAS_DRAW,
                                                                RAS_TEMPERATURE, RAS_TOP_P))
        if not (torch.equal(got, want) and torch.equal(got_s, want_s)):
            return f"sample_tokens drew {got.tolist()} / {got_s.tolist()}, the reference {want.tolist()} / {want_s.tolist()}"
        return None
    except Exception as e:  # a compile failure included
        return f"sample_tokens: {type(e).__name__}: {e}"
