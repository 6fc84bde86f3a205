"""The service end to end: a real uvicorn server on a free port, the official Fish SDK
and raw WebSocket clients, real encoders and decoders."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import av
import httpx
import msgpack
import numpy as np
import pytest
import torch
import websockets

from engine.engine import EngineConfig
from engine.audio import wav_bytes
from server import running_server

ROOT = Path(__file__).resolve().parent.parent
HOP, RATE = 2048, 44100
FRAMES = 12  # max_new_tokens in most tests


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # fixed-length mode: the random tiny model could say end-of-speech at any frame;
    # with ignore_end every segment is exactly max_new_tokens frames
    with running_server(tmp_path_factory.mktemp("srv"), engine=EngineConfig(max_running=10, max_queued=4, max_len=2048),
                        ignore_end=True) as s:
        yield s


def decode(data: bytes) -> tuple[str, int, np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(stream)])
        return stream.codec_context.name, stream.rate, pcm


# --- a raw client -------------------------------------------------------------------------

async def session(url, request, *events, headers=None, until="finish", timeout=60):
    """Send start + events, collect every server event until `until` (or the close)."""
    received = []
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(msgpack.packb({"event": "start", "request": request}))
        for e in events:
            await ws.send(e if isinstance(e, bytes) else msgpack.packb(e))
        try:
            async with asyncio.timeout(timeout):
                async for frame in ws:
                    event = msgpack.unpackb(frame)
                    received.append(event)
                    if event["event"] == until:
                        break
        except websockets.ConnectionClosed:
            pass
    return received


def audio_of(events):
    return b"".join(e["audio"] for e in events if e["event"] == "audio")


def run(coro):
    return asyncio.run(coro)


TEXT = [{"event": "text", "text": "Hello there, this is the service speaking."}, {"event": "stop"}]


# --- the official SDK -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus"])
def test_official_sdk_streams_every_format(srv, fmt):
    from fishaudio import FishAudio, TTSConfig

    client = FishAudio(api_key="anything", base_url=srv.http_url)
    chunks = list(client.tts.stream_websocket(
        iter(["Hello there, ", "this is the Fish SDK ", "talking to our service."]),
        format=fmt, config=TTSConfig(max_new_tokens=FRAMES, chunk_length=100), model="s2-pro",
    ))
    data = b"".join(chunks)
    assert len(chunks) > 1  # streamed, not one blob
    if fmt == "pcm":
        assert len(data) == 2 * FRAMES * HOP  # s16le mono, one segment of FRAMES frames
        return
    codec, rate, pcm = decode(data)
    assert (codec, rate) == {"wav": ("pcm_s16le", RATE), "mp3": ("mp3float", RATE), "opus": ("opus", 48000)}[fmt]
    expected = FRAMES * HOP / RATE
    # the turn's end pushes codec lookahead out with silence: up to ~0.15 s for mp3
    assert -0.01 < len(pcm) / rate - expected < (0.2 if fmt == "mp3" else 0.06), (len(pcm) / rate, expected)


def test_official_sdk_async(srv):
    from fishaudio import AsyncFishAudio, TTSConfig

    async def main():
        client = AsyncFishAudio(api_key="anything", base_url=srv.http_url)

        async def words():
            for w in "Async streaming works too.".split():
                yield w + " "

        return [c async for c in client.tts.stream_websocket(words(), format="pcm", config=TTSConfig(max_new_tokens=FRAMES))]

    assert len(b"".join(run(main()))) == 2 * FRAMES * HOP


def test_official_sdk_http(srv):
    from fishaudio import FishAudio, TTSConfig

    client = FishAudio(api_key="anything", base_url=srv.http_url)
    data = client.tts.convert(text="The HTTP endpoint. It streams too.", format="wav", config=TTSConfig(max_new_tokens=FRAMES))
    codec, rate, pcm = decode(data)
    # both sentences are shorter than min_chunk_length (50): one segment of FRAMES frames
    assert codec == "pcm_s16le" and rate == RATE and len(pcm) == FRAMES * HOP


# --- protocol behaviour ------------------------------------------------------------------------

def test_ready_turns_and_extensions(srv):
    events = run(session(srv.ws_url, {"format": "pcm", "max_new_tokens": FRAMES, "sample_rate": 16000},
                         {"event": "text", "text": "First turn."}, {"event": "flush"},
                         {"event": "text", "text": "Second turn."}, {"event": "flush"}, {"event": "stop"}))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "ready" and kinds[-1] == "finish" and events[-1]["reason"] == "stop"
    ends = [e for e in events if e["event"] == "turn_end"]
    assert [e["turn"] for e in ends] == [1, 2]
    audio = [e for e in events if e["event"] == "audio"]
    assert {e["turn"] for e in audio} == {1, 2} and all(e["sample_rate"] == 16000 for e in audio)
    assert [e["seq"] for e in audio] == list(range(1, len(audio) + 1))
    # 16 kHz PCM: FRAMES frames per turn, resampled; each turn's end adds the resampler's
    # filter tail (64 samples of padding)
    assert abs(len(audio_of(events)) / 2 - 2 * FRAMES * HOP * 16000 / RATE) < 200


def speak_pcm(url, seed, text):
    """One PCM session of FRAMES frames with this seed, saying `text` (a coroutine)."""
    return session(url, {"format": "pcm", "max_new_tokens": FRAMES, "seed": seed},
                   {"event": "text", "text": text}, {"event": "stop"})


def speak_all(url, seeds, text_of):
    """Sessions for every seed at once (text_of(seed) -> its text); their events, in order."""
    async def main():
        return await asyncio.gather(*(speak_pcm(url, s, text_of(s)) for s in seeds))

    return run(main())


def test_eight_concurrent_connections_all_get_audio(srv):
    results = speak_all(srv.ws_url, range(8), lambda i: f"Connection number {i} says hello.")
    for events in results:
        assert events[-1] == {"event": "finish", "reason": "stop"}
        assert len(audio_of(events)) == 2 * FRAMES * HOP
    # different seeds: different audio (no cross-talk of one stream's tokens into another)
    assert len({audio_of(e) for e in results}) == 8


def assert_four_streams_whole(tmp_path, engine: EngineConfig, text: str) -> None:
    """A server with this engine config: four connections at once (text.format(seed)) each
    get their full-length PCM, each its own, and seed 0 alone gives the same audio."""
    with running_server(tmp_path, engine=engine, ignore_end=True) as served:
        results = speak_all(served.ws_url, range(4), text.format)
        again = run(speak_pcm(served.ws_url, 0, text.format(0)))
    for events in results:
        assert events[-1] == {"event": "finish", "reason": "stop"}
        assert len(audio_of(events)) == 2 * FRAMES * HOP
    assert len({audio_of(e) for e in results}) == 4
    diff = np.abs(np.frombuffer(audio_of(again), "<i2").astype(int) - np.frombuffer(audio_of(results[0]), "<i2"))
    assert diff.max() < 300, diff.max()  # the same tokens (the codec's batching may round a few LSB apart)


def test_fp8_kv_cache_serves_concurrent_connections(tmp_path):
    """`--kv-quant fp8` through the whole service: four connections at once each get their
    full-length PCM, each its own, and a seed repeated alone gives the same audio."""
    assert_four_streams_whole(tmp_path, EngineConfig(max_running=4, max_queued=0, max_len=1024, kv_quant="fp8"),
                              "Stream {} on an FP8 cache.")


@pytest.mark.parametrize("first_audio", [{"codec_first_frames": 2}, {"codec_busy_streams": 2}])
def test_codec_policy_options_keep_every_streams_audio_whole(tmp_path, first_audio):
    """Chunks of up to 8 frames, a 1 s hold and first audio of two frames, always or once
    two streams speak (the codec options for a loaded GPU service), through the whole
    service: four connections at once each get their full-length PCM, and the same seed
    alone gives the same audio."""
    engine = EngineConfig(max_running=4, max_queued=0, max_len=1024, codec_max_chunk=8, codec_hold_lead_s=1.0,
                          **first_audio)
    assert_four_streams_whole(tmp_path, engine, "Stream {} in chunks of eight.")


def test_same_seed_gives_the_same_audio_alone_or_in_a_crowd(srv):
    req = {"format": "pcm", "max_new_tokens": FRAMES, "seed": 1234}
    say = [{"event": "text", "text": "Determinism check."}, {"event": "stop"}]
    alone = audio_of(run(session(srv.ws_url, req, *say)))

    async def crowd():
        others = [session(srv.ws_url, {**req, "seed": s}, *say) for s in (1, 2, 3)]
        return await asyncio.gather(session(srv.ws_url, req, *say), *others)

    together = audio_of(run(crowd())[0])
    assert len(together) == len(alone)
    # the same tokens; the codec's batched convolutions may round differently (a few LSB),
    # while different tokens would differ at full scale
    diff = np.abs(np.frombuffer(together, "<i2").astype(int) - np.frombuffer(alone, "<i2"))
    assert diff.max() < 300, diff.max()


def test_the_service_declines_websocket_compression(srv):
    """Clients offer permessage-deflate by default; audio does not compress, and zlib on
    every audio message saturated the event loop under load, so the service declines it."""
    async def main():
        async with websockets.connect(srv.ws_url) as ws:  # offers permessage-deflate
            return ws.response.headers.get("Sec-WebSocket-Extensions")

    assert run(main()) is None


def test_cancel_drops_the_turn_and_the_voice_stays_ready(srv):
    async def main():
        events = []
        async with websockets.connect(srv.ws_url) as ws:
            await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 200}}))
            await ws.send(msgpack.packb({"event": "text", "text": "A long turn that will be interrupted."}))
            await ws.send(msgpack.packb({"event": "flush"}))
            cancelled_at = None
            async for frame in ws:
                e = msgpack.unpackb(frame)
                events.append(e)
                if e["event"] == "audio" and e["turn"] == 1 and cancelled_at is None and e["seq"] >= 3:
                    await ws.send(msgpack.packb({"event": "cancel"}))
                    cancelled_at = len(events)
                if e["event"] == "cancelled":
                    await ws.send(msgpack.packb({"event": "text", "text": "The next turn."}))
                    await ws.send(msgpack.packb({"event": "stop"}))
                if e["event"] == "finish":
                    break
        return events

    events = run(main())
    ack = next(i for i, e in enumerate(events) if e["event"] == "cancelled")
    assert events[ack]["turn"] == 1
    after = events[ack + 1 :]
    assert not [e for e in after if e["event"] == "audio" and e["turn"] == 1]  # nothing of turn 1 after the ack
    turn1 = sum(len(e["audio"]) for e in events[:ack] if e["event"] == "audio")
    assert turn1 < 2 * 200 * HOP  # cut short
    turn2 = [e for e in after if e["event"] == "audio" and e["turn"] == 2]
    assert sum(len(e["audio"]) for e in turn2) == 2 * 200 * HOP and events[-1]["reason"] == "stop"


def test_disconnect_mid_utterance_frees_the_slot(tmp_path):
    # one slot; a second connection waits in the queue until the first one's slot is free
    with running_server(tmp_path, engine=EngineConfig(max_running=1, max_streams=1, max_queued=1, max_len=2048), ignore_end=True) as s:
        async def main():
            ws = await websockets.connect(s.ws_url)
            await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 2000}}))
            await ws.send(msgpack.packb({"event": "text", "text": "Talk for a long time."}))
            await ws.send(msgpack.packb({"event": "flush"}))
            while msgpack.unpackb(await ws.recv())["event"] != "audio":
                pass
            await ws.close()
            t0 = time.monotonic()
            # the only slot must free up right away: a new connection gets audio
            events = await session(s.ws_url, {"format": "pcm", "max_new_tokens": 4},
                                   {"event": "text", "text": "Next!"}, {"event": "stop"})
            return events, time.monotonic() - t0

        events, elapsed = run(main())
        assert events[-1] == {"event": "finish", "reason": "stop"} and len(audio_of(events)) == 2 * 4 * HOP
        assert elapsed < 5
        stats = s.services.engine.stats()
        assert stats["streams_decoding"] == 0 and stats["streams_queued"] == 0


def test_a_connection_waits_for_kv_pages_and_is_served_once_they_free(tmp_path):
    """A KV pool with room for one speaking stream: a second connection that starts while
    the first one speaks is neither refused nor ready: it waits in the queue, and once
    the first one leaves it is served whole; nobody gets an error."""
    from engine.kv_cache import KVCache
    from server import bundle

    tiny = bundle("tiny")
    page_bytes = KVCache.bytes_per_position(tiny.config, tiny.dtype) * 16
    voice_pages = -(-tiny.prompts.voice_prefix(None).shape[1] // 16)
    # the voice + 20 pages: the first stream's turn reserves ~8, a new one waits for 16
    config = EngineConfig(max_running=2, max_queued=2, max_len=320, kv_page_size=16,
                          kv_cache_bytes=(1 + voice_pages + 20) * page_bytes)
    with running_server(tmp_path, engine=config, ignore_end=True) as s:
        async def main():
            first = await websockets.connect(s.ws_url)
            await first.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 2000}}))
            assert msgpack.unpackb(await first.recv())["event"] == "ready"
            await first.send(msgpack.packb({"event": "text", "text": "Talk for a long time."}))
            await first.send(msgpack.packb({"event": "flush"}))
            while msgpack.unpackb(await first.recv())["event"] != "audio":
                pass
            second = asyncio.create_task(session(s.ws_url, {"format": "pcm", "max_new_tokens": 4},
                                                 {"event": "text", "text": "Next!"}, {"event": "stop"}))
            await asyncio.sleep(1.0)
            waiting = s.services.engine.stats()["streams_queued"]
            assert not second.done()
            await first.close()
            return waiting, await asyncio.wait_for(second, 30)

        waiting, events = run(main())
        assert waiting == 1
        assert [e["event"] for e in events if e["event"] in ("error", "ready")] == ["ready"]
        assert events[-1] == {"event": "finish", "reason": "stop"} and len(audio_of(events)) == 2 * 4 * HOP


# --- bad input --------------------------------------------------------------------------------

def expect_error(events, code, fragment):
    errors = [e for e in events if e["event"] == "error"]
    assert errors, f"no error event in {events}"
    assert errors[0]["code"] == code and fragment in errors[0]["message"], errors[0]
    assert events[-1]["event"] == "finish" and events[-1]["reason"] == "error"


async def raw_frames(url, *frames):
    events = []
    async with websockets.connect(url, max_size=None) as ws:
        for f in frames:
            await ws.send(f)
        try:
            async for frame in ws:
                events.append(msgpack.unpackb(frame))
                if events[-1]["event"] == "finish":
                    break
        except websockets.ConnectionClosed:
            pass
    return events


START = msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 4}})


@pytest.mark.parametrize("frames, code, fragment", [
    ([b"\xc1not msgpack"], "bad_message", "not valid MessagePack"),
    ([msgpack.packb([1, 2, 3])], "bad_message", "a map with a string 'event'"),
    ([START, msgpack.packb({"event": "dance"})], "unknown_event", "'dance'"),
    ([msgpack.packb({"event": "text", "text": "hi"})], "out_of_order", "'text' before 'start'"),
    ([START, START], "out_of_order", "already received"),
    ([START, msgpack.packb({"event": "text", "text": 42})], "invalid_field", "text must be a string"),
    ([msgpack.packb({"event": "start", "request": {"format": "flac"}})], "invalid_field", "format must be one of"),
    ([msgpack.packb({"event": "start", "request": {"temperature": "hot"}})], "invalid_field", "temperature must be a number"),
    ([msgpack.packb({"event": "start", "request": {"top_p": 3.0}})], "invalid_field", "top_p must be in [0.0, 1.0]"),
    ([msgpack.packb({"event": "start", "request": {"format": "opus", "sample_rate": 16000}})], "invalid_field", "not supported for opus"),
    ([msgpack.packb({"event": "start", "request": {"chunk_length": 5000}})], "invalid_field", "chunk_length must be in [100, 300]"),
    ([msgpack.packb({"event": "start", "request": {"max_new_tokens": 10**6}})], "invalid_field", "max_new_tokens must be in"),
    ([msgpack.packb({"event": "start", "request": {"reference_id": "nope"}})], "unknown_voice", "'nope'"),
    ([msgpack.packb({"event": "start", "request": {"references": [{"audio": b"garbage bytes", "text": "hi"}]}})], "bad_audio", ""),
    ([msgpack.packb({"event": "start", "request": {"references": [{"audio": b"x", "text": ""}]}})], "invalid_field", "transcript"),
    ([START, msgpack.packb({"event": "text", "text": "x" * 20_000})], "too_large", "longer than"),
])
def test_bad_input_gets_a_clear_error_and_others_keep_going(srv, frames, code, fragment):
    async def main():
        healthy = asyncio.create_task(session(srv.ws_url, {"format": "pcm", "max_new_tokens": FRAMES},
                                              {"event": "text", "text": "I keep talking."}, {"event": "stop"}))
        bad = await raw_frames(srv.ws_url, *frames)
        return bad, await healthy

    bad, healthy = run(main())
    expect_error(bad, code, fragment)
    assert healthy[-1] == {"event": "finish", "reason": "stop"} and len(audio_of(healthy)) == 2 * FRAMES * HOP


def test_text_frames_and_oversized_frames(tmp_path):
    from dataclasses import replace

    from realtime.protocol import Limits

    with running_server(tmp_path, limits=replace(Limits(), max_message_bytes=4096)) as s:
        async def main():
            async with websockets.connect(s.ws_url) as ws:
                await ws.send("a text frame")
                text = [msgpack.unpackb(f) async for f in ws]
            big = await session(s.ws_url, {"format": "pcm", "references": [{"audio": b"x" * 8000, "text": "t"}]})
            return text, big

        text, big = run(main())
        expect_error(text, "bad_message", "binary MessagePack")
        # over ws_max_size the server closes with 1009 before any event: either way, no audio
        assert not audio_of(big)


def test_undecodable_reference_audio_on_start(srv):
    wav = wav_bytes(np.zeros(0, dtype=np.float32), RATE)  # a valid file with no samples
    events = run(session(srv.ws_url, {"format": "pcm", "references": [{"audio": wav, "text": "silence"}]}))
    expect_error(events, "bad_audio", "")


def test_buffered_text_limit(tmp_path):
    from dataclasses import replace

    from realtime.protocol import Limits

    with running_server(tmp_path, limits=replace(Limits(), max_buffered_chars=100)) as s:
        events = run(session(s.ws_url, {"format": "pcm", "max_new_tokens": 4},
                             *[{"event": "text", "text": "word " * 10} for _ in range(5)]))
        expect_error(events, "too_large", "waiting to be spoken")


def test_server_full_is_refused_clearly(tmp_path):
    with running_server(tmp_path, engine=EngineConfig(max_running=1, max_streams=1, max_queued=0, max_len=1024)) as s:
        async def main():
            async with websockets.connect(s.ws_url) as holder:
                await holder.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
                assert msgpack.unpackb(await holder.recv())["event"] == "ready"
                return await session(s.ws_url, {"format": "pcm"})

        expect_error(run(main()), "busy", "server busy")


def test_connections_past_the_limit_are_refused_and_silent_ones_closed(tmp_path):
    """--max-connections: sockets that never send `start` cannot pile up past the limit
    (the next handshake gets 503 with the reason, and a place frees when one closes), and
    --start-timeout closes such a socket with error {timeout} + finish {error}."""
    with running_server(tmp_path, max_connections=3, start_timeout_s=1.5, ignore_end=True) as s:
        async def main():
            idle = [await websockets.connect(s.ws_url) for _ in range(3)]
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(s.ws_url)
            await idle[0].close()
            await asyncio.sleep(0.2)
            served = await session(s.ws_url, {"format": "pcm", "max_new_tokens": FRAMES}, *TEXT)
            t0 = time.monotonic()
            timed_out = [msgpack.unpackb(f) async for f in idle[1]]
            return refused.value.response, served, timed_out, time.monotonic() - t0

        response, served, timed_out, waited = run(main())
    assert response.status_code == 503 and b"--max-connections" in response.body
    assert len(audio_of(served)) == 2 * FRAMES * HOP
    expect_error(timed_out, "timeout", "no 'start' within 1.5 s")
    assert waited < 3


# --- API keys -----------------------------------------------------------------------------

def test_api_keys(tmp_path):
    with running_server(tmp_path, api_keys=frozenset({"secret"}), ignore_end=True) as s:
        async def refused(headers, url=s.ws_url):
            with pytest.raises(websockets.InvalidStatus) as info:
                async with websockets.connect(url, additional_headers=headers):
                    pass
            return info.value.response.status_code, info.value.response.body

        # the handshake is refused with a status and a body that say why
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, body = run(refused(headers))
            assert status == 401 and b"missing or wrong API key" in body
        status, body = run(refused({}, s.ws_url.replace("/v1/tts/live", "/v1/live")))
        assert status == 404 and b"/v1/tts/live" in body
        ok = run(session(s.ws_url, {"format": "pcm", "max_new_tokens": 4}, {"event": "text", "text": "Hi."},
                         {"event": "stop"}, headers={"Authorization": "Bearer secret"}))
        assert ok[-1]["reason"] == "stop" and audio_of(ok)
        query = run(session(s.ws_url + "?api_key=secret", {"format": "pcm", "max_new_tokens": 4},
                            {"event": "text", "text": "Hi."}, {"event": "stop"}))
        assert query[-1]["reason"] == "stop"
        r = httpx.post(f"{s.http_url}/v1/tts", content=msgpack.packb({"text": "hi"}),
                       headers={"content-type": "application/msgpack"})
        assert r.status_code == 401
        assert httpx.get(f"{s.http_url}/v1/voices").status_code == 401
        assert httpx.get(f"{s.http_url}/v1/health").status_code == 200


# --- HTTP -------------------------------------------------------------------------------------

def test_http_tts_msgpack_json_and_errors(srv):
    body = {"text": "Over plain HTTP.", "format": "wav", "max_new_tokens": FRAMES}
    r = httpx.post(f"{srv.http_url}/v1/tts", content=msgpack.packb(body), headers={"content-type": "application/msgpack"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    assert len(decode(r.content)[2]) == FRAMES * HOP
    whole = httpx.post(f"{srv.http_url}/v1/tts?stream=false", json={**body, "format": "pcm"})
    assert whole.status_code == 200 and len(whole.content) == 2 * FRAMES * HOP
    finalized = httpx.post(f"{srv.http_url}/v1/tts?stream=false", json=body).content
    assert int.from_bytes(finalized[40:44], "little") == 2 * FRAMES * HOP  # real data size in the header
    bad = httpx.post(f"{srv.http_url}/v1/tts", json={"text": "x", "format": "flac"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_field"
    empty = httpx.post(f"{srv.http_url}/v1/tts", json={"text": "   "})
    assert empty.status_code == 400 and "empty" in empty.json()["message"]
    garbage = httpx.post(f"{srv.http_url}/v1/tts", content=b"\xc1\xc1", headers={"content-type": "application/msgpack"})
    assert garbage.status_code == 400 and garbage.json()["error"] == "bad_message"


def test_stored_voices_survive_a_restart(tmp_path):
    t = np.arange(RATE) / RATE
    ref = wav_bytes((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), RATE)
    import base64

    with running_server(tmp_path) as s:
        r = httpx.post(f"{s.http_url}/v1/voices", json={
            "name": "hum", "id": "hum-1", "references": [{"audio": base64.b64encode(ref).decode(), "text": "A hum."}]})
        assert r.status_code == 201, r.text
        assert r.json()["references"][0]["frames"] == 22  # ceil(44100 / 2048)
        dup = httpx.post(f"{s.http_url}/v1/voices", content=msgpack.packb({"id": "hum-1", "references": [{"audio": ref, "text": "x"}]}),
                         headers={"content-type": "application/msgpack"})
        assert dup.status_code == 400 and "already exists" in dup.json()["message"]
        bad = httpx.post(f"{s.http_url}/v1/voices", json={"references": [{"audio": base64.b64encode(b"junk").decode(), "text": "x"}]})
        assert bad.status_code == 400 and bad.json()["error"] == "bad_audio"
    with running_server(tmp_path, ignore_end=True) as s:  # same voices_dir: a restart
        assert [v["id"] for v in httpx.get(f"{s.http_url}/v1/voices").json()["voices"]] == ["hum-1"]
        first = run(session(s.ws_url, {"format": "pcm", "reference_id": "hum-1", "max_new_tokens": 4},
                            {"event": "text", "text": "In the stored voice."}, {"event": "stop"}))
        second = run(session(s.ws_url, {"format": "pcm", "reference_id": "hum-1", "max_new_tokens": 4},
                             {"event": "text", "text": "Again."}, {"event": "stop"}))
        assert first[0]["event"] == "ready" and first[0]["voice_cached"] is False
        assert second[0]["voice_cached"] is True  # the prefilled prefix is reused
        assert audio_of(first) and audio_of(second)
        assert httpx.delete(f"{s.http_url}/v1/voices/hum-1").status_code == 204
        assert httpx.delete(f"{s.http_url}/v1/voices/hum-1").status_code == 404


def test_the_voice_store_is_bounded(tmp_path):
    """--limit voices=N: past it a new voice is refused with 413 and the reason, until one is
    deleted; the refused one leaves nothing on disk."""
    ref = wav_bytes((0.3 * np.sin(2 * np.pi * 200 * np.arange(RATE // 2) / RATE)).astype(np.float32), RATE)

    def add(voice_id):
        return httpx.post(f"{s.http_url}/v1/voices", headers={"content-type": "application/msgpack"},
                          content=msgpack.packb({"id": voice_id, "references": [{"audio": ref, "text": "A hum."}]}))

    with running_server(tmp_path, max_voices=2) as s:
        assert add("a").status_code == 201 and add("b").status_code == 201
        full = add("c")
        assert full.status_code == 413 and full.json()["error"] == "too_large" and "--limit voices=N" in full.json()["message"]
        assert not (tmp_path / "voices" / "c").exists()
        assert httpx.delete(f"{s.http_url}/v1/voices/a").status_code == 204
        assert add("c").status_code == 201
        assert sorted(v["id"] for v in httpx.get(f"{s.http_url}/v1/voices").json()["voices"]) == ["b", "c"]


def test_health_and_metrics(srv):
    health = httpx.get(f"{srv.http_url}/v1/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny" and health["sample_rate"] == RATE
    run(session(srv.ws_url, {"format": "pcm", "max_new_tokens": 4}, {"event": "text", "text": "Metrics."}, {"event": "stop"}))
    text = httpx.get(f"{srv.http_url}/metrics").text
    for name in ("realtime_sessions_total", "realtime_ttfa_seconds_count", "engine_frames_total",
                 "engine_frames_per_second", "engine_streams_decoding", "realtime_errors_total"):
        assert name in text
    count = next(line for line in text.splitlines() if line.startswith("realtime_ttfa_seconds_count"))
    assert int(count.split()[1]) >= 1


def ttfa_histogram(url: str) -> tuple[int, float]:
    """(count, sum in seconds) of /metrics' realtime_ttfa_seconds."""
    lines = dict(line.split() for line in httpx.get(f"{url}/metrics").text.splitlines()
                 if line.startswith("realtime_ttfa_seconds_"))
    return int(lines["realtime_ttfa_seconds_count"]), float(lines["realtime_ttfa_seconds_sum"])


