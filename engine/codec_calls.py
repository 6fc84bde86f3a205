"""The codec's batched decode calls, at a fixed set of shapes (batch bucket x chunk size)
built by `warm_up()` before serving: cuDNN plans each new conv shape on first sight, and on
a GPU each shape is a CUDA graph, one replay instead of ~1,000 eager launches that hold the
GIL the prefill and decode threads need. Padding rows decode into a scratch slot.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.codec.streaming import StreamingDecoder
from engine.graphs import capture


def batch_buckets(max_streams: int) -> list[int]:
    """The batch sizes calls are padded to, smallest first: powers of two, then max_streams."""
    if max_streams < 1:
        raise ValueError(f"a codec worker needs at least one stream, got {max_streams}")
    return [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b < max_streams] + [max_streams]


@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    slots: torch.Tensor  # static inputs: long [B]
    codes: torch.Tensor  # long [B, C, n]
    audio: torch.Tensor  # static output: float32 [B, n * hop]


class CodecCalls:
    def __init__(self, codec: torch.nn.Module, max_streams: int, chunks: tuple[int, ...],
                 cuda_graphs: bool | None = None, kernels: bool | None = None, max_batch: int | None = None) -> None:
        self.decoder = StreamingDecoder(codec, max_streams + 1, kernels)
        self.scratch = max_streams  # the slot padding rows point at
        self.buckets = batch_buckets(min(max_batch or max_streams, max_streams))
        self.chunks = chunks
        self.num_codebooks = codec.num_codebooks
        self.device = self.decoder.device
        # its own CUDA stream (the legacy default stream would serialize with decode and
        # prefill), high priority: audio someone waits for, in short calls (latency_bench/
        # RESULTS.md, "Where the c=64 gaps come from": bulk calls behind the step lost)
        self.stream = torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        self.cuda_graphs = self.stream is not None if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.stream is None:
            raise ValueError("CUDA graphs need a CUDA device")
        self.graphs: dict[tuple[int, int], _Graph] = {}  # (batch bucket, frames) -> graph
        self.gpu_s = 0.0  # GPU seconds of the graph replays, by timing events
        if self.stream is not None:  # pinned staging (the host side of every call's copies), timing events
            most = self.buckets[-1] * chunks[0]
            self._codes_host = torch.zeros(most * self.num_codebooks + self.buckets[-1], dtype=torch.long, pin_memory=True)
            self._audio_host = torch.zeros(most * self.decoder.hop_length, dtype=torch.float32, pin_memory=True)
            self._began, self._ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._copied = torch.cuda.Event()  # the PCM is on the host: waited on, not the whole stream

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def bucket(self, rows: int) -> int:
        return next(b for b in self.buckets if b >= rows)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One eager call of every shape, then (on a GPU) one graph of each; only the scratch
        slot's state is touched. cudnn.benchmark is on only meanwhile: it picks the dilated
        convs' kernels (latency_bench/RESULTS.md, "The codec worker"), and left on it would
        time every later new shape (the encoder's, on each new voice) too."""
        benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = self.device.type == "cuda" or benchmark
        try:
            for n in self.chunks:
                for b in self.buckets:
                    self._eager([self.scratch] * b, np.zeros((b, self.num_codebooks, n), dtype=np.int64))
            if self.cuda_graphs:
                self._capture()
            self.decoder.reset(self.scratch)
            if self.stream is not None:
                self.stream.synchronize()
        finally:
            torch.backends.cudnn.benchmark = benchmark

    def _capture(self) -> None:
        # largest first: the shared pool is sized by the first capture; the graphs run one
        # at a time on this stream, so they may share it
        pool = torch.cuda.graph_pool_handle()
        for b, n in sorted(((b, n) for b in self.buckets for n in self.chunks), key=lambda s: -s[0] * s[1]):
            slots = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
            codes = torch.zeros(b, self.num_codebooks, n, dtype=torch.long, device=self.device)
            # one warm-up: warm_up() already ran every shape eagerly
            graph, audio = capture(lambda: self.decoder.decode(slots, codes).float(), self.stream, pool, warmups=1)
            self.graphs[(b, n)] = _Graph(graph, slots, codes, audio)

    @torch.inference_mode()
    def decode(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        """Codes [B, C, n] for `slots` (B a bucket) -> PCM [B, n * hop]."""
        g = self.graphs.get((codes.shape[0], codes.shape[2]))
        if g is None:
            return self._eager(slots, codes)
        b = codes.shape[0]
        staged = self._codes_host[: b + codes.size]
        staged[:b] = torch.tensor(slots, dtype=torch.long)
        staged[b:] = torch.from_numpy(codes).view(-1)
        audio = self._audio_host[: g.audio.numel()].view(g.audio.shape)
        with self.on_stream():
            g.slots.copy_(staged[:b], non_blocking=True)
            g.codes.copy_(staged[b:].view(g.codes.shape), non_blocking=True)
            self._began.record(self.stream)
            g.graph.replay()
            self._ended.record(self.stream)
            audio.copy_(g.audio, non_blocking=True)
            self._copied.record(self.stream)
        self._copied.synchronize()  # the staging buffers are reused by the next call
        self.gpu_s += self._began.elapsed_time(self._ended) / 1000
        return audio.numpy().copy()

    def _eager(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        with self.on_stream():
            slots_t, codes_t = torch.tensor(slots, device=self.device), torch.from_numpy(codes).to(self.device)
            return self.decoder.decode(slots_t, codes_t).float().cpu().numpy()

    def reset(self, slot: int) -> None:
        with self.on_stream():
            self.decoder.reset(slot)

    @torch.inference_mode()
    def drain(self, slot: int) -> np.ndarray | None:
        """The audio the decoder holds back for `slot` (StreamingDecoder.drain), cleared
        there; None when it holds none."""
        with self.on_stream():
            audio = self.decoder.drain(slot)
            return None if audio is None else audio.cpu().numpy()
