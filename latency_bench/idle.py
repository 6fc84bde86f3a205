"""`python -m latency_bench.idle`: how many idle open connections one service holds, each
with a cached voice and ready to speak (the issue's target: >= 2,000 on one GPU).

A level opens N WebSocket connections at a bounded rate, all with one voice (a synthetic
reference by default: the first connection prefills it, the others find it cached), waits
for each one's `ready`, holds them all open, then a seeded random sample of K of them each
speak one short turn at once while the rest stay idle, and audio must arrive (TTFA from
the flush). While they are idle it reads the service's /v1/health and /metrics: streams by
phase, KV pages in use (so KV bytes per idle connection) and live sessions; and the RSS of
a service it started. A level fails on any refusal or error, a connection the service
closed while idle, or a speaker without audio; the ladder stops at the first that fails.

    python -m latency_bench.idle --model s2-pro --device cuda --connections 500,1000,2000 --out out/idle
    python -m latency_bench.idle --url ws://host:8765/v1/tts/live --connections 2000

A service it starts gets --max-connections and --max-queued for the top level plus
headroom (latency_bench/serverproc.py), and this process's open-file limit (raised to its
hard limit first: each connection is a file descriptor on both ends). Writes
<out>/results.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from latency_bench.__main__ import capacity_line, run_meta, synthetic_reference
from latency_bench.capacity import search
from latency_bench.jsonfile import write_json
from latency_bench.loadgen import SENTENCES, Workload, add_target_args, add_turn_args, connect, open_session, speak_turn
from latency_bench.openloop import error_code
from latency_bench.report import ms
from latency_bench.serverproc import service, sizing_args
from latency_bench.shares import metrics_url
from latency_bench.stats import ConnectionResult, summary


@dataclass(slots=True)
class IdleResult(ConnectionResult):
    connect_s: float | None = None  # TCP and WebSocket handshake
    ready: bool = False
    lost: str | None = None  # closed by the service while idle: its close code and reason
    codes: list[str] = field(default_factory=list)  # error codes ("busy": refused)


@dataclass(slots=True)
class Signals:
    """One connection's hand-offs with the level: its open ended (ready or failed), it is
    told to speak, its turn ended."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)
    speak: asyncio.Event = field(default_factory=asyncio.Event)
    spoken: asyncio.Event = field(default_factory=asyncio.Event)


