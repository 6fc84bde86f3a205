"""Token sampling on the device, with no host sync.

- Order (upstream S2): top-k, then top-p over the untempered distribution (a token is
  dropped when the cumulative probability including it exceeds top_p; the first always
  stays), then temperature, then a draw.
- The draw is `argmax(log p - log E)` with E ~ Exp(1) (a Gumbel-style categorical draw).
  The noise is a counter-based hash of (stream seed, frame index, codebook, token), so
  a stream's samples do not depend on which other streams share its batch, and a fixed
  seed reproduces a run exactly.
- Repetition penalty (S1) over a window of previous tokens, per codebook.
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


def _hash32(x: Tensor) -> Tensor:
    # 32-bit integer mix (xorshift-multiply, 3 rounds) on int64 holding values < 2**32;
    # the multiplier is < 2**27, so products never overflow int64.
    for _ in range(3):
        x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def uniform_noise(seed: Tensor, step: Tensor, codebook: int, index: Tensor) -> Tensor:
    """Uniform (0, 1) noise per (stream, frame, codebook, token): [B, N] float32.

    seed, step: [B] int64; index: [B, N] int64 token indices."""
    key = _hash32((seed & _MASK32) ^ _hash32(step * 16 + codebook))  # [B]
    bits = _hash32(key[:, None] ^ _hash32(index & _MASK32))
    return (bits.float() + 0.5) / 4294967296.0


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


def _draw(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor,
    seed: Tensor, step: Tensor, codebook: int,
) -> Tensor:
    """One categorical draw per row after top-k / top-p / temperature: [B] int64."""
    logits = logits.float()
    k = min(MAX_TOP_K, logits.shape[-1])
    vals, idx = torch.topk(logits, k, dim=-1)  # sorted descending
    probs = torch.exp(vals - torch.logsumexp(logits, dim=-1, keepdim=True))
    rank = torch.arange(k, device=logits.device)[None, :]
    drop = (probs.cumsum(-1) > top_p[:, None]) | (rank >= top_k[:, None])
    drop[:, 0] = False
    temp = temperature.clamp(min=1e-5)[:, None]
    scores = torch.where(drop, float("-inf"), vals / temp)
    log_p = scores - torch.logsumexp(scores, dim=-1, keepdim=True)
    noise = uniform_noise(seed, step, codebook, idx)
    choice = torch.argmax(log_p - torch.log(-torch.log(noise)), dim=-1)
    sampled = idx.gather(1, choice[:, None])[:, 0]
    greedy = idx[:, 0]
    return torch.where(temperature > 0, sampled, greedy)


def sample_codebook(
    logits: Tensor, params: SamplingTensors, window: Tensor, step: Tensor, codebook: int
) -> Tensor:
    """Sample a residual code. logits: [B, V]; window: [B, W] previous codes of this
    codebook (-1 empty); step: [B] frame index per stream. Returns [B] int64."""
    presence = window_presence(window, logits.shape[-1])
    logits = apply_repetition_penalty(logits.float(), presence, params.repetition_penalty)
    return _draw(logits, params.temperature, params.top_p, params.top_k, params.seed, step, codebook)


def sample_semantic(
    logits: Tensor, params: SamplingTensors, window: Tensor, step: Tensor, num_semantic: int
) -> Tensor:
    """Sample the slow head's row. logits: [B, num_semantic + 1] (semantic tokens, then
    end-of-speech); window: [B, W] previous semantic codes (-1 empty). Returns [B] int64
    head rows: < num_semantic is a semantic code, == num_semantic is end-of-speech."""
    presence = window_presence(window, logits.shape[-1])
    logits = apply_repetition_penalty(logits.float(), presence, params.repetition_penalty)
    end_blocked = ~params.allow_end[:, None] & (torch.arange(logits.shape[-1], device=logits.device) == num_semantic)
    logits = logits.masked_fill(end_blocked, float("-inf"))
    normal = _draw(logits, params.temperature, params.top_p, params.top_k, params.seed, step, 0)
    hot = _draw(
        logits, torch.full_like(params.temperature, RAS_TEMPERATURE),
        torch.full_like(params.top_p, RAS_TOP_P), params.top_k, params.seed, step, 63,
    )
    repeated = presence.gather(1, normal[:, None])[:, 0] & (normal < num_semantic)
    use_hot = repeated & params.ras & (params.temperature > 0)
    return torch.where(use_hot, hot, normal)
