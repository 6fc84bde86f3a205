"""The device state that decode and prefill share and neither owns: the paged KV cache and
its page table, the per-row stream state and the two CUDA streams.

Per-row state lives on the device, indexed by page-table row (rows = streams + 1; the last
is the scratch row that padded batch entries point at):
    tokens [rows, 1 + C]   each stream's next input frame (the last one it sampled)
    positions [rows]       where that frame goes in the KV
    frame_index [rows]     the sampling noise counter
    windows [rows, W, C]   previous-frames window (int32)
    params [rows]          sampling settings
    text_spans [rows, 2]   the current segment's text in the KV: (first position, tokens),
                           set at its prefill; what the word-timestamp readout reads
A frame step gathers its rows, runs one frame for all of them and scatters the results
back, so consecutive steps chain on the device without the host.

Page-table rows are written by the thread that owns the stream at that moment, on its
own CUDA stream: the prefill thread a whole row before a prefill (and the copies of the
shared pages it writes into), the decode thread single entries as contexts grow
(engine/scheduler.py decides which). Streams of one voice point at the same pages for its
prompt, so a decode step reads those bytes once from L2 instead of once per stream from
HBM.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from engine.alignment import AlignHeads, AlignProbe
from engine.attention import gather_rows
from engine.bundle import ModelBundle
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kernel_plan import KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.layers import FeedForward
from engine.sampling import SamplingTensors

def fuse_feed_forwards_(model) -> None:
    """One gate/up GEMM per block for serving (FP8 blocks already stack theirs)."""
    for block in [*model.layers, *model.fast_layers]:
        if isinstance(block.feed_forward, FeedForward):
            block.feed_forward.fuse_gate_up_()


class DeviceState:
    def __init__(self, bundle: ModelBundle, streams: int, max_len: int, pages: int, page_size: int,
                 kv_quant: str = "none", align_heads: AlignHeads | None = None) -> None:
        self.bundle, self.model = bundle, bundle.model
        c = self.config = bundle.config
        self.device, self.dtype = bundle.device, bundle.dtype
        self.cuda = self.device.type == "cuda"
        fuse_feed_forwards_(self.model)
        self.streams = streams
        self.max_len = min(max_len, c.max_seq_len)
        rows = streams + 1
        dev = self.device
        self.kv = KVCache.paged(c, streams, self.max_len, pages, page_size, dev, self.dtype, quant=kv_quant)
        self.scratch_row = self.kv.scratch_row
        self.tokens = torch.zeros(rows, 1 + c.num_codebooks, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        self.frame_index = torch.zeros(rows, dtype=torch.long, device=dev)
        self.windows = new_window(rows, c.sampling_window, c.num_codebooks, dev)
        self.params = SamplingTensors.allocate(rows, dev)
        self.text_spans = torch.zeros(rows, 2, dtype=torch.long, device=dev)
        # the readout's heads by layer (None: no readout): {id(layer's attention): heads [S]}
        self.align_heads = align_heads
        self.align_by_module = None if align_heads is None else {
            id(self.model.layers[layer].attention): torch.tensor(sorted(h for l, h in align_heads.heads if l == layer),
                                                                 dtype=torch.long, device=dev)
            for layer in sorted({layer for layer, _ in align_heads.heads})}
        if self.cuda:
            # cuDNN's SDPA builds an execution plan per new (query, key) length: 0.7-1.5 s
            # per segment prefill on an H200; the other SDPA backends need none
            torch.backends.cuda.enable_cudnn_sdp(False)
            self.decode_stream = torch.cuda.Stream(dev)
            # high priority: someone waits for a prefill's first audio
            self.prefill_stream = torch.cuda.Stream(dev, priority=-1)

    def check_room(self, start: int, length: int) -> None:
        if start + length > self.max_len:
            raise ValueError(f"{start + length} positions exceed the KV length {self.max_len}")

    def on_stream(self, stream_name: str):
        return torch.cuda.stream(getattr(self, stream_name)) if self.cuda else nullcontext()

    def staged(self, host):
        """Host inputs of a non-blocking copy: pinned on a GPU (the caching host allocator
        keeps each buffer until its copy is done)."""
        return host.pin_memory() if self.cuda else host

    # --- page tables (on the calling thread's CUDA stream) --------------------------------

    def write_row(self, slot: int, pages: list[int]) -> None:
        """Row `slot`'s first len(pages) entries (the rest is never read)."""
        staged = self.staged(torch.tensor(pages, dtype=torch.int32))
        self.kv.page_table[slot, : len(pages)].copy_(staged, non_blocking=True)

    def write_entries(self, updates: list[tuple[int, int, int]]) -> None:
        """(row, page index, page) entries."""
        staged = self.staged(torch.tensor(updates, dtype=torch.int32))
        entries = staged.to(self.device, non_blocking=True)
        self.kv.page_table[entries[:, 0].long(), entries[:, 1].long()] = entries[:, 2]

    def write_text_spans(self, spans: list[tuple[int, int, int]]) -> None:
        """(row, first text position, text tokens) of just-prefilled segments."""
        staged = self.staged(torch.tensor(spans, dtype=torch.long)).to(self.device, non_blocking=True)
        self.text_spans.index_copy_(0, staged[:, 0], staged[:, 1:])

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Each (source, destination) page's keys and values, every layer."""
        index = self.staged(torch.tensor(pairs, dtype=torch.long)).to(self.device, non_blocking=True)
        for cache in (self.kv.k, self.kv.v):
            cache.index_copy_(1, index[:, 1], cache.index_select(1, index[:, 0]))

    def row_kv(self, slot: int, length: int) -> tuple[Tensor, Tensor]:
        """Row `slot`'s first `length` positions, gathered through its page table: k, v
        [n_layer, length, K, Dh] (tests, tools)."""
        rows = torch.tensor([slot], device=self.device)
        return tuple(torch.stack([gather_rows(layer, self.kv.page_table, rows, length)[0] for layer in cache])
                     for cache in (self.kv.k, self.kv.v))

    # --- frames ----------------------------------------------------------------------------

    def first_frames(self, idx: Tensor, ends: Tensor, head: Tensor, fast_in: Tensor, fast: FastCache,
                     plan: KernelPlan) -> Tensor:
        """Sample the first frame of the segments in rows idx ([B]) from the prefill's last
        positions and set their decode state (window emptied, noise counter, next input,
        position `ends`); returns the frames [B, 1 + C]. The rows' params must be set."""
        self.windows.index_fill_(0, idx, -1)
        self.frame_index.index_fill_(0, idx, 0)
        frames = sample_frame(self.model, fast, head, fast_in, self.params.gather(idx), self.windows[idx],
                              self.frame_index[idx], plan)
        self.tokens.index_copy_(0, idx, frames)
        self.positions.index_copy_(0, idx, ends)
        self.frame_index.index_fill_(0, idx, 1)
        return frames

    def frame_step(self, idx: Tensor, fast: FastCache, kv_len: int, plan: KernelPlan,
                   align_out: Tensor | None = None) -> Tensor:
        """One frame for the rows idx ([B]): each row's input frame at its position, the
        frame sampled, its state moved on. The decode step's body, and the prefill's
        second frame (with its own fast cache). `align_out` [B, T] (fp32): the word-timestamp
        readout's output, each row's attention of the chosen heads over its text span
        (engine/alignment.py), when the state has heads."""
        probe = None
        if align_out is not None and self.align_by_module is not None:
            probe = AlignProbe(self.align_by_module, idx, self.text_spans, self.kv.page_table, align_out,
                               kernel=plan.text_attention, pdl=plan.pdl)
        tokens = self.tokens[idx]
        windows = self.windows[idx]
        push_window(windows, tokens[:, 1:])  # the input frame joins the window before sampling
        positions = self.positions[idx]
        frame_index = self.frame_index[idx]
        out = decode_frame(self.model, self.kv, fast, tokens, idx, positions, kv_len, self.params.gather(idx), windows,
                           frame_index, plan, probe)
        self.tokens.index_copy_(0, idx, out)
        self.windows.index_copy_(0, idx, windows)
        self.positions.index_copy_(0, idx, positions + 1)
        self.frame_index.index_copy_(0, idx, frame_index + 1)
        self.positions[self.scratch_row :].fill_(0)  # padded rows must not walk off the KV (a kernel, not a host copy)
        return out
