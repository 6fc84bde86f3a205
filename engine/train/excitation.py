"""A source for source-filter synthesis: a band-limited harmonic pulse train at a given
F0, and noise, cut into the overlapping grains that an inverse-STFT head shapes and adds.

Measured, not used by the codec: scripts/voice/phase_probe.py resynthesizes teacher
speech from its own magnitude with this source's phase, and from a smoothed envelope
times this source (the ceiling of a decoder that predicts F0, voicing and an envelope).
Grains cut from one continuous source carry consistent phase by construction.

Shapes: F0 and voicing per frame [..., T]; grains [..., T, window]. Frame t's grain
covers samples [t * hop + offset, t * hop + offset + window) of the source, whose phase
advances by 2 pi F0_t / rate per sample across frame t's hop.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TWO_PI = 2.0 * math.pi


def frame_phases(f0: Tensor, rate: int, hop: int, phase0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The source's phase at the start of each frame (wrapped to [0, 2 pi)) and the phase
    after the last frame (the streaming state), from F0 [..., T] in Hz."""
    step = (TWO_PI * hop / rate) * f0.double()
    start = torch.zeros_like(step[..., :1]) if phase0 is None else phase0.double()[..., None]
    ends = start + torch.cumsum(step, dim=-1)
    starts = torch.cat([start, ends[..., :-1]], dim=-1)
    return torch.remainder(starts, TWO_PI).to(f0.dtype), torch.remainder(ends[..., -1], TWO_PI).to(f0.dtype)


def pulse_grains(f0: Tensor, starts: Tensor, rate: int, window: int, offset: int,
                 max_fraction: float = 0.45) -> Tensor:
    """Unit-power band-limited pulse trains: sum_{k=1..K} cos(k theta) / sqrt(K / 2), with
    theta the phase at each grain sample and K the harmonics below max_fraction x rate.
    f0, starts: [..., T] -> [..., T, window]. F0 must be > 0."""
    f0 = f0.float()
    n = torch.arange(window, device=f0.device, dtype=torch.float32) + offset
    omega = (TWO_PI / rate) * f0
    theta = torch.remainder(starts.float()[..., None] + omega[..., None] * n, TWO_PI)
    k = torch.floor(max_fraction * rate / f0).clamp(min=1.0)[..., None]
    half = 0.5 * theta
    s = torch.sin(half)
    # Dirichlet kernel: sum_{k<=K} cos(k theta) = sin((K + 1/2) theta) / (2 sin(theta / 2)) - 1/2;
    # at theta = 0 (mod 2 pi) the limit is K
    near = s.abs() < 1e-4
    d = torch.where(near, k, torch.sin((k + 0.5) * theta) / (2.0 * torch.where(near, torch.ones_like(s), s)) - 0.5)
    return d * torch.rsqrt(0.5 * k)


def harmonic_grains(f0: Tensor, voiced: Tensor, rate: int, hop: int, window: int, offset: int = 0,
                    phase0: Tensor | None = None) -> Tensor:
    """Voiced frames' pulse grains (zero where unvoiced); f0, voiced [..., T]."""
    starts, _ = frame_phases(f0, rate, hop, phase0)
    grains = pulse_grains(f0.clamp(min=20.0), starts, rate, window, offset)
    return grains * voiced.to(grains.dtype)[..., None]


def noise_grains(frames: int, window: int, generator: torch.Generator | None = None) -> Tensor:
    """[frames, window] unit-variance Gaussian noise grains (fp64)."""
    return torch.randn(frames, window, generator=generator, dtype=torch.float64)