def test_ttfa_runs_from_the_flush_to_the_first_non_empty_audio(srv):
    """/metrics TTFA is DESIGN.md's and latency_bench's: from the flush that ends a turn's
    first segment to the turn's first audio event with bytes in it, one sample a turn.
    MP3 at 16 kHz holds the first chunks back (LAME's lookahead: the encoder returns no
    bytes for them), so a clock stopped by the first engine chunk would read short of
    the first audio event's gen_ms, which runs from the same flush."""
    async def main():
        async with websockets.connect(srv.ws_url, max_size=None) as ws:
            request = {"format": "mp3", "sample_rate": 16000, "max_new_tokens": FRAMES}
            await ws.send(msgpack.packb({"event": "start", "request": request}))
            assert msgpack.unpackb(await ws.recv())["event"] == "ready"  # the voice is prefilled first
            firsts = []
            for text in ("First turn.", "Second turn."):
                await ws.send(msgpack.packb({"event": "text", "text": text}))
                await ws.send(msgpack.packb({"event": "flush"}))
                audio = []
                while (event := msgpack.unpackb(await ws.recv()))["event"] != "turn_end":
                    audio += [event] if event["event"] == "audio" else []
                assert len(audio) > 1 and all(e["audio"] for e in audio)
                firsts.append(audio[0]["gen_ms"] / 1000)
            return firsts

    count0, sum0 = ttfa_histogram(srv.http_url)
    firsts = run(main())
    count, total = ttfa_histogram(srv.http_url)
    assert count - count0 == 2  # one sample a turn, however many chunks it had
    assert abs((total - sum0) - sum(firsts)) < 1e-4, (total - sum0, firsts)


