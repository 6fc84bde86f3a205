"""The engine with its threads: batched decoding gives each stream exactly the frames it
gets alone (greedy), also when streams join and leave mid-flight; cancel and close free
the slot within a step; a voice prefix is reused from the cache."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from conftest import UPSTREAM
from engine.bundle import ModelBundle, load_bundle
from engine.checkpoint import load_checkpoint
from engine.engine import BenchSettings, Engine, EngineConfig, StreamParams
from engine.generate import GenerateOptions, Synthesizer
from engine.prompt import PromptBuilder
from engine.sampling import SamplingParams
from engine.voice import ReferenceInput, VoiceInput

GREEDY = SamplingParams(temperature=0.0)
TEXTS = ["Hello there.", "A somewhat longer sentence, with a clause.", "Short!", "Numbers: 1, 2, 3."]


@pytest.fixture(scope="module")
def bundle():
    """The upstream-parity S2 checkpoint (fp32) with the tiny codec (4 codebooks)."""
    model, tok = load_checkpoint(UPSTREAM / "s2", "cpu", torch.float32)
    codec = load_bundle("tiny", "cpu").codec
    return ModelBundle("s2-fixture", model, tok, codec, PromptBuilder(tok, model.config), 0.0)


class Recorder:
    def __init__(self):
        self.frames, self.audio, self.ends, self.errors = [], [], [], []
        self.ready = threading.Event()
        self.done = threading.Event()
        self.expected_ends = 1

    def on_ready(self, cached, ms):
        self.cached = cached
        self.ready.set()

    def on_audio(self, turn, pcm):
        self.audio.append((turn, pcm))

    def on_segment_end(self, turn, reason):
        self.ends.append((turn, reason))
        if len(self.ends) >= self.expected_ends:
            self.done.set()

    def on_error(self, code, message):
        self.errors.append((code, message))
        self.done.set()


def tap_frames(engine: Engine) -> Engine:
    """Record each stream's code frames on their way to the codec (a spy on the real worker)."""
    forward = engine.codec.frames

    def frames(items):
        for owner, _, _, codes in items:
            owner.sink.frames.append(np.array(codes))
        forward(items)

    engine.codec.frames = frames
    return engine


def alone(bundle, text, n):
    synth = Synthesizer(bundle, max_len=512)
    return [f.numpy() for f in synth.frames([text], None, GREEDY, GenerateOptions(max_frames=n))]


def alone_in_engine(bundle, text, n, config: EngineConfig):
    """A stream's frames when it is the only one in an engine of this config."""
    engine = Engine(bundle, config).start()
    tap_frames(engine)
    try:
        sink = Recorder()
        handle = engine.open(VoiceInput(), StreamParams(GREEDY, frame_budget=n), sink)
        assert sink.ready.wait(30)
        engine.say(handle, 1, text)
        assert sink.done.wait(60) and not sink.errors
        return sink.frames
    finally:
        engine.stop()


def check_batched_equals_alone(bundle, n: int = 16, kv_quant: str = "none", prefill_second_frame: bool = True,
                               alone_in_the_engine: bool = False) -> None:
    """Four streams, two joining while the first two decode, each get exactly the frames
    (and the audio length) the single-stream path gives them (with an FP8 KV cache, or
    `alone_in_the_engine`: the frames each gets alone in an engine with that config)."""
    # a small KV pool: on a GPU the default takes most of the card, and these engines follow each other
    config = EngineConfig(max_running=4, max_queued=0, max_len=512, kv_quant=kv_quant, kv_cache_bytes=256 << 20,
                          bench=BenchSettings(prefill_second_frame=prefill_second_frame))
    if kv_quant == "none" and not alone_in_the_engine:
        expected = [alone(bundle, t, n) for t in TEXTS]
    else:
        expected = [alone_in_engine(bundle, t, n, config) for t in TEXTS]
    engine = Engine(bundle, config).start()
    tap_frames(engine)
    try:
        sinks = [Recorder() for _ in TEXTS]
        handles = [engine.open(VoiceInput(), StreamParams(GREEDY, frame_budget=n), s) for s in sinks]
        for s in sinks:
            assert s.ready.wait(30)
        engine.say(handles[0], 1, TEXTS[0])
        engine.say(handles[1], 1, TEXTS[1])
        time.sleep(0.05)  # streams 2 and 3 join while 0 and 1 are decoding
        engine.say(handles[2], 1, TEXTS[2])
        engine.say(handles[3], 1, TEXTS[3])
        for s in sinks:
            assert s.done.wait(60) and not s.errors
        for s, exp in zip(sinks, expected):
            assert len(s.frames) == len(exp)
            assert all(np.array_equal(a, b) for a, b in zip(s.frames, exp))
            samples = sum(len(p) for _, p in s.audio)
            assert samples == len(exp) * bundle.codec.hop_length
    finally:
        engine.stop()


