"""The one GPU boundary: the kernel plan, the shared device state, the decode side and
the prefill side, built together at start-up (engine/device_state.py, engine/decode.py,
engine/prefill.py). The engine's threads call only the methods here.

On a CPU everything runs eagerly through the same code; `cuda_graphs=False` and a
reference plan select the eager and PyTorch paths on a GPU too (tests, baselines).
Which KV pages a stream uses is the caller's (engine/scheduler.py): each prefill and
decode call carries the page-table entries it needs written first.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from engine.alignment import AlignHeads
from engine.bundle import ModelBundle
from engine.decode import Decoder, StepHandle
from engine.device_state import DeviceState
from engine.kernel_plan import KernelPlan, build_plan
from engine.kv_cache import KVCache, own_pages
from engine.prefill import MAX_PREFILL_BATCH, Item, Prefiller, RowPages

__all__ = ["MAX_PREFILL_BATCH", "RowPages", "Runner", "StepHandle"]


class Runner:
    def __init__(
        self, bundle: ModelBundle, max_running: int, max_len: int, plan: KernelPlan | None = None, *,
        streams: int | None = None, pages: int | None = None, page_size: int = 16, kv_quant: str = "none",
        cuda_graphs: bool | None = None, chunked_prefill: bool | None = None, align_heads: AlignHeads | None = None,
    ) -> None:
        """`max_running`: the largest decode batch; `streams`: page-table rows (default
        max_running); `pages`: KV pages of `page_size` positions (None: every row its own
        pages for its whole length, set in its row now, for callers that manage no pages:
        tools and tests). `plan` None: every kernel that matches its reference on this
        device (engine/kernel_plan.py). `align_heads`: the word-timestamp readout's heads
        (engine/alignment.py; None: no readout)."""
        streams = max_running if streams is None else streams
        per_row = -(-max_len // page_size)
        self.state = DeviceState(bundle, streams, max_len, 1 + streams * per_row if pages is None else pages, page_size,
                                 kv_quant, align_heads)
        st = self.state
        if pages is None:
            st.kv.page_table[:streams] = own_pages(streams, st.kv.page_table.shape[1]).to(st.device)
        self.plan = build_plan(bundle.model, st.device, st.dtype, kv_quant) if plan is None else plan
        self.cuda_graphs = st.cuda if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not st.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.decoder = Decoder(st, self.plan, self.cuda_graphs, max_running)
        chunked = self.cuda_graphs and self.plan.attention if chunked_prefill is None else chunked_prefill
        self.prefiller = Prefiller(st, self.plan, self.cuda_graphs, chunked, max_running)

    @property
    def max_len(self) -> int:
        return self.state.max_len

    @property
    def scratch_row(self) -> int:
        return self.state.scratch_row

    @property
    def decode_gpu_s(self) -> float:
        return self.decoder.gpu_s

    def check_room(self, start: int, length: int) -> None:
        """Raises ValueError when `length` positions from `start` do not fit a stream's KV."""
        self.state.check_room(start, length)

    def kv_bytes_per_page(self) -> int:
        kv = self.state.kv
        return KVCache.bytes_per_position(self.state.config, self.state.dtype, kv.quant) * kv.page_size

    # prefill thread
    def prefill_prefix(self, slot: int, tokens: Tensor, pages: list[int] | None = None) -> None:
        """A voice prompt into row `slot` from position 0 (through `pages`, set first)."""
        self.prefiller.prefix(RowPages(slot, pages or []), tokens)

    def encode_audio(self, codec, wav: np.ndarray) -> Tensor:
        return self.prefiller.encode_audio(codec, wav)

    def prefill_segments(self, items: list[Item], rows: list[RowPages] = (),
                         text_spans: list[tuple[int, int, int]] = ()) -> list[np.ndarray]:
        return self.prefiller.segments(items, list(rows), text_spans)

    def prefill_segment(self, slot: int, start: int, tokens: Tensor, params) -> np.ndarray:
        return self.prefiller.segments([(slot, start, tokens, params)], [])[0]

    def second_frames(self, slots: list[int], ends: list[int]) -> list[np.ndarray]:
        return self.prefiller.second_frames(slots, ends)

    # decode thread
    def launch(self, slots: list[int], kv_len: int, table_updates: list[tuple[int, int, int]] = ()) -> StepHandle:
        return self.decoder.launch(slots, kv_len, table_updates)

    def read(self, handle: StepHandle) -> np.ndarray:
        return self.decoder.read(handle)

    def read_alignment(self, handle: StepHandle) -> np.ndarray | None:
        """The word-timestamp readout of a step already read: [batch, T], or None."""
        return self.decoder.read_alignment(handle)
