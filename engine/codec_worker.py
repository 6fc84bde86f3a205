"""The codec thread: turns code frames into PCM, batched across streams, off the decode
thread. Items arrive in order per stream (frames, segment ends, slot resets), and each
stream's audio and segment ends reach its sink in order.

Every decode call has a shape from a small fixed set: the batch is padded to a bucket
(padding rows use a scratch slot) and each stream's pending frames go out in chunks of
4, 2 or 1 (by default; `max_chunk` 8 or 16 adds larger ones). cuDNN builds an execution
plan the first time it sees a convolution shape, which was measured on an H200 at
100-1,500 ms per new shape for the release-size codec; with a fixed set, `warm_up()`
builds them all before serving.

Frames are held back while their stream is well ahead of real time: each stream's
first frames go out at once (time to first audio), and once the audio already sent
leads its playback by more than `hold_lead_s`, frames wait to go out four at a time
(one decode row and one message instead of four). Measured on an H200 at 64
connections the service topped out near 1,800 frames/s with a message per frame, the
engine alone at 5,800: the per-message Python work (codec call, callbacks, encoding,
WebSocket sends) was the limit. A held frame goes out as soon as its stream's lead
falls to `hold_lead_s`, so holding never starves a real-time player.

A turn's first audio may wait for `first_frames` frames (default 1). Measured on an H200
at 64 connections, nearly every underrun was a turn's first frame (46 ms of audio)
running out before the second came through a saturated GPU and codec; with 2, underruns
fell from 105 to 6 and TTFA p50 rose from 79 to 121 ms (README, "Reference numbers").

With `cut_in` (EngineConfig.codec_cut_in, off by default until measured on a GPU), a
frame of a stream near the start of its audio that reaches the queue while a round is
being decoded cuts the round short before its next call; the round's remaining chunks go
back to be held, ahead of their streams' later frames, and the round after a cut runs whole.
Measured on an H200 and an H100 at 64 connections (2026-12-05), the gaps of a real-time
player began after a turn's first or second frame even when the prefill thread made the
first three back to back: each of them was a small call queued behind rounds of up to 64
streams x 4 frames, on a codec that is on the GPU ~65% of the time there. The stream
priority of the codec's calls is not the lever: with the calls of streams well ahead of
real time on a stream behind the decode step's, the step gained ~4% and a turn's first
frame waited behind a starved call (latency_bench/reference/h200-s2pro/priority).

A segment end hands out the audio the decoder still holds back (the "istft" codec's
lookahead hops: engine/codec/streaming.py, `drain`) as the segment's last audio, before
the end itself; a barge-in drops it. Without that, a reply's last ~35 ms (default voice)
came out mixed into the first hops of the next reply, and a connection's last reply
never had them.

On a GPU each of those shapes is also captured as a CUDA graph (static slot, code and
audio buffers; the decoder's per-slot state is updated inside the graph), so a call is
one replay instead of ~1,000 eager launches: measured on an H200 with the release-size
codec, an eager call took 17-20 ms of host time at any batch of one frame, and that host
time was spent holding the GIL that the prefill and decode threads need too.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.codec.streaming import StreamingDecoder
from engine.graphs import capture
from engine.gpu_errors import device_lost
from engine.timeshare import Phases


@dataclass(slots=True)
class _Frame:
    owner: Any
    slot: int
    turn: int
    codes: np.ndarray  # [C]


@dataclass(slots=True)
class _End:
    owner: Any
    slot: int
    turn: int
    reason: str


@dataclass(slots=True)
class _Lead:
    """How far a stream's audio is ahead of its real-time playback, this turn."""

    turn: int
    started: float  # monotonic time of the turn's first audio
    frames: int = 0  # frames of this turn decoded so far

    def lead_s(self, now: float, frame_s: float) -> float:
        return self.started + self.frames * frame_s - now


@dataclass(slots=True)
class _Reset:
    slot: int


@dataclass(slots=True)
class _Cut:
    """A stream's turns were cancelled: the audio its decoder still holds back is theirs,
    so it is dropped, not heard at the start of the next reply."""

    slot: int


@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    slots: torch.Tensor  # static inputs: long [B]
    codes: torch.Tensor  # long [B, C, n]
    audio: torch.Tensor  # static output: float32 [B, n * hop]


