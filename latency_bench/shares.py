"""Where a load level's time went inside the service: the engine's counters (/metrics)
scraped before and after the level, turned into per-step times and per-thread shares.

The engine counts host seconds per phase of each worker thread (engine/timeshare.py) and
the GPU seconds of decode steps and codec calls (timing events). Over one level of wall
time W with S decode steps:

    step interval            W / S: what one frame of every running stream costs
    decode <phase> per step  host ms the decode thread spent in each phase per step
                             ("wait": blocked on the GPU finishing the step)
    decode GPU per step      ms from a step's first kernel to its last (queued behind
                             the codec's and the prefill's kernels included)
    <thread> busy            share of W a thread was not idle
    codec GPU                share of W the codec's graph replays took on the GPU

So "decode GPU per step" close to the step interval says the GPU is the limit; a step
interval well above it says the decode thread is (host work, the lock, the GIL).
"""

from __future__ import annotations

import urllib.request


def metrics_url(ws_url: str) -> str:
    """ws://host:port/v1/tts/live -> http://host:port/metrics."""
    scheme, rest = ws_url.split("://", 1)
    host = rest.split("/", 1)[0]
    return f"{'https' if scheme == 'wss' else 'http'}://{host}/metrics"


def parse_engine(text: str) -> dict[str, float]:
    """The engine_* samples of a /metrics page, by name without "engine_" and "_total"."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("engine_"):
            continue
        name, _, value = line.partition(" ")
        key = name.removeprefix("engine_").removesuffix("_total")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """The engine counters now; None when the service has no /metrics we can read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return parse_engine(r.read().decode())
    except OSError:
        return None


def level_shares(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict | None:
    """Per-step times (ms) and thread shares of one level, from two scrapes around it;
    None when the service does not count these (an older build) or nothing decoded."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d.get("decode_steps", 0.0)
    if "decode_gpu_seconds" not in d or steps <= 0 or wall_s <= 0:
        return None

    def per_step_ms(key: str) -> float:
        return 1000 * d.get(key, 0.0) / steps

    def busy(prefix: str) -> float:
        return 1 - d.get(f"{prefix}_idle_seconds", 0.0) / wall_s

    calls = d.get("codec_calls", 0.0)
    computed = d.get("codec_frames", 0.0) + d.get("codec_padded_frames", 0.0)  # padding rows too
    return {
        "decode_steps": int(steps),
        "mean_batch": d.get("decode_rows", 0.0) / steps,
        "step_interval_ms": 1000 * wall_s / steps,
        "decode_gpu_ms_per_step": per_step_ms("decode_gpu_seconds"),
        "decode_ms_per_step": {p: per_step_ms(f"decode_{p}_seconds") for p in ("schedule", "launch", "wait", "emit", "idle")},
        "decode_busy": busy("decode"),
        "prefill_busy": busy("prefill"),
        "codec_busy": busy("codec"),
        "codec_gpu_share": d.get("codec_gpu_seconds", 0.0) / wall_s,
        "codec_calls": int(calls),
        "codec_frames_per_call": d.get("codec_frames", 0.0) / calls if calls else 0.0,
        # of the frames the codec's calls computed, the share that was padding rows
        "codec_padding": d.get("codec_padded_frames", 0.0) / computed if computed else 0.0,
        "codec_gpu_ms_per_frame": 1000 * d.get("codec_gpu_seconds", 0.0) / d["codec_frames"] if d.get("codec_frames") else 0.0,
    }


def shares_line(s: dict) -> str:
    m = s["decode_ms_per_step"]
    return (f"step {s['step_interval_ms']:.2f} ms (GPU {s['decode_gpu_ms_per_step']:.2f}; host: schedule {m['schedule']:.2f}, "
            f"launch {m['launch']:.2f}, wait {m['wait']:.2f}, emit {m['emit']:.2f}) at batch {s['mean_batch']:.1f}; "
            f"busy: decode {s['decode_busy']:.0%}, prefill {s['prefill_busy']:.0%}, codec {s['codec_busy']:.0%} "
            f"(GPU {s['codec_gpu_share']:.0%}, {s['codec_frames_per_call']:.1f} frames/call, "
            f"{s['codec_padding']:.0%} padding, "
            f"{s['codec_gpu_ms_per_frame']:.3f} ms/frame)")
