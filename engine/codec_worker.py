"""The codec thread: turns code frames into PCM, batched across streams, off the decode
thread. Items arrive in order per stream (frames, segment ends, resets, cuts), and each
stream's audio and segment ends reach its sink in order. When held frames go out is
engine/codec_pacing.py's; the calls themselves are engine/codec_calls.py's.

A segment end hands out the audio the decoder still holds back (the "istft" codec's
lookahead: StreamingDecoder.drain) as the segment's last audio, before the end itself; a
barge-in (cut) drops it, so it never opens the next reply.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.codec_calls import CodecCalls
from engine.codec_pacing import CHUNKS, Pacer
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
class _Reset:
    slot: int


@dataclass(slots=True)
class _Cut:
    """A stream's turns were cancelled: the audio its decoder still holds back is dropped."""

    slot: int


_STOP = object()


class CodecWorker:
    def __init__(self, codec: torch.nn.Module, max_streams: int, *, max_batch: int | None = None,
                 cuda_graphs: bool | None = None,
                 hold_lead_s: float | None = 0.3, max_chunk: int = CHUNKS[0], first_frames: int = 1,
                 busy_streams: int = 0, kernels: bool | None = None) -> None:
        frame_s = codec.hop_length / codec.sample_rate  # audio per frame
        self.pacing = Pacer(frame_s, hold_lead_s, max_chunk, first_frames, busy_streams)
        # state for max_streams streams; calls of at most max_batch of them (default: all)
        self.codec_calls = CodecCalls(codec, max_streams, self.pacing.chunks, cuda_graphs, kernels, max_batch)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # made by start()
        self.calls = 0
        self.frames_decoded = 0
        self.frames_padded = 0  # frames of the padding rows (scratch slot) of those calls
        # host time by phase (engine/timeshare.py): waiting for work, in decode calls (to
        # the PCM on the host), the rest (policy, splitting, callbacks)
        self.phases = Phases("idle", "decode", "deliver")
        self.on_error = None  # callable(owner, exc), set by the engine

    @property
    def gpu_s(self) -> float:
        """GPU seconds of the decode calls (graph replays)."""
        return self.codec_calls.gpu_s

    def warm_up(self) -> None:
        """Every call shape once (and on a GPU its graph), before the thread starts."""
        self.codec_calls.warm_up()

    def start(self, guard=None) -> None:
        """Start the thread; `guard` wraps its loop (the engine's: a crash stops serving)."""
        self._thread = threading.Thread(target=guard(self._run) if guard else self._run, name="codec", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def drain_samples(self) -> int:
        """The audio a segment's end drains (its frames' audio lags by as much)."""
        return self.codec_calls.decoder.drain_samples

    def depth(self) -> int:
        return self._queue.qsize()

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

    def _run(self) -> None:
        while True:
            wait = self.pacing.deadline()
            self.phases.to("idle")
            items = []
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
        """Take in queued items, in order, then decode one round of the frames due (so a
        turn's first frame queued meanwhile joins the next round, not the end of a backlog:
        latency_bench/RESULTS.md, "One codec round per pass"). A stream's held frames are
        decoded before its later items; a run of stream items with no frame between them is
        flushed as one batch (latency_bench/RESULTS.md, "The first c=64 run's tail, fixed")."""
        run: list[_Reset | _Cut | _End] = []  # stream items queued since the last frame
        for item in _flat(items):
            if isinstance(item, (_Reset, _Cut, _End)):
                run.append(item)
                continue
            self._stream_items(run)  # before anything queued after them
            run = []
            if item is _STOP:
                self._decode(self.pacing.take(list(self.pacing.held)))
                return True
            self._decode(self.pacing.hold(item))  # a new turn: the old one's frames first
        self._stream_items(run)
        self._decode(self.pacing.take_due())
        return False

    def _stream_items(self, run: list[_Reset | _Cut | _End]) -> None:
        """Their streams' held frames in one batch, then each item in order."""
        if not run:
            return
        self._decode(self.pacing.take(list(dict.fromkeys(item.slot for item in run))))
        for item in run:
            self.pacing.ended(item.slot)
            if isinstance(item, _Reset):
                self.codec_calls.reset(item.slot)
            elif isinstance(item, _Cut):
                self.codec_calls.drain(item.slot)
            else:  # the segment's last audio (held back for frames that will not come), then its end
                pcm = self.codec_calls.drain(item.slot)
                if pcm is not None and item.owner.wanted(item.turn):
                    item.owner.audio(item.turn, pcm)
                item.owner.segment_end(item.turn, item.reason)

    def _decode(self, run: list[_Frame]) -> None:
        run = [f for f in run if f.owner.wanted(f.turn)]  # closed or cancelled: skip the work
        most = self.codec_calls.buckets[-1]
        for n, chunks in self.pacing.rounds(run):
            for i in range(0, len(chunks), most):
                self._call(n, chunks[i : i + most])

    def _call(self, n: int, chunks: list[list[_Frame]]) -> None:
        """One call: `n` frames of each chunk's stream (distinct slots), padded to a bucket."""
        calls = self.codec_calls
        bucket = calls.bucket(len(chunks))
        codes = np.zeros((bucket, calls.num_codebooks, n), dtype=np.int64)
        for row, chunk in enumerate(chunks):
            codes[row] = np.stack([f.codes for f in chunk], axis=1)
        slots = [chunk[0].slot for chunk in chunks]
        self.phases.to("decode")
        try:
            pcm = calls.decode(slots + [calls.scratch] * (bucket - len(chunks)), codes)
        except Exception as e:  # one bad batch must not stop the thread
            for chunk in chunks:
                if self.on_error:
                    self.on_error(chunk[0].owner, e)
            if device_lost(e):  # the GPU itself: the thread stops (its guard fails the engine)
                raise
            return
        finally:
            self.phases.to("deliver")
        self.calls += 1
        self.frames_decoded += n * len(chunks)
        self.frames_padded += n * (bucket - len(chunks))
        self.pacing.sent(chunks)
        for row, chunk in enumerate(chunks):
            for turn, audio in _split_by_turn(chunk, pcm[row]):  # a chunk may span a turn switch
                chunk[0].owner.audio(turn, audio)


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