_STOP = object()
CHUNKS = (4, 2, 1)  # frames per stream per decode call, by default
CHUNK_CHOICES = (1, 2, 4, 8, 16)  # the largest chunk a worker may be given
BUSY_FIRST_FRAMES = 2  # a new turn's first audio under load (busy_streams; _first_frames_now)
# the service's busy_streams by default (EngineConfig.codec_busy_streams): half the reference
# load's 64 streams, so c=1 and 16 keep the one-frame TTFA and a saturated GPU gets the guard
DEFAULT_BUSY_STREAMS = 32


def chunk_sizes(max_chunk: int) -> tuple[int, ...]:
    """The chunk sizes a worker uses, largest first: the powers of two up to max_chunk.
    Each (batch bucket, chunk) pair is one cuDNN plan and one CUDA graph, so the set is
    small; larger chunks decode a frame with less fixed cost per call (the codec's
    per-call overhead is ~half its GPU time at one frame a row)."""
    if max_chunk not in CHUNK_CHOICES:
        raise ValueError(f"the largest codec chunk must be one of {CHUNK_CHOICES}, got {max_chunk}")
    return tuple(c for c in reversed(CHUNK_CHOICES) if c <= max_chunk)


def batch_buckets(max_streams: int, step: int = 0) -> list[int]:
    """The batch sizes the worker's calls are padded to (each with every chunk size: one
    cuDNN plan and one CUDA graph a pair), smallest first, the last max_streams. step 0:
    powers of two. step N (a power of two): powers of two up to N, then every multiple of
    N. Why finer steps: a call's rows past its streams are padding that costs the codec
    the same as a stream's (33 streams x 4 frames ran as 64 x 4, nearly half of it
    padding), and at 64 connections the codec is what the decode step waits beside."""
    if max_streams < 1:
        raise ValueError(f"a codec worker needs at least one stream, got {max_streams}")
    if step < 0 or step & (step - 1) or step > 512:  # 0 passes: powers of two throughout
        raise ValueError(f"the codec's bucket step must be 0 (powers of two) or a power of two up to 512, got {step}")
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b < max_streams and (not step or b <= step)]
    if step:
        sizes += range(2 * step, max_streams, step)
    return sizes + [max_streams]


