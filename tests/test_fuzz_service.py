"""Random clients against a real server while one well-behaved client speaks.

Seeded random sessions (malformed frames, fields of every type and range, undecodable
reference audio, unknown voices, events out of order, cancels, stops and disconnects at
any point) run in waves against a real uvicorn server, while a victim connection speaks
turn after turn. Nothing they send may end the process, touch the victim's audio or leave
an engine stream behind, and every refusal must be a named protocol error, never an
internal one. (A first run of this found a session that handled a `cancel` after its
client had gone away and logged an AttributeError: tests/test_service.py
test_messages_after_the_client_went_away_are_dropped_quietly.)"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import httpx
import msgpack
import pytest
import websockets

from engine.engine import EngineConfig
from server import running_server

HOP = 2048
VICTIM_FRAMES = 6
TEXTS = ["Hello there.", "", " ", "a" * 3000, "\u0000\u0001", "\U0001f600" * 40, "Hi. " * 100, "<|im_end|>",
         "1 2 3.", "\n\n", "\u00e7a va? \u4f60\u597d\u3002"]


def random_request(rng: random.Random) -> dict:
    r = {"format": rng.choice(["pcm", "wav", "opus", "mp3", "flac", 7]), "max_new_tokens": rng.choice([1, 3, 8, 0, -1])}
    for key, choices in (("sample_rate", [8000, 44100, 48000, 12345, "x"]), ("latency", ["normal", "balanced", "x"]),
                         ("temperature", [0.0, 0.01, 2.0, float("nan"), 9.0]), ("top_p", [0.0, 1e-9, 1.0, -1.0]),
                         ("top_k", [0, 1, 128, 10**12]), ("chunk_length", [100, 300, 99]),
                         ("reference_id", ["nope", "../../etc/passwd", "a" * 200]),
                         ("prosody", [{"speed": 0.5, "volume": -20}, {"speed": 0.0}, [], None]),
                         ("seed", [0, 2**31 - 1, 2**40, None]), ("normalize", [True, False, "no"]),
                         ("condition_on_previous_chunks", [True, False]), ("early_stop_threshold", [0.0, 0.5, 1.0]),
                         ("repetition_penalty", [0.5, 1.0, 2.0, 3.0]), ("min_chunk_length", [0, 300, 301]),
                         ("ignore_end", [True, False]), ("mp3_bitrate", [64, 192, 100]),
                         ("opus_bitrate", [-1000, 24, 64, 7])):
        if rng.random() < 0.25:
            r[key] = rng.choice(choices)
    if rng.random() < 0.2:
        r["references"] = [{"audio": rng.randbytes(rng.randrange(1, 2000)), "text": "hi"}]
    return r


def random_frame(rng: random.Random) -> bytes:
    c = rng.random()
    if c < 0.05:
        return rng.randbytes(rng.randrange(1, 50))
    if c < 0.15:
        event = {"event": "start", "request": random_request(rng)}
    elif c < 0.55:
        event = {"event": "text", "text": rng.choice(TEXTS)}
    elif c < 0.7:
        event = {"event": "flush"}
    elif c < 0.8:
        event = {"event": "cancel"}
    elif c < 0.88:
        event = {"event": "stop"}
    else:
        event = rng.choice([{"event": "zzz"}, {"nope": 1}, {"event": "text", "text": 5}, {"event": None}])
    return msgpack.packb(event)


async def random_client(url: str, rng: random.Random) -> None:
    try:
        async with websockets.connect(url, max_size=None, open_timeout=30) as ws:
            if rng.random() < 0.8:
                await ws.send(msgpack.packb({"event": "start", "request": random_request(rng)}))
            for _ in range(rng.randrange(1, 20)):
                await ws.send(random_frame(rng))
                if rng.random() < 0.3:
                    try:
                        await asyncio.wait_for(ws.recv(), rng.choice([0.01, 0.2]))
                    except asyncio.TimeoutError:
                        pass
            if rng.random() < 0.5:  # read a while, or vanish mid-stream
                try:
                    async with asyncio.timeout(rng.choice([0.1, 0.5])):
                        async for _ in ws:
                            pass
                except TimeoutError:
                    pass
    except websockets.ConnectionClosed:
        pass


async def victim(url: str, turns: int) -> list[int]:
    """Samples heard per turn by a client speaking one sentence a turn (PCM)."""
    heard = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": VICTIM_FRAMES}}))
        assert msgpack.unpackb(await ws.recv())["event"] == "ready"
        for _ in range(turns):
            heard.append(await victim_turn(ws))
    return heard


async def victim_turn(ws) -> int:
    """One sentence spoken as a turn; the samples heard (PCM), only audio before turn_end."""
    await ws.send(msgpack.packb({"event": "text", "text": "The quick brown fox jumps over the lazy dog."}))
    await ws.send(msgpack.packb({"event": "flush"}))
    samples = 0
    async with asyncio.timeout(60):
        while (event := msgpack.unpackb(await ws.recv()))["event"] != "turn_end":
            assert event["event"] == "audio", event
            samples += len(event["audio"]) // 2
    return samples


@pytest.mark.parametrize("seed", [1, 2])
def test_random_clients_never_touch_a_victims_audio_or_the_server(tmp_path, caplog, seed):
    rng = random.Random(seed)
    with running_server(tmp_path, engine=EngineConfig(max_running=4, max_queued=6, max_len=2048),
                        ignore_end=True) as srv:
        async def main() -> tuple[list[int], int]:
            speaking = asyncio.create_task(victim(srv.ws_url, 4))
            waves = 0
            while not speaking.done() or waves < 30:
                await asyncio.gather(*(random_client(srv.ws_url, random.Random(rng.random())) for _ in range(6)))
                waves += 1
            return await speaking, waves

        with caplog.at_level(logging.ERROR):
            heard, waves = asyncio.run(main())
        assert heard == [VICTIM_FRAMES * HOP] * 4, (heard, waves)  # whole turns, in fixed-length mode
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        deadline = time.monotonic() + 15
        while any(httpx.get(srv.http_url + "/v1/health").json()["streams"].values()):
            assert time.monotonic() < deadline, httpx.get(srv.http_url + "/v1/health").json()
            time.sleep(0.1)
        metrics = httpx.get(srv.http_url + "/metrics").text
        assert 'realtime_errors_total{code="internal"}' not in metrics
        assert 'realtime_errors_total{code="invalid_field"}' in metrics  # the random fields were refused by name
