"""The prefill side of the GPU boundary: voice prompts, text segments (several streams in
one batch) and each segment's first two frames, on the high-priority prefill stream.

On a GPU a prefill runs in fixed chunk shapes (1-16 streams x 16-256 positions, at most
PREFILL_CHUNK_TOKENS a chunk, which bounds the graphs' memory), each chunk, each batch's
first frame and its second frame one CUDA graph: a few replays instead of ~1,000 eager
launches. A longer prefill is several chunks, each attending to the ones before through
the KV cache. Elsewhere (a CPU, or graphs off) the same model code runs eagerly.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.device_state import DeviceState
from engine.graphs import capture
from engine.kernel_plan import KernelPlan
from engine.kv_cache import FastCache
from engine.linear import LOGITS_DTYPE
from engine.sampling import SamplingParams, SamplingTensors

# segments prefilled together at most: streams that flush at once share one prefill's launches
MAX_PREFILL_BATCH = 16
PREFILL_BATCHES = (1, 2, 4, 8, 16)
PREFILL_LENGTHS = (16, 32, 64, 128, 256)
PREFILL_CHUNK_TOKENS = 2048

Item = tuple[int, int, Tensor, SamplingParams]  # row, start position, tokens [1 + C, T], sampling


@dataclass(slots=True)
class RowPages:
    """A stream's page-table row for a prefill, and the shared pages to copy first
    (engine/scheduler.py PrefillWork)."""

    slot: int
    pages: list[int]
    copies: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclass(slots=True)
class _ChunkGraph:
    """The slow transformer over one chunk of B rows x T positions; it leaves each row's
    head logits and fast input in its batch's _FirstFrameGraph inputs."""

    graph: object  # torch.cuda.CUDAGraph
    tokens: Tensor  # static inputs: long [B, 1 + C, T]
    slots: Tensor  # long [B]
    starts: Tensor  # long [B]
    lengths: Tensor  # long [B] (0 for padding rows: they write to the scratch row only)


@dataclass(slots=True)
class _FirstFrameGraph:
    """The first frame of B segments: reset their window and noise counter, sample, set
    their decode state."""

    graph: object
    slots: Tensor  # static inputs: long [B]
    ends: Tensor  # long [B]: each segment's end position (its first decode position)
    head: Tensor  # [B, num_semantic + 1] (written by the chunk graph)
    fast_in: Tensor  # [B, fast_dim]
    params: SamplingTensors  # [B]
    out: Tensor  # static output: long [B, 1 + C]


@dataclass(slots=True)
class _SecondFrameGraph:
    """One frame step of B just-prefilled segments, in the prefill's own buffers."""

    graph: object
    slots: Tensor  # static input: long [B] (the scratch row for padding rows)
    out: Tensor  # static output: long [B, 1 + C]