class CodecWorker:
    def __init__(
        self, codec: torch.nn.Module, max_streams: int, cuda_graphs: bool | None = None, hold_lead_s: float | None = 0.3,
        snake_kernel: bool | None = None, max_chunk: int = CHUNKS[0], first_frames: int = 1,
        release_interval_s: float = 0.0, state_kernels: bool | None = None, cut_in: bool = False,
        bucket_step: int = 0, silent: bool = False, busy_streams: int = 0,
    ) -> None:
        self.chunks = chunk_sizes(max_chunk)  # frames per stream per decode call, largest first
        if first_frames not in self.chunks:
            raise ValueError(f"a turn's first audio must be one of the chunk sizes {self.chunks}, got {first_frames}")
        # frames a turn's first audio waits for (1: the first frame goes out alone; 2: a
        # player starts with two frames of audio, so the third has two frames' time to come)
        self.first_frames = first_frames
        # under load: from `busy_streams` streams whose audio is in progress (0: never), a
        # new turn's first audio waits for BUSY_FIRST_FRAMES instead (see _first_frames_now)
        if busy_streams < 0 or (busy_streams and BUSY_FIRST_FRAMES not in self.chunks):
            raise ValueError(f"busy_streams must be 0 (off) or positive, with {BUSY_FIRST_FRAMES} among the chunk "
                             f"sizes {self.chunks}; got {busy_streams}")
        self.busy_streams = busy_streams
        self.decoder = StreamingDecoder(codec, max_streams + 1, snake_kernel, state_kernels)
        # None: never hold frames back (every frame decoded as soon as it arrives)
        self.hold_lead_s = hold_lead_s
        # streams well ahead of real time release their full chunks together, at most
        # this often (0: each as soon as its chunk is full); see _due
        if not 0 <= release_interval_s <= 1:
            raise ValueError(f"release_interval_s must be in 0..1 s, got {release_interval_s}")
        self.release_interval_s = release_interval_s
        self._release_at = 0.0  # clock time of the next shared release
        # a frame of a stream near the start of its audio (see _urgent) that arrives while
        # a round is being decoded cuts the round short before its next call: the round's
        # remaining chunks go back to be held (see _cut_in)
        self.cut_in = cut_in
        self._inbox: list = []  # queue items taken while looking for such frames mid-round
        self._after_cut = False  # the last round was cut short: the next one runs whole
        self.cuts = 0  # rounds cut short
        self.frame_s = codec.hop_length / codec.sample_rate  # audio per frame
        # a diagnosis, never for serving: every call returns silence of the right length
        # without touching the GPU, so a load run shows what the decode loop gives with no
        # codec work beside it (EngineConfig.codec_silent)
        self.silent = silent
        self._held: OrderedDict[int, list[_Frame]] = OrderedDict()  # slot -> frames not yet decoded
        self._leads: dict[int, _Lead] = {}  # slot -> its current turn's lead
        self.clock = time.monotonic  # seconds (tests replace it)
        self.scratch = max_streams  # the slot padding rows point at
        self.buckets = batch_buckets(max_streams, bucket_step)
        self.num_codebooks = codec.num_codebooks
        self.device = self.decoder.device
        # its own CUDA stream: work on the legacy default stream would serialize with the
        # decode and prefill streams
        # (high priority: audio someone waits for, in short calls; ahead of decode kernels.
        # Bulk calls behind the decode step were measured and dropped: module docstring)
        self.stream = torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        self.cuda_graphs = self.stream is not None if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.stream is None:
            raise ValueError("CUDA graphs need a CUDA device")
        self._graphs: dict[tuple[int, int], _Graph] = {}  # (batch bucket, frames) -> graph
        if self.stream is not None:  # pinned staging: the host side of every call's copies
            most = self.buckets[-1] * self.chunks[0]
            self._codes_host = torch.zeros(most * self.num_codebooks + self.buckets[-1], dtype=torch.long, pin_memory=True)
            self._audio_host = torch.zeros(most * self.decoder.hop_length, dtype=torch.float32, pin_memory=True)
        if self.stream is not None:  # around each graph replay: the codec's GPU time
            self._call_began = torch.cuda.Event(enable_timing=True)
            self._call_ended = torch.cuda.Event(enable_timing=True)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # made by start()
        self.frames_decoded = 0
        self.frames_padded = 0  # frames of the padding rows (scratch slot) of those calls
        self.calls = 0
        # host time by phase (engine/timeshare.py): waiting for work, in decode calls (to
        # the PCM on the host), the rest (policy, splitting, callbacks)
        self.phases = Phases("idle", "decode", "deliver")
        self.gpu_s = 0.0  # GPU seconds of the decode calls (graph replays), by timing events
        self.on_error = None  # callable(owner, exc), set by the engine

    def start(self, guard=None) -> None:
        """Start the thread; `guard` wraps its loop (the engine's: a crash stops serving)."""
        self._thread = threading.Thread(target=guard(self._run) if guard else self._run, name="codec", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def depth(self) -> int:
        return self._queue.qsize() + len(self._inbox)  # the inbox: items taken mid-round (cut_in)

    def frames(self, frames: list[tuple[Any, int, int, np.ndarray]]) -> None:
        """(owner, slot, turn, codes [C]) frames, e.g. a decode step's, as one queue item:
        the worker sees them all at once and decodes them in one call."""
        self._queue.put([_Frame(*f) for f in frames])

    def end(self, owner: Any, slot: int, turn: int, reason: str) -> None:
        self._queue.put(_End(owner, slot, turn, reason))

    def reset(self, slot: int) -> None:
        self._queue.put(_Reset(slot))

    def cut(self, slot: int) -> None:
        """The stream's turns so far were cancelled (barge-in)."""
        self._queue.put(_Cut(slot))

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _run(self) -> None:
        while True:
            items, self._inbox = self._inbox, []
            wait = 0.0 if items else self._next_deadline()
            self.phases.to("idle")
            try:
                items.append(self._queue.get(timeout=wait) if wait is not None else self._queue.get())
            except queue.Empty:  # a held frame's stream is about to run out of audio
                pass
            self.phases.to("deliver")
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._process(items):
                return

    def _process(self, items: list) -> bool:
        """Take in queued items (in order) and decode every stream's frames that are due.

        A stream's frames always precede its later items (segment end, reset, cut), so
        before such an item its held frames are decoded. A run of such items with no frame
        between them (the decode thread queues one end per stream whose segment ended in a
        step) is flushed as one batch across its streams. Flushed one stream at a time, 64
        turns that ended in the same step cost up to ~190 batch-1 calls, and the next
        turns' first frames queued behind them: on an H100 (2026-12-06, FP8, c=64, the
        server's first run, whose turns ran in step) the second turns' prefill-to-audio
        was 477 ms at the median and 850 at worst against 15 ms on the next run. With
        this batching, on an H100 (2026-12-07, same load): 11 ms at the median and 35 at
        worst, and the first run's TTFA p99 83 ms with no underruns against 893 ms and 17
        (latency_bench/reference/h100-s2pro/first-run-tail/after-batched-flush)."""
        run: list[_Reset | _Cut | _End] = []  # stream items queued since the last frame
        for item in _flat(items):
            if isinstance(item, (_Reset, _Cut, _End)):
                run.append(item)
                continue
            self._stream_items(run)  # before anything queued after them
            run = []
            if item is _STOP:
                self._flush(list(self._held))
                return True
            held = self._held.get(item.slot)
            if held and held[0].turn != item.turn:  # a new turn: the old one's frames first
                self._flush([item.slot])
            self._held.setdefault(item.slot, []).append(item)
        self._stream_items(run)
        self._decode_due(self.clock())
        return False

    def _stream_items(self, run: list[_Reset | _Cut | _End]) -> None:
        """Stream items queued with no frame between them: their streams' held frames in
        one batch, then each item in order (a reset, a cut from a barge-in, or a segment
        end)."""
        if not run:
            return
        self._flush(list(dict.fromkeys(item.slot for item in run)))
        for item in run:
            self._leads.pop(item.slot, None)  # a segment end or a new stream: the next turn starts afresh
            if isinstance(item, _Reset):
                with self._on_stream():
                    self.decoder.reset(item.slot)
            elif isinstance(item, _Cut):
                self._drain(item.slot)
            else:
                # the segment's last audio (what the decoder held back for frames that
                # will not come), then its end
                pcm = self._drain(item.slot)
                if pcm is not None and item.owner.wanted(item.turn):
                    item.owner.audio(item.turn, pcm)
                item.owner.segment_end(item.turn, item.reason)

    @torch.inference_mode()
    def _drain(self, slot: int) -> np.ndarray | None:
        """The audio the decoder holds back for `slot` (engine/codec/streaming.py,
        `drain`), cleared there; None when it holds none."""
        if self.silent:
            return None
        with self._on_stream():
            audio = self.decoder.drain(slot)
            return None if audio is None else audio.cpu().numpy()

    def _started(self, slot: int, frames: list[_Frame]) -> _Lead | None:
        """The lead of the turn these held frames belong to, once its first audio went out."""
        lead = self._leads.get(slot)
        return lead if lead is not None and lead.turn == frames[0].turn else None

    def _due(self, slot: int, frames: list[_Frame], now: float) -> bool:
        """A turn's first frames go out once `first_frames` of them are there (the rest of
        a shorter turn goes out at its segment end); later frames go out now unless the
        stream is ahead of real time by more than hold_lead_s. Then they wait for a full
        chunk, and with a release interval also for the next shared release.

        Why a shared release: each stream's chunk fills at its own moment, so without one
        every decode step completes a chunk somewhere and the worker makes about one small
        call per step (on an H200 at 16 connections: 137 calls a second of ~10 frames,
        the codec's graphs in flight 72% of the time, the decode step 9.05 ms against 7.3
        alone; latency_bench shares). A call's cost is mostly fixed (~1,000 kernels), so
        the same frames in fewer, fuller calls cost less GPU time. Streams near real time
        (lead <= hold_lead_s) and turns' first frames never wait for it."""
        lead = self._started(slot, frames)
        if lead is None:
            return len(frames) >= self._first_frames_now()
        if self._near_real_time(lead, now):
            return True
        return len(frames) >= self.chunks[0] and now >= self._release_at

    def _first_frames_now(self) -> int:
        """Frames a new turn's first audio waits for now: `first_frames`, or under load
        (`busy_streams` or more streams with audio in progress) BUSY_FIRST_FRAMES.

        Why by load: a turn's first frame is 46 ms of audio (s2-pro's codec), and the
        second comes one decode step plus a codec call later. With a few streams that is
        ~10-20 ms, and a second frame of waiting would only add to the TTFA; at 64 streams
        the step and the codec's calls share a saturated GPU, and nearly every underrun was
        a first frame playing out before the second arrived (H200, H100: README,
        "Reference numbers"). Measured on an H100 (2026-12-07, bf16, c=64 twice on a fresh
        server each): with 32, no underruns in either run, TTFA p50 / p99 77-79 / 120 ms,
        against 0 and 5 (7 ms) underruns at 64-67 / 107-112 ms with the guard off. Past
        64 streams (same card, --max-running 128): with 32 none at c=96 and 128 in bf16
        and FP8, against 5 and 34 (bf16) and 0 and 55 (FP8) underruns without, for 6-20 ms
        more TTFA p50 from 64 streams up (latency_bench/RESULTS.md, "The capacity sweep").
        Hence on by default (DEFAULT_BUSY_STREAMS)."""
        if self.busy_streams and len(self._leads) >= self.busy_streams:
            return max(self.first_frames, BUSY_FIRST_FRAMES)
        return self.first_frames

    def _near_real_time(self, lead: _Lead, now: float) -> bool:
        """The stream's audio leads its playback by at most hold_lead_s (or nothing is held)."""
        return self.hold_lead_s is None or lead.lead_s(now, self.frame_s) <= self.hold_lead_s

    def _urgent(self, frame: _Frame, now: float) -> bool:
        """A frame of a turn whose audio has not started, or of a stream near real time
        (the first ~7 frames of a turn at twice real time)."""
        lead = self._started(frame.slot, [frame])
        return lead is None or self._near_real_time(lead, now)

    def _cut_in(self, pending: OrderedDict[int, list[_Frame]]) -> bool:
        """Between two calls of a round: take what has been queued meanwhile into the inbox
        and, if a frame of some stream near the start of its audio is among it, put the
        round's remaining frames (`pending`) back to be held (in order, ahead of their
        streams' later frames) and end the round, so that frame goes out in the next round
        (smallest chunks first) instead of after this one's larger calls. The round after a
        cut is never cut, so put-back frames wait at most once."""
        if self._after_cut or not any(pending.values()):
            return False
        while True:
            try:
                self._inbox.append(self._queue.get_nowait())
            except queue.Empty:
                break
        now = self.clock()
        if not any(isinstance(f, _Frame) and self._urgent(f, now) for f in _flat(self._inbox)):
            return False
        for slot, frames in reversed(pending.items()):  # reversed: the round's first stream ends up first
            if frames:
                self._held[slot] = frames + self._held.get(slot, [])
                self._held.move_to_end(slot, last=False)
        self.cuts += 1
        self._after_cut = True
        return True

    def _releasing(self) -> bool:
        """Some held stream, past its turn's first audio, has a full chunk waiting (well
        ahead of real time, it waits for the shared release)."""
        return any(len(frames) >= self.chunks[0] and self._started(slot, frames) is not None
                   for slot, frames in self._held.items())

    def _next_deadline(self) -> float | None:
        """Seconds until the first held stream's lead falls to hold_lead_s, or until the
        next shared release while full chunks wait for it (None: nothing held; 0: some
        stream's frames are due now, left over from the last round)."""
        if not self._held:
            return None
        now = self.clock()
        if any(self._due(slot, frames, now) for slot, frames in self._held.items()):
            return 0.0
        if self.hold_lead_s is None:  # only turns' first frames are held: their next frame or end comes
            return None
        waits = [
            lead.lead_s(now, self.frame_s) - self.hold_lead_s
            for slot, frames in self._held.items()
            if (lead := self._started(slot, frames)) is not None
        ]
        if self._releasing():  # full chunks wait for the shared release
            waits.append(self._release_at - now)
        # None: every held frame is a turn's first, waiting for more frames or its end,
        # both of which come through the queue
        return max(0.0, min(waits)) if waits else None

    def _decode_due(self, now: float) -> None:
        """One round: the next chunk of every stream that is due, then back to the queue.
        A backlog (a saturated GPU, many streams with frames waiting) thus goes out one
        round at a time, and a turn's first frame that arrives meanwhile joins the next
        round (smallest chunks first) instead of waiting for the whole backlog: measured
        on an H200 at 64 connections, prefill-to-first-audio was 42 ms p50 and 128 ms p90
        when every due frame went out before the queue was looked at again.

        Tried and dropped (H200, 64 connections, 2026-12-01): rounds of only the streams
        about to run dry (a turn's first frames, or less than 0.15 s of lead) while any
        were waiting, the rest after. Nearly every underrun is a turn's first frame running
        out before its second, so that looked like the fix; instead the worker spent its
        time on small calls, the others fell behind until they were urgent too, and the
        service did 1,941 frames/s against 3,465 with TTFA p50 671 ms against 99
        (latency_bench/reference/h200-s2pro/codec-policy/run2-*.json)."""
        due = [slot for slot, frames in self._held.items() if self._due(slot, frames, now)]
        self._flush(due, one_chunk=True)
        if self.release_interval_s and now >= self._release_at and not self._releasing():
            # a release lasts (one chunk per stream a round) until no full chunk is left
            self._release_at = now + self.release_interval_s

    def _flush(self, slots: list[int], one_chunk: bool = False) -> None:
        """Decode every held frame of these streams (one_chunk: only each stream's next
        chunk, the rest stays held), in order, batched across them."""
        run = []
        for slot in slots:
            frames = self._held.pop(slot, [])
            if one_chunk and frames:
                n = next(c for c in self.chunks if c <= len(frames))
                if frames[n:]:
                    self._held[slot] = frames[n:]
                frames = frames[:n]
            run += frames
        if run:
            # only a round may be cut short: a flush before a stream's later item (its
            # segment end, a new turn, a reset) must decode everything before it
            self._decode(run, may_cut=one_chunk and self.cut_in)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One call of every shape the worker will use, then (on a GPU) one graph of each,
        before the thread starts. Only the scratch slot's state is touched.

        On a GPU cuDNN times its kernels for each conv shape here (cudnn.benchmark; the
        shapes are this fixed set, and the graphs keep what it chose): its heuristics
        gave the decoder's dilated 768-channel convs a generic kernel of ~0.95 ms each
        at batch 64 x 1 frame on an H200, and benchmarking took a call of that shape
        from 8.1 to 6.8 ms, of 64 x 4 frames from 20.0 to 15.9 (latency_bench.profile_codec).
        The flag is process-wide, so it is on only while the shapes are warmed and the
        graphs captured (the graphs keep the chosen kernels): left on, every new shape
        elsewhere (the codec encoder on each new voice's reference audio) was timed
        first, and an uncached voice took 1.3 s to open instead of 0.19."""
        if self.silent:
            return
        benchmark = torch.backends.cudnn.benchmark
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        try:
            self._warm_up()
        finally:
            torch.backends.cudnn.benchmark = benchmark

    def _warm_up(self) -> None:
        for n in self.chunks:
            for b in self.buckets:
                self._eager([self.scratch] * b, np.zeros((b, self.num_codebooks, n), dtype=np.int64))
        if self.cuda_graphs:
            self._capture()
        self.decoder.reset(self.scratch)
        if self.stream is not None:
            self.stream.synchronize()

    def _capture(self) -> None:
        # largest first: the shared memory pool is sized by the first capture; the graphs
        # run one at a time on this worker's stream, so they may share it
        pool = torch.cuda.graph_pool_handle()
        shapes = sorted(((b, n) for b in self.buckets for n in self.chunks), key=lambda s: -s[0] * s[1])
        for b, n in shapes:
            slots = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
            codes = torch.zeros(b, self.num_codebooks, n, dtype=torch.long, device=self.device)
            # one warm-up: warm_up() already ran every shape eagerly
            graph, audio = capture(lambda: self.decoder.decode(slots, codes).float(), self.stream, pool, warmups=1)
            self._graphs[(b, n)] = _Graph(graph, slots, codes, audio)

    def _call(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        """Decode codes [B, C, n] for `slots` (B a bucket); returns PCM [B, n * hop]."""
        if self.silent:
            return np.zeros((codes.shape[0], codes.shape[2] * self.decoder.hop_length), dtype=np.float32)
        g = self._graphs.get((codes.shape[0], codes.shape[2]))
        if g is None:
            return self._eager(slots, codes)
        b = codes.shape[0]
        staged = self._codes_host[: b + codes.size]
        staged[:b] = torch.tensor(slots, dtype=torch.long)
        staged[b:] = torch.from_numpy(codes).view(-1)
        audio = self._audio_host[: g.audio.numel()].view(g.audio.shape)
        self.phases.to("decode")
        with self._on_stream():
            g.slots.copy_(staged[:b], non_blocking=True)
            g.codes.copy_(staged[b:].view(g.codes.shape), non_blocking=True)
            self._call_began.record(self.stream)
            g.graph.replay()
            self._call_ended.record(self.stream)
            audio.copy_(g.audio, non_blocking=True)
        self.stream.synchronize()  # the staging buffers are reused by the next call
        self.gpu_s += self._call_began.elapsed_time(self._call_ended) / 1000
        self.phases.to("deliver")
        return audio.numpy().copy()

    def _eager(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        self.phases.to("decode")
        with self._on_stream():
            pcm = self.decoder.decode(
                torch.tensor(slots, device=self.device), torch.from_numpy(codes).to(self.device)
            ).float().cpu().numpy()
        self.phases.to("deliver")
        return pcm

    @torch.inference_mode()
    def _decode(self, run: list[_Frame], may_cut: bool = False) -> None:
        run = [f for f in run if f.owner.wanted(f.turn)]  # closed or cancelled: skip the work
        pending: OrderedDict[int, list[_Frame]] = OrderedDict()
        for f in run:
            pending.setdefault(f.slot, []).append(f)
        first = True
        while pending:  # each round takes the next chunk of every stream, in order
            groups: dict[int, list[int]] = {}
            for slot, frames in pending.items():
                groups.setdefault(next(c for c in self.chunks if c <= len(frames)), []).append(slot)
            # smallest chunks first: single frames are mostly a turn's first audio (someone
            # waits for it), chunks of four belong to streams well ahead of real time
            for n, slots in sorted(groups.items()):
                if may_cut and not first and self._cut_in(pending):
                    return
                first = False
                chunks = {s: pending[s][:n] for s in slots}
                for s in slots:
                    del pending[s][:n]
                self._decode_group(n, slots, chunks)
            pending = OrderedDict((s, f) for s, f in pending.items() if f)
        if may_cut:
            self._after_cut = False

    def _decode_group(self, n: int, slots: list[int], chunks: dict[int, list[_Frame]]) -> None:
        for start in range(0, len(slots), self.buckets[-1]):
            part = slots[start : start + self.buckets[-1]]
            bucket = next(b for b in self.buckets if b >= len(part))
            codes = np.zeros((bucket, self.num_codebooks, n), dtype=np.int64)
            for row, s in enumerate(part):
                codes[row] = np.stack([f.codes for f in chunks[s]], axis=1)
            try:
                pcm = self._call(part + [self.scratch] * (bucket - len(part)), codes)
            except Exception as e:  # one bad batch must not stop the thread
                for s in part:
                    if self.on_error:
                        self.on_error(chunks[s][0].owner, e)
                if device_lost(e):  # the GPU itself: the thread stops (its guard fails the engine)
                    raise
                continue
            self.calls += 1
            self.frames_decoded += n * len(part)
            self.frames_padded += n * (bucket - len(part))
            now = self.clock()
            for row, s in enumerate(part):
                frames = chunks[s]
                lead = self._leads.get(s)
                if lead is None or lead.turn != frames[-1].turn:
                    lead = self._leads[s] = _Lead(frames[-1].turn, now)
                lead.frames += sum(f.turn == lead.turn for f in frames)
                # frames of one chunk share a turn except right at a turn switch
                for turn, audio in _split_by_turn(frames, pcm[row]):
                    frames[0].owner.audio(turn, audio)


def _flat(items: list):
    for item in items:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def _split_by_turn(frames: list[_Frame], pcm: np.ndarray):
    hop = pcm.shape[0] // len(frames)
    start = 0
    for i in range(1, len(frames) + 1):
        if i == len(frames) or frames[i].turn != frames[start].turn:
            yield frames[start].turn, pcm[start * hop : i * hop]
            start = i