class _GoneClient:
    """A WebSocket whose client vanished under the server's first send, with a `cancel`
    already on its way: the receive side gets it after the writer has closed the session
    and released its engine stream (found by fuzzing the service with real clients that
    disconnect mid-stream: each such race logged an AttributeError traceback)."""

    def __init__(self, start: dict) -> None:
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.incoming.put_nowait({"type": "websocket.receive", "bytes": msgpack.packb(start)})
        self.sends = 0

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send_bytes(self, data: bytes) -> None:
        self.sends += 1
        self.incoming.put_nowait({"type": "websocket.receive", "bytes": msgpack.packb({"event": "cancel"})})
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1006})
        raise RuntimeError("the client went away")

    async def close(self, code: int = 1000) -> None:
        pass


def test_messages_after_the_client_went_away_are_dropped_quietly(srv, caplog):
    from realtime.session import LiveSession

    svc = srv.app.state.services
    ws = _GoneClient({"event": "start", "request": {"format": "pcm", "max_new_tokens": 4}})
    internal_before = svc.metrics.errors["internal"]
    with caplog.at_level(logging.ERROR, logger="realtime.session"):
        run(asyncio.wait_for(LiveSession(ws, svc).run(), 30))
    assert ws.sends == 1  # the session wrote `ready`, the write failed, and it sent nothing more
    assert ws.incoming.qsize() == 1  # it read the cancel (only the disconnect is left): the race ran
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    assert svc.metrics.errors["internal"] == internal_before
    deadline = time.monotonic() + 10
    while svc.engine.stats()["streams_decoding"] or svc.engine.stats()["streams_queued"]:
        assert time.monotonic() < deadline, svc.engine.stats()
        time.sleep(0.05)


