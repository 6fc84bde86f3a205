"""The engine's settings: what an operator tunes (EngineConfig) and the baselines only
benchmarks set (BenchSettings, through `python -m latency_bench.server`). Figures behind
the defaults are in latency_bench/RESULTS.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.codec_pacing import BUSY_FIRST_FRAMES, CHUNKS, DEFAULT_BUSY_STREAMS, chunk_sizes
from engine.kv_cache import KV_QUANTS


@dataclass(slots=True)
class BenchSettings:
    """Baselines a benchmark compares against; never faster than the defaults."""

    # one utterance at a time, a host sync after every step, no CUDA graphs
    naive: bool = False
    ignore_end: bool = False  # never sample end-of-speech: every segment is max_new_tokens frames
    gemv: bool = True  # False: single-stream steps on cuBLAS instead of kernels/gemv.py
    pdl: bool = True  # False: the batch-1 decode graph without programmatic dependent launch
    prefill_second_frame: bool = True  # False: a segment's second frame comes from the decode batch
    # False: no word-timestamp readout in the decode step (its cost's A/B; issue 51); streams
    # with word_timestamps then get the characters-over-frames estimate (engine/alignment.py)
    alignment: bool = True


@dataclass(slots=True)
class EngineConfig:
    # streams decoding at once (the decode batch); None: 8 on a CPU, on a GPU
    # DEFAULT_GPU_RUNNING or what the KV pool holds if less
    max_running: int | None = None
    max_streams: int = 1024  # open streams: each holds a page-table row and the codec's state
    max_queued: int = 16  # streams waiting for a row or for KV pages; more are refused
    max_len: int = 4096  # KV positions per stream (voice prompt + context)
    voice_cache_bytes: int = 1 << 30  # most KV memory kept for cached voice prompts
    # the KV page pool: None sizes it from gpu_memory_fraction on a GPU, and on a CPU holds
    # max_running whole contexts twice over
    kv_cache_bytes: int | None = None
    gpu_memory_fraction: float = 0.9  # of the GPU's memory the process may use, KV pool included
    kv_page_size: int = 32  # positions per KV page ("Paged KV" in latency_bench/RESULTS.md)
    max_reference_seconds: float = 30.0
    # "fp8": the KV cache as e4m3 with a scale per position and head: 0.56x the memory,
    # no faster under load ("FP8 KV cache" in RESULTS.md)
    kv_quant: str = "none"
    log_timing: bool = False  # log each segment's say -> prefill -> first audio times
    # the PyTorch references instead of every Triton kernel (a GPU the kernels were never checked on)
    reference_kernels: bool = False
    # frames are held back, to be decoded several at a time, while a stream's audio leads
    # real-time playback by more than this (None: never hold)
    codec_hold_lead_s: float | None = 0.3
    codec_max_chunk: int = CHUNKS[0]  # most frames of one stream in one codec call
    # frames a turn's first audio waits for: 2 gives a player two frames to start on
    codec_first_frames: int = 1
    # from this many streams with audio in progress (0: never), a turn's first audio waits
    # for two frames: the underrun guard under load ("The underrun guard" in RESULTS.md).
    # None: DEFAULT_BUSY_STREAMS where the chunk sizes include two frames, else 0
    codec_busy_streams: int | None = None
    # on a CPU: torch threads (None: half the cores; the decode and codec threads compute at once)
    cpu_threads: int | None = None
    bench: BenchSettings = field(default_factory=BenchSettings)

    def __post_init__(self) -> None:
        if (self.max_running is not None and self.max_running < 1) or self.max_queued < 0 or self.max_len < 64:
            raise ValueError("max_running >= 1, max_queued >= 0 and max_len >= 64 are required")
        if not 1 <= self.max_streams <= 65536:
            raise ValueError(f"max_streams must be in 1..65536, got {self.max_streams}")
        if not 0.1 <= self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in 0.1..1, got {self.gpu_memory_fraction}")
        if self.kv_page_size not in (16, 32, 64):
            raise ValueError(f"kv_page_size must be 16, 32 or 64, got {self.kv_page_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.cpu_threads is not None and not 1 <= self.cpu_threads <= 1024:
            raise ValueError(f"cpu_threads must be None (auto) or in 1..1024, got {self.cpu_threads}")
        if self.codec_hold_lead_s is not None and not 0 <= self.codec_hold_lead_s <= 30:
            raise ValueError(f"codec_hold_lead_s must be None or in 0..30 s, got {self.codec_hold_lead_s}")
        if self.kv_quant not in KV_QUANTS:
            raise ValueError(f"kv_quant must be one of {KV_QUANTS}, got {self.kv_quant!r}")
        chunks = chunk_sizes(self.codec_max_chunk)  # raises ValueError on a size it does not offer
        if self.codec_first_frames not in chunks:
            raise ValueError(f"codec_first_frames must be one of {chunks} (at most codec_max_chunk), "
                             f"got {self.codec_first_frames}")
        if self.codec_busy_streams is None:
            self.codec_busy_streams = DEFAULT_BUSY_STREAMS if BUSY_FIRST_FRAMES in chunks else 0
        if self.codec_busy_streams < 0 or (self.codec_busy_streams and BUSY_FIRST_FRAMES not in chunks):
            raise ValueError(f"codec_busy_streams must be 0 (off) or positive, with {BUSY_FIRST_FRAMES} among the "
                             f"chunk sizes {chunks}; got {self.codec_busy_streams}")