def raise_fd_limit() -> int:
    """The open-file soft limit raised to the hard one (a service started later inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


async def hold(r: IdleResult, w: Workload, delay_s: float, sig: Signals, release: asyncio.Event) -> None:
    await asyncio.sleep(delay_s)
    t0 = time.perf_counter()
    try:
        async with connect(w) as ws:
            r.connect_s = time.perf_counter() - t0
            async with asyncio.timeout(w.timeout_s):
                await open_session(ws, w, r.index, r)
            r.ready = True
            sig.opened.set()
            closed = asyncio.ensure_future(ws.wait_closed())
            await _first(closed, sig.speak.wait(), release.wait())
            if sig.speak.is_set() and not closed.done():
                async with asyncio.timeout(w.timeout_s):
                    await speak_turn(ws, w, SENTENCES[r.index % len(SENTENCES)], r)
                sig.spoken.set()
                await _first(closed, release.wait())
            if closed.done():
                r.lost = f"{ws.close_code} {ws.close_reason}".strip()
            closed.cancel()
    except Exception as e:  # every failure is counted, none stops the level
        r.codes += [x.split(":", 1)[0] for x in r.errors] or [error_code(e)]
        r.errors.append(f"{type(e).__name__}: {e}"[:200])
    finally:
        sig.opened.set()
        sig.spoken.set()


async def _first(*aws) -> None:
    """Until the first of `aws` is done (the others keep running or are cancelled)."""
    futures = [asyncio.ensure_future(a) for a in aws]
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    for f in futures[1:]:  # the first is the caller's (the connection's close), kept
        if not f.done():
            f.cancel()


async def run_level(n: int, a: argparse.Namespace, w: Workload, http: str, pid: int | None) -> dict:
    results = [IdleResult(i) for i in range(n)]
    signals = [Signals() for _ in range(n)]
    release = asyncio.Event()
    start = time.perf_counter()
    tasks = [asyncio.create_task(hold(r, w, i / a.rate, s, release)) for i, (r, s) in enumerate(zip(results, signals))]
    pending = [asyncio.ensure_future(s.opened.wait()) for s in signals]
    while not all(p.done() for p in pending):
        await asyncio.wait(pending, timeout=2.0)
        log(f"  {time.perf_counter() - start:6.1f}s ready={sum(r.ready for r in results)}/{n} "
            f"failed={sum(bool(r.codes) for r in results)}")
    opened_s = time.perf_counter() - start
    await asyncio.sleep(a.hold)
    idle = await asyncio.to_thread(server_view, http, pid)
    held = [r for r in results if r.ready and r.lost is None]
    speakers = random.Random(a.seed).sample(held, min(a.speakers, len(held)))
    for r in speakers:
        signals[r.index].speak.set()
    await asyncio.gather(*(signals[r.index].spoken.wait() for r in speakers))
    release.set()
    await asyncio.gather(*tasks)
    return aggregate(n, results, speakers, idle, opened_s)


def aggregate(n: int, results: list[IdleResult], speakers: list[IdleResult], idle: dict | None,
              opened_s: float) -> dict:
    codes = Counter(c for r in results for c in r.codes)
    held = sum(r.ready and r.lost is None for r in results)
    heard = [r for r in speakers if r.turns and r.turns[0].chunks]
    level = {
        "connections": n,
        "ready": sum(r.ready for r in results),
        "held": held,
        "refusals": sum("busy" in r.codes for r in results),
        "errors": sum(bool(r.codes) and "busy" not in r.codes for r in results),
        "errors_by_code": dict(codes),
        "error_samples": [e for r in results for e in r.errors][:5],
        "lost": sum(r.lost is not None for r in results),
        "lost_samples": [r.lost for r in results if r.lost is not None][:5],
        "open_s": opened_s,  # from the first connection's start to the last one's ready (or failure)
        "connect_s": summary([r.connect_s for r in results if r.connect_s is not None]),
        "open_to_ready_s": summary([r.open_to_ready for r in results if r.open_to_ready is not None]),
        "voice_cached": sum(bool(r.voice_cached) for r in results),
        "speakers": len(speakers),
        "speakers_with_audio": len(heard),
        "ttfa_s": summary([r.turns[0].ttfa for r in heard]),
        "server": idle,
        "kv_bytes_per_idle_connection": None,
    }
    kv = (idle or {}).get("kv_pages") or {}
    if "pages_used" in kv and "page_bytes" in kv and held:
        level["kv_bytes_per_idle_connection"] = kv["pages_used"] * kv["page_bytes"] / held
    return level


def verdict(level: dict) -> tuple[bool, str]:
    why = [f"{level[k]} {what}" for k, what in (("refusals", "refused"), ("errors", "error(s)"),
                                                ("lost", "closed by the service while idle")) if level[k]]
    if level["speakers_with_audio"] < level["speakers"]:
        why.append(f"{level['speakers'] - level['speakers_with_audio']} of {level['speakers']} speakers got no audio")
    if level["held"] < level["connections"]:
        why.append(f"{level['held']} of {level['connections']} held")
    return not why, "; ".join(why)


def server_view(http: str, pid: int | None) -> dict | None:
    """The service now: /v1/health's streams and KV pages, /metrics' live sessions and
    event-loop lag, and the process's RSS (when it runs here); None when unreachable."""
    try:
        with urllib.request.urlopen(f"{http}/v1/health", timeout=10) as r:
            health = json.loads(r.read())
        with urllib.request.urlopen(f"{http}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    gauges = dict(line.split(" ", 1) for line in text.splitlines()
                  if line.startswith(("realtime_sessions_active ", "realtime_loop_lag_max_seconds ")))
    return {"streams": health.get("streams"), "kv_pages": health.get("kv_pages"),
            "sessions_active": float(gauges.get("realtime_sessions_active", "nan")),
            "loop_lag_max_s": float(gauges.get("realtime_loop_lag_max_seconds", "nan")), "rss_bytes": rss_bytes(pid)}


def rss_bytes(pid: int | None) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text() if pid else ""
    except OSError:
        return None
    kib = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
    return int(kib[0]) * 1024 if kib else None


