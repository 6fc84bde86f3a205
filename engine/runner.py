"""The one GPU boundary: the kernel plan, the shared device state, the decode side and
the prefill side, built together at start-up (engine/device_state.py, engine/decode.py,
engine/prefill.py). The engine's threads call only the methods here.

On a CPU everything runs eagerly through the same code; `cuda_graphs=False` and a
reference plan select the eager and PyTorch paths on a GPU too (tests, baselines).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from engine.bundle import ModelBundle
from engine.decode import Decoder, StepHandle
from engine.device_state import DeviceState, PrefixKV
from engine.kernel_plan import KernelPlan, build_plan
from engine.kv_cache import KVCache
from engine.prefill import MAX_PREFILL_BATCH, Item, Prefiller

__all__ = ["MAX_PREFILL_BATCH", "PrefixKV", "Runner", "StepHandle"]


class Runner:
    def __init__(
        self, bundle: ModelBundle, max_running: int, max_len: int, plan: KernelPlan | None = None, *,
        kv_quant: str = "none", cuda_graphs: bool | None = None, chunked_prefill: bool | None = None,
        shared_prefix: bool = True,
    ) -> None:
        """`plan` None: every kernel that matches its reference on this device
        (engine/kernel_plan.py). `shared_prefix`: streams of one voice read its prompt from
        one KV row in a decode step (engine/device_state.py)."""
        self.state = DeviceState(bundle, max_running, max_len, kv_quant)
        st = self.state
        self.plan = build_plan(bundle.model, st.device, st.dtype, kv_quant) if plan is None else plan
        self.cuda_graphs = st.cuda if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not st.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.decoder = Decoder(st, self.plan, self.cuda_graphs, shared_prefix)
        chunked = self.cuda_graphs and self.plan.attention if chunked_prefill is None else chunked_prefill
        self.prefiller = Prefiller(st, self.plan, self.cuda_graphs, chunked)

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

    def kv_bytes_per_stream(self) -> int:
        return KVCache.bytes_per_stream(self.state.config, self.max_len, self.state.dtype, self.state.kv.quant)

    # prefill thread
    def prefill_prefix(self, slot: int, tokens: Tensor) -> PrefixKV:
        return self.prefiller.prefix(slot, tokens)

    def load_prefix(self, slot: int, prefix: PrefixKV) -> None:
        self.prefiller.load_prefix(slot, prefix)

    def encode_audio(self, codec, wav: np.ndarray) -> Tensor:
        return self.prefiller.encode_audio(codec, wav)

    def prefill_segments(self, items: list[Item]) -> list[np.ndarray]:
        return self.prefiller.segments(items)

    def prefill_segment(self, slot: int, start: int, tokens: Tensor, params) -> np.ndarray:
        return self.prefiller.segments([(slot, start, tokens, params)])[0]

    def second_frames(self, slots: list[int], ends: list[int]) -> list[np.ndarray]:
        return self.prefiller.second_frames(slots, ends)

    # decode thread
    def launch(self, slots: list[int], kv_len: int) -> StepHandle:
        return self.decoder.launch(slots, kv_len)

    def read(self, handle: StepHandle) -> np.ndarray:
        return self.decoder.read(handle)
