"""Reconstruction losses of the codec: multi-scale log-mel L1 (DAC's recipe: seven STFT
window lengths from 32 to 2048 samples, 5 to 320 mel bands; the short windows constrain
timing and, indirectly, phase, the long ones pitch harmonics) and a multi-resolution
STFT loss (log magnitude L1 + spectral convergence); for the "istft" decoder, the head's
own log-magnitude against the target's spectrum on the same causal frames."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MEL_WINDOWS = (32, 64, 128, 256, 512, 1024, 2048)
MEL_BANDS = (5, 10, 20, 40, 80, 160, 320)
STFT_WINDOWS = (512, 1024, 2048)


def mel_filterbank(rate: int, n_fft: int, n_mels: int) -> Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters on the HTK mel scale, 0 Hz to Nyquist."""
    def to_mel(f: Tensor) -> Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    edges_mel = torch.linspace(0.0, float(to_mel(torch.tensor(rate / 2.0))), n_mels + 2)
    edges = 700.0 * (10.0 ** (edges_mel / 2595.0) - 1.0)
    freqs = torch.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    lower = (freqs[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None]) / (edges[2:, None] - edges[1:-1, None])
    return torch.clamp(torch.minimum(lower, upper), min=0.0)


def magnitude(x: Tensor, window: int) -> Tensor:
    """x: [B, T] -> |STFT| [B, F, frames] (hop window/4, Hann), in fp32."""
    w = torch.hann_window(window, device=x.device, dtype=torch.float32)
    spec = torch.stft(x.float(), n_fft=window, hop_length=window // 4, win_length=window, window=w,
                      center=True, return_complex=True)
    return spec.abs()


class ReconstructionLoss(nn.Module):
    def __init__(self, rate: int, mel_windows=MEL_WINDOWS, mel_bands=MEL_BANDS, stft_windows=STFT_WINDOWS) -> None:
        super().__init__()
        self.mel_windows, self.stft_windows = tuple(mel_windows), tuple(stft_windows)
        for w, n in zip(self.mel_windows, mel_bands):
            self.register_buffer(f"mel_{w}", mel_filterbank(rate, w, n), persistent=False)

    def log_mel(self, x: Tensor, window: int) -> Tensor:
        """x [B, T] -> log10 mel spectrogram [B, bands, frames] at one of mel_windows."""
        return torch.log10((getattr(self, f"mel_{window}") @ magnitude(x, window)).clamp(min=1e-5))

    def mel(self, y: Tensor, x: Tensor) -> Tensor:
        total = y.new_zeros((), dtype=torch.float32)
        for w in self.mel_windows:
            total = total + F.l1_loss(self.log_mel(y, w), self.log_mel(x, w))
        return total / len(self.mel_windows)

    def stft(self, y: Tensor, x: Tensor) -> Tensor:
        total = y.new_zeros((), dtype=torch.float32)
        for w in self.stft_windows:
            sy, sx = magnitude(y, w), magnitude(x, w)
            convergence = torch.linalg.norm(sy - sx) / torch.linalg.norm(sx).clamp(min=1e-6)
            log_mag = F.l1_loss(torch.log(sy.clamp(min=1e-5)), torch.log(sx.clamp(min=1e-5)))
            total = total + convergence + log_mag
        return total / len(self.stft_windows)


HEAD_FLOOR = 1e-4  # magnitudes below this (~-80 dB of full scale per bin) count as this


def frame_spectrum(x: Tensor, window: Tensor, hop: int, lookahead: int = 0) -> Tensor:
    """x [B, T] (T a multiple of hop) -> rfft(window * frame) of the "istft" head's frames:
    frame t covers samples [(t - lookahead) * hop, (t - lookahead) * hop + n_fft) (zeros
    outside x): complex [B, T / hop, n_fft // 2 + 1]. `window` is the head's analysis
    window (SpectralHead.analysis_window): with this spectrum's own phase, the head's
    synthesis gives x back."""
    n_fft = window.shape[0]
    left = lookahead * hop
    frames = F.pad(x.float(), (left, n_fft - hop - left)).unfold(-1, n_fft, hop)
    return torch.fft.rfft(frames * window)


