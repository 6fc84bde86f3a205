"""F0 and voicing of training audio, per codec hop, for scripts/voice/phase_probe.py (with
engine/train/excitation.py, the source of its source-phase and source-filter variants;
no codec uses either). Autocorrelation over a 46 ms Hann window (by FFT, divided by the
window's own autocorrelation), the first lag within 85% of the best peak (multiples of
the period score as high), refined by a parabola. Built for clean single-voice speech;
batched, runs on the training device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def track_f0(x: Tensor, rate: int, hop: int, frames: int | None = None, fmin: float = 60.0, fmax: float = 450.0,
             threshold: float = 0.5, window_s: float = 0.046) -> tuple[Tensor, Tensor]:
    """x [N] or [B, N] -> (f0 Hz, voiced) [(B,) frames], frame t centred on sample t * hop.
    Unvoiced frames get the nearest voiced frame's F0 (a plausible rate for a source
    that keeps running), or 100 Hz where nothing is voiced."""
    squeeze = x.dim() == 1
    x = x[None] if squeeze else x
    x = x.float()
    w = int(window_s * rate) // 2 * 2
    frames = frames if frames is not None else x.shape[-1] // hop + 1
    padded = F.pad(x[:, None], (w // 2, w // 2 + frames * hop), mode="constant")[:, 0]
    seg = padded.unfold(-1, w, hop)[:, :frames]  # [B, T, w]
    seg = seg - seg.mean(-1, keepdim=True)
    energy = seg.pow(2).sum(-1)
    win = torch.hann_window(w, device=x.device)
    spec = torch.fft.rfft(seg * win, 2 * w)
    ac = torch.fft.irfft(spec.abs().pow(2), 2 * w)[..., :w]
    taper = torch.fft.irfft(torch.fft.rfft(win, 2 * w).abs().pow(2), 2 * w)[:w]
    r = ac / (ac[..., :1] + 1e-9) / (taper / taper[0] + 1e-3)
    lo, hi = int(rate / fmax), int(rate / fmin)
    band = r[..., lo:hi]
    peak = band.max(-1).values
    first = torch.argmax((band >= 0.85 * peak[..., None]).int(), dim=-1)
    # the top of the peak that starts at `first` (search a quarter period ahead)
    reach = torch.arange(max(2, lo // 4 + 1), device=x.device)
    idx = (first[..., None] + reach).clamp(max=band.shape[-1] - 1)
    best = first + torch.argmax(band.gather(-1, idx), dim=-1)
    # parabolic refinement around the best lag
    b0 = band.gather(-1, (best - 1).clamp(min=0)[..., None])[..., 0]
    b1 = band.gather(-1, best[..., None])[..., 0]
    b2 = band.gather(-1, (best + 1).clamp(max=band.shape[-1] - 1)[..., None])[..., 0]
    denom = b0 - 2 * b1 + b2
    shift = torch.where(denom.abs() > 1e-6, 0.5 * (b0 - b2) / denom, torch.zeros_like(denom)).clamp(-0.5, 0.5)
    lag = lo + best.float() + shift
    f0 = rate / lag
    loud = energy > energy.amax(-1, keepdim=True) * 1e-3
    voiced = (peak > threshold) & loud
    f0 = _fill_unvoiced(f0, voiced)
    return (f0[0], voiced[0]) if squeeze else (f0, voiced)


def _fill_unvoiced(f0: Tensor, voiced: Tensor) -> Tensor:
    """Each unvoiced frame takes the last voiced frame's F0 (before the first: the first's)."""
    b, t = f0.shape
    idx = torch.arange(t, device=f0.device).expand(b, t)
    last = torch.where(voiced, idx, torch.full_like(idx, -1)).cummax(-1).values
    nxt = torch.where(voiced, idx, torch.full_like(idx, t)).flip(-1).cummin(-1).values.flip(-1)
    pick = torch.where(last >= 0, last, nxt).clamp(max=t - 1)
    out = f0.gather(-1, pick)
    return torch.where(voiced.any(-1, keepdim=True), out, torch.full_like(out, 100.0))
