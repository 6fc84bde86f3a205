"""The one GPU boundary: the model, the KV state, per-slot device state, static step
buffers, pinned host staging, the prefill and decode CUDA streams.

Per-slot state lives on the device, indexed by KV slot (rows = max_running + 1; the last
is the scratch row that padded batch entries point at):
    tokens [rows, 1 + C]   each stream's next input frame (the last one it sampled)
    positions [rows]       where that frame goes in the KV
    frame_index [rows]     the sampling noise counter
    windows [rows, W, C]   previous-frames window (int32)
    sampling params [rows]
A decode step gathers its rows by `batch_slots`, runs one frame for all of them, and
scatters the results back, so consecutive steps chain on the device: step t + 1 can be
launched before the host has looked at step t. The host reads each step's frames from a
pinned buffer behind a CUDA event, one step late. Only a change of batch membership moves
data from the host (the slot list, through a pinned staging buffer).

On a GPU, one CUDA graph per batch-size bucket captures the whole step (gather, slow
step, every fast codebook step, sampling, window update, scatter), so a step is one
graph replay; graphs attend through the Triton decode-attention kernel, which reads each
row only up to its own length. On a CPU everything runs eagerly and synchronously
through the same code (`cuda_graphs=False` / `attention_kernel=False` / `fused_qkv=False`
select the eager and reference paths on a GPU too).
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.bundle import ModelBundle
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kv_cache import FastCache, KVCache
from engine.layers import FeedForward
from engine.sampling import SamplingParams, SamplingTensors

log = logging.getLogger("engine")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Segments prefilled together at most: one prefill launches ~1,000 kernels whatever its
# batch, so when many streams flush at once they share those launches.
MAX_PREFILL_BATCH = 16


def fuse_feed_forwards_(model) -> None:
    """One gate/up GEMM per block for serving (FeedForward.fuse_gate_up_); FP8 blocks
    already stack theirs."""
    for block in [*model.layers, *model.fast_layers]:
        if isinstance(block.feed_forward, FeedForward):
            block.feed_forward.fuse_gate_up_()


def batch_buckets(max_running: int) -> list[int]:
    """Decode batch sizes (CUDA-graph buckets) up to and including max_running."""
    return [b for b in BUCKETS if b < max_running] + [max_running]


@dataclass(slots=True)
class StepHandle:
    parity: int
    batch: int
    event: object | None  # torch.cuda.Event, None on the CPU


@dataclass(slots=True)
class PrefixKV:
    """A voice prefix's KV, kept to copy into a new stream's slot."""

    k: Tensor  # [n_layer, L, K, Dh]
    v: Tensor
    length: int

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class Runner:
    def __init__(
        self,
        bundle: ModelBundle,
        max_running: int,
        max_len: int,
        cuda_graphs: bool | None = None,
        attention_kernel: bool | None = None,
        fused_qkv: bool | None = None,
    ) -> None:
        self.bundle = bundle
        self.model = bundle.model
        c = self.config = bundle.config
        self.device, self.dtype = bundle.device, bundle.dtype
        fuse_feed_forwards_(self.model)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            # cuDNN's SDPA backend builds an execution plan per new (query, key) length,
            # measured at 0.7-1.5 s per segment prefill on an H200 (every segment has new
            # lengths); flash / memory-efficient / math attention need no plan.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.attention_kernel = self.cuda if attention_kernel is None else attention_kernel
        self.cuda_graphs = self.cuda if cuda_graphs is None else cuda_graphs
        self.fused_qkv = self._fused_qkv_ok() if fused_qkv is None else fused_qkv
        if self.cuda_graphs and not self.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.max_running = max_running
        self.max_len = min(max_len, c.max_seq_len)
        self.buckets = batch_buckets(max_running)
        rows = max_running + 1
        dev = self.device
        self.kv = KVCache.allocate(c, max_running, self.max_len, dev, self.dtype)
        self.scratch_row = self.kv.scratch_row
        self.decode_fast = FastCache.allocate(c, self.buckets[-1], dev, self.dtype)
        self.prefill_fast = FastCache.allocate(c, MAX_PREFILL_BATCH, dev, self.dtype)
        self.tokens = torch.zeros(rows, 1 + c.num_codebooks, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        self.frame_index = torch.zeros(rows, dtype=torch.long, device=dev)
        self.windows = new_window(rows, c.sampling_window, c.num_codebooks, dev)
        self.params = SamplingTensors.allocate(rows, dev)
        # step I/O
        self.batch_slots = torch.full((self.buckets[-1],), self.scratch_row, dtype=torch.long, device=dev)
        self.out = torch.zeros(self.buckets[-1], 1 + c.num_codebooks, dtype=torch.long, device=dev)
        pin = self.cuda
        # double-buffered like the outputs: the buffer of step t is rewritten at step t + 2,
        # after the host has seen step t finish, so an in-flight copy never reads a half-written list
        self.slots_host = torch.full((2, self.buckets[-1]), self.scratch_row, dtype=torch.long, pin_memory=pin)
        self.out_host = torch.zeros(2, self.buckets[-1], 1 + c.num_codebooks, dtype=torch.long, pin_memory=pin)
        self._parity = 0
        self._last_slots: list[int] | None = None
        if self.cuda:
            self.decode_stream = torch.cuda.Stream(dev)
            self.prefill_stream = torch.cuda.Stream(dev)
        self._prefill_lock = threading.Lock()  # one prefill at a time (prefill thread + tools)
        # the first frame of a segment (prefill thread): static inputs for its graph
        self.first_slot = torch.zeros(1, dtype=torch.long, device=dev)
        self.first_head = torch.zeros(1, c.num_semantic + 1, dtype=self.dtype, device=dev)
        self.first_fast_in = torch.zeros(1, c.fast_dim, dtype=self.dtype, device=dev)
        self.first_out = torch.zeros(1, 1 + c.num_codebooks, dtype=torch.long, device=dev)
        self.first_frame_graph = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if self.cuda_graphs:
            self._capture_graphs()
            self._capture_first_frame_graph()

    def _fused_qkv_ok(self) -> bool:
        """On a GPU, frame steps norm, rotate and cache q/k/v in one Triton launch per
        layer, slow and fast (kernels/qk_rope_kv.py), once that kernel has compiled and
        matched its reference here at both transformers' shapes; elsewhere, or if it did
        not, PyTorch."""
        if not (self.cuda and self.attention_kernel):
            return False
        from kernels.qk_rope_kv import self_check

        c = self.config
        why = self_check(self.device, self.dtype, c.n_head, c.n_local_heads, c.head_dim, c.attention_qk_norm, c.norm_eps)
        why = why or self_check(self.device, self.dtype, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim,
                                c.fast_attention_qk_norm, c.norm_eps)
        if why is not None:
            log.warning("fused q/k/v decode kernel off (PyTorch path instead): %s", why)
        return why is None

    # --- prefill (prefill thread) ----------------------------------------------------------

    def _on_prefill_stream(self):
        return torch.cuda.stream(self.prefill_stream) if self.cuda else nullcontext()

    @torch.inference_mode()
    def prefill_prefix(self, slot: int, tokens: Tensor) -> PrefixKV:
        """Prefill a voice prefix ([1 + C, L]) into `slot` from position 0; returns a copy
        of its KV for the voice cache."""
        length = tokens.shape[1]
        self._check_room(0, length)
        with self._prefill_lock, self._on_prefill_stream():
            self.model.prefill(tokens.to(self.device, non_blocking=True), slot, 0, self.kv)
            prefix = PrefixKV(self.kv.k[:, slot, :length].clone(), self.kv.v[:, slot, :length].clone(), length)
            self._sync_prefill()
        return prefix

    @torch.inference_mode()
    def load_prefix(self, slot: int, prefix: PrefixKV) -> None:
        """Copy a cached voice prefix into `slot` (a device copy instead of a prefill)."""
        with self._prefill_lock, self._on_prefill_stream():
            self.kv.k[:, slot, : prefix.length].copy_(prefix.k, non_blocking=True)
            self.kv.v[:, slot, : prefix.length].copy_(prefix.v, non_blocking=True)
            self._sync_prefill()

    @torch.inference_mode()
    def prefill_segment(self, slot: int, start: int, tokens: Tensor, params: SamplingParams) -> np.ndarray:
        """Prefill a segment's tokens ([1 + C, T]) at `start` and sample its first frame.
        Sets the slot's device state so that the decode batch can pick it up. Returns
        the first frame [1 + C] on the host."""
        self._check_room(start, tokens.shape[1])
        sl = slice(slot, slot + 1)
        with self._prefill_lock, self._on_prefill_stream():
            head, fast_in = self.model.prefill(tokens.to(self.device, non_blocking=True), slot, start, self.kv)
            self.params.set_row(slot, params)
            self.windows[sl] = -1
            self.frame_index[sl] = 0
            if self.first_frame_graph is not None:  # the fast transformer + sampling: one replay
                self.first_head.copy_(head)
                self.first_fast_in.copy_(fast_in)
                self.first_slot.fill_(slot)
                self.first_frame_graph.replay()
            else:
                self._first_frame(self.first_slot.fill_(slot), head, fast_in)
            self.positions[sl] = start + tokens.shape[1]
            self.frame_index[sl] = 1
            host = self.first_out[0].to("cpu", copy=True)  # waits for this prefill only; a copy, also on a CPU
        return host.numpy()

    @torch.inference_mode()
    def prefill_segments(self, items: list[tuple[int, int, Tensor, SamplingParams]]) -> list[np.ndarray]:
        """Prefill several streams' segments together: items are (slot, start, tokens
        [1 + C, T], params). Same results as prefill_segment on each, one batch of work."""
        if len(items) == 1:
            return [self.prefill_segment(*items[0])]
        if len(items) > MAX_PREFILL_BATCH:
            raise ValueError(f"at most {MAX_PREFILL_BATCH} segments per batched prefill")
        for slot, start, tokens, _ in items:
            self._check_room(start, tokens.shape[1])
        c = self.config
        s = max(t.shape[1] for _, _, t, _ in items)
        batch = torch.zeros(len(items), 1 + c.num_codebooks, s, dtype=torch.long)
        for row, (_, _, tokens, _) in enumerate(items):
            batch[row, :, : tokens.shape[1]] = tokens
        slots = [slot for slot, _, _, _ in items]
        starts = [start for _, start, _, _ in items]
        lengths = [t.shape[1] for _, _, t, _ in items]
        kv_len = max(a + n for a, n in zip(starts, lengths))
        dev = self.device
        with self._prefill_lock, self._on_prefill_stream():
            idx = torch.tensor(slots, device=dev)
            start_t, length_t = torch.tensor(starts, device=dev), torch.tensor(lengths, device=dev)
            head, fast_in = self.model.prefill_batch(batch.to(dev), idx, start_t, length_t, kv_len, self.kv)
            for (slot, _, _, params) in items:
                self.params.set_row(slot, params)
            self.windows.index_fill_(0, idx, -1)
            self.frame_index.index_fill_(0, idx, 0)
            frames = sample_frame(
                self.model, self.prefill_fast, head, fast_in, self.params.gather(idx), self.windows[idx], self.frame_index[idx],
                self.fused_qkv,
            )
            self.tokens.index_copy_(0, idx, frames)
            self.positions.index_copy_(0, idx, start_t + length_t)
            self.frame_index.index_fill_(0, idx, 1)
            host = frames.to("cpu", copy=True)
        return list(host.numpy())

    def _first_frame(self, idx: Tensor, head: Tensor, fast_in: Tensor) -> None:
        """Sample the first frame of the stream in row idx ([1]) from the prefill's last
        position; its device state then feeds the decode batch."""
        frame = sample_frame(
            self.model, self.prefill_fast, head, fast_in, self.params.gather(idx), self.windows[idx], self.frame_index[idx],
            self.fused_qkv,
        )
        self.tokens.index_copy_(0, idx, frame)
        self.first_out.copy_(frame)

    def _capture_first_frame_graph(self) -> None:
        """The first frame's sampling (the fast transformer's ten steps and eleven draws,
        ~1,000 small kernels) as one graph on the prefill stream, in its own memory pool:
        it may run while a decode graph runs."""
        with torch.inference_mode(), torch.cuda.stream(self.prefill_stream):
            self.first_slot.fill_(self.scratch_row)
            for _ in range(2):
                self._first_frame(self.first_slot, self.first_head, self.first_fast_in)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.prefill_stream, capture_error_mode="thread_local"):
                self._first_frame(self.first_slot, self.first_head, self.first_fast_in)
        torch.cuda.synchronize(self.device)
        self.first_frame_graph = graph

    def _check_room(self, start: int, length: int) -> None:
        if start + length > self.max_len:
            raise ValueError(f"{start + length} positions exceed the KV length {self.max_len}")

    def _sync_prefill(self) -> None:
        if self.cuda:
            self.prefill_stream.synchronize()

    # --- decode (decode thread) ------------------------------------------------------------

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    @torch.inference_mode()
    def launch(self, slots: list[int], kv_len: int) -> StepHandle:
        """Launch one decode step for the streams in `slots` (no host sync)."""
        n = len(slots)
        bucket = self.bucket_for(n)
        with torch.cuda.stream(self.decode_stream) if self.cuda else nullcontext():
            if slots != self._last_slots:
                staging = self.slots_host[self._parity]
                staging[:n] = torch.tensor(slots, dtype=torch.long)
                staging[n:bucket] = self.scratch_row
                self.batch_slots[:bucket].copy_(staging[:bucket], non_blocking=True)
                self._last_slots = list(slots)
            if self.cuda_graphs:
                self.graphs[bucket].replay()
            else:
                self._step(bucket, min(kv_len, self.max_len))
            parity = self._parity
            self._parity ^= 1
            self.out_host[parity, :n].copy_(self.out[:n], non_blocking=True)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record(self.decode_stream)
        return StepHandle(parity, n, event)

    def read(self, handle: StepHandle) -> np.ndarray:
        """The frames of a launched step, [batch, 1 + C] (waits for that step only)."""
        if handle.event is not None:
            handle.event.synchronize()
        return self.out_host[handle.parity, : handle.batch].numpy().copy()

    def _step(self, bucket: int, kv_len: int) -> None:
        idx = self.batch_slots[:bucket]
        tokens = self.tokens[idx]
        windows = self.windows[idx]
        push_window(windows, tokens[:, 1:])  # the input frame joins the window before sampling
        positions = self.positions[idx]
        frame_index = self.frame_index[idx]
        out = decode_frame(
            self.model, self.kv, self.decode_fast, tokens, idx, positions, kv_len,
            self.params.gather(idx), windows, frame_index, self.attention_kernel, self.fused_qkv,
        )
        self.tokens.index_copy_(0, idx, out)
        self.windows.index_copy_(0, idx, windows)
        self.positions.index_copy_(0, idx, positions + 1)
        self.frame_index.index_copy_(0, idx, frame_index + 1)
        self.positions[self.scratch_row :].fill_(0)  # padded rows must not walk off the KV (a kernel, not a host copy)
        self.out[:bucket].copy_(out)

    def _capture_graphs(self) -> None:
        """One graph per bucket, largest first (the shared memory pool is sized by it).
        Capture runs before the worker threads start; every row points at the scratch
        row while warming up and capturing, so no stream's state is touched."""
        pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        with torch.inference_mode(), torch.cuda.stream(self.decode_stream):
            for bucket in reversed(self.buckets):
                self.batch_slots.fill_(self.scratch_row)
                for _ in range(2):  # warm-up: kernel compilation, allocator, cuBLAS handles
                    self._step(bucket, self.max_len)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.decode_stream, capture_error_mode="thread_local"):
                    self._step(bucket, self.max_len)
                self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)
        self._last_slots = None

    # --- accounting ------------------------------------------------------------------------

    def kv_bytes_per_stream(self) -> int:
        return KVCache.bytes_per_stream(self.config, self.max_len, self.dtype)
