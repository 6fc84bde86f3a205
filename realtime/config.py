"""Service configuration: one dataclass, filled from the command line; the environment
is read here and nowhere else."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.bundle import QUANT_MODES
from engine.codec_worker import CHUNK_CHOICES, CHUNKS
from engine.engine import CODEC_KERNELS, EngineConfig
from engine.kv_cache import KV_QUANTS
from engine.runner import PREFILL_ATTENTION
from realtime.protocol import Limits


@dataclass(slots=True)
class ServiceConfig:
    host: str = "127.0.0.1"  # localhost unless told otherwise
    port: int = 8765
    model: str = "default"
    device: str = "auto"
    quant: str = "none"  # "fp8": block-scaled FP8 linear layers
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: Limits = field(default_factory=Limits)
    api_keys: frozenset[str] = frozenset()  # empty: no authentication
    voices_dir: Path = Path("voices")
    idle_timeout_s: float = 300.0  # a connection with nothing to do for this long is closed
    start_timeout_s: float = 30.0  # a new connection that sends no `start` for this long is closed
    # live connections at once (each holds a socket and a session, started or not; KV
    # slots are limited separately by max_running / max_queued): more are refused at the
    # handshake with 503, so idle sockets cannot exhaust the process's file descriptors
    max_connections: int = 1024
    max_voices: int = 1000  # stored voices (POST /v1/voices); more are refused until one is deleted
    ready_timeout_s: float = 120.0  # open-to-ready longer than this is an error
    max_pending_audio_bytes: int = 32 << 20  # unsent audio per connection or HTTP response (slow readers)
    demo_page: bool = True
    ignore_end: bool = False  # fixed-length mode for random-weight benchmarks and tests
    debug_stalls: bool = False  # log GC pauses and thread stacks during event-loop stalls

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")
        if self.idle_timeout_s <= 0 or self.ready_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_connections < 1 or self.max_voices < 0:
            raise ValueError("max_connections must be at least 1 and max_voices at least 0")


def parse_args(argv: list[str] | None = None) -> ServiceConfig:
    p = argparse.ArgumentParser(prog="python -m realtime", description="Realtime streaming voice service")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--model", default="default", help="default | tiny | s1-mini | s2-pro | checkpoint folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda if present)")
    p.add_argument("--quant", default="none", choices=QUANT_MODES,
                   help="weight quantization of the transformers (fp8-swiglu-epilogue: fp8 with the MLP's SwiGLU in "
                        "its gate/up GEMM, measured slower than fp8; fp8-mlp-one-launch: that and both MLP GEMMs in "
                        "one persistent launch, measured slower than fp8)")
    p.add_argument("--kv-quant", default="none", choices=KV_QUANTS,
                   help="KV cache storage (fp8: e4m3 with a scale per position and head, half the memory)")
    p.add_argument("--max-running", type=int, default=8, help="streams holding a KV slot at once")
    p.add_argument("--codec-hold-lead", type=float, default=0.3,
                   help="seconds of audio a stream may lead its real-time playback by before its frames are "
                        "held back to be decoded in larger chunks (negative: never hold)")
    p.add_argument("--codec-max-chunk", type=int, default=CHUNKS[0], choices=CHUNK_CHOICES,
                   help="most frames of one stream per codec call (larger: less GPU per frame, more held back)")
    p.add_argument("--codec-first-frames", type=int, default=1, choices=CHUNK_CHOICES,
                   help="frames a turn's first audio waits for (2: one more decode step before the first audio, "
                        "two frames of audio for the player to start on); at most --codec-max-chunk")
    p.add_argument("--codec-busy-streams", type=int, default=None, metavar="N",
                   help="from N streams with audio in progress, a new turn's first audio waits for two frames instead "
                        "of --codec-first-frames (the underrun guard under load, the one-frame TTFA when light); 0: never "
                        "(default: 32, or 0 with --codec-max-chunk 1)")
    p.add_argument("--no-prefill-second-frame", dest="prefill_second_frame", action="store_false",
                   help="leave each segment's second frame to the decode batch (2-3 steps after its prefill) "
                        "instead of one small step on the prefill thread: an A/B baseline")
    p.add_argument("--no-gemv", dest="gemv", action="store_false",
                   help="run every linear layer on its GEMM at every batch size instead of the small-batch GEMV "
                        "kernel when one stream decodes (an A/B baseline)")
    p.add_argument("--no-pdl", dest="pdl", action="store_false",
                   help="capture the single-stream decode graph with its kernels launched one after another instead "
                        "of with programmatic dependent launch (Hopper on: each kernel's launch overlaps the work of "
                        "the one before): an A/B baseline")
    p.add_argument("--pdl-all-batches", action="store_true",
                   help="capture every decode graph with programmatic dependent launch, not the single-stream one "
                        "only (measured 1.02x on the engine step alone at batch 54-64 on an H100; an A/B arm; "
                        "not with --no-pdl)")
    p.add_argument("--no-shared-prefix-reads", dest="shared_prefix_reads", action="store_false",
                   help="decode attention reads every stream's voice prompt from its own KV row instead of one row "
                        "per voice in the step (the same audio either way; shared: fewer memory reads, measured "
                        "1.01x frames/s at c=64 on an H100): an A/B baseline")
    p.add_argument("--prefix-cascade", action="store_true",
                   help="decode attention attends each voice prompt once for all the streams of a step that speak "
                        "with it (their queries in one dot; kernels/cascade_attention.py) instead of once per stream: "
                        "the same audio up to rounding, fewer memory reads; measured no faster than the shared reads on an H100 "
                        "(the c=64 load 0.99x): an A/B arm; not with --no-shared-prefix-reads, whose rows it reads")
    p.add_argument("--prefill-attention", choices=PREFILL_ATTENTION, default="blocked",
                   help="the segment prefill's attention on a GPU: blocked (16 new positions of a stream read each "
                        "key block once; the default: 1.59x faster for 16 segments, a lower TTFA under load) or "
                        "per-query (each new position reads its context alone: the baseline); with --kv-quant fp8 the "
                        "prefill is per-query either way (the blocked kernel reads bf16 caches)")
    p.add_argument("--codec-release-interval", type=float, default=0.0,
                   help="seconds: streams well ahead of real time send full chunks to the codec together, at most "
                        "this often (0: each when its chunk is full); fewer, fuller codec calls")
    p.add_argument("--codec-kernels", choices=CODEC_KERNELS, default="all",
                   help="the codec's Triton kernels on a GPU, each used once it matches its reference there: all, "
                        "snake (the Snake kernel only) or off (the codec's PyTorch path)")
    p.add_argument("--codec-bucket-step", type=int, default=0, metavar="N",
                   help="the codec calls' batch sizes: 0, powers of two (default); N (a power of two), powers of "
                        "two up to N and then every multiple of N, so fewer rows of a call are padding (more CUDA "
                        "graphs; with --codec-release-interval 0.05 measured at c=64 on an H100: padding 32%% -> 5%%, "
                        "frames/s unchanged)")
    p.add_argument("--codec-cut-in", action="store_true",
                   help="a frame of a stream near the start of its audio cuts the codec's round in progress short "
                        "(its remaining calls go out after that frame's): fewer gaps early in a reply under load "
                        "(measured at c=64 on an H100: no change in frames/s or underruns)")
    p.add_argument("--codec-silent", action="store_true",
                   help="a diagnosis, never for serving: skip the codec and send silence of the right length, so a "
                        "load run measures the decode loop with no codec work on the GPU beside it")
    p.add_argument("--cpu-threads", type=int, default=0,
                   help="on a CPU device: torch threads while serving (0: half the cores; the decode and codec "
                        "threads compute at once, and more threads than cores slows both)")
    p.add_argument("--max-queued", type=int, default=16, help="streams waiting for a slot; more are refused")
    p.add_argument("--max-len", type=int, default=4096, help="KV positions per stream")
    p.add_argument("--voice-cache-mb", type=int, default=1024, help="device memory for cached voice prefixes")
    p.add_argument("--voices-dir", default="voices", help="where stored voices are kept")
    p.add_argument("--api-key", action="append", default=[], help="accepted API key (repeatable; also $REALTIME_API_KEYS, comma-separated)")
    p.add_argument("--idle-timeout", type=float, default=300.0, help="seconds before an idle connection is closed")
    p.add_argument("--start-timeout", type=float, default=30.0,
                   help="seconds a new connection may take to send its start message")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="live WebSocket connections at once; more are refused at the handshake (503)")
    p.add_argument("--max-voices", type=int, default=1000,
                   help="stored voices (POST /v1/voices); more are refused (413) until one is deleted")
    p.add_argument("--max-message-mb", type=float, default=16.0, help="largest WebSocket frame / HTTP body")
    p.add_argument("--max-text-chars", type=int, default=10_000, help="longest text event")
    p.add_argument("--max-buffered-chars", type=int, default=100_000, help="text received but not yet spoken")
    p.add_argument("--max-references", type=int, default=8)
    p.add_argument("--max-reference-seconds", type=float, default=30.0)
    p.add_argument("--max-new-tokens", type=int, default=2048, help="upper bound clients may ask for (frames per segment)")
    p.add_argument("--no-demo", action="store_true", help="do not serve the browser demo at /")
    p.add_argument("--log-timing", action="store_true", help="log each turn's say -> prefill -> first audio times")
    p.add_argument("--debug-stalls", action="store_true",
                   help="log GC pauses and what every thread was doing while the event loop was stalled (realtime/stalls.py)")
    p.add_argument("--naive", action="store_true",
                   help="benchmark baseline: one utterance at a time, host sync after every step, no CUDA graphs")
    p.add_argument("--ignore-end", action="store_true",
                   help="fixed-length mode: never sample end-of-speech, every segment is max_new_tokens frames (random-weight benchmarks)")
    a = p.parse_args(argv)
    keys = set(a.api_key) | {k.strip() for k in os.environ.get("REALTIME_API_KEYS", "").split(",") if k.strip()}
    try:  # the configs validate their fields together; a bad combination is a usage error
        return _service_config(a, keys)
    except ValueError as e:
        p.error(str(e))


def _service_config(a: argparse.Namespace, keys: set[str]) -> ServiceConfig:
    return ServiceConfig(
        host=a.host,
        port=a.port,
        model=a.model,
        device=a.device,
        quant=a.quant,
        engine=EngineConfig(
            max_running=a.max_running, max_queued=a.max_queued, max_len=a.max_len,
            voice_cache_bytes=a.voice_cache_mb << 20, max_reference_seconds=a.max_reference_seconds, kv_quant=a.kv_quant,
            naive=a.naive, log_timing=a.log_timing,
            codec_hold_lead_s=None if a.codec_hold_lead < 0 else a.codec_hold_lead, codec_max_chunk=a.codec_max_chunk,
            codec_first_frames=a.codec_first_frames, codec_busy_streams=a.codec_busy_streams, prefill_second_frame=a.prefill_second_frame, gemv=a.gemv, pdl=a.pdl, pdl_all_batches=a.pdl_all_batches,
            shared_prefix_reads=a.shared_prefix_reads, prefix_cascade=a.prefix_cascade,
            prefill_attention=a.prefill_attention,
            codec_release_interval_s=a.codec_release_interval,
            codec_kernels=a.codec_kernels, codec_cut_in=a.codec_cut_in,
            codec_bucket_step=a.codec_bucket_step, codec_silent=a.codec_silent,
            cpu_threads=a.cpu_threads or None,
        ),
        limits=Limits(
            max_message_bytes=int(a.max_message_mb * 2**20), max_text_chars=a.max_text_chars,
            max_buffered_chars=a.max_buffered_chars, max_references=a.max_references,
            max_reference_seconds=a.max_reference_seconds, max_new_tokens=a.max_new_tokens,
        ),
        api_keys=frozenset(keys),
        voices_dir=Path(a.voices_dir),
        idle_timeout_s=a.idle_timeout,
        start_timeout_s=a.start_timeout,
        max_connections=a.max_connections,
        max_voices=a.max_voices,
        demo_page=not a.no_demo,
        ignore_end=a.ignore_end,
        debug_stalls=a.debug_stalls,
    )
