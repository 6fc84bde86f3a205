"""The codec thread: turns code frames into PCM, batched across streams, off the decode
thread. Items arrive in order per stream (frames, segment ends, slot resets), and each
stream's audio and segment ends reach its sink in order.

Every decode call has a shape from a small fixed set: the batch is padded to a bucket
(padding rows use a scratch slot) and each stream's pending frames go out in chunks of
4, 2 or 1. cuDNN builds an execution plan the first time it sees a convolution shape,
which was measured on an H200 at 100-1,500 ms per new shape for the release-size codec;
with a fixed set, `warm_up()` builds them all before serving.

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


@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    slots: torch.Tensor  # static inputs: long [B]
    codes: torch.Tensor  # long [B, C, n]
    audio: torch.Tensor  # static output: float32 [B, n * hop]


_STOP = object()
CHUNKS = (4, 2, 1)  # frames per stream per decode call


class CodecWorker:
    def __init__(self, codec: torch.nn.Module, max_streams: int, cuda_graphs: bool | None = None) -> None:
        self.decoder = StreamingDecoder(codec, max_streams + 1)
        self.scratch = max_streams  # the slot padding rows point at
        self.buckets = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b < max_streams] + [max_streams]
        self.num_codebooks = codec.num_codebooks
        self.device = self.decoder.device
        # its own CUDA stream: work on the legacy default stream would serialize with the
        # decode and prefill streams
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.cuda_graphs = self.stream is not None if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.stream is None:
            raise ValueError("CUDA graphs need a CUDA device")
        self._graphs: dict[tuple[int, int], _Graph] = {}  # (batch bucket, frames) -> graph
        if self.stream is not None:  # pinned staging: the host side of every call's copies
            most = self.buckets[-1] * max(CHUNKS)
            self._codes_host = torch.zeros(most * self.num_codebooks + self.buckets[-1], dtype=torch.long, pin_memory=True)
            self._audio_host = torch.zeros(most * self.decoder.hop_length, dtype=torch.float32, pin_memory=True)
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
    def warm_up(self) -> None:
        """One call of every shape the worker will use, then (on a GPU) one graph of each,
        before the thread starts. Only the scratch slot's state is touched."""
        for n in CHUNKS:
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
        shapes = sorted(((b, n) for b in self.buckets for n in CHUNKS), key=lambda s: -s[0] * s[1])
        with torch.cuda.stream(self.stream):
            for b, n in shapes:
                slots = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
                codes = torch.zeros(b, self.num_codebooks, n, dtype=torch.long, device=self.device)
                self.decoder.decode(slots, codes)  # warm-up on the static buffers
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.stream, capture_error_mode="thread_local"):
                    audio = self.decoder.decode(slots, codes).float()
                self._graphs[(b, n)] = _Graph(graph, slots, codes, audio)

    def _call(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        """Decode codes [B, C, n] for `slots` (B a bucket); returns PCM [B, n * hop]."""
        g = self._graphs.get((codes.shape[0], codes.shape[2]))
        if g is None:
            return self._eager(slots, codes)
        b, n = codes.shape[0], codes.shape[2]
        staged = self._codes_host[: b + codes.size]
        staged[:b] = torch.tensor(slots, dtype=torch.long)
        staged[b:] = torch.from_numpy(codes).view(-1)
        audio = self._audio_host[: g.audio.numel()].view(g.audio.shape)
        with self._on_stream():
            g.slots.copy_(staged[:b], non_blocking=True)
            g.codes.copy_(staged[b:].view(g.codes.shape), non_blocking=True)
            g.graph.replay()
            audio.copy_(g.audio, non_blocking=True)
        self.stream.synchronize()  # the staging buffers are reused by the next call
        return audio.numpy().copy()

    def _eager(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        with self._on_stream():
            return self.decoder.decode(
                torch.tensor(slots, device=self.device), torch.from_numpy(codes).to(self.device)
            ).float().cpu().numpy()

    @torch.inference_mode()
    def _decode(self, run: list[_Frame]) -> None:
        run = [f for f in run if f.owner.wanted(f.turn)]  # closed or cancelled: skip the work
        pending: OrderedDict[int, list[_Frame]] = OrderedDict()
        for f in run:
            pending.setdefault(f.slot, []).append(f)
        while pending:  # each round takes the next chunk of every stream, in order
            groups: dict[int, list[int]] = {}
            for slot, frames in pending.items():
                groups.setdefault(next(c for c in CHUNKS if c <= len(frames)), []).append(slot)
            for n, slots in groups.items():
                chunks = {s: pending[s][:n] for s in slots}
                for s in slots:
                    del pending[s][:n]
                self._decode_group(n, slots, chunks)
            pending = OrderedDict((s, f) for s, f in pending.items() if f)

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
                continue
            self.calls += 1
            self.frames_decoded += n * len(part)
            for row, s in enumerate(part):
                frames = chunks[s]
                # frames of one chunk share a turn except right at a turn switch
                for turn, audio in _split_by_turn(frames, pcm[row]):
                    frames[0].owner.audio(turn, audio)


def _split_by_turn(frames: list[_Frame], pcm: np.ndarray):
    hop = pcm.shape[0] // len(frames)
    start = 0
    for i in range(1, len(frames) + 1):
        if i == len(frames) or frames[i].turn != frames[start].turn:
            yield frames[start].turn, pcm[start * hop : i * hop]
            start = i
