"""The codec worker's hold-back policy: a stream's first frames are decoded at once, frames
are held back (to go out four at a time) only while the audio already sent leads
real-time playback by more than hold_lead_s, a held frame goes out when that lead runs
down even if no more frames come, and a segment end flushes everything before it."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

from engine.bundle import load_bundle
from engine.codec_worker import CHUNKS, CodecWorker, _Cut, _End, _Frame, batch_buckets, chunk_sizes
from engine.engine import EngineConfig


class Listener:
    def __init__(self) -> None:
        self.chunks: list[int] = []  # samples per audio callback
        self.ends: list[str] = []

    def wanted(self, turn: int) -> bool:
        return True

    def audio(self, turn: int, pcm: np.ndarray) -> None:
        self.chunks.append(len(pcm))

    def segment_end(self, turn: int, reason: str) -> None:
        self.ends.append(reason)


class Logged(Listener):
    """Appends ("audio" | "end", name, turn) to a log shared by several streams, in the
    order the worker calls back."""

    def __init__(self, name, log: list) -> None:
        super().__init__()
        self.name, self.log = name, log

    def audio(self, turn: int, pcm: np.ndarray) -> None:
        super().audio(turn, pcm)
        self.log.append(("audio", self.name, turn))

    def segment_end(self, turn: int, reason: str) -> None:
        super().segment_end(turn, reason)
        self.log.append(("end", self.name, turn))


@pytest.fixture(scope="module")
def codec():
    return load_bundle("tiny", "cpu", torch.float32).codec


def make_worker(codec, hold, max_chunk=CHUNKS[0], streams=2, cut_in=False):
    worker = CodecWorker(codec, streams, hold_lead_s=hold, max_chunk=max_chunk, cut_in=cut_in)
    clock = [1000.0]
    worker.clock = lambda: clock[0]
    return worker, clock


@pytest.mark.parametrize("max_chunk", [CHUNKS[0], 8])
def test_frames_are_held_only_while_well_ahead_of_real_time(codec, max_chunk):
    worker, clock = make_worker(codec, 0.3, max_chunk)
    hop, frame_s = codec.hop_length, worker.frame_s
    listener = Listener()
    total = 15 * max_chunk
    codes = np.random.default_rng(0).integers(0, 64, (total, codec.num_codebooks))
    start = clock[0]
    for i in range(total):  # frames arrive at twice real time
        worker._process([_Frame(listener, 0, 1, codes[i])])
        if i == 0:
            assert listener.chunks == [hop]  # the first frame goes out at once
        heard_s = sum(listener.chunks) / hop * frame_s
        assert heard_s >= clock[0] - start  # a real-time player never runs dry
        clock[0] += frame_s / 2
    assert len(listener.chunks) < total / 2  # most frames went out a full chunk at a time
    assert max(listener.chunks) == max_chunk * hop
    assert set(listener.chunks) <= {c * hop for c in worker.chunks}
    held = total - sum(listener.chunks) // hop
    assert held > 0
    worker._process([_End(listener, 0, 1, "end")])  # the end flushes the held frames first
    assert sum(listener.chunks) == total * hop and listener.ends == ["end"]


def run_staggered(codec, release_interval_s: float, steps: int = 80):
    """Four streams as a busy service decodes them: one frame each per decode step at
    three times real time, turns starting a step apart with a burst of 16 frames (so
    each is soon well ahead, and their chunks fill at different steps). Returns the
    worker and, per stream, [(time, samples heard)] from its first audio on."""
    worker = CodecWorker(codec, 4, hold_lead_s=0.3, release_interval_s=release_interval_s)
    clock = [1000.0]
    worker.clock = lambda: clock[0]
    step_s = worker.frame_s / 3
    codes = np.random.default_rng(3).integers(0, 64, (steps + 16, codec.num_codebooks))
    listeners = [Listener() for _ in range(4)]
    heard: list[list[tuple[float, int]]] = [[] for _ in range(4)]
    for t in range(steps):
        frames = []
        for s, lst in enumerate(listeners):
            if t >= s:
                frames += [_Frame(lst, s, 1, c) for c in (codes[:16] if t == s else codes[16 + t - s : 17 + t - s])]
        worker._process([frames])
        while (wait := worker._next_deadline()) is not None and wait < step_s:  # the worker's timer
            clock[0] += wait
            worker._process([])
        for s, lst in enumerate(listeners):
            if t >= s:
                heard[s].append((clock[0], sum(lst.chunks)))
        clock[0] = 1000.0 + (t + 1) * step_s
    return worker, listeners, heard


def test_streams_well_ahead_release_their_chunks_together(codec):
    """With a release interval, streams well ahead of real time send their full chunks
    in shared calls: fewer codec calls for the same audio, a turn's first audio still
    at once, and no real-time player runs dry."""
    hop = codec.hop_length
    alone, _, _ = run_staggered(codec, 0.0)
    worker, listeners, heard = run_staggered(codec, 0.05)
    assert worker.frames_decoded <= alone.frames_decoded  # (what is still held goes at the end)
    assert worker.calls <= 0.6 * alone.calls * worker.frames_decoded / alone.frames_decoded
    for s, lst in enumerate(listeners):
        start, first = heard[s][0]
        assert first > 0  # the turn's first audio went out at once, in the step it came
        for now, samples in heard[s]:
            assert samples / hop * worker.frame_s >= now - start - 1e-9  # never behind real time
    with pytest.raises(ValueError, match="release_interval"):
        CodecWorker(codec, 2, release_interval_s=2.0)
    with pytest.raises(ValueError, match="codec_release_interval_s"):
        EngineConfig(codec_release_interval_s=-0.1)


def test_chunk_sizes_are_powers_of_two_up_to_the_largest_offered():
    assert chunk_sizes(8) == (8, 4, 2, 1) and chunk_sizes(1) == (1,)
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="largest codec chunk"):
            chunk_sizes(bad)
    with pytest.raises(ValueError, match="largest codec chunk"):
        EngineConfig(codec_max_chunk=6)
    with pytest.raises(ValueError, match="codec_hold_lead_s"):
        EngineConfig(codec_hold_lead_s=-1.0)


def test_a_held_frame_goes_out_when_the_lead_runs_down(codec):
    worker, clock = make_worker(codec, 0.3)
    frame_s = worker.frame_s
    listener = Listener()
    codes = np.random.default_rng(1).integers(0, 64, (20, codec.num_codebooks))
    for i in range(20):  # far ahead: 20 frames at once, then one more
        worker._process([_Frame(listener, 1, 1, codes[i])])
    sent = sum(listener.chunks)
    worker._process([_Frame(listener, 1, 1, codes[0])])
    assert sum(listener.chunks) == sent  # held: the stream is ~0.9 s ahead
    wait = worker._next_deadline()
    assert wait == pytest.approx(sent / codec.hop_length * frame_s - 0.3, abs=1e-6)
    clock[0] += wait - 0.01
    worker._process([])
    assert sum(listener.chunks) == sent  # not yet
    clock[0] += 0.011
    worker._process([])  # the queue timed out: nothing new, the lead is down to 0.3 s
    assert sum(listener.chunks) == 21 * codec.hop_length


def test_no_hold_decodes_every_frame_at_once(codec):
    worker, _ = make_worker(codec, None)
    listener = Listener()
    codes = np.random.default_rng(2).integers(0, 64, (10, codec.num_codebooks))
    for i in range(10):
        worker._process([_Frame(listener, 0, 1, codes[i])])
    assert listener.chunks == [codec.hop_length] * 10


def test_a_first_frame_overtakes_another_streams_backlog(codec):
    """A backlog goes out one round (one chunk per stream) at a time, so a turn's first
    frame queued meanwhile is decoded in the next round, not after the whole backlog."""
    worker, clock = make_worker(codec, None)  # nothing held back: every frame is due
    log: list[tuple[str, str, int]] = []
    a, b = Logged("a", log), Logged("b", log)

    def order() -> list[str]:
        return [name for kind, name, _ in log if kind == "audio"]

    codes = np.random.default_rng(2).integers(0, 64, (12, codec.num_codebooks))
    worker._process([[_Frame(a, 0, 1, c) for c in codes]])  # one decode step's worth: 12 frames of a
    assert order() == ["a"] and a.chunks == [CHUNKS[0] * codec.hop_length]  # one round: a's first chunk
    assert worker._next_deadline() == 0.0  # a's frames are still due
    worker._process([_Frame(b, 1, 1, codes[0])])  # b's first frame arrives
    assert order() == ["a", "b", "a"]  # b (a single frame: smallest chunk first) before a's next chunk
    while worker._next_deadline() is not None:
        worker._process([])
    assert sum(a.chunks) == 12 * codec.hop_length and b.chunks == [codec.hop_length]
    assert order() == ["a", "b", "a", "a"]


def test_turns_ending_in_one_step_are_flushed_in_one_batch(codec):
    """The decode thread queues one end per stream whose turn ended in a step; their held
    frames go out batched across the streams (as many calls as one stream's flush), each
    stream's audio before its end and the next turn's first frame after it."""
    worker, clock = make_worker(codec, 0.3, streams=8)
    hop = codec.hop_length
    events: list[tuple[str, int, int]] = []
    listeners = [Logged(i, events) for i in range(8)]
    codes = np.random.default_rng(4).integers(0, 64, (14, codec.num_codebooks))
    for i in range(14):  # one decode step after another, far ahead of real time: most are held
        worker._process([[_Frame(listeners[s], s, 1, codes[i]) for s in range(8)]])
    held = sum(len(frames) for frames in worker._held.values())
    assert held >= 8 * 2  # frames wait to go out a full chunk at a time
    # how many calls one stream's flush takes
    alone, _ = make_worker(codec, 0.3, streams=1)
    one = Listener()
    for i in range(14):
        alone._process([_Frame(one, 0, 1, codes[i])])
    before = alone.calls
    alone._process([_End(one, 0, 1, "end")])
    one_stream_calls = alone.calls - before

    before = worker.calls
    events.clear()
    worker._process([_End(listeners[s], s, 1, "end") for s in range(8)]
                    + [[_Frame(listeners[s], s, 2, codes[0]) for s in range(8)]])
    assert worker.calls - before == one_stream_calls + 1  # the flush, then the next turns' first frames
    for s, listener in enumerate(listeners):
        mine = [e for e in events if e[1] == s]
        assert mine[-2:] == [("end", s, 1), ("audio", s, 2)]
        assert all(e == ("audio", s, 1) for e in mine[:-2])
        assert sum(listener.chunks) == 15 * hop and listener.ends == ["end"]


def _one_pass(worker: CodecWorker) -> None:
    """One pass of the worker's loop (_run) without waiting: what it took into its inbox
    mid-round first, then everything queued."""
    items, worker._inbox = worker._inbox, []
    while True:
        try:
            items.append(worker._queue.get_nowait())
        except queue.Empty:
            break
    worker._process(items)


@pytest.mark.parametrize("cut_in", [False, True])
def test_a_turns_first_frame_cuts_a_round_in_progress_short(codec, cut_in):
    """With cut_in, a turn's first frame queued while a round is decoded goes out before
    the round's remaining (larger) calls; the round after a cut runs whole, so a second
    such frame waits for them; every stream's audio stays whole and in order."""
    worker, clock = make_worker(codec, 0.3, streams=4, cut_in=cut_in)
    order: list[str] = []
    codes = np.random.default_rng(3).integers(0, 64, (40, codec.num_codebooks))

    class Named(Listener):
        def __init__(self, name: str, on_audio=None) -> None:
            super().__init__()
            self.name, self.on_audio = name, on_audio

        def audio(self, turn: int, pcm: np.ndarray) -> None:
            super().audio(turn, pcm)
            order.append(self.name)
            if self.on_audio:  # the decode thread queues frames while the worker decodes
                self.on_audio(), setattr(self, "on_audio", None)

    d = Named("d")
    c = Named("c", lambda: worker.frames([(d, 3, 1, codes[1])]))
    a, b = Named("a"), Named("b", lambda: worker.frames([(c, 2, 1, codes[2])]))
    near = int(0.3 // worker.frame_s) + 1
    for i in range(near):  # a's lead passes the hold: its frames now go out four at a time
        worker._process([_Frame(a, 0, 1, codes[i])])
    order.clear()
    # one round: b's first frame (1 frame, first), then a's chunk of 4
    worker._process([_Frame(b, 1, 1, codes[3]), [_Frame(a, 0, 1, codes[4 + i]) for i in range(CHUNKS[0])]])
    while worker._inbox or not worker._queue.empty():
        _one_pass(worker)
    if cut_in:  # c cut in before a's chunk; d, queued during c's call, waits for it (no second cut)
        assert order == ["b", "c", "a", "d"] and worker.cuts == 1
    else:
        assert order == ["b", "a", "c", "d"] and worker.cuts == 0
    assert sum(a.chunks) == (near + CHUNKS[0]) * codec.hop_length and a.chunks[-1] == CHUNKS[0] * codec.hop_length
    assert [sum(x.chunks) for x in (b, c, d)] == [codec.hop_length] * 3


def _two_streams_under_load(codec, cut_in: bool):
    """Stream a well ahead of real time, stream b's turn starting at step 10, frames of
    both coming from a "decode thread" at twice real time while the worker decodes (each
    audio callback queues the next step's frames); returns ({stream: PCM}, {stream:
    events in order}, rounds cut)."""
    worker, clock = make_worker(codec, 0.3, cut_in=cut_in)
    codes = np.random.default_rng(4).integers(0, 64, (40, codec.num_codebooks))
    steps = [[(0, t)] + ([(1, t)] if t >= 10 else []) for t in range(40)]
    pcm: dict[int, list] = {0: [], 1: []}
    events: dict[int, list] = {0: [], 1: []}

    class Rec(Listener):
        def __init__(self, slot: int) -> None:
            super().__init__()
            self.slot = slot

        def audio(self, turn: int, chunk: np.ndarray) -> None:
            pcm[self.slot].append(chunk)
            events[self.slot].append("audio")
            if self.slot == 1:  # b's audio out: the decode thread's next step lands mid-round
                step()

        def segment_end(self, turn: int, reason: str) -> None:
            events[self.slot].append("end")

    who = {0: Rec(0), 1: Rec(1)}

    def step() -> None:
        clock[0] += worker.frame_s / 2
        if steps:
            worker.frames([(who[s], s, 1, codes[t]) for s, t in steps.pop(0)])
        elif not ended:  # after the last step: both segments end
            for s in (0, 1):
                worker.end(who[s], s, 1, "end")
            ended.append(True)

    ended: list[bool] = []
    for _ in range(500):  # the decode thread: one step per pass of the worker
        step()
        _one_pass(worker)
        if events[0][-1:] == ["end"] and events[1][-1:] == ["end"]:
            break
    return {s: np.concatenate(p) for s, p in pcm.items()}, events, worker.cuts


def test_a_cut_round_never_reorders_a_streams_audio_or_its_end(codec):
    """Rounds cut short put their rest back ahead of the streams' later frames: each
    stream's audio is the audio it gets without cuts (the decoder is stateful, so a frame
    out of order would change it), and its segment end comes after all of it."""
    plain, plain_events, cuts = _two_streams_under_load(codec, cut_in=False)
    cut, cut_events, cuts_made = _two_streams_under_load(codec, cut_in=True)
    assert cuts == 0 and cuts_made > 0
    for s, n in ((0, 40), (1, 30)):
        assert cut[s].shape == (n * codec.hop_length,)
        np.testing.assert_allclose(cut[s], plain[s], atol=1e-5)
        assert cut_events[s][-1] == "end" and "end" not in cut_events[s][:-1]


def _stream_with_a_backlog(codec, cut_in: bool, end: bool):
    """Stream a, well ahead, gets 9 more frames at once; b's first frame comes with them
    (its call goes first, smallest chunks first), and b's audio callback queues c's first
    frame, which cuts the round (cut_in) while a still holds 5 frames behind the chunk in
    the round. end: a's segment end comes with the 9 frames too (a flush, which is never
    cut: c's frame then arrives during it). Returns (a's PCM, a's events in order, cuts)."""
    worker, clock = make_worker(codec, 0.3, streams=4, cut_in=cut_in)
    codes = np.random.default_rng(5).integers(0, 64, (40, codec.num_codebooks))
    events: list[str] = []
    pcm: list[np.ndarray] = []
    queued: list[bool] = []

    class A(Listener):
        def audio(self, turn: int, chunk: np.ndarray) -> None:
            pcm.append(chunk)
            events.append("audio")
            if end and len(pcm) > near and not queued:  # c's first frame lands during the flush
                worker.frames([(Listener(), 2, 1, codes[30])])
                queued.append(True)

        def segment_end(self, turn: int, reason: str) -> None:
            events.append("end")

    class B(Listener):
        def audio(self, turn: int, chunk: np.ndarray) -> None:
            if not queued:
                worker.frames([(Listener(), 2, 1, codes[30])])
                queued.append(True)

    a, b = A(), B()
    near = int(0.3 // worker.frame_s) + 1
    for i in range(near):
        worker._process([_Frame(a, 0, 1, codes[i])])
    items = [[_Frame(a, 0, 1, codes[near + i]) for i in range(9)]]
    items += [_End(a, 0, 1, "end")] if end else [_Frame(b, 1, 1, codes[35])]
    worker._process(items)
    for _ in range(50):
        clock[0] += worker.frame_s
        _one_pass(worker)
    if not end:
        worker._process([_End(a, 0, 1, "end")])
    return np.concatenate(pcm), events, worker.cuts


@pytest.mark.parametrize("end", [False, True], ids=["round", "flush"])
def test_a_cut_round_puts_its_rest_back_ahead_of_the_streams_later_frames(codec, end):
    plain, _, _ = _stream_with_a_backlog(codec, cut_in=False, end=end)
    cut, events, cuts = _stream_with_a_backlog(codec, cut_in=True, end=end)
    assert cuts == (0 if end else 1)  # a flush before a segment end is never cut
    near = int(0.3 // (codec.hop_length / codec.sample_rate)) + 1
    assert cut.shape == plain.shape == ((near + 9) * codec.hop_length,)
    np.testing.assert_allclose(cut, plain, atol=1e-5)  # the same frames, in the same order
    assert events[-1] == "end" and "end" not in events[:-1]


def test_batch_buckets_are_powers_of_two_or_steps_past_them():
    assert batch_buckets(65) == [1, 2, 4, 8, 16, 32, 64, 65]
    assert batch_buckets(65, 8) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 65]
    assert batch_buckets(64, 16) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_buckets(3, 8) == [1, 2, 3] and batch_buckets(1) == [1]
    for step in (3, 12, -8, 1024):
        with pytest.raises(ValueError, match="power of two"):
            batch_buckets(65, step)
    with pytest.raises(ValueError, match="codec_bucket_step"):
        EngineConfig(codec_bucket_step=6)


@pytest.mark.parametrize("step", [0, 2])
def test_padding_rows_are_counted_and_never_heard(codec, step):
    """Five streams' first frames go out in one call padded to the next batch bucket (7
    with powers of two, 6 with steps of 2): the padding is counted (engine stats, the load
    benchmark's shares), and each stream hears exactly the audio it hears alone."""
    worker = CodecWorker(codec, 7, hold_lead_s=None, bucket_step=step)
    codes = np.random.default_rng(4).integers(0, 64, (5, codec.num_codebooks))
    listeners = [Recorder() for _ in range(5)]
    worker._process([[_Frame(r, slot, 1, codes[slot]) for slot, r in enumerate(listeners)]])
    assert worker.calls == 1 and worker.frames_decoded == 5
    assert worker.frames_padded == {0: 2, 2: 1}[step]
    for slot, r in enumerate(listeners):
        alone = Recorder()
        CodecWorker(codec, 7, hold_lead_s=None)._process([_Frame(alone, slot, 1, codes[slot])])
        # (batched CPU convs sum in another order than one row alone: ~1e-4 apart)
        np.testing.assert_allclose(r.turn(1), alone.turn(1), atol=1e-3)


def test_service_flags_set_the_codec_policy():
    from realtime.config import parse_args

    e = parse_args(["--codec-max-chunk", "8", "--codec-hold-lead", "1.5"]).engine
    assert (e.codec_max_chunk, e.codec_hold_lead_s) == (8, 1.5)
    assert parse_args(["--codec-hold-lead", "-1"]).engine.codec_hold_lead_s is None  # never hold
    assert (parse_args([]).engine.codec_max_chunk, parse_args([]).engine.codec_hold_lead_s) == (CHUNKS[0], 0.3)
    with pytest.raises(SystemExit):
        parse_args(["--codec-max-chunk", "5"])
    assert parse_args(["--codec-cut-in"]).engine.codec_cut_in and not parse_args([]).engine.codec_cut_in
    assert parse_args(["--codec-bucket-step", "8"]).engine.codec_bucket_step == 8
    assert parse_args([]).engine.codec_bucket_step == 0
    with pytest.raises(SystemExit):
        parse_args(["--codec-bucket-step", "6"])


def test_a_silent_worker_hands_out_silence_of_the_audio_length(codec):
    """EngineConfig.codec_silent (--codec-silent, a load-run diagnosis): the same frames
    through the same policy give the same audio lengths, calls and segment ends as the
    real codec, but every sample is 0 and the codec is never run (no warm-up shapes)."""
    codes = np.random.default_rng(5).integers(0, 64, (9, codec.num_codebooks))
    heard = {}
    for silent in (False, True):
        worker = CodecWorker(codec, 3, hold_lead_s=None, silent=silent)
        worker.warm_up()
        listeners = [Recorder() for _ in range(2)]
        for i in range(9):
            worker._process([[_Frame(r, slot, 1, codes[i]) for slot, r in enumerate(listeners)]])
        worker._process([_End(r, slot, 1, "end") for slot, r in enumerate(listeners)])
        heard[silent] = worker, listeners
    (real, real_heard), (silent, silent_heard) = heard[False], heard[True]
    assert (silent.calls, silent.frames_decoded) == (real.calls, real.frames_decoded) == (9, 18)
    for r, s in zip(real_heard, silent_heard):
        assert s.chunks == r.chunks[: len(s.chunks)] and s.ends == r.ends == ["end"]
        assert len(s.turn(1)) == 9 * codec.hop_length and not s.turn(1).any()
        assert np.abs(r.turn(1)).max() > 1e-3  # the real codec's audio is not silence
    from realtime.config import parse_args

    assert parse_args(["--codec-silent"]).engine.codec_silent and not parse_args([]).engine.codec_silent


@pytest.mark.parametrize("hold", [0.3, None])
def test_a_turns_first_audio_waits_for_first_frames(codec, hold):
    """With first_frames 2 a turn's first audio is two frames (one call), later frames
    follow the usual policy, and a one-frame turn still goes out at its segment end."""
    worker = CodecWorker(codec, 2, hold_lead_s=hold, first_frames=2)
    clock = [1000.0]
    worker.clock = lambda: clock[0]
    hop = codec.hop_length
    listener = Listener()
    codes = np.random.default_rng(4).integers(0, 64, (6, codec.num_codebooks))
    worker._process([_Frame(listener, 0, 1, codes[0])])
    assert listener.chunks == [] and worker._next_deadline() is None  # waits for the second frame, no timer
    worker._process([_Frame(listener, 0, 1, codes[1])])
    assert listener.chunks == [2 * hop] and worker.calls == 1
    worker._process([_Frame(listener, 0, 1, codes[2])])  # 93 ms ahead, under the hold lead: at once
    assert listener.chunks == [2 * hop, hop]
    worker._process([_End(listener, 0, 1, "end")])
    worker._process([_Frame(listener, 0, 2, codes[3])])  # the next turn waits again
    assert sum(listener.chunks) == 3 * hop
    worker._process([_End(listener, 0, 2, "end")])  # ... unless it ends first
    assert sum(listener.chunks) == 4 * hop and listener.ends == ["end", "end"]


def test_a_busy_worker_starts_turns_on_two_frames(codec):
    """busy_streams 3: while fewer than 3 streams have audio in progress a new turn's first
    frame goes out alone; once 3 have, the next turn's first audio waits for a second
    frame; when turns end and the load falls, one frame again."""
    worker = CodecWorker(codec, 4, hold_lead_s=0.3, busy_streams=3)
    worker.clock = lambda: 1000.0
    hop = codec.hop_length
    listeners = [Listener() for _ in range(4)]
    codes = np.random.default_rng(5).integers(0, 64, (2, codec.num_codebooks))
    for slot in range(3):  # 0 and 1 in progress when 1 and 2 start: under 3, one frame each
        worker._process([_Frame(listeners[slot], slot, 1, codes[0])])
        assert listeners[slot].chunks == [hop]
    worker._process([_Frame(listeners[3], 3, 1, codes[0])])  # 3 streams speaking: waits
    assert listeners[3].chunks == []
    worker._process([_Frame(listeners[3], 3, 1, codes[1])])
    assert listeners[3].chunks == [2 * hop]
    for slot in range(3):  # three turns end: one stream left speaking
        worker._process([_End(listeners[slot], slot, 1, "end")])
    worker._process([_Frame(listeners[0], 0, 2, codes[0])])
    assert listeners[0].chunks == [hop, hop]
    with pytest.raises(ValueError, match="busy_streams"):
        CodecWorker(codec, 2, max_chunk=1, busy_streams=3)
    with pytest.raises(ValueError, match="codec_busy_streams"):
        EngineConfig(codec_max_chunk=1, codec_busy_streams=32)
    from realtime.config import parse_args

    assert parse_args(["--codec-busy-streams", "32"]).engine.codec_busy_streams == 32
    # on by default from 32 streams, and off where no two-frame chunk exists to wait for
    assert parse_args([]).engine.codec_busy_streams == 32
    assert parse_args(["--codec-max-chunk", "1"]).engine.codec_busy_streams == 0
    assert parse_args(["--codec-busy-streams", "0"]).engine.codec_busy_streams == 0


def test_first_frames_must_be_a_chunk_size():
    from realtime.config import parse_args

    with pytest.raises(ValueError, match="first audio"):
        CodecWorker(load_bundle("tiny", "cpu", torch.float32).codec, 2, first_frames=3)
    with pytest.raises(ValueError, match="codec_first_frames"):
        EngineConfig(codec_max_chunk=2, codec_first_frames=4)
    assert parse_args(["--codec-first-frames", "2"]).engine.codec_first_frames == 2
    assert parse_args([]).engine.codec_first_frames == 1
    with pytest.raises(SystemExit):
        parse_args(["--codec-first-frames", "4", "--codec-max-chunk", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--codec-first-frames", "3"])


class Recorder(Listener):
    """Keeps the audio itself, per turn."""

    def __init__(self) -> None:
        super().__init__()
        self.pcm: dict[int, list[np.ndarray]] = {}
        self.dropped_below = 0

    def wanted(self, turn: int) -> bool:
        return turn >= self.dropped_below

    def audio(self, turn: int, pcm: np.ndarray) -> None:
        super().audio(turn, pcm)
        self.pcm.setdefault(turn, []).append(pcm)

    def turn(self, turn: int) -> np.ndarray:
        return np.concatenate(self.pcm[turn])


@pytest.mark.parametrize("barge_in", [False, True])
def test_a_replys_held_back_audio_ends_it_and_never_opens_the_next(barge_in):
    """The default voice's codec holds a reply's last hops back (its lookahead). At the
    segment end they go out as that reply's last audio, before the end event; the next
    reply starts from silence. Against the plain stream (no drain) fed the same chunks:
    exactly those samples move from the start of reply 2 to the end of reply 1, nothing
    else changes. After a barge-in they are dropped instead of opening the next reply.
    (tests/test_gpu.py runs the same on a GPU, through the worker's CUDA graphs.)"""
    check_held_back_audio(torch.device("cpu"), barge_in, tol=1e-5)


def check_held_back_audio(device: torch.device, barge_in: bool, tol: float) -> None:
    from engine.bundle import DEFAULT_FOLDER
    from engine.codec.loader import load_codec
    from engine.codec.streaming import StreamingDecoder

    codec = load_codec(DEFAULT_FOLDER / "codec.pth", device=device, dtype=torch.float32)
    worker = CodecWorker(codec, 2, hold_lead_s=None)
    worker.warm_up()  # on a GPU: the graphs
    held = worker.decoder.drain_samples
    hop = codec.hop_length
    assert 0 < held < hop  # the default codec holds back part of a frame
    rec = Recorder()
    codes = np.random.default_rng(5).integers(0, 512, (7, codec.num_codebooks))
    for f in codes[:4]:
        worker._process([_Frame(rec, 0, 1, f)])
    if barge_in:
        rec.dropped_below = 2
        worker._process([_Cut(0)])
    else:
        worker._process([_End(rec, 0, 1, "end")])
    assert rec.ends == ([] if barge_in else ["end"])
    for f in codes[4:]:
        worker._process([_Frame(rec, 0, 2, f)])
    worker._process([_End(rec, 0, 2, "end")])

    plain = StreamingDecoder(codec, 1)
    one = [plain.decode(torch.tensor([0]), torch.from_numpy(f).to(device)[None, :, None])[0].cpu().numpy() for f in codes]
    plain1, plain2 = np.concatenate(one[:4]), np.concatenate(one[4:])
    reply1, reply2 = rec.turn(1), rec.turn(2)
    # the whole-sequence decode of reply 1's frames: the stream gives it `held` samples later
    whole1 = codec.decode(torch.from_numpy(codes[:4]).T[None].to(device))[0].cpu().numpy()
    tail1 = whole1[-held:]  # the samples the stream held back at the end of reply 1
    assert np.abs(tail1).max() > 1e-3  # speech, not padding
    assert np.abs(reply1[: 4 * hop] - plain1).max() < tol
    if barge_in:
        assert len(reply1) == 4 * hop  # heard up to the barge-in; the held samples dropped
    else:
        assert len(reply1) == 4 * hop + held and np.abs(reply1[held:] - whole1).max() < 10 * tol
    # reply 2 starts without them (the plain stream mixed them into its first samples)
    assert len(reply2) == 3 * hop + held
    assert np.abs(reply2[:held] + tail1 - plain2[:held]).max() < 10 * tol
    assert np.abs(reply2[held : 3 * hop] - plain2[held:]).max() < tol