def test_fp8_kv_cache_keeps_streams_apart(bundle):
    """With the FP8 KV cache each position's codes and scale depend on that position's
    keys and values alone, so batching still gives each stream its own frames."""
    check_batched_equals_alone(bundle, kv_quant="fp8")


def test_kv_quant_is_validated():
    with pytest.raises(ValueError, match="kv_quant"):
        EngineConfig(kv_quant="int4")


def test_cancel_and_close_free_the_stream_within_a_step(bundle):
    engine = Engine(bundle, EngineConfig(max_running=2, max_streams=2, max_queued=1, max_len=512)).start()
    try:
        long = StreamParams(SamplingParams(temperature=0.0, allow_end=False), frame_budget=400)
        a, b = Recorder(), Recorder()
        ha, hb = engine.open(VoiceInput(), long, a), engine.open(VoiceInput(), long, b)
        assert a.ready.wait(10) and b.ready.wait(10)
        engine.say(ha, 1, TEXTS[1])
        engine.say(hb, 1, TEXTS[1])
        while len(a.audio) < 3 or len(b.audio) < 3:
            time.sleep(0.005)
        steps = engine.steps
        engine.cancel(ha)
        engine.close(hb)
        deadline = time.monotonic() + 5
        while engine.stats()["streams_decoding"] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert engine.stats()["streams_decoding"] == 0
        assert engine.steps - steps <= 2  # the step in flight, and at most one launched before the lock was taken
        # b's slot is free: a waiting stream gets it
        c = Recorder()
        engine.open(VoiceInput(), long, c)
        assert c.ready.wait(10)
        # nothing of a's cancelled turn arrives any more; its voice is still prefilled and
        # the next turn speaks at once
        heard = len(a.audio)
        engine.say(ha, 2, TEXTS[0])
        deadline = time.monotonic() + 10
        while not any(t == 2 for t, _ in a.audio) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert all(t == 2 for t, _ in a.audio[heard:]) and any(t == 2 for t, _ in a.audio)
    finally:
        engine.stop()


def test_voice_prefix_is_cached_by_content(bundle):
    engine = Engine(bundle, EngineConfig(max_running=3, max_queued=0, max_len=1024)).start()
    try:
        codes = torch.randint(0, 64, (4, 30))
        voice = VoiceInput((ReferenceInput("A stored reference.", codes=codes),))
        first, second, other = Recorder(), Recorder(), Recorder()
        engine.open(voice, StreamParams(), first)
        assert first.ready.wait(10) and first.cached is False
        engine.open(VoiceInput((ReferenceInput("A stored reference.", codes=codes.clone()),)), StreamParams(), second)
        assert second.ready.wait(10) and second.cached is True
        engine.open(VoiceInput((ReferenceInput("Another text.", codes=codes),)), StreamParams(), other)
        assert other.ready.wait(10) and other.cached is False
        assert engine.stats()["voice_cache_hits"] == 1
    finally:
        engine.stop()