class Prefiller:
    def __init__(self, state: DeviceState, plan: KernelPlan, cuda_graphs: bool, chunked: bool, max_batch: int) -> None:
        self.state = state
        self.plan = plan.without_pdl()
        # the eager prefill attends through PyTorch's SDPA (host-known lengths)
        self.eager_plan = dataclasses.replace(self.plan, attention=False)
        self.fast = FastCache.allocate(state.config, MAX_PREFILL_BATCH, state.device, state.dtype)
        self.lock = threading.Lock()  # one prefill at a time (prefill thread + tools)
        # graph-captured chunks attend through the Triton kernels (no host-dependent shapes)
        self.chunked = chunked
        if chunked and not plan.attention:
            raise ValueError("chunked prefill attends through the Triton kernels (plan.attention)")
        wanted = min(max_batch, MAX_PREFILL_BATCH)
        self.batches = [b for b in PREFILL_BATCHES if b < wanted] + [next(b for b in PREFILL_BATCHES if b >= wanted)]
        self.chunk_graphs: dict[tuple[int, int], _ChunkGraph] = {}
        self.first_graphs: dict[int, _FirstFrameGraph] = {}
        self.second_graphs: dict[int, _SecondFrameGraph] = {}
        if chunked:
            self._allocate_chunks()
        if cuda_graphs:
            self._capture_graphs()

    # --- voice prompts ---------------------------------------------------------------

    @torch.inference_mode()
    def prefix(self, row: RowPages, tokens: Tensor) -> None:
        """Prefill a voice prompt ([1 + C, L]) into the row's pages from position 0."""
        st, length = self.state, tokens.shape[1]
        st.check_room(0, length)
        with self.lock, st.on_stream("prefill_stream"):
            self._write_rows([row])
            if self.chunked:
                self._chunks([(row.slot, 0, tokens)])
            else:
                st.model.prefill(tokens.to(st.device, non_blocking=True), row.slot, 0, st.kv, self.eager_plan)
            self._sync()

    @torch.inference_mode()
    def encode_audio(self, codec, wav: np.ndarray) -> Tensor:
        """A reference's audio [T] -> codes [C, frames] on the host, on the prefill stream."""
        st = self.state
        dtype = next(codec.parameters()).dtype
        with self.lock, st.on_stream("prefill_stream"):
            return codec.encode(torch.from_numpy(wav).to(st.device, dtype)[None])[0].cpu()

    # --- segments --------------------------------------------------------------------

    @torch.inference_mode()
    def segments(self, items: list[Item], rows: list[RowPages],
                 text_spans: list[tuple[int, int, int]] = ()) -> list[np.ndarray]:
        """Prefill several streams' segments together, each as it would be alone, and sample
        each one's first frame; returns them [1 + C] on the host (waiting for this prefill
        only) and leaves each row's decode state set. `rows`: the page-table rows (and
        page copies) the segments are written through, set first; `text_spans`: (row, first
        text position, text tokens) of each segment, for the word-timestamp readout."""
        if not 1 <= len(items) <= MAX_PREFILL_BATCH:
            raise ValueError(f"1 to {MAX_PREFILL_BATCH} segments per batched prefill, got {len(items)}")
        st = self.state
        for slot, start, tokens, _ in items:
            st.check_room(start, tokens.shape[1])
        with self.lock, st.on_stream("prefill_stream"):
            self._write_rows(rows)
            if text_spans:
                st.write_text_spans(list(text_spans))
        return self._chunked_segments(items) if self.chunked else self._eager_segments(items)

    def _write_rows(self, rows: list[RowPages]) -> None:
        """The rows' page-table entries and page copies, on the prefill stream (lock held)."""
        st = self.state
        entries = [(r.slot, i, page) for r in rows for i, page in enumerate(r.pages)]
        if entries:
            st.write_entries(entries)
        copies = [pair for r in rows for pair in r.copies]
        if copies:
            st.copy_pages(copies)

    def _eager_segments(self, items: list[Item]) -> list[np.ndarray]:
        st, dev, plan = self.state, self.state.device, self.eager_plan
        slots = [slot for slot, _, _, _ in items]
        ends = [start + t.shape[1] for _, start, t, _ in items]
        with self.lock, st.on_stream("prefill_stream"):
            if len(items) == 1:
                slot, start, tokens, _ = items[0]
                head, fast_in = st.model.prefill(tokens.to(dev, non_blocking=True), slot, start, st.kv, plan)
            else:
                s = max(t.shape[1] for _, _, t, _ in items)
                batch = torch.zeros(len(items), 1 + st.config.num_codebooks, s, dtype=torch.long)
                for row, (_, _, tokens, _) in enumerate(items):
                    batch[row, :, : tokens.shape[1]] = tokens
                starts = torch.tensor([start for _, start, _, _ in items], device=dev)
                lengths = torch.tensor([t.shape[1] for _, _, t, _ in items], device=dev)
                head, fast_in = st.model.prefill_batch(batch.to(dev), torch.tensor(slots, device=dev), starts, lengths,
                                                       max(ends), st.kv, plan)
            for slot, _, _, params in items:
                st.params.set_row(slot, params)
            frames = st.first_frames(torch.tensor(slots, device=dev), torch.tensor(ends, device=dev), head, fast_in,
                                     self.fast, self.plan)
            host = frames.to("cpu", copy=True)  # waits for this prefill only; a copy, also on a CPU
        return list(host.numpy())

    def _chunked_segments(self, items: list[Item]) -> list[np.ndarray]:
        n = len(items)
        longest = max(t.shape[1] for _, _, t, _ in items)
        batch = self._batch_for(n)
        if n > 1 and (longest > PREFILL_LENGTHS[-1] or batch * _length_for(longest) > PREFILL_CHUNK_TOKENS):
            half = n // 2  # too long to share one chunk: halves (a long segment ends up alone)
            return self._chunked_segments(items[:half]) + self._chunked_segments(items[half:])
        st, f, pad = self.state, self.first_graphs[batch], batch - n
        index = torch.tensor([s for s, _, _, _ in items] + [st.scratch_row] * pad +
                             [a + t.shape[1] for _, a, t, _ in items] + [0] * pad, dtype=torch.long)
        params = SamplingTensors.from_params([p for *_, p in items] + [SamplingParams()] * pad, "cpu")
        index, params = st.staged(index), st.staged(params)
        with self.lock, st.on_stream("prefill_stream"):
            self._chunks([(s, a, t) for s, a, t, _ in items])  # leaves the heads in f's inputs
            f.slots.copy_(index[:batch], non_blocking=True)
            f.ends.copy_(index[batch:], non_blocking=True)
            f.params.copy_(params, non_blocking=True)
            if f.graph is not None:
                f.graph.replay()
            else:
                self._first_body(f)
            host = f.out[:n].to("cpu", copy=True)
        return list(host.numpy())

    def _chunks(self, rows: list[tuple[int, int, Tensor]]) -> None:
        """Slow-transformer prefill of (slot, start, tokens [1 + C, L]) rows through the
        chunk shapes; each row's last head logits and fast input land in the first-frame
        inputs of the batch's bucket. Rows longer than one chunk go alone. The caller holds
        the lock, on the prefill stream."""
        st, batch = self.state, self._batch_for(len(rows))
        lengths = [t.shape[1] for _, _, t in rows]
        step = PREFILL_LENGTHS[-1]
        if len(rows) > 1 and max(lengths) > step:
            raise ValueError("rows longer than one chunk are prefilled alone")
        pad = batch - len(rows)
        for offset in range(0, max(lengths), step):
            take = [max(0, min(n - offset, step)) for n in lengths]
            g = self.chunk_graphs[(batch, _length_for(max(take)))]
            tokens = torch.zeros(g.tokens.shape, dtype=torch.long)
            for row, (_, _, t) in enumerate(rows):
                tokens[row, :, : take[row]] = t[:, offset : offset + take[row]]
            meta = torch.tensor([[s for s, _, _ in rows] + [st.scratch_row] * pad,
                                 [a + offset for _, a, _ in rows] + [0] * pad, take + [0] * pad], dtype=torch.long)
            tokens, meta = st.staged(tokens), st.staged(meta)
            g.tokens.copy_(tokens, non_blocking=True)
            g.slots.copy_(meta[0], non_blocking=True)
            g.starts.copy_(meta[1], non_blocking=True)
            g.lengths.copy_(meta[2], non_blocking=True)
            if g.graph is not None:
                g.graph.replay()
            else:
                self._chunk_body(g, self.first_graphs[batch])

    @torch.inference_mode()
    def second_frames(self, slots: list[int], ends: list[int]) -> list[np.ndarray]:
        """One frame step of just-prefilled segments (slots, each one's end position) from
        the state their first frame left: the frame the decode batch would give them 2-3
        steps later, when under load a turn's first 46 ms of audio ran out before it came
        ("A turn's second frame" in latency_bench/RESULTS.md). Returns each one's second
        frame [1 + C] on the host. A row whose segment ends at the KV's end runs in the
        scratch row; the caller drops its frame and keeps the decode thread off these slots."""
        n, st = len(slots), self.state
        if not 1 <= n <= MAX_PREFILL_BATCH or len(ends) != n:
            raise ValueError(f"1 to {MAX_PREFILL_BATCH} slots with one end each, got {n} and {len(ends)}")
        rows = [slot if end < st.max_len else st.scratch_row for slot, end in zip(slots, ends)]
        with self.lock, st.on_stream("prefill_stream"):
            if not self.second_graphs:
                out = st.frame_step(torch.tensor(rows, device=st.device), self.fast, min(max(ends) + 1, st.max_len),
                                    self.plan)
                return list(out.to("cpu", copy=True).numpy())
            g = self.second_graphs[self._batch_for(n)]
            staged = st.staged(torch.tensor(rows + [st.scratch_row] * (g.slots.shape[0] - n), dtype=torch.long))
            g.slots.copy_(staged, non_blocking=True)
            g.graph.replay()
            host = g.out[:n].to("cpu", copy=True)
        return list(host.numpy())

    # --- graphs --------------------------------------------------------------------------

    def _batch_for(self, n: int) -> int:
        return next(b for b in self.batches if b >= n)

    def _chunk_body(self, g: _ChunkGraph, f: _FirstFrameGraph) -> None:
        st = self.state
        head, fast_in = st.model.prefill_batch(g.tokens, g.slots, g.starts, g.lengths, st.max_len, st.kv, self.plan)
        f.head.copy_(head)
        f.fast_in.copy_(fast_in)

    def _first_body(self, f: _FirstFrameGraph) -> None:
        self.state.params.scatter_(f.slots, f.params)
        f.out.copy_(self.state.first_frames(f.slots, f.ends, f.head, f.fast_in, self.fast, self.plan))

    def _allocate_chunks(self) -> None:
        """Static inputs and outputs of every chunk shape and first-frame batch."""
        st, c, dev = self.state, self.state.config, self.state.device
        for b in self.batches:
            self.first_graphs[b] = _FirstFrameGraph(
                None, slots=torch.full((b,), st.scratch_row, dtype=torch.long, device=dev),
                ends=torch.zeros(b, dtype=torch.long, device=dev),
                head=torch.zeros(b, c.num_semantic + 1, dtype=LOGITS_DTYPE, device=dev),
                fast_in=torch.zeros(b, c.fast_dim, dtype=st.dtype, device=dev),
                params=SamplingTensors.allocate(b, dev),
                out=torch.zeros(b, 1 + c.num_codebooks, dtype=torch.long, device=dev),
            )
            for t in PREFILL_LENGTHS:
                if b * t <= PREFILL_CHUNK_TOKENS:
                    self.chunk_graphs[(b, t)] = _ChunkGraph(
                        None, tokens=torch.zeros(b, 1 + c.num_codebooks, t, dtype=torch.long, device=dev),
                        slots=torch.full((b,), st.scratch_row, dtype=torch.long, device=dev),
                        starts=torch.zeros(b, dtype=torch.long, device=dev),
                        lengths=torch.zeros(b, dtype=torch.long, device=dev),
                    )

    def _capture_graphs(self) -> None:
        """The chunk graphs (largest first: they share one memory pool, sized by the first
        capture), the first- and second-frame graphs, on the prefill stream in a pool of
        their own (a prefill may run while a decode graph runs). Warm-up and capture touch
        only the scratch row."""
        st = self.state
        pool, stream, dev = torch.cuda.graph_pool_handle(), st.prefill_stream, st.device
        with torch.inference_mode():
            for (b, _), g in sorted(self.chunk_graphs.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
                g.graph, _ = capture(lambda: self._chunk_body(g, self.first_graphs[b]), stream, pool)
            for b in reversed(self.batches):
                if b in self.first_graphs:
                    f = self.first_graphs[b]
                    f.graph, _ = capture(lambda: self._first_body(f), stream, pool)
                s = _SecondFrameGraph(None, torch.full((b,), st.scratch_row, dtype=torch.long, device=dev),
                                      torch.zeros(b, 1 + st.config.num_codebooks, dtype=torch.long, device=dev))
                s.graph, _ = capture(lambda: s.out.copy_(st.frame_step(s.slots, self.fast, st.max_len, self.plan)),
                                     stream, pool)
                self.second_graphs[b] = s
        torch.cuda.synchronize(dev)

    def _sync(self) -> None:
        if self.state.cuda:
            self.state.prefill_stream.synchronize()


def _length_for(n: int) -> int:
    return next(t for t in PREFILL_LENGTHS if t >= n)
