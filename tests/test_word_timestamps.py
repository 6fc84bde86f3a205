"""Word timestamps through the engine (issue 51), on the CPU with the default voice: a
stream that asks gets each word of its turn once, in order, with start < end, never before
the audio that completes it, at most one audio chunk after it, and before its segment's
end; the timings match pocketsphinx's forced alignment of the same audio (the issue's
gate, at the level measured); cancelled turns get no more words; a stream's words are the
same alone and in a batch; streams that do not ask are unaffected."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine import WordTiming
from engine.alignment import word_token_spans
from engine.bundle import load_bundle
from engine.engine import BenchSettings, Engine, EngineConfig, StreamParams
from engine.sampling import SamplingParams
from engine.voice import VoiceInput
from test_engine import tap_frames as tap

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def bundle():
    return load_bundle("default", "cpu")


@pytest.fixture(scope="module")
def engine(bundle):
    engine = tap(Engine(bundle, EngineConfig(max_running=4, max_queued=4, max_len=1536)).start())
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
    # where the segment's prompt holds that text: what the readout reads (DeviceState.text_spans)
    prompt = bundle.prompts.segment("  Hello,   wide\u2019s world! \U0001f600 ok")
    first, n = bundle.prompts.segment_text_span(prompt)
    assert prompt[0, first : first + n].tolist() == encode(norm) and n == total


def test_each_word_once_in_order_after_its_audio_and_before_its_segment_end(engine, bundle):
    """Two segments of one turn: the second one's words continue the first one's count and
    its times the turn's audio; each on_words call comes after the on_audio that delivers
    its words' ends, and no later than the one after it (or the segment's end); a
    correction replaces its index."""
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
    # each segment's last word comes as soon as it is spoken, then its end is corrected
    assert check_delivery(sink.events, rate, first_segment_words=len(texts[0].split())) >= 1


def check_delivery(events: list, rate: int, first_segment_words: int) -> int:
    """Each on_words call after the audio up to its words' ends, and at most one on_audio
    call after the one that first covered a word's end; the first segment's words all
    before its end, none of the second's; a word sent again (a correction) keeps its text
    and start and ends later. Returns how many corrections came."""
    heard, ends, before_end, seen, corrections = [0], 0, set(), {}, 0
    for kind, _, payload in events:
        if kind == "audio":
            heard.append(heard[-1] + len(payload))
        elif kind == "words":
            for w in payload:
                if w.index in seen:  # a correction replaces the word of its index: a later end
                    old = seen[w.index]
                    assert (w.text, w.start) == (old.text, old.start) and w.end > old.end, (old, w)
                    corrections += 1
                seen[w.index] = w
                end = round(w.end * rate)
                assert end <= heard[-1] + 1, (heard[-1], w)
                covered = next(i for i, h in enumerate(heard) if h + 1 >= end)  # audio calls that covered it
                assert len(heard) - 1 - covered <= 1, (w, covered, len(heard) - 1)
                if ends == 0:
                    before_end.add(w.index)
        else:
            ends += 1
    assert before_end == set(range(first_segment_words)), before_end
    return corrections


def test_streams_without_the_flag_get_no_words_and_the_same_audio(engine, bundle):
    """Also the same frames as an engine without the readout (BenchSettings.alignment off):
    reading the attention changes nothing the model computes."""
    text = "A short plain sentence."
    plain = speak(engine, [text], StreamParams(GREEDY, frame_budget=120))
    timed = speak(engine, [text], StreamParams(GREEDY, frame_budget=120, word_timestamps=True))
    assert not any(e[0] == "words" for e in plain.events)
    before = tap(Engine(bundle, EngineConfig(max_running=4, max_queued=4, max_len=1536,
                                             bench=BenchSettings(alignment=False))).start())
    try:
        without = speak(before, [text], StreamParams(GREEDY, frame_budget=120))
    finally:
        before.stop()
    assert len(without.frames) == len(plain.frames) and all(np.array_equal(a, b) for a, b in zip(without.frames,
                                                                                                  plain.frames))
    assert len(plain.frames) == len(timed.frames) > 10
    assert all(np.array_equal(a, b) for a, b in zip(plain.frames, timed.frames))
    # the same samples up to the codec's batching (float rounding)
    assert len(plain.audio(1)) == len(timed.audio(1))
    assert np.allclose(plain.audio(1), timed.audio(1), atol=1e-4)
    assert len(timed.words(1)) == len(text.split())


def test_a_cancelled_turn_gets_no_more_words_and_the_next_turn_counts_afresh(engine, bundle):
    sink = Sink(ends=1)
    handle = engine.open(VoiceInput(), StreamParams(GREEDY, frame_budget=300, word_timestamps=True), sink)
    try:
        assert sink.ready.wait(60)
        engine.say(handle, 1, "This first reply is long enough to be cut off in the middle of a word or two.")
        deadline = time.monotonic() + 60
        while not any(e[0] == "audio" for e in sink.events) and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.cancel(handle)
        cut = len(sink.events)
        time.sleep(0.5)
        assert not any(e[0] == "words" and e[1] == 1 for e in sink.events[cut:]), sink.events[cut:]
        engine.say(handle, 2, "Then a short one.")
        assert sink.done.wait(120) and not sink.errors
    finally:
        engine.close(handle)
    words = sink.words(2)
    assert [words[i].text for i in sorted(words)] == ["Then", "a", "short", "one."] and sorted(words) == [0, 1, 2, 3]
    audio = sink.audio(2)
    assert 0 <= words[0].start < 0.3 and words[3].end <= len(audio) / bundle.codec.sample_rate + 1e-9


def test_words_are_the_same_alone_and_in_a_batch(engine):
    texts = ["Good morning, how are you today?", "The weather is lovely.", "Please close the window."]
    params = lambda: StreamParams(GREEDY, frame_budget=150, word_timestamps=True)  # noqa: E731
    alone = [speak(engine, [t], params()).words(1) for t in texts]
    sinks = [Sink() for _ in texts]
    handles = [engine.open(VoiceInput(), params(), s) for s in sinks]
    try:
        for s in sinks:
            assert s.ready.wait(60)
        for h, t in zip(handles, texts):
            engine.say(h, 1, t)
        for s in sinks:
            assert s.done.wait(120) and not s.errors
    finally:
        for h in handles:
            engine.close(h)
    assert [s.words(1) for s in sinks] == alone


def test_accuracy_against_pocketsphinx_forced_alignment():
    """The issue's gate on 20 held-out sentences (latency_bench.word_timestamps; sentences
    0-29 chose the heads): median word-start error <= 60 ms and 90% within 150 ms, asserted
    at the measured level (24 ms, 97%; the characters-over-frames estimate measures 85 ms
    and 72%); each word once, in order; no speech outside the words' spans but breaths."""
    from latency_bench.word_timestamps import measure

    r = measure(20)
    assert r["sentences"] == 20 and r["words"] >= 150, r
    assert r["start_error_median_abs_s"] <= 0.035, r
    assert r["start_within_150ms"] >= 0.95 and r["start_within_60ms"] >= 0.85, r
    assert r["end_error_median_abs_s"] <= 0.040, r
    assert not r["order_problems"], r
    assert r["speech_energy_outside_words_max"] <= 0.08 and r["longest_speech_outside_words_s"] <= 0.1, r
