"""Which half of an "istft" codec's output loses the words: its magnitude or its phase?
Teacher sentences (plain, never trained on) go through a trained codec's encoder and
quantizer; its decoder's head gives each frame's (log-magnitude, phase). The head's own
synthesis then runs on four spectra, in the head's framing (its analysis window and
lookahead, codec_losses.frame_log_magnitude), and pocketsphinx scores each:

- `codec`:            the codec's magnitude and phase (the round trip);
- `codec_magnitude`:  the codec's magnitude with the teacher's true phase;
- `codec_phase`:      the teacher's true magnitude with the codec's phase;
- `teacher`:          both true (the head's synthesis gives the teacher back: a check).

    python scripts/voice/blame_probe.py --codec .carry/export-Ia --sentences 8 --out run/blame.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine.codec.layers import LOG_MAGNITUDE_MAX
from engine.codec.loader import load_codec
from engine.codec.model import SpectralDecoder
from engine.train.codec_losses import HEAD_FLOOR, ReconstructionLoss, frame_spectrum
from engine.train.evaluate import WER, Recognizer


@torch.no_grad()
def variants(codec, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x [n] float32 at the codec's rate -> each variant's audio [n']."""
    decoder = codec.decoder
    if not isinstance(decoder, SpectralDecoder):
        raise SystemExit("the codec's decoder is not the istft one: nothing to split")
    head = decoder.head
    x = F.pad(x, (0, -x.shape[-1] % codec.hop_length))
    h = decoder.hidden(codec.quantizer.decode(codec.encode(x[None])))
    log_magnitude, phase = head.spectrum(h)
    true = frame_spectrum(x[None], head.analysis_window(), head.hop, decoder.lookahead)
    true_log = torch.log(true.abs().clamp(min=HEAD_FLOOR)).clamp(max=LOG_MAGNITUDE_MAX)
    true_phase = torch.angle(true)
    spectra = {
        "codec": (log_magnitude, phase),
        "codec_magnitude": (log_magnitude, true_phase),
        "codec_phase": (true_log, phase),
        "teacher": (true_log, true_phase),
    }
    return {name: decoder.synthesize(h, s)[0, 0] for name, s in spectra.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", type=Path, required=True, help="folder with codec.pth + codec_config.json")
    p.add_argument("--sentences", type=int, default=8)
    p.add_argument("--speakers", default="0,4", help="pseudo-speaker indices (engine.train.speakers)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)

    from engine.train.phonemes import Espeak, phoneme_ids
    from engine.train.corpus import plain_sentences
    from engine.train.speakers import SPEAKERS
    from engine.train.teacher import PiperVoice

    torch.set_num_threads(2)
    codec = load_codec(a.codec / "codec.pth", dtype=torch.float32)
    lines = [item["text"] for item in plain_sentences()][: a.sentences]
    voice, espeak, asr = PiperVoice(threads=2), Espeak(), Recognizer()
    if voice.sample_rate != codec.sample_rate:
        raise SystemExit(f"teacher at {voice.sample_rate} Hz, codec at {codec.sample_rate} Hz")
    loss = ReconstructionLoss(voice.sample_rate)
    wers: dict[str, WER] = {}
    mels: dict[str, list[float]] = {}
    for si in [int(s) for s in a.speakers.split(",")]:
        speaker = SPEAKERS[si]
        for text in lines:
            y = voice.speak(phoneme_ids(espeak.phonemize(text), voice.id_map), speaker)
            x = torch.from_numpy(y.astype(np.float32))
            for name, z in variants(codec, x).items():
                z = z[: x.shape[-1]]
                wers.setdefault(name, WER()).add(text, asr.transcribe(z.numpy(), voice.sample_rate))
                mels.setdefault(name, []).append(float(loss.mel(z[None], x[None])))
        print(f"speaker {si} done", flush=True)
    report = {name: {"wer": round(w.value, 4), "mel_l1": round(float(np.mean(mels[name])), 4),
                     "samples": w.samples[:2]} for name, w in wers.items()}
    for name, r in report.items():
        print(f"{name:18s} WER {r['wer']:6.3f}  mel L1 {r['mel_l1']:.3f}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"codec": str(a.codec), "sentences": len(lines), "speakers": a.speakers,
                                     "variants": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
