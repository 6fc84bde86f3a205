"""Token sampling on the device, with no host sync.

- Order (upstream S2): top-k, then top-p over the untempered distribution (a token is
  dropped when the cumulative probability including it exceeds top_p; the first always
  stays), then temperature, then a draw.
- The draw is `argmax(log p + G)` with G ~ Gumbel(0, 1) (upstream: `argmax(p / E)`,
  E ~ Exp(1): the same categorical draw). The noise is a counter-based hash of (stream
  seed, frame index, draw, candidate rank), so a stream's samples do not depend on which
  other streams share its batch, a fixed seed reproduces a run exactly, and a frame's
  noise for all its draws is made in one go before it (frame_gumbel).
- Repetition penalty (S1) over a window of previous tokens, per codebook; S2 models do
  not use it (upstream S2 has RAS instead), and their frame step skips it.
- Repetition-aware resampling (S2): when the sampled semantic token is in the stream's
  window, it is redrawn at temperature 1.0 / top-p 0.9.
- Greedy rows (temperature 0) take the argmax.

All inputs are batched per stream ([B] tensors), so one call serves a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Candidates kept per row before top-p. Requests ask for top_k <= MAX_TOP_K; top_k 0
# means "no top-k" and keeps all MAX_TOP_K candidates. Upstream S2 uses top_k 30.
MAX_TOP_K = 128

RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.9


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings (host side)."""

    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.7
    top_k: int = 30
    repetition_penalty: float = 1.0  # S1-style penalty over the window; 1.0 = off
    ras: bool = True  # S2 repetition-aware resampling of the semantic token
    seed: int = 0
    allow_end: bool = True  # False: end-of-speech is never sampled (fixed-length runs)

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be in [0, {MAX_TOP_K}] (0 = off)")
        if not 0.5 <= self.repetition_penalty <= 2.0:
            raise ValueError("repetition_penalty must be in [0.5, 2]")
        if not 0 <= self.seed < 2**31:
            raise ValueError("seed must be in [0, 2**31)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class SamplingTensors:
    """Device-side batch of sampling settings; rows follow the decode batch."""

    temperature: Tensor  # [B] float32 (0 = greedy)
    top_p: Tensor  # [B] float32
    top_k: Tensor  # [B] int64, 1..MAX_TOP_K
    repetition_penalty: Tensor  # [B] float32
    ras: Tensor  # [B] bool
    seed: Tensor  # [B] int64
    allow_end: Tensor  # [B] bool

    @classmethod
    def allocate(cls, batch: int, device: torch.device | str) -> "SamplingTensors":
        z = dict(device=device)
        return cls(
            temperature=torch.zeros(batch, dtype=torch.float32, **z),
            top_p=torch.ones(batch, dtype=torch.float32, **z),
            top_k=torch.full((batch,), MAX_TOP_K, dtype=torch.int64, **z),
            repetition_penalty=torch.ones(batch, dtype=torch.float32, **z),
            ras=torch.zeros(batch, dtype=torch.bool, **z),
            seed=torch.zeros(batch, dtype=torch.int64, **z),
            allow_end=torch.ones(batch, dtype=torch.bool, **z),
        )

    def gather(self, idx: Tensor) -> "SamplingTensors":
        """Rows `idx` (a decode batch) of per-slot settings."""
        return SamplingTensors(*(getattr(self, f)[idx] for f in _FIELDS))

    def rows(self, sl: slice) -> "SamplingTensors":
        """A view of rows `sl` (no copy)."""
        return SamplingTensors(*(getattr(self, f)[sl] for f in _FIELDS))

    def scatter_(self, idx: Tensor, src: "SamplingTensors") -> None:
        """Rows idx of every setting from src's rows, in place (device side, no host sync)."""
        for f in _FIELDS:
            getattr(self, f).index_copy_(0, idx, getattr(src, f))

    def copy_(self, src: "SamplingTensors", non_blocking: bool = False) -> None:
        for f in _FIELDS:
            getattr(self, f).copy_(getattr(src, f), non_blocking=non_blocking)

    def pin_memory(self) -> "SamplingTensors":
        return SamplingTensors(*(getattr(self, f).pin_memory() for f in _FIELDS))

    def set_row(self, row: int, p: SamplingParams) -> None:
        values = (p.temperature, p.top_p, p.top_k or MAX_TOP_K, p.repetition_penalty, p.ras, p.seed, p.allow_end)
        for name, value in zip(_FIELDS, values):
            getattr(self, name)[row] = value

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device | str) -> "SamplingTensors":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k or MAX_TOP_K for p in params], dtype=torch.int64, device=device),
            repetition_penalty=torch.tensor(
                [p.repetition_penalty for p in params], dtype=torch.float32, device=device
            ),
            ras=torch.tensor([p.ras for p in params], dtype=torch.bool, device=device),
            seed=torch.tensor([p.seed for p in params], dtype=torch.int64, device=device),
            allow_end=torch.tensor([p.allow_end for p in params], dtype=torch.bool, device=device),
        )


