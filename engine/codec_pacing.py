"""When the codec worker decodes the frames it holds, and in which calls: plain Python (no
torch), with an injectable clock, unit-tested in tests/test_codec_pacing.py.

A turn's first audio goes out once `first_frames` frames are there (BUSY_FIRST_FRAMES
under load). Later frames go out at once while the stream's audio leads its real-time
playback by at most `hold_lead_s`; further ahead they wait for a full chunk, so a busy
service sends one message where it would send four (latency_bench/RESULTS.md, "The codec
worker's policy at c=64").
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

CHUNKS = (4, 2, 1)  # frames per stream per decode call, by default
CHUNK_CHOICES = (1, 2, 4, 8, 16)  # the largest chunk a worker may be given
BUSY_FIRST_FRAMES = 2  # a new turn's first audio under load (Pacer.first_frames_now)
# busy_streams by default: half the reference load's 64 streams, so c=1 and 16 keep the
# one-frame TTFA (latency_bench/RESULTS.md, "The capacity sweep past 64 streams")
DEFAULT_BUSY_STREAMS = 32


def chunk_sizes(max_chunk: int) -> tuple[int, ...]:
    """The powers of two up to max_chunk, largest first. Each (batch bucket, chunk) pair is
    one cuDNN plan and one CUDA graph, so the set is small."""
    if max_chunk not in CHUNK_CHOICES:
        raise ValueError(f"the largest codec chunk must be one of {CHUNK_CHOICES}, got {max_chunk}")
    return tuple(c for c in reversed(CHUNK_CHOICES) if c <= max_chunk)


class Frame(Protocol):
    slot: int
    turn: int


@dataclass(slots=True)
class _Lead:
    """How far a stream's audio is ahead of its real-time playback, this turn."""

    turn: int
    started: float  # clock time of the turn's first audio
    frames: int = 0  # frames of this turn sent so far


@dataclass(slots=True)
class Pacer:
    """The frames held per stream, each stream's lead this turn, and the policy over them."""

    frame_s: float  # audio per frame
    hold_lead_s: float | None = 0.3  # None: never hold a turn's later frames
    max_chunk: int = CHUNKS[0]
    first_frames: int = 1  # frames a turn's first audio waits for
    busy_streams: int = 0  # from this many streams with audio in progress, BUSY_FIRST_FRAMES (0: never)
    clock: Callable[[], float] = time.monotonic
    chunks: tuple[int, ...] = field(init=False)
    held: OrderedDict[int, list] = field(init=False, default_factory=OrderedDict)  # slot -> frames
    leads: dict[int, _Lead] = field(init=False, default_factory=dict)  # slot -> its turn's lead

    def __post_init__(self) -> None:
        self.chunks = chunk_sizes(self.max_chunk)
        if self.first_frames not in self.chunks:
            raise ValueError(f"a turn's first audio must be one of the chunk sizes {self.chunks}, got {self.first_frames}")
        if self.busy_streams < 0 or (self.busy_streams and BUSY_FIRST_FRAMES not in self.chunks):
            raise ValueError(f"busy_streams must be 0 (off) or positive, with {BUSY_FIRST_FRAMES} among the chunk "
                             f"sizes {self.chunks}; got {self.busy_streams}")

    def hold(self, frame: Frame) -> list:
        """Hold `frame`; returns the frames of its stream's previous turn, to decode first."""
        older = self.held.get(frame.slot)
        earlier = self.take([frame.slot]) if older and older[0].turn != frame.turn else []
        self.held.setdefault(frame.slot, []).append(frame)
        return earlier

    def take(self, slots: list[int]) -> list:
        """Every held frame of these streams, in order."""
        return [f for slot in slots for f in self.held.pop(slot, [])]

    def take_due(self) -> list:
        """One round: the next chunk of every stream that is due now, the rest stays held."""
        now, run = self.clock(), []
        for slot in [s for s, frames in self.held.items() if self._due(s, frames, now)]:
            frames = self.held.pop(slot)
            n = self.chunk(len(frames))
            if frames[n:]:
                self.held[slot] = frames[n:]
            run += frames[:n]
        return run

    def deadline(self) -> float | None:
        """Seconds until some held frame is due (0: now; None: only when more frames or a
        segment end arrive)."""
        if not self.held:
            return None
        now = self.clock()
        if any(self._due(slot, frames, now) for slot, frames in self.held.items()):
            return 0.0
        if self.hold_lead_s is None:
            return None
        waits = [self._lead_s(lead, now) - self.hold_lead_s
                 for slot, frames in self.held.items() if (lead := self._started(slot, frames)) is not None]
        return max(0.0, min(waits)) if waits else None

    def rounds(self, run: list) -> Iterator[tuple[int, list[list]]]:
        """The calls that decode `run`: a round takes the next chunk of every stream, calls
        grouped by chunk size, smallest first (single frames are mostly a turn's first
        audio, which someone waits for); yields (frames per row, one chunk per row)."""
        pending: OrderedDict[int, list] = OrderedDict()
        for f in run:
            pending.setdefault(f.slot, []).append(f)
        while pending:
            groups: dict[int, list[list]] = {}
            for slot, frames in pending.items():
                n = self.chunk(len(frames))
                groups.setdefault(n, []).append(frames[:n])
                del frames[:n]
            yield from sorted(groups.items())
            pending = OrderedDict((s, f) for s, f in pending.items() if f)

    def chunk(self, frames: int) -> int:
        return next(c for c in self.chunks if c <= frames)

    def sent(self, chunks: list[list]) -> None:
        """These chunks' audio (one stream each) goes out now; a turn's first starts its lead."""
        now = self.clock()
        for frames in chunks:
            lead = self.leads.get(frames[0].slot)
            if lead is None or lead.turn != frames[-1].turn:
                lead = self.leads[frames[0].slot] = _Lead(frames[-1].turn, now)
            lead.frames += sum(f.turn == lead.turn for f in frames)

    def ended(self, slot: int) -> None:
        """The stream's segment ended, or it was reset or cut: its next turn starts afresh."""
        self.leads.pop(slot, None)

    def first_frames_now(self) -> int:
        """`first_frames`, or BUSY_FIRST_FRAMES from `busy_streams` streams with audio in
        progress: a saturated GPU lets a turn's first frame play out before the second comes
        (latency_bench/RESULTS.md, "The capacity sweep past 64 streams")."""
        if self.busy_streams and len(self.leads) >= self.busy_streams:
            return max(self.first_frames, BUSY_FIRST_FRAMES)
        return self.first_frames

    def _started(self, slot: int, frames: list) -> _Lead | None:
        """The lead of the turn these held frames belong to, once its first audio went out."""
        lead = self.leads.get(slot)
        return lead if lead is not None and lead.turn == frames[0].turn else None

    def _due(self, slot: int, frames: list, now: float) -> bool:
        lead = self._started(slot, frames)
        if lead is None:  # (the rest of a shorter turn goes out at its segment end)
            return len(frames) >= self.first_frames_now()
        if self.hold_lead_s is None or self._lead_s(lead, now) <= self.hold_lead_s:
            return True
        return len(frames) >= self.chunks[0]

    def _lead_s(self, lead: _Lead, now: float) -> float:
        return lead.started + lead.frames * self.frame_s - now
