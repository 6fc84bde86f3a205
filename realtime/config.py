"""Service configuration: one dataclass, filled from the command line; the environment
is read here and nowhere else."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.bundle import QUANT_MODES
from engine.codec_pacing import CHUNK_CHOICES, CHUNKS
from engine.kv_cache import KV_QUANTS
from engine.settings import EngineConfig
from realtime.protocol import Limits

UNKNOWN_VOICE = ("error", "default")  # --unknown-voice


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
    # a reference_id that is not a stored voice (e.g. one of the hosted service's library):
    # "error" refuses it (unknown_voice); "default" speaks with the default voice, warning once per id
    unknown_voice: str = "error"
    idle_timeout_s: float = 300.0  # a connection with nothing to do for this long is closed
    start_timeout_s: float = 30.0  # a new connection that sends no `start` for this long is closed
    # live connections at once (each holds a socket and a session, started or not; a
    # started one holds an engine stream, EngineConfig.max_streams): more are refused at
    # the handshake with 503, so idle sockets cannot exhaust the process's file descriptors
    max_connections: int = 1024
    max_voices: int = 1000  # stored voices (POST /v1/voices); more are refused until one is deleted
    ready_timeout_s: float = 120.0  # open-to-ready longer than this is an error
    max_pending_audio_bytes: int = 32 << 20  # unsent audio per connection or HTTP response (slow readers)
    demo_page: bool = True
    debug_stalls: bool = False  # log GC pauses and thread stacks during event-loop stalls
    # SIGTERM: turns in flight get this long to finish before they are cut (Services.drain)
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")
        if self.idle_timeout_s <= 0 or self.ready_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_connections < 1 or self.max_voices < 0:
            raise ValueError("max_connections must be at least 1 and max_voices at least 0")
        if self.unknown_voice not in UNKNOWN_VOICE:
            raise ValueError(f"unknown_voice must be one of {', '.join(UNKNOWN_VOICE)}")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must not be negative")


# --limit NAME=VALUE: what a client may send, and how many stored voices (README, "Limits")
LIMITS = {
    "message-mb": ("max_message_bytes", lambda v: int(float(v) * 2**20)),
    "text-chars": ("max_text_chars", int),
    "buffered-chars": ("max_buffered_chars", int),
    "references": ("max_references", int),
    "reference-seconds": ("max_reference_seconds", float),
    "new-tokens": ("max_new_tokens", int),
    "voices": (None, int),  # ServiceConfig.max_voices
}
DEBUG = ("timing", "stalls")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m realtime", description="Realtime streaming voice service")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--model", default="default", help="default | tiny | s1-mini | s2-pro | checkpoint folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda if present)")
    p.add_argument("--quant", default="none", choices=QUANT_MODES, help="fp8: block-scaled FP8 linear layers")
    p.add_argument("--kv-quant", default="none", choices=KV_QUANTS,
                   help="KV cache storage (fp8: e4m3 with a scale per position and head, 0.56x the memory)")
    p.add_argument("--max-running", type=int, default=None,
                   help="streams decoding at once, the decode batch (default: 128 on a GPU, fewer if the KV pool is "
                        "small; 8 on a CPU)")
    p.add_argument("--max-queued", type=int, default=16,
                   help="streams waiting for KV pages (or a free stream); more are refused with busy")
    p.add_argument("--max-len", type=int, default=4096, help="KV positions per stream (voice prompt + context)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.9,
                   help="share of the GPU's memory this process may use; the KV page pool gets what the weights, "
                        "codec and CUDA graphs leave of it")
    p.add_argument("--kv-cache-mb", type=int, default=None,
                   help="the KV page pool's size instead (default: from --gpu-memory-fraction on a GPU; on a CPU, "
                        "twice --max-running whole contexts)")
    p.add_argument("--voice-cache-mb", type=int, default=1024, help="most KV memory kept for cached voice prompts")
    p.add_argument("--voices-dir", default="voices", help="where stored voices are kept")
    p.add_argument("--unknown-voice", default="error", choices=UNKNOWN_VOICE,
                   help="a reference_id that is no stored voice (e.g. from the hosted voice library): error refuses "
                        "it (unknown_voice); default speaks with the default voice and logs a warning once per id")
    p.add_argument("--api-key", action="append", default=[],
                   help="accepted API key (repeatable; also $REALTIME_API_KEYS, comma-separated)")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="live WebSocket connections at once; more are refused at the handshake (503)")
    p.add_argument("--idle-timeout", type=float, default=300.0, help="seconds before an idle connection is closed")
    p.add_argument("--start-timeout", type=float, default=30.0,
                   help="seconds a new connection may take to send its start message")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds the turns in flight get to finish before the service exits")
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   help=f"a client limit (repeatable): {', '.join(LIMITS)} (defaults in the README)")
    p.add_argument("--no-demo", action="store_true", help="do not serve the browser demo at /")
    p.add_argument("--cpu-threads", type=int, default=0,
                   help="torch threads on a CPU device (0: half the cores: the decode and codec threads compute at once)")
    p.add_argument("--codec-first-frames", type=int, default=1, choices=CHUNK_CHOICES,
                   help="frames a turn's first audio waits for (2: the player starts with two frames of audio)")
    p.add_argument("--codec-busy-streams", type=int, default=None, metavar="N",
                   help="from N streams with audio in progress a turn's first audio waits for two frames, the "
                        "underrun guard under load (default 32; 0: never)")
    p.add_argument("--codec-hold-lead", type=float, default=0.3,
                   help="seconds a stream's audio may lead real-time playback before its frames are held back to "
                        "be decoded in larger chunks (negative: never hold)")
    p.add_argument("--codec-max-chunk", type=int, default=CHUNKS[0], choices=CHUNK_CHOICES,
                   help="most frames of one stream per codec call (larger: less GPU per frame, more held back)")
    p.add_argument("--reference-kernels", action="store_true",
                   help="run the PyTorch references instead of the Triton kernels (a GPU they were never checked on)")
    p.add_argument("--debug", action="append", default=[], choices=DEBUG,
                   help="timing: log each turn's say -> prefill -> first audio; stalls: log GC pauses and thread "
                        "stacks while the event loop stalls (repeatable)")
    return p


def parse_args(argv: list[str] | None = None, bench=None) -> ServiceConfig:
    """The service's configuration from its command line; `bench`: benchmark-only
    baselines (engine.settings.BenchSettings, set by latency_bench.server)."""
    p = build_parser()
    a = p.parse_args(argv)
    keys = set(a.api_key) | {k.strip() for k in os.environ.get("REALTIME_API_KEYS", "").split(",") if k.strip()}
    try:  # the configs validate their fields together; a bad combination is a usage error
        return _service_config(a, keys, bench)
    except ValueError as e:
        p.error(str(e))


def _limits(pairs: list[str]) -> tuple[Limits, dict]:
    fields, service = {}, {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in LIMITS:
            raise ValueError(f"--limit takes NAME=VALUE with NAME one of {', '.join(LIMITS)}; got {pair!r}")
        field_name, convert = LIMITS[name]
        try:
            number = convert(value)
        except ValueError:
            raise ValueError(f"--limit {name} needs a number, got {value!r}") from None
        if number < 0:
            raise ValueError(f"--limit {name} must not be negative, got {value}")
        if field_name is None:
            service["max_voices"] = number
        else:
            fields[field_name] = number
    return Limits(**fields), service


def _service_config(a: argparse.Namespace, keys: set[str], bench) -> ServiceConfig:
    limits, service = _limits(a.limit)
    engine = EngineConfig(
        max_running=a.max_running, max_streams=a.max_connections, max_queued=a.max_queued, max_len=a.max_len,
        voice_cache_bytes=a.voice_cache_mb << 20, gpu_memory_fraction=a.gpu_memory_fraction,
        kv_cache_bytes=None if a.kv_cache_mb is None else a.kv_cache_mb << 20,
        max_reference_seconds=limits.max_reference_seconds, kv_quant=a.kv_quant, log_timing="timing" in a.debug,
        reference_kernels=a.reference_kernels, codec_hold_lead_s=None if a.codec_hold_lead < 0 else a.codec_hold_lead,
        codec_max_chunk=a.codec_max_chunk, codec_first_frames=a.codec_first_frames,
        codec_busy_streams=a.codec_busy_streams, cpu_threads=a.cpu_threads or None,
    )
    if bench is not None:
        engine.bench = bench
    return ServiceConfig(
        host=a.host, port=a.port, model=a.model, device=a.device, quant=a.quant, engine=engine, limits=limits,
        api_keys=frozenset(keys), voices_dir=Path(a.voices_dir), unknown_voice=a.unknown_voice, idle_timeout_s=a.idle_timeout,
        start_timeout_s=a.start_timeout, max_connections=a.max_connections, demo_page=not a.no_demo,
        debug_stalls="stalls" in a.debug, drain_timeout_s=a.drain_timeout, **service,
    )