_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "ras", "seed", "allow_end")
_MASK32 = 0xFFFFFFFF
# Noise slots of one frame: 0 the semantic token, 1..C-1 the residual codes, RAS_DRAW the
# repetition-aware redraw of the semantic token (so at most 63 codebooks).
RAS_DRAW = 63
DRAWS_PER_FRAME = 64


def _hash32(x: Tensor) -> Tensor:
    # 32-bit integer mix (xorshift-multiply, 3 rounds) on int64 holding values < 2**32;
    # the multiplier is < 2**27, so products never overflow int64.
    for _ in range(3):
        x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def gumbel_noise(seed: Tensor, step: Tensor, draws: Tensor, k: int) -> Tensor:
    """Gumbel(0, 1) noise per (stream, frame, draw, candidate rank): [B, D, k] float32.

    seed, step: [B] int64; draws: [D] int64 noise slots (see RAS_DRAW). The noise is
    indexed by the rank of a candidate after top-k, not by its token id: iid noise on
    the sorted candidates gives the same categorical draw, and it depends on nothing the
    model computed, so one call before the frame serves every draw of it (~45 integer
    kernels once instead of once per draw)."""
    key = _hash32((seed & _MASK32)[:, None] ^ _hash32(step[:, None] * DRAWS_PER_FRAME + draws[None, :]))  # [B, D]
    rank = _hash32(torch.arange(k, device=seed.device))  # [k]
    return -torch.log(-torch.log(uniform_open(_hash32(key[:, :, None] ^ rank[None, None, :]))))


def uniform_open(bits: Tensor) -> Tensor:
    """32 random bits (int64 < 2**32) -> float32 uniform on the open interval (0, 1).

    From the top 23 bits: (n + 0.5) / 2**23 is exact in float32 and at most 1 - 2**-24,
    the largest float32 below 1. Converting all 32 bits rounds the largest ~128 values up
    to 2**32, i.e. u = 1.0 and an infinite Gumbel draw (about once per 2**25 candidates:
    every few minutes of audio), which makes the argmax pick a dropped candidate."""
    return ((bits >> 9).float() + 0.5) * (1.0 / 8388608.0)


def frame_gumbel(params: SamplingTensors, step: Tensor, num_codebooks: int) -> Tensor:
    """All the noise of one frame's draws, made once before it: [B, C + 1, MAX_TOP_K];
    rows 0..C-1 for the semantic token and the residual codes, row C for the RAS redraw
    (noise slot RAS_DRAW). Built on the device alone (CUDA-graph safe)."""
    if num_codebooks >= RAS_DRAW:
        raise ValueError(f"at most {RAS_DRAW - 1} codebooks")
    slots = torch.arange(num_codebooks + 1, device=step.device)
    slots = torch.where(slots == num_codebooks, RAS_DRAW, slots)
    return gumbel_noise(params.seed, step, slots, MAX_TOP_K)


def window_presence(window: Tensor, vocab: int) -> Tensor:
    """[B, W] int token window (-1 = empty) -> [B, vocab] bool 'appears in window'."""
    b = window.shape[0]
    # empty entries (-1) and codes outside this head's rows go to a discarded column
    idx = torch.where((window >= 0) & (window < vocab), window.long(), vocab)
    present = torch.zeros(b, vocab + 1, dtype=torch.bool, device=window.device)
    present.scatter_(1, idx, True)
    return present[:, :vocab]


def apply_repetition_penalty(logits: Tensor, presence: Tensor, penalty: Tensor) -> Tensor:
    pen = penalty[:, None]
    penalized = torch.where(logits < 0, logits * pen, logits / pen)
    return torch.where(presence, penalized, logits)


