"""Quality of a trained voice on held-out sentences (never seen in training):

- WER with pocketsphinx (PyPI; it bundles its US English model) of: the teacher audio
  itself, the codec round trip (teacher audio -> encode -> decode), the full model through
  the engine's single-stream path (default voice, and cloning each pseudo-speaker);
- voice cloning: for each trial the output's pitch and spectral envelope are compared with
  every pseudo-speaker's held-out teacher audio; a trial counts when the nearest speaker is
  the one whose reference was in the prompt (one held-out utterance by default; with
  --clone-min-reference-seconds S, one or two of them totalling S seconds or more);
- CPU speed: real-time factor and time to first audio of the engine path.

    python -m training.evaluate --model runs/voice --data data/voice/audio --out runs/eval.json

training/recipe/evaluate.py adds the service path (WebSocket, streamed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ASR_RATE = 16_000


# --- WER ------------------------------------------------------------------------------

def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


@dataclass
class WER:
    errors: int = 0
    words: int = 0
    samples: list = field(default_factory=list)

    def add(self, ref: str, hyp: str) -> None:
        r, h = words(ref), words(hyp)
        e = edit_distance(r, h)
        self.errors += e
        self.words += len(r)
        if len(self.samples) < 5:
            self.samples.append({"ref": ref, "hyp": hyp, "errors": e})

    @property
    def value(self) -> float:
        return self.errors / max(1, self.words)

    def report(self) -> dict:
        return {"wer": round(self.value, 4), "words": self.words, "samples": self.samples}


class Recognizer:
    def __init__(self) -> None:
        from pocketsphinx import Decoder, set_loglevel

        set_loglevel("FATAL")
        self.decoder = Decoder(samprate=ASR_RATE)

    def transcribe(self, audio: np.ndarray, rate: int) -> str:
        from engine.audio import resample, to_pcm16

        pcm = to_pcm16(resample(np.asarray(audio, np.float32), rate, ASR_RATE))
        self.decoder.start_utt()
        self.decoder.process_raw(pcm, full_utt=True)
        self.decoder.end_utt()
        hyp = self.decoder.hyp()
        return hyp.hypstr if hyp else ""


# --- voice similarity ---------------------------------------------------------------------

FEATURE_RATE = 16_000


def pitch_semitones(audio: np.ndarray, rate: int = FEATURE_RATE, fmin: float = 60, fmax: float = 400) -> float:
    """Median F0 (semitones above 55 Hz) over voiced 40 ms frames: the autocorrelation
    (by FFT, corrected for the window's taper) peaks above 0.5 of its zero-lag value
    somewhere in 60-400 Hz; NaN when nothing is voiced."""
    n, hop = int(0.04 * rate), int(0.01 * rate)
    if audio.size < n:
        return float("nan")
    idx = np.arange(0, audio.size - n, hop)[:, None] + np.arange(n)[None]
    frames = audio[idx] - audio[idx].mean(1, keepdims=True)
    energy = (frames ** 2).sum(1)
    frames = frames[energy > max(1e-4, energy.max() * 1e-3)] * np.hanning(n)
    if frames.size == 0:
        return float("nan")
    spec = np.fft.rfft(frames, 2 * n)
    ac = np.fft.irfft(np.abs(spec) ** 2)[:, :n]
    taper = np.fft.irfft(np.abs(np.fft.rfft(np.hanning(n), 2 * n)) ** 2)[:n]
    r = ac / (ac[:, :1] + 1e-12) / (taper / taper[0] + 1e-3)
    lo, hi = int(rate / fmax), int(rate / fmin)
    r = r[:, lo:hi]
    peak = r.max(1)
    # the first lag within 85% of the highest peak (not the highest: multiples of the
    # period score as high), then the top of that peak
    first = np.argmax(r >= 0.85 * peak[:, None], axis=1)
    best = np.array([f + int(np.argmax(row[f : f + max(2, (lo + f) // 4)])) for f, row in zip(first, r)])
    voiced = peak > 0.5
    if not voiced.any():
        return float("nan")
    f0 = rate / (lo + best[voiced])
    return float(12 * np.log2(np.median(f0) / 55.0))


def envelope(audio: np.ndarray, rate: int = FEATURE_RATE, bands: int = 40) -> np.ndarray:
    """Mean log-mel spectrum (40 bands to 8 kHz) of the louder frames, level removed."""
    import torch

    from training.codec_losses import magnitude, mel_filterbank

    mag = magnitude(torch.from_numpy(audio.astype(np.float32))[None], 512)[0]  # [F, T]
    mel = torch.log(mel_filterbank(rate, 512, bands) @ mag + 1e-5)  # [bands, T]
    energy = mel.mean(0)
    loud = mel[:, energy > energy.max() - 4.0]  # within ~35 dB of the loudest frame
    env = loud.mean(1).numpy()
    return env - env.mean()


def voice_features(audio: np.ndarray, rate: int) -> np.ndarray:
    """[pitch in semitones, 40-band envelope]."""
    from engine.audio import resample

    x = resample(np.asarray(audio, np.float32), rate, FEATURE_RATE)
    return np.r_[pitch_semitones(x), envelope(x)]


PITCH_WEIGHT = 5.0  # the pitch counts as much as 5 of the 40 envelope bands (z-scored)


class SpeakerSpace:
    """Nearest pseudo-speaker by z-scored distance: each feature divided by its pooled
    within-speaker spread, pitch weighted x5 (tuned on the teacher's held-out audio: with
    40 utterances per speaker, 92% of single utterances, and 98% of those of 3 s or more,
    are nearest to their own speaker)."""

    def __init__(self, features: dict[int, list[np.ndarray]]) -> None:
        self.centroids = {s: np.nanmean(np.array(fs), 0) for s, fs in features.items()}
        dev = np.concatenate([np.array(fs) - self.centroids[s] for s, fs in features.items()])
        self.scale = np.nanstd(dev, 0) + 1e-6
        self.weights = np.r_[PITCH_WEIGHT, np.ones(dev.shape[1] - 1)]

    def distances(self, feature: np.ndarray) -> dict[int, float]:
        return {s: float(np.nansum(self.weights * ((feature - c) / self.scale) ** 2))
                for s, c in self.centroids.items()}

    def nearest(self, feature: np.ndarray) -> int:
        d = self.distances(feature)
        return min(d, key=d.get)


# --- the evaluation ----------------------------------------------------------------------

SPLITS = ("plain", "test")  # the project's plain sentences; held-out Austen sentences
MIN_TRIAL_SECONDS = 3.0


@dataclass
class Item:
    id: str
    speaker: int
    text: str
    split: str
    audio: np.ndarray  # the teacher's, at HeldOut.rate


@dataclass
class HeldOut:
    items: list[Item]
    rate: int

    @classmethod
    def load(cls, folders: list[Path], rate: int, limit: int | None = None) -> "HeldOut":
        from training.audio_data import AudioSet

        data = AudioSet(folders, rate, SPLITS)
        items = [Item(u.id, u.speaker, u.text, u.split, data.waveform(u)) for u in data.utterances]
        if limit is not None:
            items = [it for split in SPLITS for it in [i for i in items if i.split == split][:limit]]
        return cls(items, rate)

    def split(self, name: str) -> list[Item]:
        return [it for it in self.items if it.split == name]

    def by_speaker(self) -> dict[int, list[Item]]:
        out: dict[int, list[Item]] = {}
        for it in self.items:
            out.setdefault(it.speaker, []).append(it)
        return out


def _wer_by_split(held: HeldOut, hypothesis) -> dict:
    """{split: {wer, words, per_speaker, samples}} with hypothesis(item) -> text."""
    report = {}
    for split in SPLITS:
        total, per = WER(), {}
        for it in held.split(split):
            hyp = hypothesis(it)
            total.add(it.text, hyp)
            per.setdefault(it.speaker, WER()).add(it.text, hyp)
        if total.words:
            report[split] = {**total.report(), "per_speaker": {s: round(w.value, 4) for s, w in sorted(per.items())}}
    return report


def teacher_wer(held: HeldOut, asr: Recognizer) -> dict:
    return _wer_by_split(held, lambda it: asr.transcribe(it.audio, held.rate))


def round_trip(codec, audio: np.ndarray, rate: int) -> np.ndarray:
    import torch

    from engine.audio import resample

    x = torch.from_numpy(resample(audio, rate, codec.sample_rate))[None]
    with torch.inference_mode():
        return codec.decode(codec.encode(x.to(next(codec.parameters()).dtype)))[0].float().numpy()


def codec_wer(held: HeldOut, codec, asr: Recognizer) -> dict:
    return _wer_by_split(held, lambda it: asr.transcribe(round_trip(codec, it.audio, held.rate), codec.sample_rate))


def speaker_space(held: HeldOut) -> tuple[SpeakerSpace, dict]:
    """The space, and its own accuracy on the teacher audio (leave-one-out): the ceiling of
    what a cloning trial can score (all utterances, and those of MIN_TRIAL_SECONDS or more)."""
    by = held.by_speaker()
    feats = {s: [voice_features(it.audio, held.rate) for it in items] for s, items in by.items()}
    hits = n = long_hits = long_n = 0
    for s, fs in feats.items():
        for i in range(len(fs)):
            rest = {t: [f for j, f in enumerate(gs) if (t, j) != (s, i)] for t, gs in feats.items()}
            hit = SpeakerSpace(rest).nearest(fs[i]) == s
            hits, n = hits + hit, n + 1
            if by[s][i].audio.size >= MIN_TRIAL_SECONDS * held.rate:
                long_hits, long_n = long_hits + hit, long_n + 1
    return SpeakerSpace(feats), {"teacher_leave_one_out_accuracy": round(hits / max(1, n), 4),
                                 f"teacher_leave_one_out_accuracy_{MIN_TRIAL_SECONDS:g}s_plus":
                                     round(long_hits / max(1, long_n), 4), "utterances": n}


def synthesize(synth, text: str, voice, seed: int, max_frames: int) -> tuple[np.ndarray, float, float]:
    """(audio, seconds to first chunk, total seconds) through the engine's Synthesizer."""
    from engine.generate import GenerateOptions
    from engine.sampling import SamplingParams

    params = SamplingParams(seed=seed)
    t0 = time.perf_counter()
    first, chunks = None, []
    for chunk in synth.audio([text], voice, params, GenerateOptions(max_frames=max_frames)):
        first = first if first is not None else time.perf_counter() - t0
        chunks.append(chunk)
    total = time.perf_counter() - t0
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return audio, first or total, total


def reference_voice(bundle, item: Item | list[Item], rate: int):
    """The Voice of one reference utterance, or of several (each encoded on its own and
    kept as its own Reference, as the model saw one or two of them in training)."""
    import torch

    from engine.audio import resample
    from engine.prompt import Reference, Voice

    refs = []
    for it in item if isinstance(item, list) else [item]:
        x = torch.from_numpy(resample(it.audio, rate, bundle.codec.sample_rate))[None]
        with torch.inference_mode():
            codes = bundle.codec.encode(x.to(next(bundle.codec.parameters()).dtype))[0].cpu()
        refs.append(Reference(it.text, codes))
    return Voice(refs)


def clone_trials(held: HeldOut, n: int) -> list[tuple[Item, str]]:
    """(reference item, target text) pairs: speakers in turn, each reference a held-out
    utterance of that speaker, each target another held-out sentence long enough (60+
    characters, ~4 s of speech) to be scored."""
    by = held.by_speaker()
    targets = [it.text for it in held.items if len(it.text) >= 60] or [it.text for it in held.items]
    speakers = sorted(by)
    return [(by[s][(k // len(speakers)) % len(by[s])], targets[(7 * k + 3) % len(targets)])
            for k, s in ((k, speakers[k % len(speakers)]) for k in range(n))]


MAX_REFERENCES = 2  # the model was trained with one or two reference utterances
MAX_REFERENCE_SECONDS = 14.8  # training's cap: 320 frames of references (lm_data.SequenceConfig)


def clone_references(held: HeldOut, n: int, min_seconds: float = 0.0,
                     max_refs: int = MAX_REFERENCES) -> list[tuple[list[Item], str]]:
    """clone_trials with references of at least `min_seconds` (the ~10 s a user of Fish-style
    cloning passes, rather than one held-out utterance of often 2-4 s): the same targets and
    order of trials; each trial's references are the first run of 1..max_refs consecutive
    utterances of its speaker (held-out order, cyclic, leaving out any utterance of the
    target sentence) that starts at clone_trials' reference or after it and totals
    `min_seconds` or more (at most MAX_REFERENCE_SECONDS; if no run qualifies, the longest
    run within that cap). min_seconds <= 0: clone_trials' single references, unchanged."""
    trials = clone_trials(held, n)
    if min_seconds <= 0:
        return [([ref], target) for ref, target in trials]
    by = held.by_speaker()

    def seconds(items: list[Item]) -> float:
        return sum(it.audio.size for it in items) / held.rate

    out = []
    for ref, target in trials:
        pool = by[ref.speaker]
        start = next(i for i, it in enumerate(pool) if it is ref)
        ring = [pool[(start + j) % len(pool)] for j in range(len(pool))]
        ring = [it for it in ring if it.text != target]
        best = None
        for i in range(len(ring)):
            for m in range(1, min(max_refs, len(ring)) + 1):
                run = [ring[(i + j) % len(ring)] for j in range(m)]
                if seconds(run) > MAX_REFERENCE_SECONDS:
                    break
                if best is None or seconds(run) > seconds(best):
                    best = run
                if seconds(run) >= min_seconds:
                    break
            if best is not None and seconds(best) >= min_seconds:
                break
        out.append((best or ring[:1], target))
    return out


def model_eval(bundle, held: HeldOut, space: SpeakerSpace, asr: Recognizer, sentences: int,
               trials: int, max_frames: int = 600, min_reference_seconds: float = 0.0) -> dict:
    """The engine's single-stream path: the default voice (plain prompt) on `sentences`
    held-out texts of each split, then `trials` cloning trials (WER + nearest speaker), each
    with clone_references(held, trials, min_reference_seconds)."""
    import torch

    from engine.generate import Synthesizer

    synth = Synthesizer(bundle)
    rate = bundle.codec.sample_rate
    report, spent, produced, ttfa = {}, 0.0, 0.0, []
    for split in SPLITS:
        wer = WER()
        for i, it in enumerate(held.split(split)[:sentences]):
            audio, first, total = synthesize(synth, it.text, None, i, max_frames)
            wer.add(it.text, asr.transcribe(audio, rate))
            spent, produced = spent + total, produced + audio.size / rate
            ttfa.append(first)
        if wer.words:
            report[f"default_voice_{split}"] = wer.report()
    clone, hits, pairs, ref_ids, ref_seconds = WER(), 0, [], [], []
    for k, (refs, target) in enumerate(clone_references(held, trials, min_reference_seconds)):
        speaker = refs[0].speaker
        audio, _, _ = synthesize(synth, target, reference_voice(bundle, refs, held.rate), 1000 + k, max_frames)
        clone.add(target, asr.transcribe(audio, rate))
        nearest = space.nearest(voice_features(audio, rate)) if audio.size > rate // 4 else -1
        hits += nearest == speaker
        pairs.append([speaker, nearest])
        ref_ids.append([it.id for it in refs])
        ref_seconds.append(round(sum(it.audio.size for it in refs) / held.rate, 3))
    report["cloning"] = {**clone.report(), "similarity_accuracy": round(hits / max(1, trials), 4),
                         "trials": trials, "min_reference_seconds": min_reference_seconds,
                         "reference_vs_nearest": pairs, "reference_ids": ref_ids, "reference_seconds": ref_seconds}
    report["cpu"] = {"rtf": round(spent / max(produced, 1e-9), 4),
                     "ttfa_ms_median": round(1000 * float(np.median(ttfa)), 1) if ttfa else None,
                     "threads": torch.get_num_threads()}
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder (model + codec); omit to score the teacher only")
    p.add_argument("--codec", type=Path, help="codec folder (default: the model folder's codec)")
    p.add_argument("--data", type=Path, action="append", required=True, help="teacher data folder")
    p.add_argument("--limit", type=int, help="held-out utterances per split (default: all)")
    p.add_argument("--sentences", type=int, default=40, help="default-voice sentences per split")
    p.add_argument("--clone-trials", type=int, default=60)
    p.add_argument("--clone-min-reference-seconds", type=float, default=0.0, metavar="S",
                   help="each cloning trial's reference: 1-2 held-out utterances of the speaker totalling "
                        "S seconds or more (clone_references); 0: one utterance (the benchmark's protocol)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    report = evaluate(args.data, args.model, args.codec, args.limit, args.sentences, args.clone_trials, args.threads,
                      args.clone_min_reference_seconds)
    text = json.dumps(report, indent=1, default=float)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


def evaluate(data: list[Path], model: str | None = None, codec_folder: Path | None = None, limit: int | None = None,
             sentences: int = 40, trials: int = 60, threads: int = 2, min_reference_seconds: float = 0.0) -> dict:
    import torch

    from training.presets import SAMPLE_RATE

    torch.set_num_threads(threads)
    held = HeldOut.load(data, SAMPLE_RATE, limit)
    asr = Recognizer()
    report: dict = {"held_out": {s: len(held.split(s)) for s in SPLITS}, "teacher": teacher_wer(held, asr)}
    _progress("teacher", report["teacher"])
    space, report["speaker_space"] = speaker_space(held)
    codec_folder = codec_folder or (Path(model) if model else None)
    if codec_folder is not None:
        from engine.codec.loader import load_codec

        codec = load_codec(codec_folder / "codec.pth", dtype=torch.float32)
        report["codec_round_trip"] = codec_wer(held, codec, asr)
        _progress("codec round trip", report["codec_round_trip"])
    if model:
        from engine.bundle import load_bundle

        report["model"] = model_eval(load_bundle(model, "cpu"), held, space, asr, sentences, trials,
                                     min_reference_seconds=min_reference_seconds)
    return report


def _progress(name: str, by_split: dict) -> None:
    print(f"{name} WER: " + ", ".join(f"{s} {r['wer']:.3f}" for s, r in by_split.items()), file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
