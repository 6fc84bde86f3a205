"""`python -m latency_bench`: the TTFA load test.

    # start the service with the default model on the CPU, sweep 1/4/8 connections,
    # with the naive serving mode as baseline in the same run:
    python -m latency_bench --model default --device cpu --concurrency 1,4,8 --baseline naive --out out/bench

    # against a running service:
    python -m latency_bench --url ws://host:8765/v1/tts/live --concurrency 1,16,64

Writes <out>/results.json, <out>/ttfa_throughput.png and prints a table per run. A service
it starts runs as `python -m latency_bench.server` (the service plus the benchmark's
baselines); `--baseline naive` starts a second one with `--naive`.

This is the closed loop (each connection: turns back to back); the open-loop conversation
load and the capacity search are `python -m latency_bench.conversation`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import subprocess
import sys
from pathlib import Path

import numpy as np

from latency_bench.loadgen import Workload, add_target_args, add_turn_args, run_level
from latency_bench.jsonfile import write_json
from latency_bench.report import aggregate, plot, ratios, table
from latency_bench.serverproc import service, sizing_args
from latency_bench.shares import level_shares, metrics_url, scrape, shares_line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latency_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    add_turn_args(p, text_mode="sentences")
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated levels")
    p.add_argument("--turns", type=int, default=3, help="turns per connection")
    p.add_argument("--think", type=float, default=0.3, help="seconds between turns (randomized 0.5x-1.5x)")
    p.add_argument("--ramp", type=float, default=1.0, help="seconds over which connections arrive")
    p.add_argument("--reference-audio", help="inline reference audio file")
    p.add_argument("--reference-text", help="its transcript")
    p.add_argument("--barge-in", type=float, help="cancel each turn this many seconds after its first audio")
    p.add_argument("--baseline", choices=["naive"], help="also run the naive serving mode (needs --model)")
    p.add_argument("--baseline-concurrency", help="levels for the baseline (default: --concurrency); the naive "
                   "mode serves one utterance at a time, so high levels take minutes")
    p.add_argument("--baseline-turns", type=int, help="turns per connection for the baseline (default: --turns)")
    p.add_argument("--only-baseline", action="store_true", help="run the baseline alone (split long sweeps)")
    p.add_argument("--max-running", type=int, help="the decode batch cap of a started service (default: the "
                   "service's); its --max-connections and --max-queued follow the largest level")
    p.add_argument("--out", default="out/latency_bench")
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    if a.baseline and not a.model:
        p.error("--baseline needs --model (the bench starts both services)")
    if bool(a.reference_audio) != bool(a.reference_text):
        p.error("--reference-audio and --reference-text go together")
    return a


def synthetic_reference(seconds: float, rate: int = 44100) -> tuple[bytes, str]:
    """A speech-like signal (a gliding harmonic tone, amplitude-modulated at syllable rate)
    and a transcript of about 2.5 words per second."""
    from engine.audio import wav_bytes

    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    audio = (0.2 * voice * envelope).astype(np.float32)
    words = ("the quick brown fox jumps over a lazy dog while seven happy children sing near the old "
             "stone bridge and the river runs quietly toward the sea").split()
    n = max(3, int(seconds * 2.5))
    text = " ".join(words[i % len(words)] for i in range(n)).capitalize() + "."
    return wav_bytes(audio, rate), text


def capacity_line(health: dict) -> str:
    """What a started service holds, from its /v1/health: open streams, the decode batch
    cap and the KV page pool."""
    kv = health.get("kv_pages", {})
    line = f"streams {health.get('max_streams', '?')}, decode batch {health.get('max_running', '?')}"
    if "pages_total" in kv:
        line += (f", KV pool {kv['pages_total']} pages of {kv.get('page_size', '?')} positions "
                 f"({kv['pages_total'] * kv.get('page_bytes', 0) / 2**20:.0f} MiB)")
    return line


def run_meta(prog: str, argv: list[str] | None) -> dict:
    """What every benchmark's JSON starts with: the command line, the commit and the time."""
    return {
        "command": " ".join([prog, *(argv if argv is not None else sys.argv[1:])]),
        "commit": git_commit(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def git_commit(cwd: str | None = None) -> str:
    """HEAD's short hash, with "+changes" when tracked files differ from it: a result is then
    not HEAD's (the GPU machine runs a copy of the working tree, whose .git may lag it)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=cwd).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return f"{head}+changes" if head and git("status", "--porcelain", "--untracked-files=no") else head
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def sweep(url: str, levels: list[int], w: Workload, ramp: float, name: str) -> list[dict]:
    out = []
    counters = metrics_url(url)
    for c in levels:
        print(f"[{name}] {c} connection(s)", file=sys.stderr, flush=True)
        before = scrape(counters)
        results, wall, lag = asyncio.run(run_level(c, w, ramp, log=lambda m: print(m, file=sys.stderr, flush=True)))
        after = scrape(counters)
        level = aggregate(c, results, wall, w.hop_length / w.codec_rate)
        # a client that stalled would have stamped its own receive times late: kept beside
        # the TTFA and underruns it would have inflated
        level["client_loop_lag_s"] = lag
        # where the service's time went (engine counters around the level)
        shares = level_shares(before, after, wall) if before and after else None
        if shares is not None:
            level["engine_shares"] = shares
            print(f"[{name}] c={c}: {shares_line(shares)}", file=sys.stderr, flush=True)
        out.append(level)
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    levels = [int(x) for x in a.concurrency.split(",")]
    reference = None
    if a.reference_audio:
        reference = (Path(a.reference_audio).read_bytes(), a.reference_text)
    elif a.synthetic_reference:
        reference = synthetic_reference(a.synthetic_reference)
    out = Path(a.out)

    def workload(url: str, turns: int) -> Workload:
        return Workload(
            url=url, turns=turns, text_mode=a.text_mode, tokens_per_s=a.tokens_per_s, think_s=a.think,
            max_new_tokens=a.max_new_tokens, fixed_frames=a.fixed_frames, format=a.format,
            reference_id=a.voice, reference=reference, barge_in_after_s=a.barge_in, api_key=a.api_key,
        )

    meta = {
        **run_meta("python -m latency_bench", argv),
        "levels": levels,
    }
    runs: dict[str, list[dict]] = {}
    if a.url:
        runs["service"] = sweep(a.url, levels, workload(a.url, a.turns), a.ramp, "service")
    else:
        base_levels = [int(x) for x in (a.baseline_concurrency or a.concurrency).split(",")]
        modes = [] if a.only_baseline else [("engine", [], levels, a.turns)]
        if a.baseline:
            modes.append(("naive", ["--naive"], base_levels, a.baseline_turns or a.turns))
        for name, extra, lv, turns in modes:
            server_args = [*sizing_args(max(lv), a.max_running), *(["--ignore-end"] if a.fixed_frames else []),
                           *a.server_arg, *extra]
            with service(a.model, a.device, server_args, out / f"server-{name}.log") as (ws_url, _, health, startup_s, _):
                meta.setdefault("health", health)
                meta[f"{name}_startup_s"] = round(startup_s, 2)
                print(f"{name} server started in {startup_s:.1f} s ({capacity_line(health)})", flush=True)
                meta[f"{name}_turns"] = turns
                runs[name] = sweep(ws_url, lv, workload(ws_url, turns), a.ramp, name)
    data = {"meta": meta, "runs": runs}
    if "naive" in runs and "engine" in runs:
        data["ratios_vs_naive"] = ratios(runs["engine"], runs["naive"])
    write_json(out / "results.json", data)
    title = a.title or f"{meta.get('health', {}).get('model', a.url)} on {meta.get('health', {}).get('device', '?')}"
    plot(out / "ttfa_throughput.png", runs, title)
    for name, levels_out in runs.items():
        print(table(levels_out, f"\n== {name}: {title} =="))
    for r in data.get("ratios_vs_naive", []):
        print(f"c={r['concurrency']}: TTFA p50 {r['ttfa_p50_speedup']:.2f}x faster, frames/s {r['frames_per_s_ratio']:.2f}x vs naive")
    print(f"\nwrote {out / 'results.json'} and {out / 'ttfa_throughput.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
