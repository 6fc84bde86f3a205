"""The device state that decode and prefill share and neither owns: the KV cache, the
per-slot stream state, the shared voice prefixes and the two CUDA streams.

Per-slot state lives on the device, indexed by KV slot (rows = max_running + 1; the last
is the scratch row that padded batch entries point at):
    tokens [rows, 1 + C]   each stream's next input frame (the last one it sampled)
    positions [rows]       where that frame goes in the KV
    frame_index [rows]     the sampling noise counter
    windows [rows, W, C]   previous-frames window (int32)
    params [rows]          sampling settings
A frame step gathers its rows by slot, runs one frame for all of them and scatters the
results back, so consecutive steps chain on the device without the host.

Shared voice prefixes: every stream of a voice holds the same prompt KV at its first
positions (one prefilled prefix, copied into each slot). `slot_prefix` remembers which
prefix each slot holds, so that a decode step can point the streams of one voice at one
of them for those positions: the step reads each voice prompt's bytes once from L2
instead of once per stream from HBM, bit for bit the same output.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.bundle import ModelBundle
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kernel_plan import KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.layers import FeedForward
from engine.sampling import SamplingTensors

_PREFIX_IDS = itertools.count(1)


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


def fuse_feed_forwards_(model) -> None:
    """One gate/up GEMM per block for serving (FP8 blocks already stack theirs)."""
    for block in [*model.layers, *model.fast_layers]:
        if isinstance(block.feed_forward, FeedForward):
            block.feed_forward.fuse_gate_up_()


class DeviceState:
    def __init__(self, bundle: ModelBundle, max_running: int, max_len: int, kv_quant: str = "none") -> None:
        self.bundle, self.model = bundle, bundle.model
        c = self.config = bundle.config
        self.device, self.dtype = bundle.device, bundle.dtype
        self.cuda = self.device.type == "cuda"
        fuse_feed_forwards_(self.model)
        self.max_running = max_running
        self.max_len = min(max_len, c.max_seq_len)
        rows = max_running + 1
        dev = self.device
        self.kv = KVCache.allocate(c, max_running, self.max_len, dev, self.dtype, quant=kv_quant)
        self.scratch_row = self.kv.scratch_row
        self.tokens = torch.zeros(rows, 1 + c.num_codebooks, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        self.frame_index = torch.zeros(rows, dtype=torch.long, device=dev)
        self.windows = new_window(rows, c.sampling_window, c.num_codebooks, dev)
        self.params = SamplingTensors.allocate(rows, dev)
        # per slot: (PrefixKV.ident, length) of the prefix its first positions hold, or None;
        # the version tells the decode loop to stage the prefix rows again
        self.slot_prefix: list[tuple[int, int] | None] = [None] * rows
        self.prefix_version = 0
        if self.cuda:
            # cuDNN's SDPA builds an execution plan per new (query, key) length: 0.7-1.5 s
            # per segment prefill on an H200; the other SDPA backends need none
            torch.backends.cuda.enable_cudnn_sdp(False)
            self.decode_stream = torch.cuda.Stream(dev)
            # high priority: someone waits for a prefill's first audio
            self.prefill_stream = torch.cuda.Stream(dev, priority=-1)

    def hold_prefix(self, slot: int, held: tuple[int, int] | None) -> None:
        """Record the prefix `slot`'s first positions hold (None: none to share)."""
        self.slot_prefix[slot] = held
        self.prefix_version += 1

    def check_room(self, start: int, length: int) -> None:
        if start + length > self.max_len:
            raise ValueError(f"{start + length} positions exceed the KV length {self.max_len}")

    def on_stream(self, stream_name: str):
        return torch.cuda.stream(getattr(self, stream_name)) if self.cuda else nullcontext()

    def staged(self, host):
        """Host inputs of a non-blocking copy: pinned on a GPU (the caching host allocator
        keeps each buffer until its copy is done)."""
        return host.pin_memory() if self.cuda else host

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
                   prefix: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """One frame for the rows idx ([B]): each row's input frame at its position, the
        frame sampled, its state moved on. The decode step's body, and the prefill's
        second frame (with its own fast cache). `prefix`: shared voice prefixes."""
        tokens = self.tokens[idx]
        windows = self.windows[idx]
        push_window(windows, tokens[:, 1:])  # the input frame joins the window before sampling
        positions = self.positions[idx]
        frame_index = self.frame_index[idx]
        out = decode_frame(self.model, self.kv, fast, tokens, idx, positions, kv_len, self.params.gather(idx), windows,
                           frame_index, plan, prefix)
        self.tokens.index_copy_(0, idx, out)
        self.windows.index_copy_(0, idx, windows)
        self.positions.index_copy_(0, idx, positions + 1)
        self.frame_index.index_copy_(0, idx, frame_index + 1)
        self.positions[self.scratch_row :].fill_(0)  # padded rows must not walk off the KV (a kernel, not a host copy)
        return out
