"""GET /v1/ready and the autoscaling signals of /metrics, on a real server: ready while one
more conversation fits; 503 when the connections are at --max-connections, when the KV
pages admit no more and the wait queue is full, while warming up and while draining; TTFA
p99 over the last minute; gauges never named like counters."""

from __future__ import annotations

import asyncio
import math
import re

import httpx
import msgpack
import websockets
from starlette.testclient import TestClient

from engine.engine import Engine, EngineConfig
from realtime.app import build_app
from realtime.config import ServiceConfig
from realtime.metrics import Metrics, RecentValues
from server import bundle, running_server


def scrape(http_url: str) -> dict[str, float]:
    text = httpx.get(f"{http_url}/metrics").text
    return {name: float(value) for name, value in re.findall(r"^([a-z0-9_]+) (\S+)$", text, re.M)}


async def started(url: str, **request):
    ws = await websockets.connect(url, max_size=None)
    await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", **request}}))
    assert msgpack.unpackb(await ws.recv())["event"] == "ready"
    return ws


async def speaking(url: str, frames: int):
    """A connection in the middle of a long turn."""
    ws = await started(url, max_new_tokens=frames)
    await ws.send(msgpack.packb({"event": "text", "text": "Talk for a long time."}))
    await ws.send(msgpack.packb({"event": "flush"}))
    while msgpack.unpackb(await ws.recv())["event"] != "audio":
        pass
    return ws


def test_ready_turns_off_at_max_connections_and_back_on_when_one_leaves(tmp_path):
    with running_server(tmp_path, max_connections=2) as s:
        async def main():
            ready = [httpx.get(f"{s.http_url}/v1/ready")]
            a = await started(s.ws_url)
            ready.append(httpx.get(f"{s.http_url}/v1/ready"))
            b = await websockets.connect(s.ws_url)  # not started yet: it still holds a place
            ready.append(httpx.get(f"{s.http_url}/v1/ready"))
            full = scrape(s.http_url)
            await b.close()
            await asyncio.sleep(0.2)
            ready.append(httpx.get(f"{s.http_url}/v1/ready"))
            await a.close()
            return ready, full

        ready, full = asyncio.run(main())
        assert [r.status_code for r in ready] == [200, 200, 503, 200]
        assert ready[0].json() == {"status": "ready"}
        assert ready[2].json()["reason"] == "full: 2 connections are open (--max-connections)"
        assert full["realtime_ready"] == 0 and full["realtime_capacity_used_ratio"] == 1.0
        assert full["realtime_sessions_active"] == 2


def test_ready_turns_off_when_the_kv_pages_admit_no_more_and_the_queue_is_full(tmp_path):
    """A pool with room for one speaking stream and a wait queue of one: while it speaks, a
    new conversation would still wait (ready); once one waits, the next would be refused
    (503); the free share of pages and the queue depth say so on /metrics."""
    from engine.kv_cache import KVCache

    tiny = bundle("tiny")
    page_bytes = KVCache.bytes_per_position(tiny.config, tiny.dtype) * 16
    voice_pages = -(-tiny.prompts.voice_prefix(None).shape[1] // 16)
    config = EngineConfig(max_running=2, max_queued=1, max_len=320, kv_page_size=16,
                          kv_cache_bytes=(1 + voice_pages + 20) * page_bytes)
    with running_server(tmp_path, engine=config, ignore_end=True) as s:
        async def main():
            idle = scrape(s.http_url)
            first = await speaking(s.ws_url, 2000)
            one_speaking = httpx.get(f"{s.http_url}/v1/ready").status_code, scrape(s.http_url)
            second = await websockets.connect(s.ws_url)
            await second.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
            await asyncio.sleep(1.0)
            waiting = httpx.get(f"{s.http_url}/v1/ready"), scrape(s.http_url)
            await first.close()
            assert msgpack.unpackb(await asyncio.wait_for(second.recv(), 30))["event"] == "ready"
            await asyncio.sleep(0.3)
            after = httpx.get(f"{s.http_url}/v1/ready").status_code
            await second.close()
            return idle, one_speaking, waiting, after

        idle, (status1, m1), (r2, m2), after = asyncio.run(main())
        assert idle["engine_kv_pages_free_ratio"] > m1["engine_kv_pages_free_ratio"]
        assert status1 == 200 and m1["engine_streams_decoding"] == 1 and m1["realtime_ready"] == 1
        assert r2.status_code == 503 and "--max-queued" in r2.json()["reason"]
        assert m2["engine_streams_queued"] == 1 and m2["realtime_capacity_used_ratio"] == 1.0
        assert after == 200


def test_not_ready_before_the_engine_is_warm_and_while_draining(tmp_path):
    config = ServiceConfig(voices_dir=tmp_path / "voices", demo_page=False)
    app = build_app(config, Engine(bundle("tiny"), config.engine))
    cold = TestClient(app).get("/v1/ready")  # no lifespan: Engine.start has not run
    with TestClient(app) as client:  # the lifespan starts the engine
        warm = client.get("/v1/ready")
        asyncio.run(app.state.services.drain())  # no sessions: returns at once
        draining = client.get("/v1/ready")
        health = client.get("/v1/health")
    assert (cold.status_code, cold.json()["reason"]) == (503, "warming up")
    assert warm.status_code == 200
    assert (draining.status_code, draining.json()["reason"]) == (503, "draining")
    assert health.json()["status"] == "draining"


def test_ttfa_p99_covers_the_last_minute_only():
    now = [0.0]
    recent = RecentValues(60.0, clock=lambda: now[0])
    assert recent.quantile(0.99) is None
    for i in range(100):  # 1..100 ms
        recent.add((i + 1) / 1000)
    assert recent.quantile(0.99) == 0.099 and recent.quantile(0.5) == 0.050
    now[0] = 30.0
    recent.add(0.5)
    assert recent.quantile(0.99) == 0.1 and recent.quantile(1.0) == 0.5  # 101 values: the 100th
    now[0] = 61.0  # the first hundred are older than a minute
    assert recent.quantile(0.99) == 0.5
    now[0] = 91.0
    assert recent.quantile(0.99) is None


def test_ttfa_p99_of_real_turns_is_exported(tmp_path):
    with running_server(tmp_path) as s:
        assert math.isnan(scrape(s.http_url)["realtime_ttfa_p99_seconds"])  # no turn yet
        async def turn():
            ws = await speaking(s.ws_url, 8)
            await ws.close()

        asyncio.run(turn())
        p99 = scrape(s.http_url)["realtime_ttfa_p99_seconds"]
        assert 0 < p99 < 10


def test_gauges_are_not_named_like_counters():
    """Prometheus: a counter ends in _total and a gauge never does (the KV pool's size is
    engine_kv_pages, not engine_kv_pages_total)."""
    text = Metrics().render({"kv_pages_total": 64, "kv_pages_used": 3, "frames": 10, "decode_idle_seconds": 1.0})
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types["engine_kv_pages"] == "gauge" and "engine_kv_pages_total" not in types
    assert types["engine_frames_total"] == "counter"
    assert [n for n, t in types.items() if (t == "counter") != n.endswith("_total")] == []
