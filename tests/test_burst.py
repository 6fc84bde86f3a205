"""A burst: 1,024 WebSocket connections opened within one second against a service limited
to far fewer (64 connections, 32 engine streams, 16 waiting). Each one resolves, within a
bound, to one of: served (ready, audio, finish), `busy` (error event + finish), or a
refused handshake (503); both refusals carry the hosted Fish API's
`{"error": "Concurrency limit exceeded", "max_concurrency": N}` besides our code. The
service stays healthy and serves the next request whole."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections import Counter

import httpx
import msgpack
import pytest
import websockets

from engine.engine import EngineConfig
from server import running_server

CONNECTIONS = 1024
FRAMES = 4
HOP = 2048
BOUND_S = 90  # no connection may take longer than this to resolve (on 2 shared CPU cores)
FISH_BUSY = "Concurrency limit exceeded"


@pytest.fixture
def many_files():
    """The test process holds both ends of every connection: the soft limit on open files
    goes up to the hard one for the test (skipped where that is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else hard
    if target < 2300:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 2300")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def connect_and_speak(url: str, delay: float) -> tuple[str, dict]:
    """(outcome, detail): "served", "busy", "refused", or anything else for a test failure."""
    await asyncio.sleep(delay)
    try:
        ws = await websockets.connect(url, max_size=None, open_timeout=BOUND_S)
    except websockets.InvalidStatus as e:
        body = json.loads(e.response.body)
        return ("refused" if e.response.status_code == 503 else f"status {e.response.status_code}"), body
    events = []
    async with ws:
        await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": FRAMES}}))
        await ws.send(msgpack.packb({"event": "text", "text": "A burst of callers."}))
        await ws.send(msgpack.packb({"event": "stop"}))
        try:
            async for frame in ws:
                events.append(msgpack.unpackb(frame))
        except websockets.ConnectionClosed as e:
            return f"closed {e.rcvd.code if e.rcvd else None}", {"events": events}
    kinds = [e["event"] for e in events]
    audio = sum(len(e["audio"]) for e in events if e["event"] == "audio")
    if kinds and kinds[0] == "ready" and kinds[-1] == "finish" and events[-1]["reason"] == "stop" and audio:
        return "served", {"audio": audio}
    if kinds == ["error", "finish"] and events[0]["code"] == "busy":
        return "busy", events[0]
    return "other", {"events": events}


async def resolve(url: str, delay: float) -> tuple[str, dict]:
    try:
        async with asyncio.timeout(BOUND_S):
            outcome, detail = await connect_and_speak(url, delay)
            return outcome, {**detail, "at": time.monotonic()}
    except TimeoutError:
        return "hung", {}
    except OSError as e:  # a refused or reset TCP connection: not a clear answer
        return f"{type(e).__name__}", {"error": str(e)}


def test_a_burst_of_1024_connections_each_gets_ready_or_a_clear_refusal(tmp_path, many_files):
    engine = EngineConfig(max_streams=32, max_queued=16, max_running=8, max_len=1024)
    with running_server(tmp_path, engine=engine, max_connections=64, ignore_end=True) as s:
        async def main():
            t0 = time.monotonic()
            results = await asyncio.gather(*(resolve(s.ws_url, i / CONNECTIONS) for i in range(CONNECTIONS)))
            after = await resolve(s.ws_url, 0)
            return results, after, max(d.get("at", t0) for _, d in results) - t0

        results, after, last = asyncio.run(main())
        health = httpx.get(f"{s.http_url}/v1/health")
        streams = s.services.engine.stats()
    counts = Counter(outcome for outcome, _ in results)
    print(f"\nburst of {CONNECTIONS}: {dict(counts)}; the last resolved {last:.1f} s after the first opened")
    assert set(counts) <= {"served", "busy", "refused"}, [r for r in results if r[0] not in ("served", "busy", "refused")][:5]
    assert counts["served"] >= 32 and counts["refused"] >= CONNECTIONS // 2
    for outcome, detail in results:
        detail.pop("at")
        if outcome == "served":
            assert detail["audio"] == 2 * FRAMES * HOP
        elif outcome == "busy":  # an accepted connection the engine had no stream for
            assert detail["error"] == FISH_BUSY and detail["max_concurrency"] == 32 and "server busy" in detail["message"]
        else:  # the handshake, past --max-connections
            assert detail["error"] == FISH_BUSY and detail["max_concurrency"] == 64 and detail["code"] == "busy"
            assert "--max-connections" in detail["message"]
    assert after[0] == "served" and after[1]["audio"] == 2 * FRAMES * HOP
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert streams["streams_queued"] == 0 and streams["streams_decoding"] == 0