def test_a_model_that_never_stops_is_cut_at_the_end_of_the_context(bundle):
    """Frames are KV positions: a stream whose model never says end-of-speech, with a frame
    budget far past the KV, is cut where the KV ends (reason "context") instead of writing
    past it (that was an IndexError in the decode thread, and every stream stalled), and
    its next turn restarts from the voice prefix and is cut the same way."""
    max_len = 320  # a voice prompt needs 256 positions of room (Engine's "leaves no room")
    engine = Engine(bundle, EngineConfig(max_running=1, max_queued=0, max_len=max_len)).start()
    try:
        sink = Recorder()
        sink.expected_ends = 2
        endless = StreamParams(SamplingParams(temperature=0.0, allow_end=False), frame_budget=1024)
        handle = engine.open(VoiceInput(), endless, sink)
        assert sink.ready.wait(10)
        engine.say(handle, 1, TEXTS[0])
        engine.say(handle, 2, TEXTS[2])
        assert sink.done.wait(60), sink.ends
        assert sink.ends == [(1, "context"), (2, "context")] and not sink.errors
        hop = bundle.codec.hop_length
        for turn in (1, 2):
            samples = sum(pcm.size for t, pcm in sink.audio if t == turn)
            assert samples % hop == 0 and 0 < samples // hop < max_len
    finally:
        engine.stop()


def test_a_failed_decode_step_fails_its_streams_and_the_engine_goes_on(bundle):
    """A decode step that raises (a device error, a bug) must not stall the service: the
    streams in it hear an `internal` error and lose their turn in progress; their next
    turns, and a stream that was idle meanwhile, speak as before."""
    engine = Engine(bundle, EngineConfig(max_running=3, max_queued=0, max_len=512)).start()
    try:
        long = StreamParams(SamplingParams(temperature=0.0, allow_end=False), frame_budget=400)
        short = StreamParams(SamplingParams(temperature=0.0, allow_end=False), frame_budget=6)
        a, b, idle = Recorder(), Recorder(), Recorder()
        ha, hb = engine.open(VoiceInput(), long, a), engine.open(VoiceInput(), long, b)
        hi = engine.open(VoiceInput(), short, idle)
        assert a.ready.wait(10) and b.ready.wait(10) and idle.ready.wait(10)
        launch, calls = engine.runner.launch, []

        def failing_launch(slots, kv_len, updates=()):
            calls.append(len(slots))
            if len(calls) == 5:
                raise RuntimeError("injected device fault")
            return launch(slots, kv_len, updates)

        engine.runner.launch = failing_launch
        engine.say(ha, 1, TEXTS[1])
        engine.say(hb, 1, TEXTS[1])
        assert a.done.wait(10) and b.done.wait(10)
        for sink in (a, b):
            assert sink.errors and sink.errors[0][0] == "internal" and "injected" in sink.errors[0][1]
        deadline = time.monotonic() + 5
        while engine.stats()["streams_decoding"] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.stats()["streams_decoding"] == 0  # the 400-frame turns were dropped
        # the engine goes on: the idle stream, and the failed streams' next turns, speak
        for h, sink in ((hi, idle), (ha, a)):
            sink.done.clear()
            sink.ends.clear()
            sink.expected_ends = 1
            engine.say(h, 2, TEXTS[0])
        assert idle.done.wait(20) and idle.ends == [(2, "budget")] and not idle.errors
        assert any(t == 2 for t, _ in idle.audio)
        deadline = time.monotonic() + 20
        while not any(t == 2 for t, _ in a.audio) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert any(t == 2 for t, _ in a.audio) and len(a.errors) == 1
    finally:
        engine.stop()


def test_a_voice_too_long_for_the_context_is_an_error(bundle):
    engine = Engine(bundle, EngineConfig(max_running=1, max_queued=0, max_len=128)).start()
    try:
        sink = Recorder()
        engine.open(VoiceInput((ReferenceInput("Long.", codes=torch.zeros(4, 200, dtype=torch.long)),)), StreamParams(), sink)
        assert sink.done.wait(10)
        assert sink.errors[0][0] == "too_large" and "leaves no room" in sink.errors[0][1]
    finally:
        engine.stop()


