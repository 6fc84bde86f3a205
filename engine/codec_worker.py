"""The codec thread: turns code frames into PCM, batched across streams, off the decode
thread. Items arrive in order per stream (frames, segment ends, slot resets); a run of
frame items is decoded in as few batched calls as possible (one per distinct number of
pending frames), and each stream's audio and segment ends reach its sink in order."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.codec.streaming import StreamingDecoder


@dataclass(slots=True)
class _Frame:
    owner: Any
    slot: int
    turn: int
    codes: np.ndarray  # [C]


@dataclass(slots=True)
class _End:
    owner: Any
    turn: int
    reason: str


@dataclass(slots=True)
class _Reset:
    slot: int


_STOP = object()


class CodecWorker:
    def __init__(self, codec: torch.nn.Module, max_streams: int) -> None:
        self.decoder = StreamingDecoder(codec, max_streams)
        self.device = self.decoder.device
        # its own CUDA stream: work on the legacy default stream would serialize with the
        # decode and prefill streams
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="codec", daemon=True)
        self.frames_decoded = 0
        self.calls = 0
        self.on_error = None  # callable(owner, exc), set by the engine

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)

    def depth(self) -> int:
        return self._queue.qsize()

    def frame(self, owner: Any, slot: int, turn: int, codes: np.ndarray) -> None:
        self._queue.put(_Frame(owner, slot, turn, codes))

    def end(self, owner: Any, turn: int, reason: str) -> None:
        self._queue.put(_End(owner, turn, reason))

    def reset(self, slot: int) -> None:
        self._queue.put(_Reset(slot))

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._process(items):
                return

    def _process(self, items: list) -> bool:
        run: list[_Frame] = []
        for item in items:
            if isinstance(item, _Frame):
                run.append(item)
                continue
            self._decode(run)
            run = []
            if item is _STOP:
                return True
            if isinstance(item, _Reset):
                with self._on_stream():
                    self.decoder.reset(item.slot)
            else:
                item.owner.segment_end(item.turn, item.reason)
        self._decode(run)
        return False

    @torch.inference_mode()
    def _decode(self, run: list[_Frame]) -> None:
        run = [f for f in run if f.owner.wanted(f.turn)]  # closed or cancelled: skip the work
        if not run:
            return
        per_slot: OrderedDict[int, list[_Frame]] = OrderedDict()
        for f in run:
            per_slot.setdefault(f.slot, []).append(f)
        by_count: dict[int, list[int]] = {}
        for slot, frames in per_slot.items():
            by_count.setdefault(len(frames), []).append(slot)
        for count, slots in by_count.items():
            codes = np.stack([np.stack([f.codes for f in per_slot[s]], axis=1) for s in slots])  # [B, C, n]
            try:
                with self._on_stream():
                    pcm = self.decoder.decode(
                        torch.tensor(slots, device=self.device), torch.from_numpy(codes).to(self.device)
                    ).float().cpu().numpy()
            except Exception as e:  # one bad batch must not stop the thread
                for s in slots:
                    if self.on_error:
                        self.on_error(per_slot[s][0].owner, e)
                continue
            self.calls += 1
            self.frames_decoded += count * len(slots)
            for row, s in enumerate(slots):
                frames = per_slot[s]
                # frames of one slot in a run share a turn except right at a turn switch
                for turn, chunk in _split_by_turn(frames, pcm[row]):
                    frames[0].owner.audio(turn, chunk)


def _split_by_turn(frames: list[_Frame], pcm: np.ndarray):
    hop = pcm.shape[0] // len(frames)
    start = 0
    for i in range(1, len(frames) + 1):
        if i == len(frames) or frames[i].turn != frames[start].turn:
            yield frames[start].turn, pcm[start * hop : i * hop]
            start = i
