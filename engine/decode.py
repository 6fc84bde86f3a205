"""The decode side of the GPU boundary: one batched frame step for every decoding
stream, launched before the host reads the step before it.

A step's batch is padded to a bucket (padded rows point at the scratch row). On a GPU,
one CUDA graph per bucket captures the whole step (gather, slow step, every fast
codebook step, sampling, window update, scatter), so a step is one replay. Only a change
of batch membership (the row list) or a stream's new KV page (a page-table entry) moves
data from the host, through pinned staging; the host reads each step's frames from a
pinned buffer behind a CUDA event, one step late.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.alignment import ALIGN_TOKENS
from engine.device_state import DeviceState
from engine.graphs import capture
from engine.kernel_plan import KernelPlan
from engine.kv_cache import FastCache

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def batch_buckets(max_running: int) -> list[int]:
    """Decode batch sizes (CUDA-graph buckets) up to and including max_running."""
    return [b for b in BUCKETS if b < max_running] + [max_running]


@dataclass(slots=True)
class StepHandle:
    parity: int
    batch: int
    event: object | None  # torch.cuda.Event, None on the CPU
    started: object | None = None  # timing event recorded before the step's kernels


class Decoder:
    def __init__(self, state: DeviceState, plan: KernelPlan, cuda_graphs: bool, max_batch: int) -> None:
        self.state = state
        st, c, dev = state, state.config, state.device
        self.buckets = batch_buckets(max_batch)
        self.plans = {b: plan.for_decode_batch(b) for b in self.buckets}  # PDL on batch 1's graph only
        self.fast = FastCache.allocate(c, self.buckets[-1], dev, st.dtype)
        most = self.buckets[-1]
        self.batch_slots = torch.full((most,), st.scratch_row, dtype=torch.long, device=dev)
        self.out = torch.zeros(most, 1 + c.num_codebooks, dtype=torch.long, device=dev)
        # double-buffered: step t's buffers are rewritten at step t + 2, after the host has
        # seen step t finish, so an in-flight copy never reads a half-written list
        pin = st.cuda
        self.slots_host = torch.full((2, most), st.scratch_row, dtype=torch.long, pin_memory=pin)
        self.out_host = torch.zeros(2, most, 1 + c.num_codebooks, dtype=torch.long, pin_memory=pin)
        # the word-timestamp readout (DeviceState.frame_step's align_out), copied with the frames
        self.align_out = self.align_host = None
        if st.align_heads is not None:
            self.align_out = torch.zeros(most, ALIGN_TOKENS, dtype=torch.float32, device=dev)
            self.align_host = torch.zeros(2, most, ALIGN_TOKENS, dtype=torch.float32, pin_memory=pin)
        self._parity = 0
        self._last_slots: list[int] | None = None
        # GPU seconds of the decode steps read so far, from each step's first kernel to its
        # last, waits behind the codec's and prefill's kernels included (engine stats)
        self.gpu_s = 0.0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if cuda_graphs:
            self._capture_graphs()

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    @torch.inference_mode()
    def launch(self, slots: list[int], kv_len: int, table_updates: list[tuple[int, int, int]] = ()) -> StepHandle:
        """Launch one decode step for the streams in `slots` (no host sync), after writing
        `table_updates` (row, page index, page) into the page table."""
        st, n = self.state, len(slots)
        bucket = self.bucket_for(n)
        with st.on_stream("decode_stream"):
            started = None
            if st.cuda:
                started = torch.cuda.Event(enable_timing=True)
                started.record(st.decode_stream)
            if table_updates:
                st.write_entries(list(table_updates))
            if slots != self._last_slots:
                staging = self.slots_host[self._parity]
                staging[:n] = torch.tensor(slots, dtype=torch.long)
                staging[n:bucket] = st.scratch_row
                self.batch_slots[:bucket].copy_(staging[:bucket], non_blocking=True)
                self._last_slots = list(slots)
            if self.graphs:
                self.graphs[bucket].replay()
            else:
                self._step(bucket, min(kv_len, st.max_len))
            parity = self._parity
            self._parity ^= 1
            self.out_host[parity, :n].copy_(self.out[:n], non_blocking=True)
            if self.align_out is not None:
                self.align_host[parity, :n].copy_(self.align_out[:n], non_blocking=True)
            event = None
            if st.cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record(st.decode_stream)
        return StepHandle(parity, n, event, started)

    def read(self, handle: StepHandle) -> np.ndarray:
        """The frames of a launched step, [batch, 1 + C] (waits for that step only)."""
        if handle.event is not None:
            handle.event.synchronize()
            self.gpu_s += handle.started.elapsed_time(handle.event) / 1000
        return self.out_host[handle.parity, : handle.batch].numpy().copy()

    def read_alignment(self, handle: StepHandle) -> np.ndarray | None:
        """The readout of a step read with read(): [batch, T] (None without one)."""
        if self.align_host is None:
            return None
        return self.align_host[handle.parity, : handle.batch].numpy().copy()

    def _step(self, bucket: int, kv_len: int) -> None:
        align = None if self.align_out is None else self.align_out[:bucket]
        self.out[:bucket].copy_(self.state.frame_step(self.batch_slots[:bucket], self.fast, kv_len, self.plans[bucket],
                                                      align))

    def _capture_graphs(self) -> None:
        """One graph per bucket, largest first (the shared memory pool is sized by it),
        before the worker threads start; every row points at the scratch row meanwhile."""
        st = self.state
        pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(st.device)
        with torch.inference_mode(), torch.cuda.stream(st.decode_stream):
            for bucket in reversed(self.buckets):
                self.batch_slots.fill_(st.scratch_row)
                self.graphs[bucket], _ = capture(lambda: self._step(bucket, st.max_len), st.decode_stream, pool)
        torch.cuda.synchronize(st.device)
        self._last_slots = None
