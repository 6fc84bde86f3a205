"""How large the KV page pool is and how many streams decode at once, decided at start-up
from the device's memory (EngineConfig.gpu_memory_fraction) or set by the operator.

On a GPU the pool gets what is left of `gpu_memory_fraction` of the card once the weights
and the codec's per-stream state are in place (measured with cudaMemGetInfo), less a
reserve for what start-up allocates after it (CUDA graphs' pools, activations) and for
what serving allocates later (the codec encoder on a new voice's reference audio): so no
load ends in a device out-of-memory, only in streams that wait for pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.settings import EngineConfig

CPU_RUNNING = 8
# the decode batch cap on a GPU: the most streams the reference workload held within its
# TTFA bounds on an H100 (README, "GPU install and sizing")
DEFAULT_GPU_RUNNING = 128
# positions a decoding stream typically holds beyond its voice prompt: caps the default
# decode batch where the pool is small
TYPICAL_SEGMENT = 512
# device memory kept out of the pool for graphs, activations and the codec encoder
# ("Paged KV" in latency_bench/RESULTS.md)
GPU_RESERVE_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class KVPlan:
    pages: int  # pool pages, the scratch page included
    page_size: int
    page_bytes: int
    max_running: int

    @property
    def pool_bytes(self) -> int:
        return self.pages * self.page_bytes


def plan_kv(config: EngineConfig, model: ModelConfig, device: torch.device, dtype: torch.dtype) -> KVPlan:
    page_size = config.kv_page_size
    page_bytes = KVCache.bytes_per_position(model, dtype, config.kv_quant) * page_size
    per_context = -(-min(config.max_len, model.max_seq_len) // page_size)
    if config.kv_cache_bytes is not None:
        pages = config.kv_cache_bytes // page_bytes
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # blocks torch's caching allocator holds but no tensor uses are free for the pool too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        budget = int(config.gpu_memory_fraction * total) - (total - free) - GPU_RESERVE_BYTES
        pages = max(0, budget) // page_bytes
    else:
        pages = 1 + 2 * (config.max_running or CPU_RUNNING) * per_context
    if pages < 1 + per_context:
        raise ValueError(
            f"the KV pool holds {max(0, pages - 1)} pages of {page_size} positions ({page_bytes / 2**20:.1f} MiB each), "
            f"less than one stream's context (--max-len {config.max_len}): lower --max-len, or give the pool more "
            f"memory (--gpu-memory-fraction, --kv-cache-mb)")
    running = wanted_running(config, device)
    if config.max_running is None:  # no more than the pool holds typical segments of
        running = max(1, min(running, (pages - 1) // -(-TYPICAL_SEGMENT // page_size)))
    return KVPlan(pages, page_size, page_bytes, running)


def wanted_running(config: EngineConfig, device: torch.device) -> int:
    """The decode batch cap asked for, or the default for the device (before the pool)."""
    running = config.max_running or (DEFAULT_GPU_RUNNING if device.type == "cuda" else CPU_RUNNING)
    return min(running, config.max_streams)
