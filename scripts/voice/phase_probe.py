"""Which synthesis can a small codec decoder afford? Resynthesize teacher sentences from
their own STFT (window 1024, hop 256: the istft decoder's grid) in several ways, with no
codec and no training, and score each with the project's gates (pocketsphinx WER,
multi-scale log-mel L1 of codec_losses):

- `griffin_lim`:   true magnitude, 32 Griffin-Lim iterations (phase found by iterating);
- `random_phase`:  true magnitude, random phase (what an untrained phase head gives);
- `source_phase`:  true magnitude, the phase of a harmonic excitation at the tracked F0
                   (noise phase where unvoiced): phase made by a deterministic source;
- `source_filter`: a source-filter vocoder: harmonic excitation at the tracked F0 and
                   noise, shaped by the cepstrally smoothed true envelope. No fine
                   spectral structure comes from the target: this is the ceiling of a
                   decoder that predicts F0, voicing and an envelope per hop.

    python scripts/voice/phase_probe.py --sentences 10 --out run/phase_probe.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from engine.train.codec_losses import ReconstructionLoss
from engine.train.evaluate import WER, Recognizer
from engine.train.excitation import harmonic_grains, noise_grains
from engine.train.pitch import track_f0

WINDOW, HOP = 1024, 256


def stft(x: torch.Tensor) -> torch.Tensor:
    return torch.stft(x, WINDOW, HOP, window=torch.hann_window(WINDOW, dtype=x.dtype), return_complex=True)


def istft(spec: torch.Tensor, length: int) -> torch.Tensor:
    return torch.istft(spec, WINDOW, HOP, window=torch.hann_window(WINDOW, dtype=torch.float64), length=length)


def griffin_lim(mag: torch.Tensor, length: int, iters: int = 32) -> torch.Tensor:
    phase = torch.exp(2j * math.pi * torch.rand(mag.shape, dtype=torch.float64))
    for _ in range(iters):
        y = istft(mag * phase, length)
        phase = torch.exp(1j * torch.angle(stft(y)))
    return istft(mag * phase, length)


def smooth_log(mag: torch.Tensor, lifter: int = 40) -> torch.Tensor:
    """Cepstral smoothing of log magnitude along frequency: [F, T] -> [F, T]."""
    logm = torch.log(mag.clamp(min=1e-6))
    cep = torch.fft.irfft(logm.T, n=2 * (mag.shape[0] - 1))
    cep[:, lifter:-lifter] = 0
    return torch.fft.rfft(cep).real.T


def spectrum_of(grains: torch.Tensor) -> torch.Tensor:
    """Windowed time grains [T, W] -> their spectra [F, T], as stft frames would be."""
    return torch.fft.rfft(grains * torch.hann_window(WINDOW, dtype=torch.float64), dim=-1).T


def variants(x: torch.Tensor, rate: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = x.shape[-1]
    spec = stft(x)
    mag = spec.abs()
    frames = mag.shape[1]
    f0, voiced = track_f0(x, rate, HOP, frames)
    # stft(center=True) frame t covers samples [t*HOP - W/2, t*HOP + W/2)
    harm = spectrum_of(harmonic_grains(f0, voiced, rate, HOP, WINDOW, offset=-WINDOW // 2))
    noise = spectrum_of(noise_grains(frames, WINDOW, generator=g))
    source = torch.where(voiced[None], harm, noise)
    unit = lambda s: s / s.abs().clamp(min=1e-9)  # noqa: E731
    out = {
        "griffin_lim": griffin_lim(mag, n),
        "random_phase": istft(mag * torch.exp(2j * math.pi * torch.rand(mag.shape, generator=g, dtype=torch.float64)), n),
        "source_phase": istft(mag * unit(source), n),
    }
    env = torch.exp(smooth_log(mag))
    # each source normalized to a flat smoothed envelope, then given the target's
    flat_h = harm / torch.exp(smooth_log(harm.abs())).clamp(min=1e-9)
    flat_n = noise / torch.exp(smooth_log(noise.abs())).clamp(min=1e-9)
    for aper in (0.0, 0.3):
        mix = torch.where(voiced[None], flat_h + aper * flat_n, flat_n)
        out[f"source_filter_aper{aper}"] = istft(env * mix, n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=10)
    p.add_argument("--speakers", default="0,4", help="pseudo-speaker indices (engine.train.speakers)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--save-wavs", type=Path, default=None)
    a = p.parse_args(argv)

    from engine.train.phonemes import Espeak, phoneme_ids
    from engine.train.corpus import plain_sentences
    from engine.train.speakers import SPEAKERS
    from engine.train.teacher import PiperVoice

    lines = [item["text"] for item in plain_sentences()][: a.sentences]
    voice, espeak, asr = PiperVoice(threads=2), Espeak(), Recognizer()
    loss = ReconstructionLoss(voice.sample_rate)
    wers: dict[str, WER] = {}
    mels: dict[str, list[float]] = {}
    for si in [int(s) for s in a.speakers.split(",")]:
        speaker = SPEAKERS[si]
        for i, text in enumerate(lines):
            y = voice.speak(phoneme_ids(espeak.phonemize(text), voice.id_map), speaker)
            x = torch.from_numpy(y.astype(np.float64))
            outs = {"teacher": x, **variants(x, voice.sample_rate, seed=i)}
            for name, z in outs.items():
                z = z.float().numpy()
                wers.setdefault(name, WER()).add(text, asr.transcribe(z, voice.sample_rate))
                zt, xt = torch.from_numpy(z)[None], x.float()[None]
                mels.setdefault(name, []).append(float(loss.mel(zt, xt)))
                for w in (32, 256, 2048):
                    mel_w = float((loss.log_mel(zt, w) - loss.log_mel(xt, w)).abs().mean())
                    mels.setdefault(f"{name}@{w}", []).append(mel_w)
                if a.save_wavs is not None and i < 2:
                    from engine.audio import write_wav

                    a.save_wavs.mkdir(parents=True, exist_ok=True)
                    write_wav(a.save_wavs / f"s{si}-{i}-{name}.wav", z, voice.sample_rate)
        print(f"speaker {si} done", flush=True)
    report = {name: {"wer": round(w.value, 4), "mel_l1": round(float(np.mean(mels[name])), 4),
                     "mel_l1_by_window": {win: round(float(np.mean(mels[f"{name}@{win}"])), 4) for win in (32, 256, 2048)},
                     "samples": w.samples[:2]} for name, w in wers.items()}
    print(f"{'variant':24s} {'WER':>6s} {'mel L1':>7s}   at windows 32 / 256 / 2048")
    for name, r in report.items():
        by = " / ".join(f"{v:.3f}" for v in r["mel_l1_by_window"].values())
        print(f"{name:24s} {r['wer']:6.3f} {r['mel_l1']:7.3f}   {by}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"sentences": len(lines), "speakers": a.speakers, "variants": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
