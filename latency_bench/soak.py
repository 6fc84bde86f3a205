"""`python -m latency_bench.soak`: a bounded run of mixed traffic, watching the service's
process for leaks.

Live clients open sessions one after another and speak turns; a turn is spoken to its
`turn_end`, cancelled mid-turn, or abandoned with an abrupt disconnect (no close
handshake). Beside them a voice client stores a voice (`POST /v1/voices`), speaks a turn
in it and deletes it, and an HTTP client sends one-shot `POST /v1/tts` requests. Every few
seconds it samples the service's process: RSS, open file descriptors and threads (from
/proc, or psutil where installed), device memory where exported (a /metrics gauge, else
nvidia-smi's figure for the process), live sessions and KV pages.

The first 20% of the duration is warm-up. The clients then pause until the service is idle
(its rest level: fds, threads), go on for the rest of the duration, and stop; the service
must come back to that rest level. It passes with:
  - RSS growth under 5%: the mean of the last 20% of the duration against the mean of the
    20% right after warm-up (device memory too, where measured);
  - fds and threads at rest after the run within a small slack of the rest level after
    warm-up, and no engine stream left open;
  - every flushed turn ended by `turn_end`, `cancelled` (naming it) or an `error` event
    (or the client's own disconnect): no unaccounted turn;
  - no `internal` error, at the clients or in the service's /metrics.

    python -m latency_bench.soak --model s2-pro --device cuda --duration 1800 --clients 32 --out out/soak
    python -m latency_bench.soak --url ws://host:8765/v1/tts/live --pid 1234 --duration 1800

Writes <out>/results.json and prints a table. A service it starts gets --ignore-end with
--fixed-frames, and connections for the clients plus headroom (latency_bench/serverproc.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import websockets

from latency_bench.__main__ import capacity_line, run_meta, synthetic_reference
from latency_bench.jsonfile import write_json
from latency_bench.loadgen import SENTENCES, Workload, add_target_args, add_turn_args, connect, send_text
from latency_bench.serverproc import service, sizing_args
from latency_bench.shares import metrics_url

WARMUP_SHARE = 0.2  # of the duration: warm-up, and the windows memory is compared over
RSS_GROWTH_LIMIT = 0.05
FD_SLACK, THREAD_SLACK = 4, 2  # at rest after the run vs after warm-up (a socket in TIME_WAIT's close, a pool thread)
MODES = ("speak", "cancel", "disconnect")  # what a live client does with a flushed turn
ERRORS = re.compile(r'^realtime_errors_total\{code="([^"]+)"\} (\d+)', re.M)


@dataclass(slots=True)
class Tally:
    """What the clients saw, summed over the run."""

    turns: Counter = field(default_factory=Counter)  # by outcome: turn_end, cancelled, error, disconnected, unaccounted
    errors: Counter = field(default_factory=Counter)  # by code (error events, HTTP error bodies, client exceptions)
    sessions: int = 0
    voices: Counter = field(default_factory=Counter)  # created, deleted
    http_ok: int = 0
    unaccounted: list[str] = field(default_factory=list)  # what happened to the first few


@dataclass(slots=True)
class Soak:
    a: argparse.Namespace
    w: Workload
    http: str
    pid: int | None
    tally: Tally = field(default_factory=Tally)
    samples: list[dict] = field(default_factory=list)
    phase: str = "warmup"
    phase_started: float = 0.0


# --- the service's process --------------------------------------------------------------

def process_view(pid: int | None) -> dict:
    """RSS bytes, open fds and threads of a process on this machine (None: not here)."""
    if pid is None:
        return {"rss_bytes": None, "fds": None, "threads": None}
    try:
        import psutil

        p = psutil.Process(pid)
        return {"rss_bytes": p.memory_info().rss, "fds": p.num_fds(), "threads": p.num_threads()}
    except ImportError:
        pass
    except Exception:  # psutil.NoSuchProcess and kin: the process is gone
        return {"rss_bytes": None, "fds": None, "threads": None}
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"rss_bytes": None, "fds": None, "threads": None}
    return {"rss_bytes": int(status["VmRSS"].split()[0]) * 1024, "fds": fds, "threads": int(status["Threads"])}


def device_memory(metrics: str, pid: int | None) -> int | None:
    """Device bytes the service holds: a /metrics gauge if it exports one, else what
    nvidia-smi reports for its process, else for the whole GPU (in a container nvidia-smi
    may list the host's pids; a soak has the machine to itself); None on a CPU."""
    for line in metrics.splitlines():
        if re.match(r"^\w*(device|cuda|gpu)_memory\w*_bytes ", line):
            return int(float(line.split()[1]))
    if pid is None or not shutil.which("nvidia-smi"):
        return None
    apps = _nvidia_smi("--query-compute-apps=pid,used_memory")
    used = [int(mib) for p, _, mib in (row.partition(",") for row in apps.splitlines()) if p.strip() == str(pid)]
    if not used:
        used = [int(mib) for mib in _nvidia_smi("--query-gpu=memory.used").split() if mib.isdigit()]
    return sum(used) * 2**20 if used else None


def _nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def server_view(http: str, pid: int | None) -> dict:
    """One sample: the process, and the service's own view (sessions, streams, KV pages, errors)."""
    view: dict = {"t": time.monotonic(), **process_view(pid)}
    try:
        with urllib.request.urlopen(f"{http}/v1/health", timeout=10) as r:
            health = json.loads(r.read())
        with urllib.request.urlopen(f"{http}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    except OSError as e:
        return {**view, "unreachable": str(e)[:200]}
    sessions = re.search(r"^realtime_sessions_active (\d+)", metrics, re.M)
    return {**view, "device_bytes": device_memory(metrics, pid), "status": health.get("status"),
            "sessions_active": int(sessions.group(1)) if sessions else None,
            "streams": sum((health.get("streams") or {}).values()),
            "kv_pages_used": (health.get("kv_pages") or {}).get("pages_used"),
            "errors": {code: int(n) for code, n in ERRORS.findall(metrics)}}


async def sampler(s: Soak) -> None:
    while True:
        view = await asyncio.to_thread(server_view, s.http, s.pid)
        s.samples.append({**view, "phase": s.phase, "phase_t": view["t"] - s.phase_started})
        await asyncio.sleep(s.a.sample_every)


# --- live clients -------------------------------------------------------------------------

class Ended(Exception):
    """The session is over (an error event, the connection closed): its turn's outcome."""

    def __init__(self, outcome: str, why: str = "") -> None:
        super().__init__(why or outcome)
        self.outcome = outcome


async def next_event(ws, s: Soak) -> dict:
    try:
        async with asyncio.timeout(s.a.turn_timeout):
            event = msgpack.unpackb(await ws.recv())
    except TimeoutError:
        raise Ended("unaccounted", f"nothing for {s.a.turn_timeout:g} s") from None
    except websockets.ConnectionClosed as e:
        raise Ended("unaccounted", f"closed by the service ({e.rcvd.code if e.rcvd else 'no close frame'})") from None
    if event.get("event") == "error":
        s.tally.errors[event.get("code", "?")] += 1
        raise Ended("error")
    if event.get("event") == "finish":
        raise Ended("unaccounted", "finish while a turn was open")
    return event


async def until(ws, s: Soak, turn: int, stop_on_audio: bool = False, deadline: float | None = None) -> str | None:
    """Reads the turn's events: its `turn_end` ("turn_end"), or with stop_on_audio its first
    audio, or until `deadline` (monotonic), whichever first (None: not ended yet)."""
    while True:
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            async with asyncio.timeout(timeout):
                event = await next_event(ws, s)
        except TimeoutError:
            return None
        if event["event"] == "turn_end" and event["turn"] == turn:
            return "turn_end"
        if event["event"] == "audio" and stop_on_audio and event.get("turn") == turn:
            return None


async def after_cancel(ws, s: Soak, turn: int, ended: str | None) -> str:
    """Reads up to the `cancelled` acknowledgement: the turn was dropped (it names it) or
    had ended already (its `turn_end` came first)."""
    while True:
        event = await next_event(ws, s)
        if event["event"] == "turn_end" and event["turn"] == turn:
            ended = "turn_end"
        elif event["event"] == "cancelled":
            if turn in event["turns"]:
                return "cancelled"
            if ended:
                return ended
            raise Ended("unaccounted", f"cancelled {event} names neither turn {turn} nor follows its turn_end")


async def speak_turn(ws, s: Soak, turn: int, mode: str, rng: random.Random) -> str:
    await send_text(ws, s.w, SENTENCES[rng.randrange(len(SENTENCES))])
    await ws.send(msgpack.packb({"event": "flush"}))
    if mode == "speak":
        return await until(ws, s, turn)
    # mid-turn: at its first audio, or sooner
    ended = await until(ws, s, turn, stop_on_audio=True, deadline=time.monotonic() + rng.uniform(0.0, 0.5))
    if mode == "disconnect":
        ws.transport.abort()  # no close handshake: the service finds a dead socket
        return ended or "disconnected"
    await ws.send(msgpack.packb({"event": "cancel"}))
    return await after_cancel(ws, s, turn, ended)


async def live_session(s: Soak, rng: random.Random, request: dict, deadline: float) -> None:
    async with connect(s.w) as ws:
        s.tally.sessions += 1
        await ws.send(msgpack.packb({"event": "start", "request": request}))
        try:
            while (event := await next_event(ws, s))["event"] != "ready":
                pass
        except Ended:
            return  # refused at start (counted by its code): no turn was flushed
        turn = 1
        for _ in range(rng.randint(1, 5)):
            if time.monotonic() >= deadline:
                break
            mode = rng.choices(MODES, weights=s.a.mix)[0]
            try:
                outcome = await speak_turn(ws, s, turn, mode, rng)
            except Ended as e:
                note(s, e.outcome, f"turn {turn} ({mode}): {e}")
                return
            note(s, outcome, "")
            if mode == "disconnect":
                return
            turn += 1
            await asyncio.sleep(rng.uniform(0.0, s.a.think))
        if rng.random() < 0.5:  # a polite end, or just a close
            await ws.send(msgpack.packb({"event": "stop"}))
            async with asyncio.timeout(s.a.turn_timeout):
                while (event := msgpack.unpackb(await ws.recv()))["event"] != "finish":
                    if event["event"] == "error":
                        s.tally.errors[event.get("code", "?")] += 1


def note(s: Soak, outcome: str, why: str) -> None:
    s.tally.turns[outcome] += 1
    if outcome == "unaccounted" and len(s.tally.unaccounted) < 10:
        s.tally.unaccounted.append(why)


async def live_client(s: Soak, index: int, deadline: float) -> None:
    rng = random.Random(s.a.seed * 1000 + index)
    while time.monotonic() < deadline:
        try:
            await live_session(s, rng, s.w.request(seed=rng.randrange(2**31)), deadline)
        except Exception as e:  # the service went away under it, a refused handshake: counted, never fatal
            s.tally.errors[f"client:{type(e).__name__}"] += 1
            await asyncio.sleep(1.0)


# --- stored voices and one-shot HTTP ------------------------------------------------------

def http_call(method: str, url: str, api_key: str | None, body: dict | None = None) -> tuple[int, bytes]:
    data = msgpack.packb(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/msgpack"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_error(s: Soak, status: int, body: bytes) -> None:
    try:
        code = json.loads(body).get("error", f"http_{status}")
    except ValueError:
        code = f"http_{status}"
    s.tally.errors[code] += 1


async def voice_client(s: Soak, deadline: float, reference: tuple[bytes, str]) -> None:
    """Stores a voice, speaks a turn in it, deletes it; again and again."""
    rng = random.Random(s.a.seed - 1)
    n = 0
    while time.monotonic() < deadline:
        n += 1
        voice_id = f"soak-{s.a.seed}-{os.getpid()}-{n}"
        body = {"name": "soak", "id": voice_id, "references": [{"audio": reference[0], "text": reference[1]}]}
        status, reply = await asyncio.to_thread(http_call, "POST", f"{s.http}/v1/voices", s.w.api_key, body)
        if status != 201:
            http_error(s, status, reply)
            await asyncio.sleep(1.0)
            continue
        s.tally.voices["created"] += 1
        try:
            request = {k: v for k, v in s.w.request(seed=n).items() if k != "references"}
            await live_session(s, rng, {**request, "reference_id": voice_id}, deadline)
        except Exception as e:
            s.tally.errors[f"client:{type(e).__name__}"] += 1
        status, reply = await asyncio.to_thread(http_call, "DELETE", f"{s.http}/v1/voices/{voice_id}", s.w.api_key)
        if status == 204:
            s.tally.voices["deleted"] += 1
        else:
            http_error(s, status, reply)
        await asyncio.sleep(rng.uniform(0.2, 1.0))


async def http_client(s: Soak, deadline: float) -> None:
    """One-shot `POST /v1/tts`, whole body (stream=false): 200 with audio, or a named error."""
    rng = random.Random(s.a.seed - 2)
    while time.monotonic() < deadline:
        body = {**s.w.request(seed=rng.randrange(2**31)), "text": SENTENCES[rng.randrange(len(SENTENCES))]}
        status, reply = await asyncio.to_thread(http_call, "POST", f"{s.http}/v1/tts?stream=false", s.w.api_key, body)
        if status == 200 and reply:
            s.tally.http_ok += 1
        else:
            http_error(s, status, reply)
        await asyncio.sleep(rng.uniform(0.2, 1.0))


# --- the run ------------------------------------------------------------------------------

async def traffic(s: Soak, seconds: float, phase: str, reference: tuple[bytes, str]) -> None:
    s.phase, s.phase_started = phase, time.monotonic()
    deadline = s.phase_started + seconds
    clients = [live_client(s, i, deadline) for i in range(s.a.clients)]
    if s.a.voices:
        clients.append(voice_client(s, deadline, reference))
    if s.a.http:
        clients.append(http_client(s, deadline))
    await asyncio.gather(*clients)


async def rest(s: Soak, phase: str) -> dict:
    """Until the service holds no session and no engine stream (or --settle seconds), then
    its rest level: the median of three samples a sample period apart."""
    s.phase, s.phase_started = phase, time.monotonic()
    deadline = s.phase_started + s.a.settle
    view = {}
    while time.monotonic() < deadline:
        view = await asyncio.to_thread(server_view, s.http, s.pid)
        if view.get("sessions_active") == 0 and view.get("streams") == 0:
            break
        await asyncio.sleep(0.5)
    views = []
    for _ in range(3):
        await asyncio.sleep(min(1.0, s.a.sample_every))
        views.append(await asyncio.to_thread(server_view, s.http, s.pid))
    level = {k: _median([v.get(k) for v in views]) for k in ("rss_bytes", "fds", "threads", "kv_pages_used")}
    return {**level, "sessions_active": views[-1].get("sessions_active"), "streams": views[-1].get("streams"),
            "settled_s": round(time.monotonic() - s.phase_started, 1)}


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


async def run(s: Soak) -> dict:
    reference = synthetic_reference(s.a.voice_seconds)
    first = await asyncio.to_thread(server_view, s.http, s.pid)
    watch = asyncio.create_task(sampler(s))
    warmup_s = s.a.duration * WARMUP_SHARE
    try:
        log(f"[soak] warm-up {warmup_s:.0f} s")
        await traffic(s, warmup_s, "warmup", reference)
        rest_warm = await rest(s, "rest-warmup")
        log(f"[soak] rest after warm-up: {rest_warm}; traffic {s.a.duration - warmup_s:.0f} s")
        await traffic(s, s.a.duration - warmup_s, "main", reference)
        rest_end = await rest(s, "rest-end")
        log(f"[soak] rest after the run: {rest_end}")
    finally:
        watch.cancel()
    last = await asyncio.to_thread(server_view, s.http, s.pid)
    server_errors = Counter(last.get("errors") or {})
    server_errors.subtract(first.get("errors") or {})
    return evaluate(s, rest_warm, rest_end, {k: v for k, v in server_errors.items() if v})


def window_mean(samples: list[dict], key: str, lo: float, hi: float) -> float | None:
    xs = [x[key] for x in samples if x["phase"] == "main" and lo <= x["phase_t"] < hi and x.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def growth(samples: list[dict], key: str, duration: float) -> dict:
    """Mean over the 20% of the duration right after warm-up vs the last 20%."""
    main_s = duration * (1 - WARMUP_SHARE)
    span = duration * WARMUP_SHARE
    base, end = window_mean(samples, key, 0.0, span), window_mean(samples, key, main_s - span, main_s + 60)
    return {"base": base, "end": end, "growth": (end / base - 1) if base and end is not None else None}


def evaluate(s: Soak, rest_warm: dict, rest_end: dict, server_errors: dict) -> dict:
    t = s.tally
    rss, device = growth(s.samples, "rss_bytes", s.a.duration), growth(s.samples, "device_bytes", s.a.duration)
    checks = {  # name -> (passed, or None: not measured; what was seen)
        "rss_growth": _limit(rss["growth"], lambda g: g < RSS_GROWTH_LIMIT, f"< {RSS_GROWTH_LIMIT:.0%}"),
        "device_growth": _limit(device["growth"], lambda g: g < RSS_GROWTH_LIMIT, f"< {RSS_GROWTH_LIMIT:.0%}"),
        "fds_at_rest": _rest(rest_warm["fds"], rest_end["fds"], FD_SLACK),
        "threads_at_rest": _rest(rest_warm["threads"], rest_end["threads"], THREAD_SLACK),
        "streams_released": (rest_end["streams"] == 0 and rest_end["sessions_active"] == 0,
                             f"{rest_end['streams']} streams, {rest_end['sessions_active']} sessions"),
        "unaccounted_turns": (t.turns["unaccounted"] == 0, str(t.turns["unaccounted"])),
        "internal_errors": (t.errors["internal"] == 0 and server_errors.get("internal", 0) == 0,
                            f"{t.errors['internal']} seen, {server_errors.get('internal', 0)} counted"),
        "turns_spoken": (t.turns["turn_end"] > 0, f"{t.turns['turn_end']} turn_end"),
    }
    return {
        "passed": all(ok is not False for ok, _ in checks.values()),
        "checks": {k: {"passed": ok, "seen": seen} for k, (ok, seen) in checks.items()},
        "rss": rss, "device_memory": device, "rest_after_warmup": rest_warm, "rest_after_run": rest_end,
        "turns": dict(t.turns), "errors_by_code": dict(t.errors), "server_errors_by_code": server_errors,
        "sessions": t.sessions, "voices": dict(t.voices), "http_ok": t.http_ok, "unaccounted_samples": t.unaccounted,
        "samples": s.samples,
    }


def _limit(value: float | None, ok, bound: str) -> tuple[bool | None, str]:
    return (None, "not measured") if value is None else (bool(ok(value)), f"{value:+.2%} ({bound})")


def _rest(before: float | None, after: float | None, slack: int) -> tuple[bool | None, str]:
    if before is None or after is None:
        return None, "not measured"
    return after <= before + slack, f"{before:.0f} -> {after:.0f} (+{slack} allowed)"


# --- report -------------------------------------------------------------------------------

def table(r: dict, title: str) -> str:
    mib = lambda b: "-" if b is None else f"{b / 2**20:.0f}"  # noqa: E731
    rw, re_ = r["rest_after_warmup"], r["rest_after_run"]
    lines = [title,
             f"RSS MiB        after warm-up {mib(r['rss']['base'])}, last 20% {mib(r['rss']['end'])}; at rest "
             f"{mib(rw['rss_bytes'])} -> {mib(re_['rss_bytes'])}",
             f"device MiB     after warm-up {mib(r['device_memory']['base'])}, last 20% {mib(r['device_memory']['end'])}",
             f"at rest        fds {rw['fds']} -> {re_['fds']}, threads {rw['threads']} -> {re_['threads']}, "
             f"KV pages {rw['kv_pages_used']} -> {re_['kv_pages_used']}",
             f"traffic        {r['sessions']} sessions, turns {r['turns']}, voices {r['voices']}, "
             f"HTTP ok {r['http_ok']}",
             f"errors         clients {r['errors_by_code'] or '{}'}; service {r['server_errors_by_code'] or '{}'}",
             ""]
    for name, c in r["checks"].items():
        verdict = {True: "ok", False: "FAILED", None: "-"}[c["passed"]]
        lines.append(f"{name:<18} {verdict:<7} {c['seen']}")
    lines.append(f"soak: {'passed' if r['passed'] else 'FAILED'}")
    if r["unaccounted_samples"]:
        lines.append("unaccounted: " + "; ".join(r["unaccounted_samples"]))
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latency_bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    add_turn_args(p, text_mode="sentences")
    p.set_defaults(max_new_tokens=40)
    p.add_argument("--pid", type=int, help="with --url: the service's process id on this machine (RSS, fds, threads)")
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (the first 20%% warm-up)")
    p.add_argument("--clients", type=int, default=8, help="live clients at once, each opening session after session")
    p.add_argument("--mix", type=lambda t: [float(x) for x in t.split(",")], default=[0.6, 0.25, 0.15],
                   help="weights of a turn spoken to its end, cancelled mid-turn, abandoned by a disconnect")
    p.add_argument("--no-voices", dest="voices", action="store_false", help="no client storing and deleting voices")
    p.add_argument("--no-http", dest="http", action="store_false", help="no client of POST /v1/tts")
    p.add_argument("--voice-seconds", type=float, default=3.0, help="length of a stored voice's reference")
    p.add_argument("--think", type=float, default=0.5, help="most seconds between a session's turns")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples of the service")
    p.add_argument("--turn-timeout", type=float, default=60.0, help="a turn with no event this long is unaccounted")
    p.add_argument("--settle", type=float, default=30.0, help="most seconds to wait for the service to be idle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/soak")
    a = p.parse_args(argv)
    if a.duration <= 0 or a.clients < 1 or len(a.mix) != len(MODES) or a.sample_every <= 0:
        p.error(f"--duration and --sample-every must be positive, --clients at least 1, --mix {len(MODES)} weights")
    if a.pid and not a.url:
        p.error("--pid goes with --url (a started service's pid is known)")
    return a


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(a: argparse.Namespace, url: str, pid: int | None) -> dict:
    w = Workload(url=url, text_mode=a.text_mode, tokens_per_s=a.tokens_per_s, max_new_tokens=a.max_new_tokens,
                 fixed_frames=a.fixed_frames, format=a.format, reference_id=a.voice, api_key=a.api_key,
                 timeout_s=a.turn_timeout,
                 reference=synthetic_reference(a.synthetic_reference) if a.synthetic_reference else None)
    s = Soak(a, w, metrics_url(url).removesuffix("/metrics"), pid)
    return asyncio.run(run(s))


def main(argv=None) -> int:
    a = parse_args(argv)
    out = Path(a.out)
    meta = {
        **run_meta("python -m latency_bench.soak", argv),
        "duration_s": a.duration, "clients": a.clients, "mix": dict(zip(MODES, a.mix)), "seed": a.seed,
    }
    if a.url:
        result = measure(a, a.url, a.pid)
    else:
        connections = a.clients + 2  # the voice and HTTP clients' connections
        server_args = [*sizing_args(connections), *(["--ignore-end"] if a.fixed_frames else []), *a.server_arg]
        with service(a.model, a.device, server_args, out / "server.log") as (ws_url, _, health, startup_s, pid):
            meta["health"], meta["startup_s"] = health, round(startup_s, 2)
            log(f"server started in {startup_s:.1f} s ({capacity_line(health)})")
            result = measure(a, ws_url, pid)
    write_json(out / "results.json", {"meta": meta, **result})
    health = meta.get("health", {})
    print(table(result, f"\n== soak: {health.get('model', a.url)} on {health.get('device', '?')}, {a.duration:g} s, "
                        f"{a.clients} live clients =="))
    print(f"\nwrote {out / 'results.json'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
