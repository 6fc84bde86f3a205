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

Shared voice prefixes (`shared_prefix`): every stream of a voice holds the same prompt
KV at its first positions (one prefilled prefix, copied into each slot). The runner
remembers which prefix each slot holds, and a decode step points the streams of one
voice at one of them in the same batch for those positions (kernels/decode_attention.py),
so the step's attention reads each voice prompt's bytes from L2 instead of one copy per
stream from HBM; the output is the same bit for bit. The row read from is always a
stream of the same step: its prefix cannot be overwritten (only the prefill thread
writes prefixes, into free slots) while the step is in flight. With `prefix_cascade`
(which stages the same prefix rows) each voice's prompt is attended once for all the
streams of the step that share it (kernels/cascade_attention.py): fewer reads and
fuller tensor-core dots, the same attention up to rounding (not the same bits).

On a GPU, one CUDA graph per batch-size bucket captures the whole step (gather, slow
step, every fast codebook step, sampling, window update, scatter), so a step is one
graph replay; graphs attend through the Triton decode-attention kernel, which reads each
row only up to its own length. On a CPU everything runs eagerly and synchronously
through the same code (`cuda_graphs=False` / `attention_kernel=False` / `fused_qkv=False`
select the eager and reference paths on a GPU too).
"""

from __future__ import annotations

import itertools
import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from engine.bundle import ModelBundle
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.graphs import capture
from engine.kv_cache import FastCache, KVCache
from engine.layers import FeedForward
from engine.sampling import MAX_TOP_K, SamplingParams, SamplingTensors
from engine.small_batch import GEMV_MAX_ROWS, LOGITS_DTYPE, gemv_shapes, head_shapes, use_gemv_

log = logging.getLogger("engine")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Segments prefilled together at most: when many streams flush at once they share one
# prefill's launches (eager: ~1,000; on a GPU: two graph replays).
MAX_PREFILL_BATCH = 16
# Decode graphs of these batch buckets are captured with programmatic dependent launch
# (kernels/pdl.py) where the GPU has it. Measured on an H200 (engine step, graphs, with
# against without, same run): FP8 weights 1.09x at batch 1 but 0.96x at 16, 0.99x at 64;
# bf16 1.02x at 1 and 1.00x at 16 and 64 (latency_bench/reference/h200-s2pro/pdl/).
PDL_BATCHES = (1,)
# Graph-captured prefill (GPU): batches of 1..16 streams, chunks of up to 256 positions
# per stream, at most PREFILL_CHUNK_TOKENS positions per chunk over the batch (bounds
# the graphs' memory); a longer prefill is several chunks, each attending to the ones
# before through the KV cache.
PREFILL_BATCHES = (1, 2, 4, 8, 16)
PREFILL_LENGTHS = (16, 32, 64, 128, 256)
PREFILL_CHUNK_TOKENS = 2048
_PREFIX_IDS = itertools.count(1)
PREFILL_ATTENTION = ("per-query", "blocked")


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
    started: object | None = None  # timing event recorded before the step's kernels


@dataclass(slots=True)
class _ChunkGraph:
    """The slow transformer over one prefill chunk of B rows x T positions; it leaves
    each row's head logits and fast input in its batch's _FirstFrameGraph inputs."""

    graph: object  # torch.cuda.CUDAGraph
    tokens: Tensor  # static inputs: long [B, 1 + C, T]
    slots: Tensor  # long [B]
    starts: Tensor  # long [B]
    lengths: Tensor  # long [B] (0 for padding rows: they write to the scratch row only)


@dataclass(slots=True)
class _FirstFrameGraph:
    """The first frame of B segments: reset their window and noise counter, sample (the
    fast transformer's ten steps and eleven draws), set their decode state."""

    graph: object
    slots: Tensor  # static inputs: long [B]
    ends: Tensor  # long [B]: each segment's end position (its first decode position)
    head: Tensor  # [B, num_semantic + 1] (written by the chunk graph)
    fast_in: Tensor  # [B, fast_dim]
    params: SamplingTensors  # [B]
    out: Tensor  # static output: long [B, 1 + C]


@dataclass(slots=True)
class _SecondFrameGraph:
    """One frame step of B just-prefilled segments on the prefill stream (their second
    frame), in the prefill's own buffers: the decode graphs' belong to the decode thread."""

    graph: object
    slots: Tensor  # static input: long [B] (the scratch row for padding rows)
    out: Tensor  # static output: long [B, 1 + C]


@dataclass(slots=True)
class PrefixKV:
    """A voice prefix's KV, kept to copy into a new stream's slot."""

    k: Tensor  # [n_layer, L, K, Dh]
    v: Tensor
    length: int
    # which prefill made these values: slots loaded from one PrefixKV hold the same bits
    ident: int = field(default_factory=lambda: next(_PREFIX_IDS))

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
        chunked_prefill: bool | None = None,
        step_kernels: bool | None = None,
        kv_quant: str = "none",
        gemv: bool | None = None,
        pdl: bool | None = None,
        pdl_all_batches: bool = False,
        shared_prefix: bool = False,
        prefill_attention: str = "blocked",
        prefix_cascade: bool = False,
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
        self.kv_quant = kv_quant
        self.pdl = self._use_pdl(pdl)
        from kernels.pdl import launching

        with launching(self.pdl):  # each kernel has compiled and matched its reference as the graphs launch it
            self.fused_qkv = self._fused_qkv_ok() if fused_qkv is None else fused_qkv
            self.model.step_kernels = self._step_kernels_ok() if step_kernels is None else step_kernels
            self.gemv = self._use_gemv(gemv)
        if self.cuda_graphs and not self.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.max_running = max_running
        self.max_len = min(max_len, c.max_seq_len)
        self.buckets = batch_buckets(max_running)
        # PDL_BATCHES' graphs with PDL, or every bucket's (pdl_all_batches: an A/B arm)
        self.pdl_buckets = [b for b in self.buckets if self.pdl and self.cuda_graphs
                            and (pdl_all_batches or b in PDL_BATCHES)]
        rows = max_running + 1
        dev = self.device
        # kv_quant "fp8": the slow KV as e4m3 codes + scales (kernels/kv_fp8.py)
        self.kv = KVCache.allocate(c, max_running, self.max_len, dev, self.dtype, quant=kv_quant)
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
        # shared voice prefixes (module docstring): per slot, (PrefixKV.ident, length) of
        # the prefix its first positions hold, or None; staged with the slot list, and
        # again after any slot's prefix changed (a slot that left and came back with
        # another voice keeps its number; the version saves the decode loop comparing
        # every stream's prefix each step)
        self.shared_prefix = (shared_prefix or prefix_cascade) and self.attention_kernel
        self.prefix_cascade = prefix_cascade and self.shared_prefix  # the cascade reads the same staged rows
        self.slot_prefix: list[tuple[int, int] | None] = [None] * rows
        self._prefix_version = 0
        self._staged_version = -1
        self.batch_prefix = torch.zeros(2, self.buckets[-1], dtype=torch.long, device=dev)  # rows, lengths
        self.batch_prefix[0].fill_(self.scratch_row)
        self.prefix_host = torch.zeros(2, 2, self.buckets[-1], dtype=torch.long, pin_memory=pin)
        # GPU seconds of the decode steps read so far: from each step's first kernel to
        # its last on the decode stream, waits behind the codec's and prefill's kernels
        # included (timing events; engine stats and latency_bench's load shares)
        self.decode_gpu_s = 0.0
        if self.cuda:
            self.decode_stream = torch.cuda.Stream(dev)
            # high priority: a prefill is short and someone is waiting for its first audio,
            # so its kernels go ahead of the decode step's when both are ready to run
            self.prefill_stream = torch.cuda.Stream(dev, priority=-1)
        self._prefill_lock = threading.Lock()  # one prefill at a time (prefill thread + tools)
        # chunked prefill: fixed (batch, length) chunk shapes, attention through the Triton
        # kernel, each chunk and each batch's first frame one CUDA graph on a GPU with
        # graphs (the same code runs eagerly without them, e.g. on a CPU under the
        # Triton interpreter, for tests)
        self.chunked_prefill = self.cuda_graphs and self.attention_kernel if chunked_prefill is None else chunked_prefill
        if self.chunked_prefill and not self.attention_kernel:
            raise ValueError("chunked prefill attends through the Triton kernel (attention_kernel=True)")
        # the chunked prefill's attention: "blocked" (kernels/prefill_attention.py) or
        # "per-query" (each new position a decode query, kernels/decode_attention.py)
        if prefill_attention not in PREFILL_ATTENTION:
            raise ValueError(f"prefill_attention must be one of {PREFILL_ATTENTION}, got {prefill_attention!r}")
        self.prefill_blocked = prefill_attention == "blocked"
        wanted = min(max_running, MAX_PREFILL_BATCH)
        self.prefill_batches = [b for b in PREFILL_BATCHES if b < wanted] + [next(b for b in PREFILL_BATCHES if b >= wanted)]
        self.chunk_graphs: dict[tuple[int, int], _ChunkGraph] = {}
        self.first_graphs: dict[int, _FirstFrameGraph] = {}
        self.second_graphs: dict[int, _SecondFrameGraph] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if self.cuda_graphs:
            self._capture_graphs()
        if self.chunked_prefill:
            self._allocate_prefill_chunks()
        if self.cuda_graphs:
            self._capture_prefill_graphs()

    def _fused_qkv_ok(self) -> bool:
        """On a GPU, frame steps norm, rotate and cache q/k/v in one Triton launch per
        layer, slow and fast (kernels/qk_rope_kv.py), once that kernel has compiled and
        matched its reference here at both transformers' shapes; elsewhere, or if it did
        not, PyTorch."""
        if not (self.cuda and self.attention_kernel):
            return False
        from kernels.qk_rope_kv import self_check

        c = self.config
        why = self_check(self.device, self.dtype, c.n_head, c.n_local_heads, c.head_dim, c.attention_qk_norm, c.norm_eps,
                         kv_fp8=self.kv_quant == "fp8")
        why = why or self_check(self.device, self.dtype, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim,
                                c.fast_attention_qk_norm, c.norm_eps)
        if why is not None:
            log.warning("fused q/k/v decode kernel off (PyTorch path instead): %s", why)
        return why is None

    def _use_pdl(self, wanted: bool | None) -> bool:
        """Whether the decode graphs of PDL_BATCHES are captured with programmatic dependent
        launch (kernels/pdl.py), and say which. None: on a GPU that supports it, once a
        chain of kernels launched with it has matched the same chain without it; True
        insists (raises where unsupported)."""
        from kernels import pdl

        on = self.cuda if wanted is None else wanted
        why = (pdl.supported(self.device) or pdl.self_check(self.device)) if on else None
        if why is not None:
            if wanted:
                raise RuntimeError(f"PDL asked for but not available: {why}")
            log.warning("PDL off (kernels launch one after another): %s", why)
            on = False
        return on

    def _use_gemv(self, wanted: bool | None) -> bool:
        """Route single-stream decode steps' linear layers and sampling heads through the
        GEMV kernel (engine/small_batch.py) or not, and say which. None: on a GPU, once
        the kernel has compiled and matched its reference here at the routed shapes (FP8
        models stay on their GEMMs: engine/small_batch.py says why); elsewhere, or if it
        did not, the GEMMs."""
        from engine.quant import is_quantized

        on = (self.cuda and not is_quantized(self.model)) if wanted is None else wanted
        use_gemv_(self.model, GEMV_MAX_ROWS if on else 0)
        if on and wanted is None:
            from kernels.gemv import self_check

            why = self_check(self.device, self.dtype, gemv_shapes(self.model), max_rows=GEMV_MAX_ROWS,
                             logits_shapes=head_shapes(self.model))
            if why is not None:
                log.warning("small-batch GEMV off (GEMMs instead): %s", why)
                use_gemv_(self.model, 0)
                return False
        return on

    def _step_kernels_ok(self) -> bool:
        """On a GPU, every block's residual add + norm, MLP activation and (fast
        transformer) attention run as Triton kernels (TransformerBlock.forward_kernels),
        and each draw is one (kernels/sample.py),
        once each has compiled and matched its reference here at the model's shapes;
        elsewhere, or if one did not, PyTorch."""
        if not self.cuda:
            return False
        from kernels import add_rms_norm, fast_attention, sample, swiglu

        c, dev, dt = self.config, self.device, self.dtype
        why = (add_rms_norm.self_check(dev, dt, c.dim, c.norm_eps)
               or add_rms_norm.self_check(dev, dt, c.fast_dim, c.norm_eps)
               or swiglu.self_check(dev, dt, c.intermediate_size)
               or swiglu.self_check(dev, dt, c.fast_intermediate_size)
               or fast_attention.self_check(dev, dt, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim,
                                            c.num_codebooks)
               or sample.self_check(dev, c.fast_vocab, c.num_semantic + 1, MAX_TOP_K))
        if why is not None:
            log.warning("decode-step Triton kernels off (PyTorch path instead): %s", why)
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
            self._hold_prefix(slot, None)
            if self.chunked_prefill:
                self._prefill_chunks([(slot, 0, tokens)])
            else:
                self.model.prefill(tokens.to(self.device, non_blocking=True), slot, 0, self.kv)
            prefix = PrefixKV(self.kv.k[:, slot, :length].clone(), self.kv.v[:, slot, :length].clone(), length)
            self._sync_prefill()
            self._hold_prefix(slot, (prefix.ident, length))
        return prefix

    @torch.inference_mode()
    def load_prefix(self, slot: int, prefix: PrefixKV) -> None:
        """Copy a cached voice prefix into `slot` (a device copy instead of a prefill)."""
        with self._prefill_lock, self._on_prefill_stream():
            self._hold_prefix(slot, None)
            self.kv.k[:, slot, : prefix.length].copy_(prefix.k, non_blocking=True)
            self.kv.v[:, slot, : prefix.length].copy_(prefix.v, non_blocking=True)
            self._sync_prefill()
            self._hold_prefix(slot, (prefix.ident, prefix.length))

    def _hold_prefix(self, slot: int, held: tuple[int, int] | None) -> None:
        """Record the prefix `slot`'s first positions hold (None: none to share)."""
        self.slot_prefix[slot] = held
        self._prefix_version += 1

    def prefill_segment(self, slot: int, start: int, tokens: Tensor, params: SamplingParams) -> np.ndarray:
        """Prefill a segment's tokens ([1 + C, T]) at `start` and sample its first frame.
        Sets the slot's device state so that the decode batch can pick it up. Returns
        the first frame [1 + C] on the host."""
        return self.prefill_segments([(slot, start, tokens, params)])[0]

    @torch.inference_mode()
    def prefill_segments(self, items: list[tuple[int, int, Tensor, SamplingParams]]) -> list[np.ndarray]:
        """Prefill several streams' segments together: items are (slot, start, tokens
        [1 + C, T], params). Each gets what it would get alone; returns each one's first
        frame [1 + C] on the host (waiting for this prefill only)."""
        if not 1 <= len(items) <= MAX_PREFILL_BATCH:
            raise ValueError(f"1 to {MAX_PREFILL_BATCH} segments per batched prefill, got {len(items)}")
        for slot, start, tokens, _ in items:
            self._check_room(start, tokens.shape[1])
            held = self.slot_prefix[slot]
            if held is not None and start < held[1]:  # overwrites the voice prompt: no longer shared
                self._hold_prefix(slot, None)
        if self.chunked_prefill:
            return self._chunked_segments(items)
        return self._eager_segments(items)

    # eager prefill (CPU, or graphs off)

    def _eager_segments(self, items) -> list[np.ndarray]:
        c, dev = self.config, self.device
        slots = [slot for slot, _, _, _ in items]
        ends = [start + t.shape[1] for _, start, t, _ in items]
        with self._prefill_lock, self._on_prefill_stream():
            if len(items) == 1:
                slot, start, tokens, _ = items[0]
                head, fast_in = self.model.prefill(tokens.to(dev, non_blocking=True), slot, start, self.kv)
            else:
                s = max(t.shape[1] for _, _, t, _ in items)
                batch = torch.zeros(len(items), 1 + c.num_codebooks, s, dtype=torch.long)
                for row, (_, _, tokens, _) in enumerate(items):
                    batch[row, :, : tokens.shape[1]] = tokens
                starts = torch.tensor([start for _, start, _, _ in items], device=dev)
                lengths = torch.tensor([t.shape[1] for _, _, t, _ in items], device=dev)
                head, fast_in = self.model.prefill_batch(
                    batch.to(dev), torch.tensor(slots, device=dev), starts, lengths, max(ends), self.kv
                )
            for slot, _, _, params in items:
                self.params.set_row(slot, params)
            frames = self._first_frames(torch.tensor(slots, device=dev), torch.tensor(ends, device=dev), head, fast_in)
            host = frames.to("cpu", copy=True)  # waits for this prefill only; a copy, also on a CPU
        return list(host.numpy())

    @torch.inference_mode()
    def second_frames(self, slots: list[int], ends: list[int]) -> list[np.ndarray]:
        """One frame step of just-prefilled segments (slots, each segment's end position),
        on the prefill stream, from the state their first frame left: the frame the
        decode thread's first step would give them, without waiting to join its batch.
        Returns each one's second frame [1 + C] on the host (waiting for this step only).

        Why: a segment joining the decode batch gets its next frame 2-3 steps after its
        prefill (the step being launched when it lands, the one queued behind it: the
        loop launches step t + 1 before reading step t). Measured on an H200 at 64
        connections (13.7 ms steps) a turn's first frame, 46 ms of audio, ran out before
        the second came in 53 of 192 turns. Here the second comes one small step after
        the first.

        A row whose segment ends at the KV's end (`end >= max_len`: room for its first
        frame only) runs in the scratch row; its frame is garbage, and the caller drops
        it (the segment's budget was one frame). The caller keeps the decode thread off
        these slots until this returns."""
        n = len(slots)
        if not 1 <= n <= MAX_PREFILL_BATCH or len(ends) != n:
            raise ValueError(f"1 to {MAX_PREFILL_BATCH} slots with one end each, got {n} and {len(ends)}")
        rows = [slot if end < self.max_len else self.scratch_row for slot, end in zip(slots, ends)]
        with self._prefill_lock, self._on_prefill_stream():
            if not self.cuda_graphs:
                out = self._frame_step(torch.tensor(rows, device=self.device), self.prefill_fast,
                                       min(max(ends) + 1, self.max_len))
                return list(out.to("cpu", copy=True).numpy())
            g = self.second_graphs[self._prefill_batch_for(n)]
            staged = self._staged(torch.tensor(rows + [self.scratch_row] * (g.slots.shape[0] - n), dtype=torch.long))
            g.slots.copy_(staged, non_blocking=True)
            g.graph.replay()
            host = g.out[:n].to("cpu", copy=True)
        return list(host.numpy())

    def _first_frames(self, idx: Tensor, ends: Tensor, head: Tensor, fast_in: Tensor) -> Tensor:
        """Sample the first frame of the segments in rows idx ([B]) from the prefill's last
        positions and set their decode state (window emptied, noise counter, next input,
        position `ends`); returns the frames [B, 1 + C]. Rows' sampling settings must be
        in place."""
        self.windows.index_fill_(0, idx, -1)
        self.frame_index.index_fill_(0, idx, 0)
        frames = sample_frame(
            self.model, self.prefill_fast, head, fast_in, self.params.gather(idx), self.windows[idx], self.frame_index[idx],
            self.fused_qkv,
        )
        self.tokens.index_copy_(0, idx, frames)
        self.positions.index_copy_(0, idx, ends)
        self.frame_index.index_fill_(0, idx, 1)
        return frames

    # chunked prefill (graph-captured on a GPU: a prefill is two replays)

    def _chunked_segments(self, items) -> list[np.ndarray]:
        n = len(items)
        longest = max(t.shape[1] for _, _, t, _ in items)
        batch = self._prefill_batch_for(n)
        if n > 1 and (longest > PREFILL_LENGTHS[-1] or batch * self._prefill_length_for(longest) > PREFILL_CHUNK_TOKENS):
            half = n // 2  # too long to share one chunk: halves (a long segment ends up alone)
            return self._chunked_segments(items[:half]) + self._chunked_segments(items[half:])
        f = self.first_graphs[batch]
        pad = batch - n
        index = torch.tensor([s for s, _, _, _ in items] + [self.scratch_row] * pad +
                             [a + t.shape[1] for _, a, t, _ in items] + [0] * pad, dtype=torch.long)
        params = SamplingTensors.from_params([p for *_, p in items] + [SamplingParams()] * pad, "cpu")
        index, params = self._staged(index), self._staged(params)
        with self._prefill_lock, self._on_prefill_stream():
            self._prefill_chunks([(s, a, t) for s, a, t, _ in items])  # leaves the heads in f's inputs
            f.slots.copy_(index[:batch], non_blocking=True)
            f.ends.copy_(index[batch:], non_blocking=True)
            f.params.copy_(params, non_blocking=True)
            if f.graph is not None:
                f.graph.replay()
            else:
                self._first_body(f)
            host = f.out[:n].to("cpu", copy=True)
        return list(host.numpy())

    def _prefill_chunks(self, rows: list[tuple[int, int, Tensor]]) -> None:
        """Slow-transformer prefill of (slot, start, tokens [1 + C, L]) rows through the
        chunk graphs; each row's last head logits and fast input land in the first-frame
        graph of the batch's bucket. Several rows share one chunk (L <= 256 each); one row
        may take several (caller holds the prefill lock, on the prefill stream)."""
        batch = self._prefill_batch_for(len(rows))
        lengths = [t.shape[1] for _, _, t in rows]
        step = PREFILL_LENGTHS[-1]
        if len(rows) > 1 and max(lengths) > step:
            raise ValueError("rows longer than one chunk are prefilled alone")
        for offset in range(0, max(lengths), step):
            take = [max(0, min(n - offset, step)) for n in lengths]
            g = self.chunk_graphs[(batch, self._prefill_length_for(max(take)))]
            tokens = torch.zeros(g.tokens.shape, dtype=torch.long)
            for row, (_, _, t) in enumerate(rows):
                tokens[row, :, : take[row]] = t[:, offset : offset + take[row]]
            meta = torch.tensor(
                [[s for s, _, _ in rows] + [self.scratch_row] * (batch - len(rows)),
                 [a + offset for _, a, _ in rows] + [0] * (batch - len(rows)),
                 take + [0] * (batch - len(rows))], dtype=torch.long)
            tokens, meta = self._staged(tokens), self._staged(meta)
            g.tokens.copy_(tokens, non_blocking=True)
            g.slots.copy_(meta[0], non_blocking=True)
            g.starts.copy_(meta[1], non_blocking=True)
            g.lengths.copy_(meta[2], non_blocking=True)
            if g.graph is not None:
                g.graph.replay()
            else:
                self._chunk_body(g, self.first_graphs[batch])

    def _staged(self, host):
        """Host inputs of a non-blocking copy: pinned on a GPU (the caching host
        allocator keeps each buffer until its copy is done), as they are on a CPU."""
        return host.pin_memory() if self.cuda else host

    def _prefill_batch_for(self, n: int) -> int:
        return next(b for b in self.prefill_batches if b >= n)

    @staticmethod
    def _prefill_length_for(n: int) -> int:
        return next(t for t in PREFILL_LENGTHS if t >= n)

    def _chunk_body(self, g: _ChunkGraph, f: _FirstFrameGraph) -> None:
        head, fast_in = self.model.prefill_batch(g.tokens, g.slots, g.starts, g.lengths, self.max_len, self.kv, kernel=True,
                                                 blocked=self.prefill_blocked)
        f.head.copy_(head)
        f.fast_in.copy_(fast_in)

    def _first_body(self, f: _FirstFrameGraph) -> None:
        self.params.scatter_(f.slots, f.params)
        f.out.copy_(self._first_frames(f.slots, f.ends, f.head, f.fast_in))

    def _allocate_prefill_chunks(self) -> None:
        """Static inputs and outputs of every chunk shape and first-frame batch."""
        c, dev = self.config, self.device
        for b in self.prefill_batches:
            self.first_graphs[b] = _FirstFrameGraph(
                None,
                slots=torch.full((b,), self.scratch_row, dtype=torch.long, device=dev),
                ends=torch.zeros(b, dtype=torch.long, device=dev),
                head=torch.zeros(b, c.num_semantic + 1, dtype=LOGITS_DTYPE, device=dev),
                fast_in=torch.zeros(b, c.fast_dim, dtype=self.dtype, device=dev),
                params=SamplingTensors.allocate(b, dev),
                out=torch.zeros(b, 1 + c.num_codebooks, dtype=torch.long, device=dev),
            )
        for b in self.prefill_batches:
            for t in PREFILL_LENGTHS:
                if b * t <= PREFILL_CHUNK_TOKENS:
                    self.chunk_graphs[(b, t)] = _ChunkGraph(
                        None,
                        tokens=torch.zeros(b, 1 + c.num_codebooks, t, dtype=torch.long, device=dev),
                        slots=torch.full((b,), self.scratch_row, dtype=torch.long, device=dev),
                        starts=torch.zeros(b, dtype=torch.long, device=dev),
                        lengths=torch.zeros(b, dtype=torch.long, device=dev),
                    )

    def _capture_prefill_graphs(self) -> None:
        """The chunk graphs (largest first: they share one memory pool, sized by the first
        capture), the first-frame graphs and the second-frame steps, all on the prefill
        stream in a pool of their own (a prefill may run while a decode graph runs).
        Warm-up and capture touch only the scratch row."""
        pool, stream = torch.cuda.graph_pool_handle(), self.prefill_stream
        c, dev = self.config, self.device
        with torch.inference_mode():
            for (b, _), g in sorted(self.chunk_graphs.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
                g.graph, _ = capture(lambda: self._chunk_body(g, self.first_graphs[b]), stream, pool)
            for b in reversed(self.prefill_batches):
                if b in self.first_graphs:
                    f = self.first_graphs[b]
                    f.graph, _ = capture(lambda: self._first_body(f), stream, pool)
                s = _SecondFrameGraph(None, torch.full((b,), self.scratch_row, dtype=torch.long, device=dev),
                                      torch.zeros(b, 1 + c.num_codebooks, dtype=torch.long, device=dev))
                s.graph, _ = capture(lambda: s.out.copy_(self._frame_step(s.slots, self.prefill_fast, self.max_len)),
                                     stream, pool)
                self.second_graphs[b] = s
        torch.cuda.synchronize(self.device)

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
            started = None
            if self.cuda:
                started = torch.cuda.Event(enable_timing=True)
                started.record(self.decode_stream)
            version = self._prefix_version  # read first: a change after it stages again next step
            if slots != self._last_slots or (self.shared_prefix and version != self._staged_version):
                staging = self.slots_host[self._parity]
                staging[:n] = torch.tensor(slots, dtype=torch.long)
                staging[n:bucket] = self.scratch_row
                self.batch_slots[:bucket].copy_(staging[:bucket], non_blocking=True)
                if self.shared_prefix:
                    self._stage_prefixes(slots, bucket)
                    self._staged_version = version
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
                event = torch.cuda.Event(enable_timing=True)
                event.record(self.decode_stream)
        return StepHandle(parity, n, event, started)

    def _stage_prefixes(self, slots: list[int], bucket: int) -> None:
        """Each stream's prefix row: the first stream of this batch holding the same
        prefix (itself for the first, and for a stream with none, length 0)."""
        first: dict[int, int] = {}
        rows, lengths = [], []
        for slot in slots:
            held = self.slot_prefix[slot]
            rows.append(slot if held is None else first.setdefault(held[0], slot))
            lengths.append(0 if held is None else held[1])
        staging = self.prefix_host[self._parity]
        n = len(slots)
        staging[0, :n] = torch.tensor(rows, dtype=torch.long)
        staging[1, :n] = torch.tensor(lengths, dtype=torch.long)
        staging[0, n:bucket] = self.scratch_row
        staging[1, n:bucket] = 0
        self.batch_prefix[:, :bucket].copy_(staging[:, :bucket], non_blocking=True)

    def read(self, handle: StepHandle) -> np.ndarray:
        """The frames of a launched step, [batch, 1 + C] (waits for that step only)."""
        if handle.event is not None:
            handle.event.synchronize()
            self.decode_gpu_s += handle.started.elapsed_time(handle.event) / 1000
        return self.out_host[handle.parity, : handle.batch].numpy().copy()

    def _step(self, bucket: int, kv_len: int) -> None:
        prefix = (self.batch_prefix[0, :bucket], self.batch_prefix[1, :bucket]) if self.shared_prefix else None
        self.out[:bucket].copy_(self._frame_step(self.batch_slots[:bucket], self.decode_fast, kv_len, prefix))

    def _frame_step(self, idx: Tensor, fast: FastCache, kv_len: int, prefix: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """One frame for the rows idx ([B]): each row's input frame at its position, the
        frame sampled, its state moved on (tokens, window, position, noise counter); the
        decode step's body, and the prefill's second frame (with its own fast cache).
        `prefix`: the decode step's shared voice prefixes (module docstring)."""
        tokens = self.tokens[idx]
        windows = self.windows[idx]
        push_window(windows, tokens[:, 1:])  # the input frame joins the window before sampling
        positions = self.positions[idx]
        frame_index = self.frame_index[idx]
        out = decode_frame(
            self.model, self.kv, fast, tokens, idx, positions, kv_len,
            self.params.gather(idx), windows, frame_index, self.attention_kernel, self.fused_qkv, prefix,
            self.prefix_cascade,
        )
        self.tokens.index_copy_(0, idx, out)
        self.windows.index_copy_(0, idx, windows)
        self.positions.index_copy_(0, idx, positions + 1)
        self.frame_index.index_copy_(0, idx, frame_index + 1)
        self.positions[self.scratch_row :].fill_(0)  # padded rows must not walk off the KV (a kernel, not a host copy)
        return out

    def _capture_graphs(self) -> None:
        """One graph per bucket, largest first (the shared memory pool is sized by it).
        Capture runs before the worker threads start; every row points at the scratch
        row while warming up and capturing, so no stream's state is touched."""
        from kernels.pdl import launching

        pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        with torch.inference_mode(), torch.cuda.stream(self.decode_stream):
            for bucket in reversed(self.buckets):
                self.batch_slots.fill_(self.scratch_row)
                self.batch_prefix[0].fill_(self.scratch_row)
                self.batch_prefix[1].zero_()
                # eager launches (prefill, tools) and the prefill graphs go without
                with launching(bucket in self.pdl_buckets):
                    self.graphs[bucket], _ = capture(lambda: self._step(bucket, self.max_len), self.decode_stream, pool)
        torch.cuda.synchronize(self.device)
        self._last_slots = None

    # --- accounting ------------------------------------------------------------------------

    def kv_bytes_per_stream(self) -> int:
        return KVCache.bytes_per_stream(self.config, self.max_len, self.dtype, self.kv.quant)
