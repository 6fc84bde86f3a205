"""Word timestamps through the engine (issue 51), on the CPU with the default voice: a
stream that asks gets each word of its turn once, in order, with start < end, never before
the audio that completes it and before its segment's end; streams that do not ask are
unaffected."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine import WordTiming
from engine.alignment import word_token_spans
from engine.bundle import load_bundle
from engine.engine import Engine, EngineConfig, StreamParams
from engine.sampling import SamplingParams
from engine.voice import VoiceInput

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def bundle():
    return load_bundle("default", "cpu")


@pytest.fixture(scope="module")
def engine(bundle):
    engine = Engine(bundle, EngineConfig(max_running=4, max_queued=4, max_len=1536)).start()
    forward = engine.codec.frames

    def frames(items):  # a spy on the real codec worker: each stream's code frames
        for owner, _, _, codes in items:
            owner.sink.frames.append(np.array(codes))
        forward(items)

    engine.codec.frames = frames
    yield engine
    engine.stop()


class Sink:
    """Records every call in order: ("audio", turn, samples) / ("words", turn, [WordTiming])
    / ("end", turn, reason), on the thread that made it."""

    def __init__(self, ends: int = 1):
        self.events, self.errors = [], []
        self.ready, self.done = threading.Event(), threading.Event()
        self.ends, self.threads = ends, set()
        self.frames = []

    def on_ready(self, cached, ms):
        self.ready.set()

    def on_audio(self, turn, pcm):
        self.threads.add(threading.current_thread().name)
        self.events.append(("audio", turn, pcm))

    def on_words(self, turn, words):
        self.threads.add(threading.current_thread().name)
        self.events.append(("words", turn, list(words)))

    def on_segment_end(self, turn, reason):
        self.events.append(("end", turn, reason))
        if sum(e[0] == "end" for e in self.events) >= self.ends:
            self.done.set()

    def on_error(self, code, message):
        self.errors.append((code, message))
        self.done.set()

    def words(self, turn: int) -> dict[int, WordTiming]:
        out = {}
        for kind, t, payload in self.events:
            if kind == "words" and t == turn:
                out.update({w.index: w for w in payload})
        return out

    def audio(self, turn: int) -> np.ndarray:
        parts = [p for kind, t, p in self.events if kind == "audio" and t == turn]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def speak(engine, texts: list[str], params: StreamParams, turn: int = 1) -> Sink:
    sink = Sink(ends=len(texts))
    handle = engine.open(VoiceInput(), params, sink)
    try:
        assert sink.ready.wait(60)
        for text in texts:
            engine.say(handle, turn, text)
        assert sink.done.wait(120) and not sink.errors, sink.errors
    finally:
        engine.close(handle)
    return sink


def test_word_spans_map_whitespace_words_to_their_tokens(bundle):
    encode = bundle.tokenizer.encode
    words, spans, total = word_token_spans("  Hello,   wide\u2019s world! \U0001f600 ok", encode)
    assert words == ["Hello,", "wide\u2019s", "world!", "\U0001f600", "ok"]
    norm = "Hello, wide's world! ok"
    assert total == len(encode(norm))
    assert [norm.encode()[a:b].decode() for a, b in spans] == ["Hello,", "wide's", "world!", "", "ok"]


def test_each_word_once_in_order_after_its_audio_and_before_its_segment_end(engine, bundle):
    texts = ["The quick brown fox jumps over the lazy dog.", "It was a bright cold day in April."]
    sink = speak(engine, texts, StreamParams(GREEDY, frame_budget=200, word_timestamps=True))
    rate = bundle.codec.sample_rate
    assert sink.threads == {"codec"}  # on_words on the same thread as on_audio
    words = sink.words(1)
    expected = " ".join(texts).split()
    assert [words[i].text for i in range(len(expected))] == expected and len(words) == len(expected)
    total = len(sink.audio(1)) / rate
    for a, b in zip(list(words.values()), list(words.values())[1:]):
        assert a.start < a.end <= b.start + 1e-9 < b.end, (a, b)
    assert words[len(expected) - 1].end <= total + 1e-9
    # each delivery comes after the audio up to its words' ends; a segment's words before its end
    heard, ends = 0, 0
    for kind, _, payload in sink.events:
        if kind == "audio":
            heard += len(payload)
        elif kind == "words":
            assert all(w.end * rate <= heard + 1 for w in payload), (heard, payload)
            assert all(w.index < len(texts[0].split()) for w in payload) or ends == 1
        else:
            ends += 1
    segment_two = [e for e in sink.events if e[0] == "end"]
    assert len(segment_two) == 2


def test_streams_without_the_flag_get_no_words_and_the_same_audio(engine):
    text = "A short plain sentence."
    plain = speak(engine, [text], StreamParams(GREEDY, frame_budget=120))
    timed = speak(engine, [text], StreamParams(GREEDY, frame_budget=120, word_timestamps=True))
    assert not any(e[0] == "words" for e in plain.events)
    assert len(plain.frames) == len(timed.frames) > 10
    assert all(np.array_equal(a, b) for a, b in zip(plain.frames, timed.frames))
    # the same samples up to the codec's batching (float rounding)
    assert len(plain.audio(1)) == len(timed.audio(1))
    assert np.allclose(plain.audio(1), timed.audio(1), atol=1e-4)
    assert len(timed.words(1)) == len(text.split())