def _candidates(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Top-MAX_TOP_K candidates of each row: values [B, k] (sorted descending), token
    ids [B, k], and their probabilities under the untempered distribution."""
    logits = logits.float()
    vals, idx = torch.topk(logits, min(MAX_TOP_K, logits.shape[-1]), dim=-1)
    probs = torch.exp(vals - torch.logsumexp(logits, dim=-1, keepdim=True))
    return vals, idx, probs


def _pick(
    cands: tuple[Tensor, Tensor, Tensor], temperature: Tensor, top_p: Tensor, top_k: Tensor, gumbel: Tensor,
) -> Tensor:
    """One categorical draw per row among the candidates after top-k / top-p /
    temperature: [B] int64 token ids. gumbel: [B, >= k] noise by rank."""
    vals, idx, probs = cands
    k = vals.shape[-1]
    rank = torch.arange(k, device=vals.device)[None, :]
    # the first candidate always stays: a row never ends up with nothing to draw
    drop = ((probs.cumsum(-1) > top_p[:, None]) | (rank >= top_k[:, None])) & (rank > 0)
    scores = torch.where(drop, float("-inf"), vals / temperature.clamp(min=1e-5)[:, None])
    # argmax(log_softmax(scores) + g) == argmax(scores + g): the normalizer is per row
    choice = torch.argmax(scores + gumbel[:, :k], dim=-1)
    sampled = idx.gather(1, choice[:, None])[:, 0]
    return torch.where(temperature > 0, sampled, idx[:, 0])


def _gumbel_or_own(gumbel: Tensor | None, params: SamplingTensors, step: Tensor, draw: int) -> Tensor:
    if gumbel is not None:
        return gumbel
    slot = torch.full((1,), draw, dtype=torch.long, device=step.device)  # no host data: graph safe
    return gumbel_noise(params.seed, step, slot, MAX_TOP_K)[:, 0]


def sample_codebook(
    logits: Tensor, params: SamplingTensors, window: Tensor, step: Tensor, codebook: int,
    gumbel: Tensor | None = None, penalize: bool = True,
) -> Tensor:
    """Sample a residual code. logits: [B, V]; window: [B, W] previous codes of this
    codebook (-1 empty); step: [B] frame index per stream. Returns [B] int64.
    gumbel: this draw's noise [B, MAX_TOP_K] (frame_gumbel(...)[:, codebook]), else made
    here; penalize=False skips the repetition penalty (models that do not use it)."""
    if penalize:
        presence = window_presence(window, logits.shape[-1])
        logits = apply_repetition_penalty(logits.float(), presence, params.repetition_penalty)
    cands = _candidates(logits)
    return _pick(cands, params.temperature, params.top_p, params.top_k, _gumbel_or_own(gumbel, params, step, codebook))


def sample_semantic(
    logits: Tensor, params: SamplingTensors, window: Tensor, step: Tensor, num_semantic: int,
    gumbel: Tensor | None = None, ras_gumbel: Tensor | None = None, penalize: bool = True,
) -> Tensor:
    """Sample the slow head's row. logits: [B, num_semantic + 1] (semantic tokens, then
    end-of-speech); window: [B, W] previous semantic codes (-1 empty). Returns [B] int64
    head rows: < num_semantic is a semantic code, == num_semantic is end-of-speech.
    gumbel / ras_gumbel: the noise of the draw and of the RAS redraw ([B, MAX_TOP_K]),
    else made here."""
    presence = window_presence(window, logits.shape[-1])  # also what RAS checks
    logits = logits.float()
    if penalize:
        logits = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    end_blocked = ~params.allow_end[:, None] & (torch.arange(logits.shape[-1], device=logits.device) == num_semantic)
    cands = _candidates(logits.masked_fill(end_blocked, float("-inf")))  # shared by both draws
    normal = _pick(cands, params.temperature, params.top_p, params.top_k, _gumbel_or_own(gumbel, params, step, 0))
    hot = _pick(
        cands, torch.full_like(params.temperature, RAS_TEMPERATURE), torch.full_like(params.top_p, RAS_TOP_P),
        params.top_k, _gumbel_or_own(ras_gumbel, params, step, RAS_DRAW),
    )
    repeated = presence.gather(1, normal[:, None])[:, 0] & (normal < num_semantic)
    use_hot = repeated & params.ras & (params.temperature > 0)
    return torch.where(use_hot, hot, normal)
