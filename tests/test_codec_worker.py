"""The codec worker with the tiny model's codec: every stream hears the audio of its frames,
whole and in order, through held frames, chunks, rounds and segment ends; its first frames
at once, held frames (four at a time) only while well ahead of real-time playback; a
segment end flushes everything before it, and a barge-in drops the audio held back.
(engine/codec_pacing.py's decisions alone: tests/test_codec_pacing.py.)"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from engine.bundle import load_bundle
from engine.codec_calls import batch_buckets
from engine.codec_pacing import CHUNKS
from engine.codec_worker import CodecWorker, _Cut, _End, _Frame


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


def make_worker(codec, hold, max_chunk=CHUNKS[0], streams=2, **kw):
    worker = CodecWorker(codec, streams, hold_lead_s=hold, max_chunk=max_chunk, **kw)
    clock = [1000.0]
    worker.pacing.clock = lambda: clock[0]
    return worker, clock


@pytest.mark.parametrize("max_chunk", [CHUNKS[0], 8])
def test_frames_are_held_only_while_well_ahead_of_real_time(codec, max_chunk):
    worker, clock = make_worker(codec, 0.3, max_chunk)
    hop, frame_s = codec.hop_length, worker.pacing.frame_s
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
    assert set(listener.chunks) <= {c * hop for c in worker.pacing.chunks}
    held = total - sum(listener.chunks) // hop
    assert held > 0
    worker._process([_End(listener, 0, 1, "end")])  # the end flushes the held frames first
    assert sum(listener.chunks) == total * hop and listener.ends == ["end"]


def test_every_stream_hears_the_whole_decode_of_its_frames(codec):
    """Three streams' turns, overlapping, through the worker's thread (held frames, chunks
    of every size, calls shared across streams, segment ends): each stream hears the
    whole-sequence decode of its frames (the decoder is stateful: a frame lost, repeated or
    out of order would change it), then its end."""
    worker = CodecWorker(codec, 3)
    lengths, starts = {0: 23, 1: 9, 2: 14}, {0: 0, 1: 3, 2: 8}
    rng = np.random.default_rng(6)
    codes = {s: rng.integers(0, 64, (n, codec.num_codebooks)) for s, n in lengths.items()}
    heard = {s: Recorder() for s in lengths}
    worker.start()
    for t in range(max(starts[s] + lengths[s] for s in lengths)):  # one decode step a pass
        worker.frames([(heard[s], s, 1, codes[s][t - starts[s]]) for s in lengths if 0 <= t - starts[s] < lengths[s]])
        for s in lengths:
            if t - starts[s] == lengths[s] - 1:
                worker.end(heard[s], s, 1, "end")
    deadline = time.monotonic() + 60
    while any(not r.ends for r in heard.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    held = worker.codec_calls.decoder.drain_samples
    for s, n in lengths.items():
        whole = codec.decode(torch.from_numpy(codes[s]).T[None])[0].numpy()
        assert whole.std() > 1e-2 and heard[s].ends == ["end"]
        got = heard[s].turn(1)
        assert got.shape == (n * codec.hop_length + held,)
        # batched CPU convs sum in another order (one sample of 47,104 was 1.1e-3 off); a wrong
        # state, chunk or order is off by ~0.1
        np.testing.assert_allclose(got[held:], whole, atol=5e-3)


def test_policy_flags_that_cannot_work_are_usage_errors():
    from realtime.config import parse_args

    for bad in (["--codec-max-chunk", "6"], ["--codec-first-frames", "3"],
                ["--codec-first-frames", "4", "--codec-max-chunk", "2"],
                ["--codec-max-chunk", "1", "--codec-busy-streams", "32"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_a_held_frame_goes_out_when_the_lead_runs_down(codec):
    worker, clock = make_worker(codec, 0.3)
    frame_s = worker.pacing.frame_s
    listener = Listener()
    codes = np.random.default_rng(1).integers(0, 64, (20, codec.num_codebooks))
    for i in range(20):  # far ahead: 20 frames at once, then one more
        worker._process([_Frame(listener, 1, 1, codes[i])])
    sent = sum(listener.chunks)
    worker._process([_Frame(listener, 1, 1, codes[0])])
    assert sum(listener.chunks) == sent  # held: the stream is ~0.9 s ahead
    wait = worker.pacing.deadline()
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
    assert worker.pacing.deadline() == 0.0  # a's frames are still due
    worker._process([_Frame(b, 1, 1, codes[0])])  # b's first frame arrives
    assert order() == ["a", "b", "a"]  # b (a single frame: smallest chunk first) before a's next chunk
    while worker.pacing.deadline() is not None:
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
    held = sum(len(frames) for frames in worker.pacing.held.values())
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


def test_batch_buckets_are_powers_of_two_then_the_most_streams():
    assert batch_buckets(65) == [1, 2, 4, 8, 16, 32, 64, 65]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(3) == [1, 2, 3] and batch_buckets(1) == [1]
    with pytest.raises(ValueError, match="at least one stream"):
        batch_buckets(0)


def test_padding_rows_are_counted_and_never_heard(codec):
    """Five streams' first frames go out in one call padded to the next batch bucket (7):
    the padding is counted (engine stats, the load benchmark's shares), and each stream
    hears exactly the audio it hears alone."""
    worker = CodecWorker(codec, 7, hold_lead_s=None)
    codes = np.random.default_rng(4).integers(0, 64, (5, codec.num_codebooks))
    listeners = [Recorder() for _ in range(5)]
    worker._process([[_Frame(r, slot, 1, codes[slot]) for slot, r in enumerate(listeners)]])
    assert worker.calls == 1 and worker.frames_decoded == 5 and worker.frames_padded == 2
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


@pytest.mark.parametrize("hold", [0.3, None])
def test_a_turns_first_audio_waits_for_first_frames(codec, hold):
    """With first_frames 2 a turn's first audio is two frames (one call), later frames
    follow the usual policy, and a one-frame turn still goes out at its segment end."""
    worker, clock = make_worker(codec, hold, first_frames=2)
    hop = codec.hop_length
    listener = Listener()
    codes = np.random.default_rng(4).integers(0, 64, (6, codec.num_codebooks))
    worker._process([_Frame(listener, 0, 1, codes[0])])
    assert listener.chunks == [] and worker.pacing.deadline() is None  # waits for the second frame, no timer
    worker._process([_Frame(listener, 0, 1, codes[1])])
    assert listener.chunks == [2 * hop] and worker.calls == 1
    worker._process([_Frame(listener, 0, 1, codes[2])])  # 93 ms ahead, under the hold lead: at once
    assert listener.chunks == [2 * hop, hop]
    worker._process([_End(listener, 0, 1, "end")])
    worker._process([_Frame(listener, 0, 2, codes[3])])  # the next turn waits again
    assert sum(listener.chunks) == 3 * hop
    worker._process([_End(listener, 0, 2, "end")])  # ... unless it ends first
    assert sum(listener.chunks) == 4 * hop and listener.ends == ["end", "end"]
    from realtime.config import parse_args

    assert parse_args(["--codec-first-frames", "2"]).engine.codec_first_frames == 2
    assert parse_args([]).engine.codec_first_frames == 1


def test_a_busy_worker_starts_turns_on_two_frames(codec):
    """busy_streams 3: while fewer than 3 streams have audio in progress a new turn's first
    frame goes out alone; once 3 have, the next turn's first audio waits for a second
    frame; when turns end and the load falls, one frame again."""
    worker, _ = make_worker(codec, 0.3, streams=4, busy_streams=3)
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
    from realtime.config import parse_args

    assert parse_args(["--codec-busy-streams", "32"]).engine.codec_busy_streams == 32
    # on by default from 32 streams, and off where no two-frame chunk exists to wait for
    assert parse_args([]).engine.codec_busy_streams == 32
    assert parse_args(["--codec-max-chunk", "1"]).engine.codec_busy_streams == 0
    assert parse_args(["--codec-busy-streams", "0"]).engine.codec_busy_streams == 0


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
    held = worker.codec_calls.decoder.drain_samples
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
