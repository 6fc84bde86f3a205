"""Where cloning loses its speakers: the speaker space's accuracy (engine.train.evaluate's
SpeakerSpace, built on the held-out teacher audio) on the teacher audio itself (leave one
out), on the same audio after the packaged codec's round trip (encode, decode), and on the
round trip's halves (scripts/voice/blame_probe.py's variants: the codec's magnitude with the
teacher's phase, the teacher's magnitude with the codec's phase), with the confusion
matrices and how far the round trip moves pitch and envelope.

    .venv/bin/python scripts/voice/run-2026-12-05/codec_speakers.py --data .carry/voice/audio \
        --model engine/assets/default --out scripts/voice/run-2026-12-05/codec_speakers.json

If the round trip keeps the teacher's accuracy, the cloning gap is the model's; if not,
the codec's decoder smears what tells the speakers apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from engine.train.evaluate import MIN_TRIAL_SECONDS, HeldOut, SpeakerSpace, voice_features  # noqa: E402
from engine.train.presets import SAMPLE_RATE  # noqa: E402


def confusion(pairs: list[tuple[int, int]]) -> dict:
    speakers = sorted({s for s, _ in pairs})
    return {s: {t: sum(1 for a, b in pairs if a == s and b == t) for t in speakers} for s in speakers}


def score(pairs: list[tuple[int, int]], long: list[bool]) -> dict:
    hit = [a == b for a, b in pairs]
    lh = [h for h, l in zip(hit, long) if l]
    return {"accuracy": round(float(np.mean(hit)), 4), "n": len(hit),
            f"accuracy_{MIN_TRIAL_SECONDS:g}s_plus": round(float(np.mean(lh)), 4) if lh else None, "n_long": len(lh),
            "confusion": confusion(pairs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", default="engine/assets/default")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import torch

    from engine.audio import resample
    from engine.bundle import load_bundle
    from scripts.voice.blame_probe import variants

    torch.set_num_threads(2)
    held = HeldOut.load([a.data], SAMPLE_RATE)
    codec = load_bundle(a.model, device="cpu", dtype=torch.float32).codec
    items = held.items
    teacher = [voice_features(it.audio, held.rate) for it in items]
    coded, halves = [], {"codec_magnitude": [], "codec_phase": []}
    for it in items:
        x = torch.from_numpy(resample(it.audio, held.rate, codec.sample_rate).astype(np.float32))
        v = variants(codec, x)
        coded.append(voice_features(v["codec"][: x.shape[-1]].numpy(), codec.sample_rate))
        for name in halves:
            halves[name].append(voice_features(v[name][: x.shape[-1]].numpy(), codec.sample_rate))
    long = [it.audio.size >= MIN_TRIAL_SECONDS * held.rate for it in items]
    feats: dict[int, list[np.ndarray]] = {}
    for it, f in zip(items, teacher):
        feats.setdefault(it.speaker, []).append(f)
    space = SpeakerSpace(feats)
    loo = []
    for i, it in enumerate(items):  # leave one out: the space without this utterance
        rest: dict[int, list[np.ndarray]] = {}
        for j, (jt, f) in enumerate(zip(items, teacher)):
            if j != i:
                rest.setdefault(jt.speaker, []).append(f)
        loo.append((it.speaker, SpeakerSpace(rest).nearest(teacher[i])))
    rt = [(it.speaker, space.nearest(f)) for it, f in zip(items, coded)]
    # how far the round trip moves each feature, in the space's within-speaker spreads
    shift = (np.array(coded) - np.array(teacher)) / space.scale
    report = {
        "teacher_leave_one_out": score(loo, long),
        "codec_round_trip": score(rt, long),
        **{name: score([(it.speaker, space.nearest(f)) for it, f in zip(items, fs)], long) for name, fs in halves.items()},
        "round_trip_shift_in_spreads": {"pitch_mean": round(float(np.nanmean(shift[:, 0])), 3),
                                        "pitch_abs_median": round(float(np.nanmedian(np.abs(shift[:, 0]))), 3),
                                        "envelope_mean_by_band": np.round(np.nanmean(shift[:, 1:], 0), 2).tolist(),
                                        "envelope_abs_median": round(float(np.nanmedian(np.abs(shift[:, 1:]))), 3)},
    }
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    for k in ("teacher_leave_one_out", "codec_round_trip", *halves):
        r = report[k]
        print(k, r["accuracy"], r[f"accuracy_{MIN_TRIAL_SECONDS:g}s_plus"], r["confusion"])
    print(report["round_trip_shift_in_spreads"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
