"""Continuous-batching scheduler: which stream holds which KV slot, what to prefill next,
which streams step in the next decode batch, and what a decoded frame means.

Plain Python (no torch), driven by the engine's threads under one lock:
- the event loop calls open / say / cancel / close;
- the prefill thread calls next_prefills / voice_done / segment_done (and
  second_frame_done when it made the segment's second frame, step 1, itself);
- the decode thread calls decode_batch / step_launched / frame / step_read.

A stream holds a KV slot from admission to close (its voice prefix stays in the slot, so
each turn only prefills its own text). A turn's text arrives as segments; each segment is
one generation: prefill its tokens, then decode frames until end-of-speech or the frame
budget. Decode results are read one step late, so a stream may step once more after its
end; such frames are recognized by their segment id and dropped.

Positions: after a segment prefill the stream's context ends at P0 and frame f0 is
sampled; decode step k feeds f(k-1) at P0 + k - 1 and samples f(k). A segment that ends
with end-of-speech after n frames has fed n frames; one cut at its budget m has fed m - 1
and its last frame is fed with the turn's closing tokens. A segment's budget is the
stream's frame budget or the KV room after its prompt, whichever is smaller (m frames
need positions up to P0 + m - 2): a model that does not stop is cut at the end of its
context (reason "context"), never written past it.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable


class Phase(Enum):
    QUEUED = "queued"  # waiting for a KV slot
    PREFILLING = "prefilling"  # voice prefix or a segment is being prefilled
    IDLE = "idle"  # voice ready, nothing to say
    DECODING = "decoding"  # in the decode batch
    CLOSED = "closed"


class Refused(Exception):
    """No slot and no room in the wait queue."""


@dataclass(slots=True)
class Segment:
    turn: int
    text: str
    id: int = 0  # set by the scheduler: unique per stream


@dataclass(slots=True)
class Closing:
    """How the last segment ended: its turn still has to be closed in the context."""

    cut_frame: Any = None  # the unfed last frame of a segment cut at its budget


@dataclass(slots=True, eq=False)
class Stream:
    id: int
    owner: Any  # opaque to the scheduler: the engine's handle (voice, settings, sink)
    frame_budget: int
    reset_context_each_segment: bool = False
    slot: int | None = None
    phase: Phase = Phase.QUEUED
    prefix_len: int = 0
    position: int = 0  # next free KV position (valid while not decoding)
    segments: deque = field(default_factory=deque)
    current: Segment | None = None  # the segment being prefilled or decoded
    turn: int | None = None  # the most recent turn (what cancel rolls back)
    prompt_end: int = 0  # P0 of the current segment
    frames: int = 0  # frames emitted in the current segment
    steps: int = 0  # decode steps launched for the current segment
    closing: Closing | None = None
    inflight: int = 0  # launched decode steps not read back yet
    prefill_busy: bool = False
    cancel_pending: bool = False
    close_pending: bool = False
    turn_checkpoint: tuple[int, Closing | None] | None = None  # (position, closing) before the turn

    @property
    def live(self) -> bool:
        return self.phase is not Phase.CLOSED and not self.close_pending


@dataclass(slots=True)
class PrefillWork:
    stream: Stream
    kind: str  # "voice" or "segment"
    segment: Segment | None = None
    start: int = 0  # KV position of the first token
    closing: Closing | None = None  # closing of the previous segment, prepended
    restart: bool = False  # the context restarted from the voice prefix


@dataclass(slots=True)
class FrameOutcome:
    emit: bool  # hand the frame to the codec
    segment_done: bool = False
    reason: str = ""  # "end" (end-of-speech), "budget" or "context" (cut at the KV's end)


class Scheduler:
    def __init__(self, max_running: int, max_queued: int, max_len: int, serial: bool = False) -> None:
        """`serial` is the naive baseline: one utterance at a time (a segment is prefilled
        only when no stream is decoding, and the decode batch holds one stream)."""
        if max_running < 1 or max_queued < 0:
            raise ValueError("max_running must be >= 1 and max_queued >= 0")
        self.serial = serial
        self.max_running = max_running
        self.max_queued = max_queued
        self.max_len = max_len
        self.streams: dict[int, Stream] = {}
        self.free_slots = list(range(max_running))[::-1]  # pop() gives the lowest slot
        self.queue: deque[Stream] = deque()
        self.voice_work: deque[Stream] = deque()
        self.segment_work: deque[Stream] = deque()
        self._ids = itertools.count(1)
        self._segment_ids = itertools.count(1)

    # --- event loop side --------------------------------------------------------------

    def open(self, owner: Any, frame_budget: int, reset_context_each_segment: bool = False) -> Stream:
        if frame_budget < 1:
            raise ValueError("frame_budget must be >= 1")
        stream = Stream(next(self._ids), owner, frame_budget, reset_context_each_segment)
        if self.free_slots:
            self._admit(stream)
        elif len(self.queue) < self.max_queued:
            self.queue.append(stream)
        else:
            raise Refused(
                f"all {self.max_running} streams are busy and {self.max_queued} are already waiting"
            )
        self.streams[stream.id] = stream
        return stream

    def _admit(self, stream: Stream) -> None:
        stream.slot = self.free_slots.pop()
        stream.phase = Phase.PREFILLING
        stream.prefill_busy = True
        self.voice_work.append(stream)

    def say(self, stream: Stream, segment: Segment) -> None:
        if not stream.live:
            return
        segment.id = next(self._segment_ids)
        stream.segments.append(segment)
        self._schedule_segment(stream)

    def cancel(self, stream: Stream) -> None:
        """Barge-in: drop queued segments and the one in progress, and roll the context
        back to before the most recent turn (the voice prefix and earlier turns stay)."""
        if not stream.live:
            return
        stream.segments.clear()
        if stream in self.segment_work:  # queued, not started: nothing to undo
            self.segment_work.remove(stream)
            stream.prefill_busy = False
            stream.phase = Phase.IDLE
        if stream.phase is Phase.PREFILLING and stream.current is not None:
            stream.cancel_pending = True  # undone when the prefill lands
            return
        if stream.phase is Phase.DECODING:
            stream.current = None
            stream.phase = Phase.IDLE
        if stream.phase is Phase.IDLE:
            self._rollback(stream)

    def close(self, stream: Stream) -> None:
        if stream.phase is Phase.CLOSED:
            return
        stream.segments.clear()
        if stream.phase is Phase.QUEUED:
            self.queue.remove(stream)
            self._finish_close(stream)
            return
        stream.close_pending = True
        if stream.phase is Phase.DECODING:
            stream.current = None
            stream.phase = Phase.IDLE
        for work in (self.segment_work, self.voice_work):  # queued, not started: drop it
            if stream in work:
                work.remove(stream)
                stream.prefill_busy = False
        self._try_release(stream)

    # --- prefill thread ---------------------------------------------------------------

    def next_prefill(self) -> PrefillWork | None:
        """Segments first (a waiting user hears audio sooner), then voice prefixes."""
        work = self.next_prefills(1)
        return work[0] if work else None

    def next_prefills(self, limit: int, quick_voice: Callable[[Stream], bool] | None = None) -> list[PrefillWork]:
        """Up to `limit` segment prefills (prefilled together in one batch), or else one
        voice prefix. A voice prefix that `quick_voice` says is quick (the engine: its KV
        is in the voice cache, one device copy) goes before the segments: measured on an
        H200 at 64 connections, new connections waited behind the talking ones' segments
        for their cached voice, 101 ms to ready at the median (437 ms once each segment
        prefill also made its second frame), and streams that are not ready yet leave
        the decode batch short."""
        works = []
        if quick_voice is not None:
            for stream in self.voice_work:
                if stream.live and quick_voice(stream):
                    self.voice_work.remove(stream)
                    return [PrefillWork(stream, "voice")]
        limit = 1 if self.serial else limit
        while len(works) < limit and (work := self._next_segment_work()) is not None:
            works.append(work)
        if works:
            return works
        while self.voice_work:
            stream = self.voice_work.popleft()
            if stream.live:
                return [PrefillWork(stream, "voice")]
            stream.prefill_busy = False
            self._try_release(stream)
        return []

    def _next_segment_work(self) -> PrefillWork | None:
        busy = self.serial and any(s.phase is Phase.DECODING for s in self.streams.values())
        while self.segment_work and not busy:
            stream = self.segment_work.popleft()
            if stream.live and stream.segments:
                return self._segment_prefill(stream)
            stream.prefill_busy = False
            if stream.live:
                stream.phase = Phase.IDLE
            self._try_release(stream)
        return None

    def _segment_prefill(self, stream: Stream) -> PrefillWork:
        segment = stream.segments.popleft()
        if stream.turn != segment.turn:
            stream.turn = segment.turn
            stream.turn_checkpoint = (stream.position, stream.closing)
        stream.current = segment
        closing, start, restart = stream.closing, stream.position, False
        if stream.reset_context_each_segment or start + self._room_needed(stream, segment) > self.max_len:
            closing, start, restart = None, stream.prefix_len, True
        stream.closing = None
        return PrefillWork(stream, "segment", segment, start, closing, restart)

    def _room_needed(self, stream: Stream, segment: Segment) -> int:
        # tokens of the segment prompt (~1 per char for byte-level, fewer for BPE) plus
        # ~1.4 frames per character of speech, capped by the frame budget, plus slack
        return 24 + len(segment.text.encode()) + min(stream.frame_budget, 2 * len(segment.text) + 32)

    def voice_done(self, stream: Stream, prefix_len: int) -> None:
        stream.prefill_busy = False
        stream.prefix_len = stream.position = prefix_len
        if not stream.live:
            self._try_release(stream)
            return
        stream.phase = Phase.IDLE
        self._schedule_segment(stream)

    def segment_done(self, stream: Stream, work: PrefillWork, prompt_len: int, second_frame: bool = False) -> bool:
        """The segment's prompt is in the KV and f0 was sampled. Returns whether the
        stream joins the decode batch (False: cancelled or closed meanwhile).

        `second_frame`: the prefill thread goes on to step this stream once more itself
        (its second frame, the segment's first step); the decode thread leaves it alone
        and its slot stays held until second_frame_done."""
        stream.prefill_busy = False
        stream.prompt_end = work.start + prompt_len
        stream.frames, stream.steps = 0, 0
        if second_frame and stream.live and not stream.cancel_pending:
            stream.prefill_busy, stream.steps = True, 1
        if not stream.live or stream.cancel_pending:
            stream.cancel_pending = False
            stream.current = None
            self._rollback(stream)
            stream.phase = Phase.IDLE
            self._try_release(stream)
            return False
        stream.phase = Phase.DECODING
        return True

    def second_frame_done(self, stream: Stream) -> None:
        """The prefill thread's step of this stream (segment_done's `second_frame`) is
        over: read back (its frame went through frame()) or failed. The stream decodes
        on in the decode thread's batch, or, ended or cancelled meanwhile, goes on to its
        next segment or is released."""
        stream.prefill_busy = False
        if stream.phase is Phase.IDLE:
            self._schedule_segment(stream)
        self._try_release(stream)

    def prefill_failed(self, stream: Stream) -> None:
        stream.prefill_busy = False
        stream.current = None
        stream.cancel_pending = False
        stream.segments.clear()
        stream.phase = Phase.IDLE
        self._try_release(stream)

    # --- decode thread ----------------------------------------------------------------

    def decode_batch(self) -> list[Stream]:
        """Streams that step next: decoding, with segment budget left (f0 came from the
        prefill, so a budget of m frames takes m - 1 steps), and not being stepped by the
        prefill thread (segment_done's `second_frame`)."""
        batch = [s for s in self.streams.values()
                 if s.phase is Phase.DECODING and not s.prefill_busy and s.steps < self._budget(s) - 1]
        return batch[:1] if self.serial else batch

    def step_launched(self, batch: list[Stream]) -> list[int]:
        """Record a launched step; returns each row's segment id for step_read."""
        for s in batch:
            s.steps += 1
            s.inflight += 1
        return [s.current.id for s in batch]

    def frame(self, stream: Stream, segment_id: int, frame: Any, is_end: bool) -> FrameOutcome:
        """A frame sampled for `stream` in segment `segment_id` (f0 from the prefill, or a
        decode step's output read back). Frames of a segment that already ended (the
        extra step after end-of-speech) or was cancelled are not emitted."""
        if stream.phase is not Phase.DECODING or stream.current is None or stream.current.id != segment_id:
            return FrameOutcome(emit=False)
        if is_end:
            self._finish_segment(stream, cut_frame=None)
            return FrameOutcome(emit=False, segment_done=True, reason="end")
        stream.frames += 1
        budget = self._budget(stream)
        if stream.frames >= budget:
            self._finish_segment(stream, cut_frame=frame)
            return FrameOutcome(emit=True, segment_done=True, reason="budget" if budget == stream.frame_budget else "context")
        return FrameOutcome(emit=True)

    def step_read(self, batch: list[Stream]) -> None:
        for s in batch:
            s.inflight -= 1
            self._try_release(s)

    def step_failed(self, streams: list[Stream]) -> None:
        """A decode step raised: nothing of these streams is in flight any more (their
        steps will never be read), and their turns in progress are dropped as cancel drops
        them; a stream closing meanwhile is released."""
        for s in streams:
            s.inflight = 0
            self.cancel(s)
            self._try_release(s)

    # --- internals --------------------------------------------------------------------

    def _budget(self, stream: Stream) -> int:
        """The current segment's frame budget: the stream's, or the KV room after the
        segment's prompt if that is less (m frames need positions up to P0 + m - 2)."""
        return max(1, min(stream.frame_budget, self.max_len - stream.prompt_end + 1))

    def _schedule_segment(self, stream: Stream) -> None:
        if stream.phase is Phase.IDLE and stream.segments and not stream.prefill_busy:
            stream.phase = Phase.PREFILLING
            stream.prefill_busy = True
            self.segment_work.append(stream)

    def _finish_segment(self, stream: Stream, cut_frame: Any) -> None:
        fed = stream.frames - (1 if cut_frame is not None else 0)
        stream.position = stream.prompt_end + fed
        stream.closing = Closing(cut_frame)
        stream.current = None
        stream.phase = Phase.IDLE
        self._schedule_segment(stream)

    def _rollback(self, stream: Stream) -> None:
        if stream.turn_checkpoint is not None:
            stream.position, stream.closing = stream.turn_checkpoint
            stream.turn_checkpoint = None

    def _try_release(self, stream: Stream) -> None:
        if not stream.close_pending or stream.prefill_busy or stream.inflight or stream.phase is Phase.CLOSED:
            return
        self.free_slots.append(stream.slot)
        self.free_slots.sort(reverse=True)
        self._finish_close(stream)
        if self.queue:
            self._admit(self.queue.popleft())

    def _finish_close(self, stream: Stream) -> None:
        stream.phase = Phase.CLOSED
        self.streams.pop(stream.id, None)

    # --- inspection -------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out = {p.value: 0 for p in Phase}
        for s in self.streams.values():
            out[s.phase.value] += 1
        out["queued"] = len(self.queue)
        return out