def frame_log_magnitude(x: Tensor, window: Tensor, hop: int, lookahead: int = 0) -> Tensor:
    """log |frame_spectrum|, floored at HEAD_FLOOR: [B, T / hop, n_fft // 2 + 1], fp32."""
    return torch.log(frame_spectrum(x, window, hop, lookahead).abs().clamp(min=HEAD_FLOOR))


def head_spectrum_loss(log_magnitude: Tensor, x: Tensor, window: Tensor, hop: int, lookahead: int = 0) -> Tensor:
    """L1 between the head's log-magnitude [B, T / hop, bins] and the target's
    (frame_log_magnitude), both floored, over the frames whose window lies inside the
    segment (the first `lookahead` start before it, the last window_hops - 1 - lookahead
    reach past it). The output losses judge the audio after overlap-add, where a frame's
    magnitude counts only as far as its phase agrees with its neighbours'; this one
    trains the magnitude directly, which is what the words rest on
    (measured 2026-12-02: the teacher's own magnitude with random phase kept its WER,
    0.213 against 0.178, at a mel L1 as bad as a codec that lost the words)."""
    target = frame_log_magnitude(x, window, hop, lookahead)
    window_hops = window.shape[0] // hop
    inside = slice(lookahead, target.shape[1] - (window_hops - 1 - lookahead))
    return F.l1_loss(log_magnitude[:, inside].clamp(min=math.log(HEAD_FLOOR)), target[:, inside])


def anti_wrapped(d: Tensor) -> Tensor:
    """|d| folded onto [0, pi]: the distance between two phases whose difference is d."""
    return (d - 2 * math.pi * torch.round(d / (2 * math.pi))).abs()


def head_phase_loss(phase: Tensor, x: Tensor, window: Tensor, hop: int, lookahead: int = 0) -> Tensor:
    """The "istft" head's phase [B, T / hop, bins] against the target's on the same frames
    (frame_spectrum), by the anti-wrapped differences of its derivatives (APNet's
    instantaneous-frequency and group-delay losses): along time (each bin's phase advance
    from one frame to the next: a harmonic's frequency) and along frequency (the delay
    that shapes each pitch pulse), over the frames inside the segment as in
    head_spectrum_loss, each pair weighted by the target's magnitude there (the phase of a
    bin with no energy is noise), the weights of a batch averaging 1.

    Why: the output losses judge magnitudes only, so the head's phase is free wherever a
    frame's overlap with its neighbours does not show in them. Measured on the shipped
    voice (2026-12-05): the teacher's magnitude with the codec's phase
    placed 79.7% of held-out utterances with their pseudo-speaker, the codec's magnitude
    with the teacher's phase 83.2%, the teacher 84.1%: the pitch feature reads the
    phase's incoherence as a higher, less periodic voice. Not the absolute phase: it
    depends on where a frame falls in a pitch period, which the codes do not say."""
    target = frame_spectrum(x, window, hop, lookahead)
    window_hops = window.shape[0] // hop
    inside = slice(lookahead, target.shape[1] - (window_hops - 1 - lookahead))
    target, phase = target[:, inside], phase[:, inside].float()
    true = torch.angle(target)
    weight = target.abs()
    weight = weight / weight.mean().clamp(min=1e-8)
    time_w = torch.sqrt(weight[:, 1:] * weight[:, :-1])
    freq_w = torch.sqrt(weight[..., 1:] * weight[..., :-1])
    frequency = anti_wrapped(phase.diff(dim=1) - true.diff(dim=1))  # instantaneous frequency
    delay = anti_wrapped(phase.diff(dim=2) - true.diff(dim=2))  # group delay
    return (time_w * frequency).mean() + (freq_w * delay).mean()


def snr_db(y: Tensor, x: Tensor) -> float:
    """Waveform SNR (dB) of a reconstruction; phase-sensitive, so only a rough monitor."""
    noise = (y.float() - x.float()).pow(2).sum()
    return float(10 * math.log10(float(x.float().pow(2).sum()) / max(float(noise), 1e-12)))