def settle(http: str, timeout_s: float = 30.0) -> None:
    """Until the last level's connections are gone from the service (or `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = server_view(http, None)
        if view is None or not view["sessions_active"] > 0:
            return
        time.sleep(0.5)


def table(levels: list[dict], title: str) -> str:
    lines = [title, f"{'conn':>6} {'ready':>6} {'held':>6} {'refused':>7} {'errors':>6} {'lost':>5} {'ready p50':>9} "
                    f"{'p99':>6} {'spoke':>6} {'TTFA p50':>9} {'p99':>6} {'KV pages':>8} {'KiB/idle':>8} "
                    f"{'RSS MiB':>8}  held"]
    for lv in levels:
        o, t, view = lv["open_to_ready_s"], lv["ttfa_s"], lv["server"] or {}
        used = (view.get("kv_pages") or {}).get("pages_used")
        per = lv["kv_bytes_per_idle_connection"]
        rss = view.get("rss_bytes")
        lines.append(
            f"{lv['connections']:>6} {lv['ready']:>6} {lv['held']:>6} {lv['refusals']:>7} {lv['errors']:>6} "
            f"{lv['lost']:>5} {ms(o['p50']):>9} {ms(o['p99']):>6} {lv['speakers_with_audio']:>3}/{lv['speakers']:<2} "
            f"{ms(t['p50']):>9} {ms(t['p99']):>6} {'-' if used is None else used:>8} "
            f"{'-' if per is None else f'{per / 1024:.1f}':>8} {'-' if rss is None else f'{rss / 2**20:.0f}':>8}  "
            f"{lv['verdict']}")
    lines.append("(ready: open-to-ready ms, `start` to `ready`; spoke: sampled speakers that got audio; TTFA in ms "
                 "from the flush; KV pages: in use while idle; KiB/idle: their bytes per held connection)")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latency_bench.idle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    add_turn_args(p, text_mode="sentences")
    p.set_defaults(max_new_tokens=40, synthetic_reference=7.0)
    p.add_argument("--connections", default="500,1000,2000", help="levels, comma-separated; stops at the first that fails")
    p.add_argument("--rate", type=float, default=200.0, help="connections opened per second")
    p.add_argument("--hold", type=float, default=5.0, help="seconds all are held idle before the sample speaks")
    p.add_argument("--speakers", type=int, default=16, help="connections of a level that each speak one turn")
    p.add_argument("--seed", type=int, default=0, help="which connections speak")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a connection may take to be ready, and a turn")
    p.add_argument("--max-running", type=int, help="the decode batch cap of a started service (default: the service's)")
    p.add_argument("--out", default="out/idle")
    a = p.parse_args(argv)
    if a.rate <= 0 or a.speakers < 0 or a.hold < 0:
        p.error("--rate must be positive, --speakers and --hold not negative")
    return a


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(a: argparse.Namespace, url: str, pid: int | None) -> dict:
    reference = synthetic_reference(a.synthetic_reference) if a.synthetic_reference else None
    w = Workload(url=url, max_new_tokens=a.max_new_tokens, fixed_frames=a.fixed_frames, format=a.format,
                 reference_id=a.voice, reference=reference, api_key=a.api_key, timeout_s=a.timeout)
    http = metrics_url(url).removesuffix("/metrics")
    levels: list[dict] = []

    def level(n: int) -> bool:
        if levels:
            settle(http)
        log(f"[idle] {n} connections at {a.rate:g}/s, {min(a.speakers, n)} then speak")
        lv = asyncio.run(run_level(n, a, w, http, pid))
        held, why = verdict(lv)
        lv["held_level"], lv["verdict"] = held, "held" if held else f"failed: {why}"
        log(f"[idle] {n}: {lv['verdict']}")
        levels.append(lv)
        return held

    s = search(level, [int(x) for x in a.connections.split(",") if x.strip()])
    return {"levels": levels, "capacity": {"connections": s.capacity, "failed_at": s.failed_at, "tried": s.tried}}


def main(argv=None) -> int:
    a = parse_args(argv)
    out = Path(a.out)
    meta = {
        **run_meta("python -m latency_bench.idle", argv),
        "rate_per_s": a.rate, "hold_s": a.hold, "speakers": a.speakers, "seed": a.seed,
        "synthetic_reference_s": a.synthetic_reference, "fd_limit": raise_fd_limit(),
    }
    if a.url:
        data = measure(a, a.url, None)
    else:
        top = max(int(x) for x in a.connections.split(",") if x.strip())
        server_args = [*sizing_args(top, a.max_running), *(["--ignore-end"] if a.fixed_frames else []), *a.server_arg]
        with service(a.model, a.device, server_args, out / "server.log") as (ws_url, _, health, startup_s, pid):
            meta["health"], meta["startup_s"] = health, round(startup_s, 2)
            log(f"server started in {startup_s:.1f} s ({capacity_line(health)})")
            data = measure(a, ws_url, pid)
    data = {"meta": meta, **data}
    write_json(out / "results.json", data)
    health = meta.get("health", {})
    print(table(data["levels"], f"\n== idle connections: {health.get('model', a.url)} on {health.get('device', '?')} =="))
    cap = data["capacity"]
    print(f"held: {cap['connections'] if cap['connections'] is not None else 'none'} idle connections ready to speak; "
          + (f"first failing level: {cap['failed_at']}" if cap["failed_at"] is not None else "no level failed"))
    print(f"\nwrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
