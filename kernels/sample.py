"""One token draw per row, in one launch: top-k, top-p, temperature, the Gumbel draw, and
for the semantic token the end-of-speech block and repetition-aware resampling (RAS).

    logits       [B, V]     one head's logits (any float dtype, unit inner stride)
    temperature  [B] fp32, top_p [B] fp32, top_k [B] int64 (1..MAX_TOP_K), seed [B] int64,
    step         [B] int64  the frame index (the noise counter)
    draw         int        the noise slot of this draw (engine/sampling.py RAS_DRAW etc.)
    -> token     [B] int64

The same function as engine/sampling.py's `sample_codebook` / `sample_semantic` without a
repetition penalty (S2 models use none), draw for draw (`sample_tokens_reference` is it in
PyTorch, tested equal to them): candidates in descending logit order (ties by lower id), each dropped once the cumulative probability including it
exceeds top_p or its rank reaches top_k (the first always stays), scores logit /
temperature plus the Gumbel noise of (seed, frame, draw, rank), the argmax wins; greedy
rows (temperature 0) take the top candidate. The noise is made here from the same hash
as `gumbel_noise`, so no noise tensor goes through memory.

In PyTorch a draw is torch.topk and ~20 small kernels, 11 draws a frame at the S2 shape
(latency_bench/profile_step.py). Here one program per row does the draw, one of two ways
(the same draws; latency_bench/RESULTS.md, 'A sampled draw from gathered candidates'):
- the walk: the candidates from the top, one max-reduction over the whole row each,
  stopping at the first that top-k or top-p drops (for RAS, once both draws have
  stopped): as many dependent reductions as live candidates, up to top_k;
- gathered (the default for sampled rows): every key at or above the top_k-th largest of
  128 group maxima (a superset of the top_k candidates; ~34 of 4,096 for flat logits at
  top_k 30) goes to a few scratch slots of the row, is sorted there, and the draw is
  computed for all of them at once: what top-k and top-p keep is a prefix of the sorted
  order (both only ever turn false along it), so the walk's stops become masks over a
  cumulative sum. A row with more than GATHER_CAP such keys (a top_k near MAX_TOP_K
  over flat logits) walks instead. latency_bench/sample_bench.py times both.

Differences from the PyTorch path, by design: the cumulative probability is summed in
fp32, in candidate order by the walk and as a scan when gathered (torch.cumsum may
associate differently, so a candidate within ~1e-7 of the top_p boundary can fall on
the other side), and tied logits are ordered by token id (torch.topk leaves their order
unspecified).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.pdl import launch_args, pdl_wait

# noise slots per frame: engine/sampling.py DRAWS_PER_FRAME (kernels import nothing of
# engine; tests/test_kernel_sample.py holds the two equal)
DRAWS_PER_FRAME = 64
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class DrawParams:
    """The per-row settings sample_tokens reads, [B] tensors on the logits' device
    (engine.sampling.SamplingTensors has these fields and is passed as it is)."""

    temperature: Tensor  # float32, 0 = greedy
    top_p: Tensor  # float32
    top_k: Tensor  # int64, 1..max_top_k
    seed: Tensor  # int64
    allow_end: Tensor  # bool: end-of-speech may be drawn (semantic draws)
    ras: Tensor  # bool: repetition-aware resampling (semantic draws)


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
def _decode_key(cur, BLOCK: tl.constexpr):
    """(logit, token) of candidate keys (see _sample_kernel); NaN logits for no candidate."""
    o = (cur >> 32).to(tl.int32)
    val = (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return val, BLOCK - 1 - (cur & 0xFFFFFFFF)


@triton.jit
def _draw_by_walk(keys, lse, top_p, top_k, greedy, inv_t, key, ras_key, ras_temperature, ras_top_p,
                  BLOCK: tl.constexpr, MAX_K: tl.constexpr, SEMANTIC: tl.constexpr):
    """The candidates walked from the top, one max-reduction over all of `keys` each, until
    top-k or top-p drops one (for RAS, once both draws have). Returns (token, RAS token)."""
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
        val, tok = _decode_key(cur, BLOCK)
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
    return best_tok, hot_tok


@triton.jit
def _draw_sorted(cand, lse, top_p, top_k, inv_t, key, ras_key, ras_temperature, ras_top_p,
                 BLOCK: tl.constexpr, MAX_K: tl.constexpr, SEMANTIC: tl.constexpr, CAP: tl.constexpr):
    """The same draws for a sampled (not greedy) row over `cand` [CAP], a set of keys that
    holds every candidate top-k can keep (padded with -2**63), all at once: sorted, the cumulative probability as a scan,
    and what top-k / top-p keep is a prefix of the sorted order (both conditions only ever
    turn false along it), so the walk's stops are masks. Returns (token, RAS token)."""
    cur = tl.sort(cand, descending=True)
    rank = tl.arange(0, CAP)
    val, tok = _decode_key(cur, BLOCK)
    found = cur > -(2**63)
    cum = tl.cumsum(tl.where(found, tl.exp(val - lse), 0.0), axis=0)
    first = rank == 0
    in_k = (rank < top_k) & (rank < MAX_K) & found
    any_found = tl.max(found.to(tl.int32), axis=0) > 0
    keep = found & (first | ((cum <= top_p) & in_k))
    score = tl.where(keep, val * inv_t + _gumbel(key, rank), float("-inf"))
    pick = tl.argmax(score, axis=0)  # ties: the higher candidate, as the walk's strict >
    best_tok = tl.where(any_found, tl.sum(tl.where(rank == pick, tok, 0), axis=0), 0)
    hot_tok = tl.zeros([], tl.int64)
    if SEMANTIC:
        hot_keep = found & (first | ((cum <= ras_top_p) & in_k))
        hot_score = tl.where(hot_keep, val / ras_temperature + _gumbel(ras_key, rank), float("-inf"))
        hot_pick = tl.argmax(hot_score, axis=0)
        hot_tok = tl.where(any_found, tl.sum(tl.where(rank == hot_pick, tok, 0), axis=0), 0)
    return best_tok, hot_tok


