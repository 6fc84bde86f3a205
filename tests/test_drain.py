"""Graceful drain: `python -m realtime` as a subprocess, SIGTERM while turns are in flight.

Each turn in flight (live, or an HTTP request) is spoken to its end, then `finish`;
meanwhile new connections and requests get 503 and health says `draining`; the process
exits 0. Past --drain-timeout a turn is cut and still ends with `finish`."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import msgpack
import pytest
import websockets

from server import service_process

HOP = 2048
LONG = 400  # frames: a turn of several seconds for the tiny model on a CPU (~60 frames/s per stream with 3)


async def open_turn(url: str, frames: int):
    """A connection speaking one long turn; returns once its first audio arrived."""
    ws = await websockets.connect(url, max_size=None)
    await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": frames,
                                                               "ignore_end": True}}))
    await ws.send(msgpack.packb({"event": "text", "text": "A long turn that is in flight."}))
    await ws.send(msgpack.packb({"event": "flush"}))
    events = []
    while (e := msgpack.unpackb(await ws.recv()))["event"] != "audio":
        events.append(e)
    return ws, events + [e]


async def rest(ws) -> tuple[list[dict], int | None]:
    """Every event until the server closes; and its close code."""
    events = [msgpack.unpackb(f) async for f in ws]
    return events, ws.close_code


def audio_bytes(events) -> int:
    return sum(len(e["audio"]) for e in events if e["event"] == "audio")


def test_sigterm_finishes_the_turns_in_flight_refuses_new_ones_and_exits_0(tmp_path):
    with service_process(tmp_path) as (proc, port):
        url, http_url = f"ws://127.0.0.1:{port}/v1/tts/live", f"http://127.0.0.1:{port}"
        tts = {"text": "An HTTP request in flight.", "format": "pcm", "max_new_tokens": LONG, "ignore_end": True}

        async def main():
            speaking = await asyncio.gather(*(open_turn(url, LONG) for _ in range(3)))
            idle = await websockets.connect(url, max_size=None)  # ready, between turns
            await idle.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
            assert msgpack.unpackb(await idle.recv())["event"] == "ready"
            async with httpx.AsyncClient(timeout=60) as http:
                oneshot = asyncio.create_task(http.post(f"{http_url}/v1/tts", json=tts))
                await asyncio.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                ends = [asyncio.create_task(rest(ws)) for ws, _ in speaking]
                idle_end = await asyncio.wait_for(rest(idle), 10)  # nothing in flight: finished at once
                health = await http.get(f"{http_url}/v1/health")
                new_oneshot = await http.post(f"{http_url}/v1/tts", json=tts)
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await websockets.connect(url)
                in_flight = not any(t.done() for t in [*ends, oneshot])
                return (speaking, await asyncio.gather(*ends), idle_end, health, refused.value.response, new_oneshot,
                        await oneshot, in_flight, t0)

        speaking, ends, idle_end, health, refused, new_oneshot, oneshot, in_flight, t0 = asyncio.run(main())
        assert in_flight  # the refusals and health below were seen while the turns were being spoken
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert refused.status_code == 503 and b'"error":"draining"' in refused.body
        assert new_oneshot.status_code == 503 and new_oneshot.json()["error"] == "draining"
        assert oneshot.status_code == 200 and len(oneshot.content) == 2 * LONG * HOP
        assert idle_end == ([{"event": "finish", "reason": "stop", "message": "the server is shutting down"}], 1001)
        for (_, head), (tail, code) in zip(speaking, ends):
            events = head + tail
            assert audio_bytes(events) == 2 * LONG * HOP  # the whole turn
            assert [e["event"] for e in events if e["event"] != "audio"] == ["ready", "turn_end", "finish"]
            assert events[-1]["reason"] == "stop" and code == 1001
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 30  # within --drain-timeout (default 30 s)


def test_a_turn_longer_than_the_drain_timeout_is_cut_and_still_finished(tmp_path):
    with service_process(tmp_path, "--drain-timeout", "1") as (proc, port):
        url = f"ws://127.0.0.1:{port}/v1/tts/live"

        async def main():
            ws, head = await open_turn(url, 2000)  # ~30 s of speaking
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            tail, code = await asyncio.wait_for(rest(ws), 20)
            return head + tail, code, t0

        events, code, t0 = asyncio.run(main())
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - t0 < 10
    error, finish = events[-2:]
    assert error["event"] == "error" and error["code"] == "busy" and "drain timeout (1 s)" in error["message"]
    assert "max_concurrency" not in error  # not a concurrency limit
    assert finish["event"] == "finish" and finish["reason"] == "error" and code == 1001
    assert 0 < audio_bytes(events) < 2 * 2000 * HOP


def test_the_drain_timeout_option():
    from realtime.config import parse_args

    assert parse_args([]).drain_timeout_s == 30.0
    assert parse_args(["--drain-timeout", "2.5"]).drain_timeout_s == 2.5
    with pytest.raises(SystemExit):
        parse_args(["--drain-timeout", "-1"])
