"""The embedded default voice (engine/assets/default) really speaks: the fast subset of the
voice's quality gates (issue 6; the full benchmark is training/recipe/evaluate.py).

What a user would notice, on the CPU, with the shipped weights:
- `--model default` is the trained voice, inside the 40 MB budget, with its model card;
- held-out plain sentences (never in training) come out as words pocketsphinx recognizes,
  through the engine and through the service (WebSocket, text streamed in pieces, PCM);
- the audio's length fits the sentence (the model stops by itself), and every reply ends
  with the audio the codec held back for it (its lookahead), none of it left for the next;
- cloning: a reference clip of a higher pseudo-speaker moves the output's pitch to it.

A decode path that produces garbage at full speed (a wrong codebook order, a scale layout
bug, a broken KV cache) scores a WER near 1.0 here; the thresholds leave room for the
recognizer's own errors on a small voice (the teacher itself scores ~0.13).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from engine.audio import load_audio, resample
from engine.bundle import DEFAULT_FOLDER, load_bundle
from engine.generate import Synthesizer
from engine.prompt import Voice
from training.corpus import plain_sentences
from training.evaluate import ASR_RATE, FEATURE_RATE, WER, Recognizer, pitch_semitones, synthesize
from server import running_server

# Until a trained voice is packaged (issue 6), `default` is the random `tiny` preset, which
# cannot speak: these tests then skip, and run as soon as engine/assets/default exists.
pytestmark = pytest.mark.skipif(not (DEFAULT_FOLDER / "config.json").exists(),
                                reason="no trained default voice is packaged yet (engine/assets/default, issue 6)")

FIXTURES = Path(__file__).parent / "fixtures" / "voice"
PLAIN = [item["text"] for item in plain_sentences()]
SENTENCES = PLAIN[:6]
MAX_WER_ENGINE = 0.45  # gate 0.30 on 99 sentences through the service; six here
MAX_WER_SERVICE = 0.45  # six other sentences (two, ~23 words, swung by 0.04 a word: 0.52 once at a 0.21 benchmark)


@pytest.fixture(scope="module")
def bundle():
    return load_bundle("default", "cpu")


@pytest.fixture(scope="module")
def synth(bundle):
    return Synthesizer(bundle)


@pytest.fixture(scope="module")
def asr():
    return Recognizer()


def speak(synth: Synthesizer, text: str, voice=None, seed: int = 0) -> np.ndarray:
    return synthesize(synth, text, voice, seed, max_frames=600)[0]  # the benchmark's engine path


def pitch(audio: np.ndarray, rate: int) -> float:
    return pitch_semitones(resample(audio, rate, FEATURE_RATE))


def test_default_is_the_packaged_voice_within_its_size_budget(bundle):
    files = {p.name: p.stat().st_size for p in DEFAULT_FOLDER.iterdir()}
    assert {"config.json", "model.safetensors", "codec.pth", "MODEL_CARD.md"} <= set(files), files
    assert sum(files.values()) <= 40 * 10**6, files
    assert Path(bundle.name) == DEFAULT_FOLDER  # not the random `tiny` preset
    assert bundle.codec.num_codebooks == bundle.config.num_codebooks
    card = (DEFAULT_FOLDER / "MODEL_CARD.md").read_text()
    assert "{{" not in card, "the model card still has template fields"


def test_plain_held_out_sentences_are_intelligible(synth, asr):
    rate = synth.bundle.codec.sample_rate
    wer = WER()
    for i, text in enumerate(SENTENCES):
        audio = speak(synth, text, seed=i)
        seconds = audio.size / rate
        # speech of ~12-18 characters a second: the model ended the segment itself
        assert 0.03 * len(text) < seconds < 0.15 * len(text), (text, seconds)
        assert np.isfinite(audio).all() and 0.01 < np.abs(audio).max() <= 1.0
        wer.add(text, asr.transcribe(audio, rate))
    assert wer.value <= MAX_WER_ENGINE, wer.report()


def test_cloning_moves_the_pitch_to_the_reference_speaker(synth):
    """Two held-out clips of the teacher data: speaker 0 (the teacher) and speaker 4 (tape
    x1.28, ~4.3 semitones higher). The same sentence cloned from each must come out nearer
    in pitch to its own reference than to the other one."""
    meta = json.loads((FIXTURES / "references.json").read_text())
    rate = synth.bundle.codec.sample_rate
    refs = {r["speaker"]: synth.encode_reference(FIXTURES / r["file"], r["text"]) for r in meta}
    ref_pitch = {r["speaker"]: pitch(load_audio(FIXTURES / r["file"], rate), rate) for r in meta}
    assert ref_pitch[4] - ref_pitch[0] > 2.5, ref_pitch  # the fixtures themselves differ
    for speaker, reference in refs.items():
        out = pitch(speak(synth, PLAIN[10], Voice([reference]), seed=3), rate)
        other = next(s for s in refs if s != speaker)
        assert abs(out - ref_pitch[speaker]) < abs(out - ref_pitch[other]), (speaker, out, ref_pitch)


def test_the_service_streams_intelligible_speech(tmp_path, asr):
    from clients import connect

    async def run(url):
        async with await connect(url, format="pcm", sample_rate=ASR_RATE, latency="balanced", seed=0) as session:
            out = []
            for text in PLAIN[6:12]:
                pieces = [w + " " for w in text.split()]  # as an LLM streams tokens
                result = await session.speak(pieces)
                out.append((text, np.frombuffer(result.audio, "<i2").astype(np.float32) / 32768.0))
            return out

    wer = WER()
    with running_server(tmp_path, model="default") as srv:
        for text, pcm in asyncio.run(run(srv.ws_url)):
            assert 0.03 * len(text) < pcm.size / ASR_RATE < 0.15 * len(text), (text, pcm.size)
            wer.add(text, asr.transcribe(pcm, ASR_RATE))
    assert wer.value <= MAX_WER_SERVICE, wer.report()



def test_every_reply_ends_with_the_audio_the_codec_held_back(tmp_path, bundle):
    """The default codec holds a reply's last hops back (its istft lookahead) until the
    reply ends; the service sends them as the reply's last audio. So every reply at the
    codec's own rate is a whole number of frames plus exactly those samples, also the
    second reply of a connection (whose start once carried the first one's end)."""
    from clients import connect
    from engine.codec.streaming import StreamingDecoder

    rate, hop = bundle.codec.sample_rate, bundle.codec.hop_length
    held = StreamingDecoder(bundle.codec, 1).drain_samples
    assert 0 < held < hop

    async def run(url):
        async with await connect(url, format="pcm", sample_rate=rate, seed=0) as session:
            return [len((await session.speak([text])).audio) // 2 for text in PLAIN[12:14]]

    with running_server(tmp_path, model="default") as srv:
        lengths = asyncio.run(run(srv.ws_url))
    assert len(lengths) == 2
    for samples in lengths:
        assert samples > 10 * hop and samples % hop == held, (lengths, hop, held)


def test_cloning_references_of_a_minimum_length_are_chosen_deterministically():
    """training.evaluate.clone_references (the benchmark's --clone-min-reference-seconds):
    the same targets as clone_trials; from each trial's usual reference onward, the first one
    or two consecutive utterances of its speaker that total the minimum, never the target
    sentence; S = 0 is clone_trials' single reference. No model runs here."""
    from training.evaluate import HeldOut, Item, clone_references, clone_trials

    rate = 100
    seconds = [1.0, 4.0, 2.0, 6.0]  # one speaker; texts < 60 characters, so every text is a target
    held = HeldOut([Item(f"u{i}", 0, f"sentence {i}", "test", np.zeros(int(s * rate), np.float32))
                    for i, s in enumerate(seconds)], rate)
    # trial k: reference u(k % 4), target sentence (7k + 3) % 4: u3, u2, u1, u0
    base = clone_trials(held, 4)
    assert [(r.id, t) for r, t in base] == [("u0", "sentence 3"), ("u1", "sentence 2"),
                                            ("u2", "sentence 1"), ("u3", "sentence 0")]
    ids = lambda trials: [[it.id for it in refs] for refs, _ in trials]  # noqa: E731
    assert ids(clone_references(held, 4, 0.0)) == [["u0"], ["u1"], ["u2"], ["u3"]]
    five = clone_references(held, 4, 5.0)
    # trial 1 skips u2 (its target) and takes u3; trial 3's u3 alone is long enough
    assert ids(five) == [["u0", "u1"], ["u1", "u3"], ["u2", "u3"], ["u3"]]
    # 8 s: trial 0 has no run of two (without u3, its target) that long: the longest one
    assert ids(clone_references(held, 4, 8.0)) == [["u1", "u2"], ["u1", "u3"], ["u2", "u3"], ["u3", "u1"]]
    for refs, target in five + clone_references(held, 4, 8.0):
        assert 1 <= len(refs) <= 2 and all(it.text != target for it in refs)
    assert [t for _, t in five] == [t for _, t in base]
    assert ids(clone_references(held, 4, 5.0)) == ids(five)  # deterministic