def test_batched_prefill_equals_one_at_a_time(bundle):
    """Segments of several streams at different positions, prefilled in one batch, give
    the same first frames, device state and KV as prefilled one by one."""
    from engine.runner import Runner

    greedy = SamplingParams(temperature=0.0)
    texts = ["Hello there.", "A longer sentence, with a clause in it.", "Short!"]
    slots = (2, 0, 3)
    prefixes = [bundle.prompts.voice_prefix(None)[:, :k] for k in (5, 9, 3)]
    one, many = Runner(bundle, 4, 512), Runner(bundle, 4, 512)
    for runner in (one, many):
        for slot, prefix in zip(slots, prefixes):
            runner.prefill_prefix(slot, prefix)
    items = [(slot, p.shape[1], bundle.prompts.segment(t), greedy) for slot, p, t in zip(slots, prefixes, texts)]
    single = [one.prefill_segment(*item) for item in items]
    batched = many.prefill_segments(items)
    for slot, a, b in zip(slots, single, batched):
        assert np.array_equal(a, b)
        assert torch.equal(one.state.tokens[slot], many.state.tokens[slot]) and int(one.state.positions[slot]) == int(many.state.positions[slot])
        n = int(one.state.positions[slot])
        torch.testing.assert_close(one.state.row_kv(slot, n)[0], many.state.row_kv(slot, n)[0], rtol=1e-5, atol=1e-6)