@triton.jit
def _sample_kernel(
    logits_ptr, temp_ptr, top_p_ptr, top_k_ptr, seed_ptr, step_ptr, allow_end_ptr, ras_ptr, window_ptr, out_ptr,
    scratch_ptr,
    stride_l, stride_w, stride_wi,
    vocab, window, draw, ras_draw, end_col,
    ras_temperature, ras_top_p,
    DRAWS: tl.constexpr, WINDOW_PAD: tl.constexpr, BLOCK: tl.constexpr, MAX_K: tl.constexpr, SEMANTIC: tl.constexpr,
    GATHER: tl.constexpr, GROUPS: tl.constexpr, CAP: tl.constexpr, PDL: tl.constexpr = False,
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

    best_tok = tl.zeros([], tl.int64)
    hot_tok = tl.zeros([], tl.int64)
    walk = tl.full([], 1, tl.int1)
    if GATHER:
        if temperature > 0.0:  # (a greedy row's walk stops at its first candidate)
            # Every candidate top-k can keep is >= the top_k-th largest of the GROUPS group
            # maxima (top_k groups have a maximum at least that high). The keys at or above
            # it (for flat logits at top_k 30 and 4,096 tokens: ~34, at most ~45) are
            # gathered into this row's CAP scratch slots and drawn from all at once; more
            # than CAP of them (a top_k near MAX_K, a vocabulary of ties) take the walk
            # over all keys instead.
            groups = tl.max(tl.reshape(keys, (GROUPS, BLOCK // GROUPS)), axis=1)
            ranked = tl.sort(groups, descending=True)
            g = tl.arange(0, GROUPS)
            floor = tl.max(tl.where(g == tl.minimum(top_k, MAX_K) - 1, ranked, -(2**63)), axis=0)
            inside = (keys >= floor) & (keys > -(2**63))
            count = tl.sum(inside.to(tl.int32), axis=0)
            if count <= CAP:
                slot = tl.cumsum(inside.to(tl.int32), axis=0) - 1
                tl.store(scratch_ptr + row * CAP + slot, keys, mask=inside)
                tl.debug_barrier()  # every thread's gathered keys written before any is read back
                c = tl.arange(0, CAP)
                cand = tl.load(scratch_ptr + row * CAP + c, mask=c < count, other=-(2**63))
                best_tok, hot_tok = _draw_sorted(cand, lse, top_p, top_k, inv_t, key, ras_key, ras_temperature,
                                                 ras_top_p, BLOCK, MAX_K, SEMANTIC, CAP)
                walk = tl.full([], 0, tl.int1)
    if walk:
        best_tok, hot_tok = _draw_by_walk(keys, lse, top_p, top_k, greedy, inv_t, key, ras_key, ras_temperature,
                                          ras_top_p, BLOCK, MAX_K, SEMANTIC)
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


# the gathered draw: group maxima per row (the threshold's resolution) and the scratch
# slots a row gathers into (more candidates than this fall back to the walk)
GATHER_GROUPS = 128
GATHER_CAP = 256


def sample_tokens(
    logits: Tensor, params, step: Tensor, draw: int, max_top_k: int,
    semantic: tuple[Tensor, int, int, float, float] | None = None, gather: bool = True, *, pdl: bool = False,
) -> Tensor:
    """See the module docstring. params: DrawParams, or anything with its fields (its rows
    follow logits'). semantic: (window [B, W] int32, end column, RAS draw slot, RAS temperature,
    RAS top_p) for the slow head's draw, whose last column is end-of-speech. gather=False:
    always the walk over all keys (the benchmark's baseline; the same draws). `pdl`:
    kernels/pdl.py."""
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
    block = triton.next_power_of_2(logits.shape[1])
    cap = min(GATHER_CAP, block)
    scratch = torch.empty(b, cap, dtype=torch.int64, device=logits.device) if gather else out  # gathered keys
    if b:
        _sample_kernel[(b,)](
            logits, params.temperature, params.top_p, params.top_k, params.seed, step,
            params.allow_end, params.ras, window, out, scratch,
            logits.stride(0), window.stride(0), window.stride(1) if semantic is not None else 0,
            logits.shape[1], window.shape[1] if semantic is not None else 0, draw, ras_draw, end_col, ras_t, ras_p,
            DRAWS=DRAWS_PER_FRAME, WINDOW_PAD=triton.next_power_of_2(window.shape[1]) if semantic is not None else 1,
            BLOCK=block, MAX_K=max_top_k, SEMANTIC=semantic is not None,
            GATHER=gather, GROUPS=min(GATHER_GROUPS, block), CAP=cap,
            num_warps=8 if logits.shape[1] > 2048 else 4, **launch_args(pdl),
        )
    return out


def _hash32_torch(x: Tensor) -> Tensor:
    for _ in range(3):
        x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def _gumbel_by_rank(seed: Tensor, step: Tensor, draw: int, k: int) -> Tensor:
    """[B, k] fp32: the kernel's noise of (seed, frame, draw slot, candidate rank)."""
    key = _hash32_torch((seed & _MASK32) ^ _hash32_torch(step * DRAWS_PER_FRAME + draw))  # [B]
    bits = _hash32_torch(key[:, None] ^ _hash32_torch(torch.arange(k, device=seed.device))[None, :])
    return -torch.log(-torch.log(((bits >> 9).float() + 0.5) * (1.0 / 8388608.0)))


def _pick(vals: Tensor, idx: Tensor, probs: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor,
          gumbel: Tensor) -> Tensor:
    """One draw per row among the sorted candidates vals / idx / probs [B, k]."""
    rank = torch.arange(vals.shape[1], device=vals.device)[None, :]
    drop = ((probs.cumsum(-1) > top_p[:, None]) | (rank >= top_k[:, None])) & (rank > 0)
    scores = torch.where(drop, float("-inf"), vals / temperature.clamp(min=1e-5)[:, None]) + gumbel
    sampled = idx.gather(1, scores.argmax(-1, keepdim=True))[:, 0]
    return torch.where(temperature > 0, sampled, idx[:, 0])


def sample_tokens_reference(
    logits: Tensor, params, step: Tensor, draw: int, max_top_k: int,
    semantic: tuple[Tensor, int, int, float, float] | None = None,
) -> Tensor:
    """sample_tokens in plain PyTorch (the same draws; ties ordered by token id, the
    cumulative probability by torch.cumsum: module docstring)."""
    _check(logits, params)
    x = logits.float()
    if semantic is not None:
        window, end_col, ras_draw, ras_t, ras_p = semantic
        x = x.masked_fill((torch.arange(x.shape[1], device=x.device) == end_col) & ~params.allow_end[:, None],
                          float("-inf"))
    k = min(max_top_k, x.shape[1])
    vals, idx = (t[:, :k] for t in torch.sort(x, dim=-1, descending=True, stable=True))
    probs = torch.exp(vals - torch.logsumexp(x, dim=-1, keepdim=True))
    token = _pick(vals, idx, probs, params.temperature, params.top_p, params.top_k,
                  _gumbel_by_rank(params.seed, step, draw, k))
    if semantic is None:
        return token
    hot = _pick(vals, idx, probs, torch.full_like(params.temperature, ras_t), torch.full_like(params.top_p, ras_p),
                params.top_k, _gumbel_by_rank(params.seed, step, ras_draw, k))
    repeated = (window == token[:, None]).any(-1) & (token < end_col)
    return torch.where(repeated & params.ras & (params.temperature > 0), hot, token)


def self_check(device: torch.device | str, vocab: int, semantic_vocab: int, max_top_k: int, *,
               pdl: bool = False) -> str | None:
    """Compile and run both draws once at the model's vocabularies against
    sample_tokens_reference: None if every draw agrees, else why not (the caller keeps the
    PyTorch path)."""
    try:
        params = DrawParams(  # sampled, greedy, and every candidate kept (top_k at its cap, top_p 1)
            temperature=torch.tensor([0.7, 0.0, 1.0], device=device), top_p=torch.tensor([0.7, 0.7, 1.0], device=device),
            top_k=torch.tensor([30, 30, max_top_k], device=device), seed=torch.tensor([1, 2, 3], device=device),
            allow_end=torch.ones(3, dtype=torch.bool, device=device), ras=torch.ones(3, dtype=torch.bool, device=device))
        g = torch.Generator().manual_seed(0)
        step = torch.tensor([3, 4, 5], device=device)
        logits = torch.randn(3, vocab, generator=g).to(device)
        want = sample_tokens_reference(logits, params, step, 1, max_top_k)
        got = sample_tokens(logits, params, step, 1, max_top_k, pdl=pdl)
        head = torch.randn(3, semantic_vocab, generator=g).to(device)
        window = torch.full((3, 10), -1, dtype=torch.int32, device=device)
        window[:, 0] = head[:, :-1].argmax(-1).int()  # the likeliest token was just said: RAS redraws
        semantic = (window, semantic_vocab - 1, DRAWS_PER_FRAME - 1, 1.0, 0.9)
        want_s = sample_tokens_reference(head, params, step, 0, max_top_k, semantic)
        got_s = sample_tokens(head, params, step, 0, max_top_k, semantic, pdl=pdl)
        if not (torch.equal(got, want) and torch.equal(got_s, want_s)):
            return f"sample_tokens drew {got.tolist()} / {got_s.tolist()}, the reference {want.tolist()} / {want_s.tolist()}"
        return None
    except Exception as e:  # a compile failure included
        return f"sample_tokens: {type(e).__name__}: {e}"
