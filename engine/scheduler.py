"""Continuous-batching scheduler: which stream holds which page-table row and which KV
pages, what to prefill next, which streams step in the next decode batch, and what a
decoded frame means.

Plain Python (no torch), driven by the engine's threads under one lock:
- the event loop calls open / say / cancel / close;
- the prefill thread calls next_prefills / take_voice_pages / voice_done / segment_done
  (and second_frame_done when it made the segment's second frame, step 1, itself);
- the decode thread calls decode_batch / step_launched / frame / step_read.

A stream holds a row (its page table, its decode state, its codec state) from admission
to close, and KV pages (engine/pages.py) as its context needs them: its voice prompt's
pages, shared with every stream of that voice, then its own. A segment prefill takes the
pages its prompt and an estimate of its frames need (a shared page it writes into is
copied first); a decoding stream takes one more page when its next position needs it;
pages beyond an idle stream's context go back to the pool. When the pool runs short,
unused cached voices go first, then idle streams' context pages, least recently used
first: such a stream's next turn starts from its voice prompt (as
`condition_on_previous_chunks=false` does). Decoding streams are capped by `max_running`
(the decode batch); open streams by the rows (`max_streams`).

A turn's text arrives as segments; each segment is one generation: prefill its tokens,
then decode frames until end-of-speech or the frame budget. Decode results are read one
step late, so a stream may step once more after its end; such frames are recognized by
their segment id and dropped.

Positions: after a segment prefill the stream's context ends at P0 and frame f0 is
sampled; decode step k feeds f(k-1) at P0 + k - 1 and samples f(k). A segment that ends
with end-of-speech after n frames has fed n frames; one cut at its budget m has fed m - 1
and its last frame is fed with the turn's closing tokens. A segment's budget is the
stream's frame budget or the KV room after its prompt, whichever is smaller (m frames
need positions up to P0 + m - 2): a model that does not stop is cut at the end of its
context (reason "context"), never written past it; so is a stream whose next page the
pool cannot give.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from engine.pages import PagePool, VoiceCache, VoicePages

# positions a new stream's first segment needs: admission waits until they can be had
ADMIT_POSITIONS = 256


class Phase(Enum):
    QUEUED = "queued"  # waiting for a row (or for pages to start in)
    PREFILLING = "prefilling"  # voice prefix or a segment is being prefilled
    IDLE = "idle"  # voice ready, nothing to say
    DECODING = "decoding"  # in the decode batch
    CLOSED = "closed"


class Refused(Exception):
    """No row (or no pages) and no room in the wait queue."""


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
    slot: int | None = None  # page-table row
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
    pages: list = field(default_factory=list)  # the page-table row: page of positions [i * P, (i + 1) * P)
    voice: VoicePages | None = None  # the voice prompt's pages (shared)
    voice_needs: int = 0  # pages an uncached voice's prefill waits for (0: not waiting)
    frame_cap: int | None = None  # frames the segment may have: the pool could not give the next page
    last_frame: Any = None
    used: int = 0  # when it last had work (idle eviction: least recently used first)

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
    pages: list | None = None  # segment: the stream's page-table row for this prefill
    copies: list = field(default_factory=list)  # segment: (shared page, its private copy) to copy first


@dataclass(slots=True)
class FrameOutcome:
    emit: bool  # hand the frame to the codec
    segment_done: bool = False
    reason: str = ""  # "end" (end-of-speech), "budget" or "context" (cut at the KV's end)


class Scheduler:
    def __init__(self, max_running: int, max_queued: int, max_len: int, serial: bool = False, *,
                 max_streams: int | None = None, pool: PagePool | None = None, voices: VoiceCache | None = None,
                 admit_positions: int = ADMIT_POSITIONS) -> None:
        """`max_running`: streams decoding at once (the decode batch); `max_streams`: open
        streams (rows; default max_running); `pool`: the KV pages (default: every row's
        whole context, 16-position pages); `voices`: the cached voice prompts;
        `admit_positions`: the free positions a new stream waits for.
        `serial` is the naive baseline: one utterance at a time (a segment is prefilled
        only when no stream is decoding, and the decode batch holds one stream)."""
        max_streams = max_running if max_streams is None else max_streams
        if max_running < 1 or max_queued < 0 or max_streams < 1:
            raise ValueError("max_running and max_streams must be >= 1 and max_queued >= 0")
        self.serial = serial
        self.max_running = max_running
        self.max_streams = max_streams
        self.max_queued = max_queued
        self.max_len = max_len
        self.admit_positions = min(admit_positions, max_len)
        self.pool = PagePool(1 + max_streams * -(-max_len // 16), 16) if pool is None else pool
        self.voices = VoiceCache(self.pool, self.pool.capacity) if voices is None else voices
        self.streams: dict[int, Stream] = {}
        self.decoding: dict[int, Stream] = {}  # phase DECODING, in admission order
        self.free_slots = list(range(max_streams))[::-1]  # pop() gives the lowest
        self.queue: deque[Stream] = deque()
        self.voice_work: deque[Stream] = deque()
        self.segment_work: deque[Stream] = deque()
        # (row, page index, page) entries the decode thread writes before its next launch
        self.table_updates: list[tuple[int, int, int]] = []
        self.evicted_contexts = 0  # idle streams whose context pages were taken back
        self.page_cuts = 0  # segments cut because the pool had no page for their next frame
        # (stream, turn) of segments decode_batch ended for want of a page, with no frame in
        # flight to end them: the decode thread reports their ends
        self.cut_now: list[tuple[Stream, int]] = []
        self._ids = itertools.count(1)
        self._segment_ids = itertools.count(1)
        self._clock = itertools.count(1)

    # --- event loop side --------------------------------------------------------------

    def open(self, owner: Any, frame_budget: int, reset_context_each_segment: bool = False) -> Stream:
        if frame_budget < 1:
            raise ValueError("frame_budget must be >= 1")
        stream = Stream(next(self._ids), owner, frame_budget, reset_context_each_segment)
        if self.free_slots and not self.queue and self._can_start():
            self._admit(stream)
        elif len(self.queue) < self.max_queued:
            self.queue.append(stream)
        elif not self.free_slots:
            raise Refused(f"all {self.max_streams} streams are busy and {self.max_queued} are already waiting")
        else:
            raise Refused(f"the KV cache is full ({self.pool.used} of {self.pool.capacity} pages in use) and "
                          f"{self.max_queued} streams are already waiting")
        self.streams[stream.id] = stream
        return stream

    def can_open(self) -> bool:
        """open() would admit or queue one more stream now (not Refused): the service's
        readiness (GET /v1/ready)."""
        return (bool(self.free_slots) and not self.queue and self._can_start()) or len(self.queue) < self.max_queued

    def _can_start(self) -> bool:
        """A new stream's first segment fits in the pages free or freeable (its voice is
        checked when it is prefilled: a cached one needs none)."""
        need = self.pool.pages_for(self.admit_positions)
        return self.pool.free >= need or self._available() >= need  # the walk over streams only when short

    def _admit(self, stream: Stream) -> None:
        stream.slot = self.free_slots.pop()
        stream.phase = Phase.PREFILLING
        stream.prefill_busy = True
        stream.used = next(self._clock)
        self.voice_work.append(stream)

    def say(self, stream: Stream, segment: Segment) -> None:
        if not stream.live:
            return
        segment.id = next(self._segment_ids)
        stream.segments.append(segment)
        stream.used = next(self._clock)
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
            self._set_idle(stream)
        if stream.phase is Phase.IDLE:
            self._rollback(stream)
            self._trim(stream)

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
            self._set_idle(stream)
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
        voice prefix. A voice prefix that `quick_voice` says is quick (the engine: its
        pages are in the voice cache, no device work) goes before the segments: measured on
        an H200 at 64 connections, new connections waited behind the talking ones'
        segments for their cached voice, 101 ms to ready at the median (437 ms once each
        segment prefill also made its second frame), and streams that are not ready yet
        leave the decode batch short. A voice waiting for pages is skipped until they can
        be had."""
        if quick_voice is not None:
            for stream in self.voice_work:
                if stream.live and quick_voice(stream):
                    self.voice_work.remove(stream)
                    return [PrefillWork(stream, "voice")]
        works = self._next_segment_works(1 if self.serial else limit)
        if works:
            return works
        for stream in list(self.voice_work):
            if not stream.live:
                self.voice_work.remove(stream)
                stream.prefill_busy = False
                self._try_release(stream)
            elif not stream.voice_needs or self.pool.free >= stream.voice_needs or (
                    self._available(exclude=stream) >= stream.voice_needs):
                self.voice_work.remove(stream)
                return [PrefillWork(stream, "voice")]
        return []

    def take_voice_pages(self, stream: Stream, length: int) -> list[int] | None:
        """Fresh pages for an uncached voice prompt of `length` positions, given to
        `stream` (its prefill writes them); None: not enough even after reclaiming, and
        the stream's voice goes back to wait for them (the engine drops this work)."""
        need = self.pool.pages_for(length)
        pages = self._alloc(need, exclude=stream)
        if pages is None:
            stream.voice_needs = need
            self.voice_work.appendleft(stream)
            return None
        stream.voice_needs = 0
        stream.pages = pages
        return pages

    def _next_segment_works(self, limit: int) -> list[PrefillWork]:
        if self.serial and self.decoding:
            return []
        works: list[PrefillWork] = []
        speaking = len(self.decoding)
        waiting: list[Stream] = []
        while self.segment_work and len(works) < limit:
            stream = self.segment_work.popleft()
            if not (stream.live and stream.segments):
                stream.prefill_busy = False
                if stream.live:
                    stream.phase = Phase.IDLE
                self._trim(stream)
                self._try_release(stream)
                continue
            # a step still in flight may write this stream's pages; the decode batch is full
            if stream.inflight or speaking + len(works) >= self.max_running:
                waiting.append(stream)
                continue
            work = self._segment_prefill(stream)
            if work is None:  # no pages for it yet: it waits for a segment to end
                waiting.append(stream)
                continue
            works.append(work)
        self.segment_work.extendleft(reversed(waiting))
        return works

    def _segment_prefill(self, stream: Stream) -> PrefillWork | None:
        segment = stream.segments[0]
        start, restart = stream.position, False
        if stream.reset_context_each_segment or start + self._room_needed(stream, segment) > self.max_len:
            start, restart = stream.prefix_len, True
        end = min(self.max_len, start + self._room_needed(stream, segment))
        copies = self._reserve(stream, start, end, restart)
        if copies is None and not restart and self._private(stream):
            # nothing else to take back: its own earlier context makes room (its voice stays)
            start, restart = stream.prefix_len, True
            end = min(self.max_len, start + self._room_needed(stream, segment))
            copies = self._reserve(stream, start, end, restart)
            self.evicted_contexts += 1
        if restart:  # the context after the voice prompt is gone: a cancel rolls back to the prompt
            stream.position, stream.closing = stream.prefix_len, None
            if stream.turn_checkpoint is not None:
                stream.turn_checkpoint = (stream.prefix_len, None)
        if copies is None:
            return None
        stream.segments.popleft()
        if stream.turn != segment.turn:
            stream.turn = segment.turn
            stream.turn_checkpoint = (stream.position, stream.closing)
        stream.current = segment
        closing = stream.closing
        stream.closing = None
        stream.frame_cap = None
        stream.used = next(self._clock)
        return PrefillWork(stream, "segment", segment, start, closing, restart, list(stream.pages), copies)

    def _reserve(self, stream: Stream, start: int, end: int, restart: bool) -> list[tuple[int, int]] | None:
        """Pages for positions [start, end) of `stream`: its own copy of a shared page
        that position `start` falls in, fresh pages past its last. Returns the (shared,
        copy) pairs to copy before the prefill, or None (nothing changed) when the pool
        cannot give them."""
        P = self.pool.page_size
        kept = stream.pages[: -(-start // P)] if restart else stream.pages
        first = start // P
        cow = first < len(kept) and self.pool.shared(kept[first])
        need = max(0, self.pool.pages_for(end) - len(kept)) + cow
        if restart and len(kept) < len(stream.pages):  # the pages past the voice prompt come back first
            self.pool.release(stream.pages[len(kept):])
            stream.pages = kept
        fresh = self._alloc(need, exclude=stream) if need else []
        if fresh is None:
            return None
        copies = []
        if cow:
            copy = fresh.pop()
            copies.append((kept[first], copy))
            self.pool.release([kept[first]])
            stream.pages[first] = copy
        stream.pages.extend(fresh)
        return copies

    def _room_needed(self, stream: Stream, segment: Segment) -> int:
        # tokens of the segment prompt (~1 per char for byte-level, fewer for BPE) plus
        # ~1.4 frames per character of speech, capped by the frame budget, plus slack
        return 24 + len(segment.text.encode()) + min(stream.frame_budget, 2 * len(segment.text) + 32)

    def ensure_room(self, stream: Stream, end: int) -> bool:
        """Pages up to position `end` (the prefill thread, once a segment's tokens are
        known, for its prompt and its first two frames)."""
        need = self.pool.pages_for(min(end, self.max_len)) - len(stream.pages)
        if need <= 0:
            return True
        fresh = self._alloc(need, exclude=stream)
        if fresh is None:
            return False
        stream.pages.extend(fresh)
        return True

    def voice_done(self, stream: Stream, voice: VoicePages | int) -> None:
        """The stream's voice prompt is in KV pages: its own (take_voice_pages; an int is
        the length of a prompt written into fresh pages, for tests) or a cached voice's,
        now shared with it."""
        if isinstance(voice, int):
            pages = stream.pages or self.take_voice_pages(stream, voice)
            if pages is None:
                raise RuntimeError("no pages for the voice prompt")
            voice = VoicePages(tuple(pages), voice)
        if stream.pages != list(voice.pages):
            self.pool.retain(voice.pages)
            self.pool.release(stream.pages)
            stream.pages = list(voice.pages)
        stream.voice = voice
        stream.prefill_busy = False
        stream.prefix_len = stream.position = voice.length
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
        and its row stays held until second_frame_done."""
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
            self._trim(stream)
            self._try_release(stream)
            self._schedule_segment(stream)  # text said after the cancel: nothing else would start it
            return False
        stream.phase = Phase.DECODING
        self.decoding[stream.id] = stream
        return True

    def second_frame_done(self, stream: Stream) -> None:
        """The prefill thread's step of this stream (segment_done's `second_frame`) is
        over: read back (its frame went through frame()) or failed. The stream decodes
        on in the decode thread's batch, or, ended or cancelled meanwhile, goes on to its
        next segment or is released."""
        stream.prefill_busy = False
        if stream.phase is Phase.IDLE:
            self._trim(stream)
            self._schedule_segment(stream)
        self._try_release(stream)

    def prefill_failed(self, stream: Stream) -> None:
        stream.prefill_busy = False
        stream.current = None
        stream.cancel_pending = False
        stream.segments.clear()
        stream.phase = Phase.IDLE
        self._trim(stream)
        self._try_release(stream)

    # --- decode thread ----------------------------------------------------------------

    def decode_batch(self) -> list[Stream]:
        """Streams that step next: decoding, with segment budget left (f0 came from the
        prefill, so a budget of m frames takes m - 1 steps), and not being stepped by the
        prefill thread (segment_done's `second_frame`). Each one holds the page its next
        position needs: new pages are listed in `table_updates` for the decode thread to
        write first; a stream the pool has no page for is cut after the frames it has."""
        batch = []
        for s in list(self.decoding.values()):  # _grow may end a segment
            if s.prefill_busy or s.steps >= self._budget(s) - 1:
                continue
            if self._grow(s):
                batch.append(s)
            if self.serial and batch:
                break
        return batch

    def _grow(self, s: Stream) -> bool:
        index = (s.prompt_end + s.steps) // self.pool.page_size  # the page of the position it writes next
        if index < len(s.pages):
            return True
        page = self._alloc(1, exclude=s)
        if page is None:  # no more frames: the segment ends with the ones it has
            self.page_cuts += 1
            s.frame_cap = s.steps + 1
            if not s.inflight and s.frames >= s.frame_cap:
                self.cut_now.append((s, s.current.turn))
                self._finish_segment(s, s.last_frame)
            return False
        s.pages.append(page[0])
        self.table_updates.append((s.slot, index, page[0]))
        return True

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
        stream.last_frame = frame
        budget = self._budget(stream)
        if stream.frames >= budget:
            self._finish_segment(stream, cut_frame=frame)
            return FrameOutcome(emit=True, segment_done=True, reason="budget" if budget == stream.frame_budget else "context")
        return FrameOutcome(emit=True)

    def step_read(self, batch: list[Stream]) -> None:
        for s in batch:
            s.inflight -= 1
            self._trim(s)
            self._try_release(s)

    def step_failed(self, streams: list[Stream]) -> None:
        """A decode step raised: nothing of these streams is in flight any more (their
        steps will never be read), and their turns in progress are dropped as cancel drops
        them; a stream closing meanwhile is released."""
        for s in streams:
            s.inflight = 0
            self.cancel(s)
            self._try_release(s)

    # --- pages ------------------------------------------------------------------------

    def _available(self, exclude: Stream | None = None) -> int:
        """Pages free, or freeable by dropping unused cached voices and idle contexts."""
        return self.pool.free + self.voices.unused_pages() + sum(self._private(s) for s in self._evictable(exclude))

    def _alloc(self, n: int, exclude: Stream | None = None) -> list[int] | None:
        """n fresh pages, after reclaiming unused voices, then idle contexts (least
        recently used first) if the pool is short; None if that is not enough (then
        nothing was reclaimed beyond the voices)."""
        if n > self.pool.free:
            self.voices.reclaim(n)
        if n > self.pool.free:
            victims = sorted(self._evictable(exclude), key=lambda s: s.used)
            if self.pool.free + sum(self._private(s) for s in victims) >= n:
                for s in victims:
                    if self.pool.free >= n:
                        break
                    self._evict(s)
        return self.pool.alloc(n)

    def _evictable(self, exclude: Stream | None):
        for s in self.streams.values():
            if (s is not exclude and s.phase is Phase.IDLE and s.live and not s.prefill_busy and not s.inflight
                    and not s.segments and s.voice is not None and self._private(s)):
                yield s

    def _private(self, s: Stream) -> int:
        """Pages evicting `s` would free: those past its voice prompt, and its own copy of
        the prompt's last page while the shared one still exists."""
        voice = s.voice.pages if s.voice is not None else ()
        tail = len(voice) - 1
        copied = 0 < len(voice) <= len(s.pages) and s.pages[tail] != voice[tail] and self.pool.refs[voice[tail]] > 0
        return max(0, len(s.pages) - len(voice)) + copied

    def _evict(self, s: Stream) -> None:
        """An idle stream's context back to its voice prompt: its next turn starts there."""
        self._reset_to_voice(s)
        s.closing, s.turn_checkpoint = None, None
        self.evicted_contexts += 1

    def _reset_to_voice(self, s: Stream) -> None:
        """Keep only the voice prompt's pages, the shared ones again where they still exist
        (a private copy of the last one holds the same prompt positions)."""
        n = len(s.voice.pages)
        keep = s.pages[:n]
        for i, page in enumerate(s.voice.pages):
            if keep[i] != page and self.pool.refs[page] > 0:
                self.pool.retain([page])
                self.pool.release([keep[i]])
                keep[i] = page
        self.pool.release(s.pages[n:])
        s.pages = keep
        s.position = s.prefix_len

    def _trim(self, s: Stream) -> None:
        """Pages past an idle stream's context back to the pool (once no step in flight
        or prefill can write them)."""
        if s.phase is not Phase.IDLE or s.inflight or s.prefill_busy:
            return
        keep = max(self.pool.pages_for(s.position), len(s.voice.pages) if s.voice is not None else 0)
        if len(s.pages) > keep:
            self.pool.release(s.pages[keep:])
            del s.pages[keep:]
            self._admit_waiting()

    # --- internals --------------------------------------------------------------------

    def _budget(self, stream: Stream) -> int:
        """The current segment's frame budget: the stream's, or the KV room after the
        segment's prompt if that is less (m frames need positions up to P0 + m - 2), or
        the frames it had when the pool ran out of pages."""
        budget = max(1, min(stream.frame_budget, self.max_len - stream.prompt_end + 1))
        return budget if stream.frame_cap is None else min(budget, stream.frame_cap)

    def _set_idle(self, stream: Stream) -> None:
        stream.phase = Phase.IDLE
        self.decoding.pop(stream.id, None)

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
        stream.used = next(self._clock)
        self._set_idle(stream)
        self._trim(stream)
        self._schedule_segment(stream)

    def _rollback(self, stream: Stream) -> None:
        if stream.turn_checkpoint is not None:
            stream.position, stream.closing = stream.turn_checkpoint
            stream.turn_checkpoint = None

    def _try_release(self, stream: Stream) -> None:
        if not stream.close_pending or stream.prefill_busy or stream.inflight or stream.phase is Phase.CLOSED:
            return
        self.pool.release(stream.pages)
        stream.pages = []
        self.free_slots.append(stream.slot)
        self.free_slots.sort(reverse=True)
        self._finish_close(stream)
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self.queue and self.free_slots and self._can_start():
            self._admit(self.queue.popleft())

    def _finish_close(self, stream: Stream) -> None:
        stream.phase = Phase.CLOSED
        self.decoding.pop(stream.id, None)
        self.streams.pop(stream.id, None)

    # --- inspection -------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out = {p.value: 0 for p in Phase}
        for s in self.streams.values():
            out[s.phase.value] += 1
        out["queued"] = len(self.queue)
        return out

    def page_counts(self) -> dict[str, int]:
        """KV pages: total, in use, free; of those in use, cached voices' and evictable ones."""
        return {"total": self.pool.capacity, "used": self.pool.used, "free": self.pool.free,
                "voice_cache": self.voices.pages, "evicted_contexts": self.evicted_contexts,
                "page_cuts": self.page_cuts}