def check_second_frame_equals_decode_step(bundle, **runner_args) -> None:
    """The prefill thread's second frame (Runner.second_frames) is the frame the decode
    step gives, with the same device state and KV left behind. Slot 1 is stepped by
    second_frames and slot 2 by a decode step in the same runner; a reference runner
    steps both by decode steps. A segment that ends at the KV's end (room for its first
    frame only) is stepped in the scratch row: its own state is left as it was."""
    from engine.runner import Runner

    segment = bundle.prompts.segment("Hello there, how are you?")
    starts = {1: 7, 2: 30}  # voice-prefix lengths: the segments sit at other positions
    ends = {slot: start + segment.shape[1] for slot, start in starts.items()}
    runner, reference = Runner(bundle, 4, 512, **runner_args), Runner(bundle, 4, 512, **runner_args)
    for r in (runner, reference):
        for slot, start in starts.items():
            r.prefill_prefix(slot, bundle.prompts.voice_prefix(None)[:, :start])
    firsts = runner.prefill_segments([(slot, start, segment, GREEDY) for slot, start in starts.items()])
    seconds = {1: runner.second_frames([1], [ends[1]])[0], 2: runner.read(runner.launch([2], ends[2] + 1))[0]}
    for (slot, start), first in zip(starts.items(), firsts):
        assert np.array_equal(reference.prefill_segment(slot, start, segment, GREEDY), first)
        assert np.array_equal(reference.read(reference.launch([slot], ends[slot] + 1))[0], seconds[slot]), slot
        for name in ("tokens", "positions", "frame_index", "windows"):
            assert torch.equal(getattr(runner.state, name)[slot], getattr(reference.state, name)[slot]), (slot, name)
        assert int(runner.state.positions[slot]) == ends[slot] + 1 and int(runner.state.frame_index[slot]) == 2
        n = ends[slot] + 1
        # close, not equal: the runner prefilled both segments in one batch, the reference
        # each alone, and a GPU's GEMMs may sum rows of a 2-segment batch in another order
        # (H200, fp32: one value of 4,864 off by 1.4e-6)
        torch.testing.assert_close(runner.state.row_kv(slot, n)[0], reference.state.row_kv(slot, n)[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(runner.state.row_kv(slot, n)[1], reference.state.row_kv(slot, n)[1], rtol=1e-4, atol=1e-5)
    # a segment ending at the KV's end: its slot's state untouched, nothing written past the KV
    full = runner.max_len - segment.shape[1]
    runner.prefill_prefix(3, bundle.prompts.voice_prefix(None)[:, :7])
    runner.prefill_segment(3, full, segment, GREEDY)
    before = {name: getattr(runner.state, name)[3].clone() for name in ("tokens", "positions", "frame_index", "windows")}
    runner.second_frames([3], [runner.max_len])
    for name, value in before.items():
        assert torch.equal(getattr(runner.state, name)[3], value), name


def test_the_prefills_second_frame_is_the_decode_steps_first(bundle):
    check_second_frame_equals_decode_step(bundle)


@pytest.mark.parametrize("second_frame", [True, False], ids=["f1-prefilled", "f1-decoded"])
def test_batched_streams_get_their_single_stream_frames_either_way_the_second_frame_is_made(bundle, second_frame):
    check_batched_equals_alone(bundle, prefill_second_frame=second_frame)


def test_a_cpu_engine_splits_the_cores_between_its_decode_and_codec_threads(bundle):
    """On a CPU the decode thread and the codec worker compute at once; with an all-core
    OpenMP team each, they wait on each other's cores (the default voice's service ran at
    0.57x real time with 2 threads on 2 cores, 0.34x with 1). The engine sets torch's
    threads when it starts: EngineConfig.cpu_threads, or half the cores."""
    from engine.engine import cpu_threads_auto

    before = torch.get_num_threads()
    try:
        for asked, expected in ((1, 1), (3, 3), (None, cpu_threads_auto())):
            engine = Engine(bundle, EngineConfig(max_running=1, max_queued=0, max_len=256, cpu_threads=asked)).start()
            engine.stop()
            assert torch.get_num_threads() == expected
        assert cpu_threads_auto() == max(1, len(os.sched_getaffinity(0)) // 2)
        for bad in (0, -2):
            with pytest.raises(ValueError, match="cpu_threads"):
                EngineConfig(cpu_threads=bad)
    finally:
        torch.set_num_threads(before)


def test_an_idle_conversation_whose_pages_were_taken_speaks_again_from_its_voice(bundle):
    """A pool too small for two contexts: a long turn of one stream takes the context
    pages of the other, idle one (least recently used first); the idle one's next turn
    starts from its voice prompt and speaks exactly what a fresh stream of that voice
    says (greedy), and no turn fails for lack of pages."""
    from engine.kv_cache import KVCache

    voice_len = bundle.prompts.voice_prefix(None).shape[1]
    page = 16
    page_bytes = KVCache.bytes_per_position(bundle.config, torch.float32) * page
    voice_pages = -(-voice_len // page)
    # the shared voice pages + 20: a's first turn (~5 pages) and b's 254-position reservation
    # (16 pages, and its copy of the voice's last page) do not fit together
    config = EngineConfig(max_running=2, max_queued=2, max_len=320, kv_page_size=page,
                          kv_cache_bytes=(1 + voice_pages + 20) * page_bytes)
    engine = Engine(bundle, config).start()
    tap_frames(engine)
    try:
        params = StreamParams(SamplingParams(temperature=0.0, allow_end=False), frame_budget=30)
        a, b = Recorder(), Recorder()
        ha, hb = engine.open(VoiceInput(), params, a), engine.open(VoiceInput(), params, b)
        assert a.ready.wait(10) and b.ready.wait(10)
        engine.say(ha, 1, "Turn one of the first stream.")
        assert a.done.wait(30) and not a.errors
        engine.say(hb, 1, "x" * 200)
        assert b.done.wait(30) and not b.errors and b.ends == [(1, "budget")]
        assert engine.stats()["kv_evicted_contexts"] >= 1
        a.done.clear()
        a.expected_ends = 2
        before = len(a.frames)
        engine.say(ha, 2, "Again, from the top.")
        assert a.done.wait(30) and not a.errors and a.ends[-1] == (2, "budget")
        again = a.frames[before:]
        fresh = Recorder()
        hf = engine.open(VoiceInput(), params, fresh)
        assert fresh.ready.wait(10)
        engine.say(hf, 1, "Again, from the top.")
        assert fresh.done.wait(30) and not fresh.errors
        assert len(again) == len(fresh.frames) == 30
        assert all(np.array_equal(x, y) for x, y in zip(again, fresh.frames))
    finally:
        engine.stop()
