"""KV state, allocated once: the slow transformer's page pool and page table, and the fast
transformer's per-frame scratch.

Slow KV (`KVCache`): k, v [n_layer, pages, P, K, Dh] (FP8, `quant="fp8"`: uint8 [n_layer,
pages, P, K, Dh + 16], e4m3 codes and a scale per position and head, kernels/kv_fp8.py:
0.56x the memory per position), and page_table [rows, max_pages] int32, rows = streams + 1.
Which pages a stream holds is decided on the host (engine/pages.py, engine/scheduler.py)
and written into its row before a prefill or decode step reads it. Page 0 is the scratch
page and the last row the scratch row (every entry page 0): padded entries of a batch point
there, so they never write into a live stream's pages, even one being prefilled on
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
    page_table: Tensor  # [rows, max_pages] int32
    max_len: int  # positions a stream may hold (max_pages * P >= max_len)

    @classmethod
    def paged(
        cls,
        config: ModelConfig,
        streams: int,
        max_len: int,
        pages: int,
        page_size: int,
        device: torch.device | str,
        dtype: torch.dtype,
        quant: str = "none",
    ) -> "KVCache":
        """`pages` pages of `page_size` positions (page 0 the scratch page) and a page table
        for `streams` rows + the scratch row."""
        if streams < 1 or max_len < 1 or pages < 2:
            raise ValueError("streams and max_len must be positive, pages at least 2")
        if quant not in KV_QUANTS:
            raise ValueError(f"KV quantization must be one of {KV_QUANTS}, got {quant!r}")
        if max_len > config.max_seq_len:
            raise ValueError(f"max_len {max_len} exceeds the model's max_seq_len {config.max_seq_len}")
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page size must be a power of two, got {page_size}")
        c = config
        if quant == "fp8":
            dtype = torch.uint8
            shape = (c.n_layer, pages, page_size, c.n_local_heads, packed_dim(c.head_dim))
        else:
            shape = (c.n_layer, pages, page_size, c.n_local_heads, c.head_dim)
        table = torch.zeros(streams + 1, -(-max_len // page_size), dtype=torch.int32, device=device)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype), table,
                   max_len)

    @classmethod
    def allocate(cls, config: ModelConfig, max_running: int, max_len: int, device: torch.device | str,
                 dtype: torch.dtype, quant: str = "none", page_size: int = 16) -> "KVCache":
        """`max_running` rows, each its own consecutive pages for its whole length (one
        stream's generation, tests, tools)."""
        streams = max_running
        if streams < 1 or max_len < 1:
            raise ValueError("max_running and max_len must be positive")
        per_row = -(-max_len // page_size)
        kv = cls.paged(config, streams, max_len, 1 + streams * per_row, page_size, device, dtype, quant)
        kv.page_table[:streams] = own_pages(streams, per_row).to(device)
        return kv

    @property
    def quant(self) -> str:
        return "fp8" if is_packed(self.k) else "none"

    @property
    def scratch_row(self) -> int:
        return self.page_table.shape[0] - 1

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    @property
    def pages(self) -> int:
        return self.k.shape[1]

    @staticmethod
    def bytes_per_position(config: ModelConfig, dtype: torch.dtype, quant: str = "none") -> int:
        if quant == "fp8":  # one byte per element plus 16 per head (the scale and its padding)
            per_head = packed_dim(config.head_dim)
        else:
            per_head = config.head_dim * torch.empty((), dtype=dtype).element_size()
        return 2 * config.n_layer * config.n_local_heads * per_head

    @staticmethod
    def bytes_per_stream(config: ModelConfig, max_len: int, dtype: torch.dtype, quant: str = "none") -> int:
        return KVCache.bytes_per_position(config, dtype, quant) * max_len


def own_pages(rows: int, per_row: int) -> Tensor:
    """Page-table rows each holding its own consecutive pages (page 0 is the scratch page)."""
    return torch.arange(rows * per_row, dtype=torch.int32).view(rows, per_row) + 1