def test_a_client_that_does_not_read_is_cut_off_and_frees_its_slot(tmp_path, caplog):
    """ServiceConfig.max_pending_audio_bytes: a client that stops reading while its audio
    piles up gets error {too_large} + finish {error} (after what was already on the wire),
    and its KV slot is freed at once, not when it finally reads or goes away; a client
    beside it is served whole. (Before: the error event itself was over the limit, and
    failing again for it recursed until Python's limit: the slot stayed held.)"""
    import socket

    with running_server(tmp_path, engine=EngineConfig(max_running=2, max_queued=2, max_len=2048), ignore_end=True,
                        max_pending_audio_bytes=256 << 10) as s:
        async def main():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client's side fills at once
            sock.connect(("127.0.0.1", s.port))
            slow = await websockets.connect(s.ws_url, sock=sock, max_size=None, max_queue=1)
            await slow.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 1500}}))
            await slow.send(msgpack.packb({"event": "text", "text": "Talk for a long while please."}))
            await slow.send(msgpack.packb({"event": "flush"}))
            deadline = time.monotonic() + 30
            while s.services.metrics.errors["too_large"] == 0:  # while it reads nothing
                assert time.monotonic() < deadline, s.services.engine.stats()
                await asyncio.sleep(0.1)
            while s.services.engine.stats()["streams_decoding"] + s.services.engine.stats()["streams_idle"]:
                assert time.monotonic() < deadline, s.services.engine.stats()
                await asyncio.sleep(0.05)
            beside = await session(s.ws_url, {"format": "pcm", "max_new_tokens": FRAMES}, *TEXT)
            tail = []
            async with asyncio.timeout(30):
                async for frame in slow:  # now it reads: what was on the wire, then why it ended
                    tail.append(msgpack.unpackb(frame))
            return beside, tail

        with caplog.at_level(logging.ERROR):
            beside, tail = run(main())
    assert len(audio_of(beside)) == 2 * FRAMES * HOP and beside[-1] == {"event": "finish", "reason": "stop"}
    assert [e["event"] for e in tail[-2:]] == ["error", "finish"] and tail[-2]["code"] == "too_large"
    assert tail[-1]["reason"] == "error"
    assert sum(len(e["audio"]) for e in tail if e["event"] == "audio") < 1500 * HOP * 2  # it never got it all
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_http_client_that_does_not_read_frees_its_slot(tmp_path):
    """POST /v1/tts streams its body as fast as the client reads; audio waiting for a
    client that stopped reading counts against the same limit as a live connection's
    (ServiceConfig.max_pending_audio_bytes). Past it the engine stream is closed (its slot
    free for others at once) and the response ends where the client stopped, well-formed.
    (Before: the audio piled up in memory for as long as the request's text ran.)"""
    import socket

    with running_server(tmp_path, engine=EngineConfig(max_running=1, max_queued=2, max_len=2048), ignore_end=True,
                        max_pending_audio_bytes=256 << 10) as s:
        body = msgpack.packb({"text": "Talk for a long while please.", "format": "pcm", "max_new_tokens": 1500})
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(b"POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 30
        while s.services.metrics.errors["too_large"] == 0:  # it reads nothing meanwhile
            assert time.monotonic() < deadline, s.services.engine.stats()
            time.sleep(0.1)
        # the only slot is free: the next request is served whole while the first still does not read
        r = httpx.post(s.http_url + "/v1/tts", content=msgpack.packb({"text": "Next!", "format": "pcm",
                                                                       "max_new_tokens": FRAMES}),
                       headers={"content-type": "application/msgpack"}, timeout=30)
        assert r.status_code == 200 and len(r.content) == 2 * FRAMES * HOP
        sock.settimeout(30)
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
        sock.close()
    assert received.startswith(b"HTTP/1.1 200") and received.endswith(b"0\r\n\r\n")  # chunked, ended cleanly
    assert len(received) < 1500 * HOP * 2  # it ended early


ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("thread, target, error", [
    ("decode", "sched.decode_batch", RuntimeError), ("prefill", "sched.next_prefills", RuntimeError),
    ("codec", "codec._process", RuntimeError),
    # an error of the GPU itself inside the per-step error handling (engine.device_lost)
    ("decode", "runner.launch", "device"), ("codec", "codec._call", "device"),
])
def test_a_stopped_engine_thread_fails_streams_and_health_loudly(tmp_path, thread, target, error):
    """A bug that stops one of the engine's worker threads (injected here: the named method
    raises), or an error of the GPU itself where one stream's failure is otherwise caught
    (after it CUDA's context is unusable), must not leave clients waiting forever on a
    service that calls itself healthy: open streams get error {internal}, new ones are
    refused naming the thread (live and HTTP), /v1/health answers 503 with the reason and
    /metrics engine_up is 0."""
    with running_server(tmp_path, engine=EngineConfig(max_running=2, max_queued=2, max_len=2048),
                        ignore_end=True) as s:
        engine = s.services.engine
        owner_name, method = target.split(".")
        owner = getattr(engine, owner_name)

        def broken(*args, **kwargs):
            raise torch.AcceleratorError(ILLEGAL_ADDRESS) if error == "device" else RuntimeError("injected fault")

        async def main():
            async with websockets.connect(s.ws_url) as ws:
                await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 2000}}))
                await ws.send(msgpack.packb({"event": "text", "text": "Talk for a long while please."}))
                await ws.send(msgpack.packb({"event": "flush"}))
                while msgpack.unpackb(await ws.recv())["event"] != "audio":
                    pass
                setattr(owner, method, broken)
                events = []
                async with asyncio.timeout(30):
                    async for frame in ws:
                        events.append(msgpack.unpackb(frame))
            refused = await session(s.ws_url, {"format": "pcm"})
            return events, refused

        events, refused = run(main())
        cause = f"AcceleratorError: {ILLEGAL_ADDRESS}" if error == "device" else "RuntimeError: injected fault"
        # (a device error reaches the stream first as its own step's failure)
        expect_error(events, "internal", ILLEGAL_ADDRESS if error == "device" else f"the engine's {thread} thread stopped")
        expect_error(refused, "internal", f"the engine's {thread} thread stopped ({cause}); restart the service")
        health = httpx.get(s.http_url + "/v1/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert f"{thread} thread stopped ({cause})" in health.json()["error"]
        assert "engine_up 0" in httpx.get(s.http_url + "/metrics").text
        r = httpx.post(s.http_url + "/v1/tts", content=msgpack.packb({"text": "Hi.", "format": "pcm"}),
                       headers={"content-type": "application/msgpack"})
        assert r.status_code == 500 and "restart the service" in r.json()["message"]


# --- the demo page ---------------------------------------------------------------------------

def test_the_demo_page_is_served(srv):
    page = httpx.get(srv.http_url + "/")
    assert page.status_code == 200 and "static/app.js" in page.text
    assert httpx.get(srv.http_url + "/static/app.js").status_code == 200


def test_a_missing_demo_page_stops_the_start_up(tmp_path):
    from realtime.demo import demo_routes

    with pytest.raises(RuntimeError, match="demo page .* is missing"):
        demo_routes(tmp_path)  # a `clients` installed without its web files


def test_an_installed_wheel_serves_the_demo_page(tmp_path):
    """The page is package data of `clients`: the wheel carries it, and the service finds
    it in the installed package (before: read from the source tree, so an installed wheel
    served no demo, silently). Built from a copy without the 38 MB of model assets: the
    wheel's names are what count."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("engine", "kernels", "realtime", "clients", "latency_bench"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", src], check=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    web = sorted(f"clients/web/{p.name}" for p in (ROOT / "clients" / "web").iterdir())
    assert set(web) <= set(zipfile.ZipFile(wheel).namelist()), web

    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", tmp_path / "site", wheel], check=True)
    found = subprocess.run(  # outside the checkout: only the installed copy is on the path
        [sys.executable, "-c", "from realtime.demo import demo_routes, web_dir; demo_routes(web_dir()); print(web_dir())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(found) == tmp_path / "site" / "clients" / "web"
