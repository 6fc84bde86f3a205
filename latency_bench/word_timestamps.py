"""`python -m latency_bench.word_timestamps`: the word timestamps' accuracy (issue 51) on the
CPU with the default voice, against pocketsphinx's forced alignment of the same audio.

Each held-out sentence (training/plain_sentences.txt from index 30 on: sentences 0-29
chose the alignment heads, engine/assets/default/alignment_heads.json) is spoken through
the engine by its own stream with word_timestamps on; the audio the sink received is
force-aligned by pocketsphinx (its `align` search, its bundled US English model, at 16 kHz)
to the sentence's words. Sentences with a word outside pocketsphinx's dictionary, or whose
alignment fails, are skipped (counted). Printed:

- word-start error (engine - pocketsphinx): median |error|, the share within 60 / 150 ms,
  and the median signed error; the same for word ends;
- monotonicity: every sentence's words once, in order, with start < end <= the audio;
- coverage: the share of the audio's speech energy (10 ms frames above -40 dB of the
  loudest) that falls outside every word's span, and the longest gap between words
  that holds speech.

    python -m latency_bench.word_timestamps --sentences 40 [--json out.json]
    python -m latency_bench.word_timestamps --reference tests/fixtures/voice/speaker4.ogg \
        --reference-text "The village of Barton was chiefly on one of these hills, and formed a \
        pleasant view from the cottage windows."
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from pathlib import Path

import numpy as np

from engine.alignment import WordTiming
from engine.audio import resample, to_pcm16
from engine.bundle import load_bundle
from engine.engine import Engine, EngineConfig, StreamParams
from engine.sampling import SamplingParams
from engine.settings import BenchSettings
from engine.voice import ReferenceInput, VoiceInput
from latency_bench.__main__ import run_meta

ASR_RATE = 16_000
FIRST_HELD_OUT = 30  # sentences before it chose the heads
# the evaluation-only sentences (read here: latency_bench does not import training/)
PLAIN_SENTENCES = Path(__file__).resolve().parent.parent / "training" / "plain_sentences.txt"


def plain_sentences() -> list[str]:
    lines = PLAIN_SENTENCES.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


class ForcedAligner:
    """pocketsphinx's forced alignment: (word, start s, end s) of each word of a text, or
    None when a word is not in its dictionary or the alignment does not cover them all."""

    def __init__(self) -> None:
        from pocketsphinx import Decoder, set_loglevel

        set_loglevel("FATAL")
        self.decoder = Decoder(samprate=ASR_RATE)

    @staticmethod
    def words(text: str) -> list[str]:
        return [re.sub(r"[^a-z']", "", w.lower()) for w in text.split()]

    def align(self, audio: np.ndarray, rate: int, text: str) -> list[tuple[str, float, float]] | None:
        words = self.words(text)
        if any(not w or self.decoder.lookup_word(w) is None for w in words):
            return None
        self.decoder.set_align_text(" ".join(words))
        self.decoder.start_utt()
        self.decoder.process_raw(to_pcm16(resample(np.asarray(audio, np.float32), rate, ASR_RATE)), full_utt=True)
        self.decoder.end_utt()
        found = self.decoder.seg() if self.decoder.hyp() is not None else None
        if found is None:  # the alignment failed (pocketsphinx logs why)
            return None
        segs = [(re.sub(r"\(\d+\)$", "", s.word), s.start_frame / 100, (s.end_frame + 1) / 100)
                for s in found if s.word not in ("<s>", "</s>", "<sil>", "(NULL)")]
        return segs if [w for w, _, _ in segs] == words else None


class _Sink:
    def __init__(self) -> None:
        self.audio, self.words, self.errors = [], {}, []
        self.ready, self.done = threading.Event(), threading.Event()

    def on_ready(self, cached, ms):
        self.ready.set()

    def on_audio(self, turn, pcm):
        self.audio.append(pcm)

    def on_words(self, turn, words):
        self.words.update({w.index: w for w in words})

    def on_segment_end(self, turn, reason):
        self.done.set()

    def on_error(self, code, message):
        self.errors.append((code, message))
        self.done.set()


def speak(engine: Engine, text: str, seed: int, voice: VoiceInput | None = None) -> tuple[np.ndarray, list[WordTiming]]:
    """One stream, one turn: the audio and the words, in index order."""
    sink = _Sink()
    handle = engine.open(voice or VoiceInput(), StreamParams(SamplingParams(seed=seed), frame_budget=600,
                                                    word_timestamps=True), sink)
    try:
        if not sink.ready.wait(60):
            raise TimeoutError("the stream never became ready")
        engine.say(handle, 1, text)
        if not sink.done.wait(300) or sink.errors:
            raise RuntimeError(f"speaking {text!r} failed: {sink.errors}")
    finally:
        engine.close(handle)
    return np.concatenate(sink.audio), [sink.words[i] for i in sorted(sink.words)]


def coverage(audio: np.ndarray, rate: int, words: list[WordTiming]) -> tuple[float, float]:
    """(share of the speech energy outside every word's span, longest run of speech frames
    outside the spans in seconds); speech: 10 ms frames within 40 dB of the loudest."""
    hop = rate // 100
    frames = audio[: len(audio) // hop * hop].reshape(-1, hop)
    energy = (frames.astype(np.float64) ** 2).mean(1)
    speech = energy > energy.max() * 1e-4
    t = (np.arange(len(energy)) + 0.5) / 100
    inside = np.zeros(len(energy), bool)
    for w in words:
        inside |= (t >= w.start) & (t < w.end)
    outside = speech & ~inside
    run = longest = 0
    for x in outside:
        run = run + 1 if x else 0
        longest = max(longest, run)
    return float(energy[outside].sum() / max(energy[speech].sum(), 1e-12)), longest / 100


def check_order(text: str, words: list[WordTiming], seconds: float) -> list[str]:
    """What is wrong with a sentence's words (empty: each once, in order, start < end,
    within the audio, not overlapping)."""
    problems = []
    if [w.index for w in words] != list(range(len(text.split()))) or [w.text for w in words] != text.split():
        problems.append(f"words {[(w.index, w.text) for w in words]} are not the text's")
    for a, b in zip(words, words[1:]):
        if b.start < a.end - 1e-9:
            problems.append(f"{a} overlaps {b}")
    problems += [f"{w} has start >= end or lies past the audio" for w in words
                 if not (0 <= w.start < w.end <= seconds + 1e-9)]
    return problems


def measure(sentences: int = 40, first: int = FIRST_HELD_OUT, alignment: bool = True, progress=None,
            voice: VoiceInput | None = None) -> dict:
    """The figures above; `voice`: a cloned voice instead of the default one."""
    bundle = load_bundle("default", "cpu")
    rate = bundle.codec.sample_rate
    engine = Engine(bundle, EngineConfig(max_running=1, max_queued=1, max_len=1536,
                                         bench=BenchSettings(alignment=alignment))).start()
    asr = ForcedAligner()
    texts = plain_sentences()[first:]
    starts, ends, gaps, outside, problems, skipped, used = [], [], [], [], [], 0, 0
    try:
        for i, text in enumerate(texts):
            if used == sentences:
                break
            audio, words = speak(engine, text, first + i, voice)
            reference = asr.align(audio, rate, text)
            if reference is None:
                skipped += 1
                continue
            used += 1
            problems += [f"{text!r}: {p}" for p in check_order(text, words, len(audio) / rate)]
            starts += [w.start - s for w, (_, s, _) in zip(words, reference)]
            ends += [w.end - e for w, (_, _, e) in zip(words, reference)]
            share, gap = coverage(audio, rate, words)
            outside.append(share)
            gaps.append(gap)
            if progress:
                progress(f"{used:3d} {text[:50]!r}: start errors (ms) "
                         f"{[round(1000 * (w.start - s)) for w, (_, s, _) in zip(words, reference)]}")
    finally:
        engine.stop()
    s, e = np.abs(starts), np.abs(ends)
    return {
        "sentences": used, "skipped_not_alignable": skipped, "words": len(starts), "alignment_readout": alignment,
        "voice": "default" if voice is None else " + ".join(r.text for r in voice.references),
        "heads": [list(h) for h in engine.align_heads.heads] if engine.align_heads else None,
        "start_error_median_abs_s": round(float(np.median(s)), 4),
        "start_within_60ms": round(float(np.mean(s <= 0.060)), 4),
        "start_within_150ms": round(float(np.mean(s <= 0.150)), 4),
        "start_error_median_signed_s": round(float(np.median(starts)), 4),
        "end_error_median_abs_s": round(float(np.median(e)), 4),
        "end_within_150ms": round(float(np.mean(e <= 0.150)), 4),
        "order_problems": problems,
        "speech_energy_outside_words_max": round(float(max(outside)), 4),
        "speech_energy_outside_words_mean": round(float(np.mean(outside)), 4),
        "longest_speech_outside_words_s": round(float(max(gaps)), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.word_timestamps", description=__doc__.split("\n")[0])
    p.add_argument("--sentences", type=int, default=40, help="held-out sentences to measure (at least 20)")
    p.add_argument("--no-alignment", dest="alignment", action="store_false",
                   help="the engine without its readout (the characters-over-frames estimate)")
    p.add_argument("--reference", help="clone the voice of this audio file (with --reference-text)")
    p.add_argument("--reference-text", help="what the reference audio says")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.sentences < 20:
        p.error("--sentences must be at least 20 (the gate's minimum)")
    voice = None
    if args.reference:
        if not args.reference_text:
            p.error("--reference needs --reference-text")
        voice = VoiceInput((ReferenceInput(args.reference_text, Path(args.reference).read_bytes()),))
    figures = measure(args.sentences, alignment=args.alignment, voice=voice,
                      progress=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run_meta("python -m latency_bench.word_timestamps", argv), "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
