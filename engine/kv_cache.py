"""KV state for a fixed number of streams, allocated once.

Slow KV: [n_layer, rows, max_len, K, Dh] with rows = max_running + 1 (FP8, `quant="fp8"`:
uint8 [n_layer, rows, max_len, K, Dh + 16], e4m3 codes and a scale per position and head,
kernels/kv_fp8.py: 0.56x the memory per stream). The last row is a
scratch row: padded entries of a decode batch (bucket larger than the live batch) point
at it, so they never write into a live stream's row, even one being prefilled on
another thread at that moment.

Fast KV (`FastCache`): [n_fast_layer, batch, num_codebooks, Kf, Dhf], per-frame scratch
indexed by batch row and restarted every frame. Each thread that samples frames (decode,
prefill) has its own, so they never share scratch rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.config import ModelConfig
from kernels.kv_fp8 import is_packed, packed_dim

KV_QUANTS = ("none", "fp8")


@dataclass(slots=True)
class FastCache:
    k: Tensor
    v: Tensor

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, device: torch.device | str, dtype: torch.dtype) -> "FastCache":
        c = config
        shape = (c.n_fast_layer, batch, c.num_codebooks, c.fast_n_local_heads, c.fast_head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))


@dataclass(slots=True)
class KVCache:
    k: Tensor
    v: Tensor

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        max_running: int,
        max_len: int,
        device: torch.device | str,
        dtype: torch.dtype,
        quant: str = "none",
    ) -> "KVCache":
        if max_running < 1 or max_len < 1:
            raise ValueError("max_running and max_len must be positive")
        if quant not in KV_QUANTS:
            raise ValueError(f"KV quantization must be one of {KV_QUANTS}, got {quant!r}")
        if max_len > config.max_seq_len:
            raise ValueError(f"max_len {max_len} exceeds the model's max_seq_len {config.max_seq_len}")
        c = config
        if quant == "fp8":
            dtype = torch.uint8
            slow = (c.n_layer, max_running + 1, max_len, c.n_local_heads, packed_dim(c.head_dim))
        else:
            slow = (c.n_layer, max_running + 1, max_len, c.n_local_heads, c.head_dim)
        return cls(k=torch.zeros(slow, device=device, dtype=dtype), v=torch.zeros(slow, device=device, dtype=dtype))

    @property
    def quant(self) -> str:
        return "fp8" if is_packed(self.k) else "none"

    @property
    def scratch_row(self) -> int:
        return self.k.shape[1] - 1

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @staticmethod
    def bytes_per_stream(config: ModelConfig, max_len: int, dtype: torch.dtype, quant: str = "none") -> int:
        if quant == "fp8":  # one byte per element plus 16 per head (the scale and its padding)
            per_head = packed_dim(config.head_dim)
        else:
            per_head = config.head_dim * torch.empty((), dtype=dtype).element_size()
        return 2 * config.n_layer * config.n_local_heads * per_head * max_len
