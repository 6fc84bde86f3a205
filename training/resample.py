"""Band-limited resampling in PyTorch (windowed-sinc polyphase, as torchaudio does), for the
machines where PyAV is not installed (the GPU image): 48 kHz Opus decodes -> the codec's
rate. Zero-phase: output sample j sits at input time j * from / to."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _kernel(orig: int, new: int, width: int, rolloff: float, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    cutoff = min(orig, new) * rolloff
    pad = math.ceil(width * orig / cutoff)
    # tap i of phase j reads input sample (j * orig / new) + i - pad
    t = torch.arange(-pad, pad + orig, dtype=torch.float64)[None, :] / orig - (
        torch.arange(new, dtype=torch.float64)[:, None] / new)
    t = t * cutoff
    window = torch.cos(t.clamp(-width, width) * math.pi / width / 2) ** 2  # Hann
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(math.pi * t) / (math.pi * t))
    return (kernel * window * cutoff / orig).to(dtype)[:, None, :], pad


def resample(x: torch.Tensor, orig: int, new: int, width: int = 16, rolloff: float = 0.95) -> torch.Tensor:
    """x: [..., T] float -> [..., ceil(T * new / orig)]."""
    if orig == new:
        return x
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    kernel, pad = _kernel(o, n, width, rolloff, torch.float32)
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1]).float()
    y = F.conv1d(F.pad(flat, (pad, pad + o)), kernel.to(x.device), stride=o)  # [N, n, frames]
    y = y.transpose(1, 2).reshape(flat.shape[0], -1)
    length = math.ceil(shape[-1] * n / o)
    return y[:, :length].reshape(*shape[:-1], length)
