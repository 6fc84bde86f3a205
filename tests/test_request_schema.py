"""The hosted API's request schema, as voice-agent integrations send it today (issue 50,
item 8): `latency: "low"`, `opus_bitrate` in bit/s, `normalize_loudness`, `features`,
`early_stop_threshold`, `condition_on_previous_chunks`, a `reference_id` of the hosted voice
library (`--unknown-voice`), and the server's rate-limited log of every refusal. A real
server, real WebSocket sessions and HTTP requests, real decoders."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import msgpack
import numpy as np
import pytest
import websockets

from engine.engine import EngineConfig
from realtime import errors
from realtime.config import parse_args
from realtime.errors import RefusalLog
from realtime.protocol import Limits, parse_request
from realtime.segmenter import TextSegmenter
from server import running_server
from test_service import HOP, RATE, audio_of, decode, expect_error, run, session

FRAMES = 8  # max_new_tokens: with ignore_end, every segment is exactly this many frames
SEGMENT = 2 * FRAMES * HOP  # pcm bytes of one segment
HOSTED_ID = "802e3bc2b27e49c2995d23ef70e6ac89"  # a voice of the hosted library (its docs' example)
# what the LiveKit Fish plugin sends (hosted schema: opus_bitrate in bit/s even for pcm,
# normalize_loudness in prosody, the quality guard always on), plus the top-level form
HOSTED = {
    "text": "", "chunk_length": 200, "format": "pcm", "sample_rate": None, "mp3_bitrate": 64,
    "opus_bitrate": 64000, "references": [], "reference_id": None, "normalize": True, "latency": "low",
    "prosody": {"speed": 1.0, "volume": 0, "normalize_loudness": True}, "top_p": 0.7, "temperature": 0.7,
    "features": ["quality-guard"], "max_new_tokens": FRAMES, "min_chunk_length": 50,
    "condition_on_previous_chunks": False, "early_stop_threshold": 0.8, "normalize_loudness": True, "seed": 1,
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("schema"), engine=EngineConfig(max_running=8, max_queued=8, max_len=1024),
                        ignore_end=True) as s:
        yield s


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(int)


def http_tts(srv, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.http_url}/v1/tts?stream=false", content=msgpack.packb(body),
                      headers={"content-type": "application/msgpack"}, timeout=60)


# --- the request fields --------------------------------------------------------------------

def test_the_hosted_request_is_served_over_websocket_and_http(srv):
    events = run(session(srv.ws_url, HOSTED, {"event": "text", "text": "Hello from a voice agent."}, {"event": "stop"}))
    assert events[-1] == {"event": "finish", "reason": "stop"} and len(audio_of(events)) == SEGMENT
    r = http_tts(srv, {**HOSTED, "text": "Hello from a voice agent."})
    assert r.status_code == 200 and len(r.content) == SEGMENT
    req = parse_request(HOSTED, Limits())
    assert (req.latency, req.opus_bitrate, req.features, req.normalize_loudness) == ("low", 64, ("quality-guard",), True)


@pytest.mark.parametrize("field, value, fragment", [
    ("opus_bitrate", 12345, "opus_bitrate must be -1000"),
    ("opus_bitrate", 128000, "opus_bitrate must be in"),
    ("opus_bitrate", 100, "opus_bitrate must be -1000"),
    ("opus_bitrate", "64k", "opus_bitrate must be an integer"),
    ("latency", "fastest", "latency must be one of normal, balanced, low"),
    ("features", "quality-guard", "features must be a list"),
    ("early_stop_threshold", 1.5, "early_stop_threshold must be in [0.0, 1.0]"),
    ("condition_on_previous_chunks", "yes", "condition_on_previous_chunks must be a boolean"),
    ("normalize_loudness", 1, "normalize_loudness must be a boolean"),
    ("prosody", {"normalize_loudness": "on"}, "normalize_loudness must be a boolean"),
])
def test_a_bad_value_is_invalid_field_naming_the_field(srv, field, value, fragment):
    expect_error(run(session(srv.ws_url, {**HOSTED, field: value})), "invalid_field", fragment)
    r = http_tts(srv, {**HOSTED, "text": "Hi.", field: value})
    assert r.status_code == 400 and r.json()["error"] == "invalid_field" and fragment in r.json()["message"]


def test_opus_bitrate_in_bits_per_second_and_kbits_decodes_at_that_rate(srv):
    sizes = {}
    for bitrate in (24000, 64000, 24, -1000):
        events = run(session(srv.ws_url, {**HOSTED, "format": "opus", "opus_bitrate": bitrate},
                             {"event": "text", "text": "Opus at a chosen bitrate."}, {"event": "stop"}))
        data = audio_of(events)
        codec, rate, pcm = decode(data)
        assert (codec, rate) == ("opus", 48000)
        assert abs(len(pcm) / rate - FRAMES * HOP / RATE) < 0.06  # the whole segment, plus padding
        sizes[bitrate] = len(data)
    # the same audio (same seed): 64 kbit/s takes well over twice the bytes of 24 kbit/s; the
    # kbit/s form is the same encoder setting as its bit/s form
    assert sizes[64000] > 2 * sizes[24000] and abs(sizes[24] - sizes[24000]) < 0.1 * sizes[24000]
    assert sizes[-1000] > 0


def first_cut(latency: str, text: str, piece: int = 3) -> int | None:
    """How many characters of `text` (streamed in LLM-like pieces) the segmenter needed
    before it handed out a turn's first segment; None: only at the flush."""
    seg = TextSegmenter(200, 50, latency)
    for i in range(0, len(text), piece):
        if seg.push(text[i : i + piece]):
            return min(i + piece, len(text))
    return None


@pytest.mark.parametrize("text", [
    "Sure thing, let me check the weather for you. It looks sunny all day.",
    "Okay so I looked into it and the answer is that you should turn left",
    "Hi. Yes. Once upon a time, in a quiet village by the sea, there lived an old fisherman.",
    "Well, that depends on what you mean by early; most people would say before nine.",
])
def test_low_latency_cuts_the_first_segment_at_least_as_early_as_balanced(text):
    low, balanced = first_cut("low", text), first_cut("balanced", text)
    assert low is not None and low < 30  # a phrase, not a sentence of min_chunk_length
    assert balanced is None or low <= balanced


def test_low_latency_speaks_before_the_flush(srv):
    """`latency: low`: "Sure thing," is spoken while the rest of the phrase is still
    coming; `balanced` waits for min_chunk_length (50) characters or the flush."""
    text = "Sure thing, let me check"

    async def low():
        async with websockets.connect(srv.ws_url, max_size=None) as ws:
            await ws.send(msgpack.packb({"event": "start", "request": {**HOSTED, "latency": "low"}}))
            await ws.send(msgpack.packb({"event": "text", "text": text}))
            events = []
            async with asyncio.timeout(30):
                while not any(e["event"] == "audio" for e in events):  # no flush was sent
                    events.append(msgpack.unpackb(await ws.recv()))
                await ws.send(msgpack.packb({"event": "stop"}))
                async for frame in ws:
                    events.append(msgpack.unpackb(frame))
        return events

    events = run(low())
    assert events[-1]["reason"] == "stop" and len(audio_of(events)) == 2 * SEGMENT  # "Sure thing," + the rest
    balanced = run(session(srv.ws_url, {**HOSTED, "latency": "balanced"}, {"event": "text", "text": text},
                           {"event": "stop"}))
    assert len(audio_of(balanced)) == SEGMENT  # one segment, cut by the stop


def test_the_official_sdk_with_low_latency(srv):
    from fishaudio import FishAudio, TTSConfig
    from pydantic import ValidationError

    try:
        config = TTSConfig(latency="low", max_new_tokens=FRAMES)
    except ValidationError:
        pytest.skip("this fish-audio-sdk's TTSConfig allows only latency normal | balanced")
    client = FishAudio(api_key="anything", base_url=srv.http_url)
    data = b"".join(client.tts.stream_websocket(iter(["Sure thing, ", "let me check."]), format="pcm", config=config))
    assert len(data) == 2 * SEGMENT


# --- reference_id of the hosted voice library --------------------------------------------------

def test_an_unknown_reference_id_is_refused_by_default(srv):
    expect_error(run(session(srv.ws_url, {**HOSTED, "reference_id": HOSTED_ID})), "unknown_voice", HOSTED_ID)
    r = http_tts(srv, {**HOSTED, "text": "Hi.", "reference_id": HOSTED_ID})
    assert r.status_code == 404 and r.json()["error"] == "unknown_voice"


def test_unknown_voice_default_speaks_with_the_default_voice_and_warns_once_per_id(tmp_path, caplog):
    assert parse_args(["--unknown-voice", "default"]).unknown_voice == "default"
    assert parse_args([]).unknown_voice == "error"
    text = [{"event": "text", "text": "Spoken by whoever we have."}, {"event": "stop"}]
    with running_server(tmp_path, unknown_voice="default", ignore_end=True) as s:
        with caplog.at_level(logging.WARNING, logger="realtime.voices"):
            hosted = run(session(s.ws_url, {**HOSTED, "reference_id": HOSTED_ID}, *text))
            again = http_tts(s, {**HOSTED, "reference_id": HOSTED_ID, "text": "Spoken by whoever we have."})
            other = run(session(s.ws_url, {**HOSTED, "reference_id": "another-hosted-voice"}, *text))
        default = run(session(s.ws_url, HOSTED, *text))
    assert hosted[-1]["reason"] == "stop" and again.status_code == 200 and other[-1]["reason"] == "stop"
    for audio in (audio_of(hosted), again.content):  # the same seed and voice: the same tokens
        assert len(audio) == len(audio_of(default)) == SEGMENT
        # batched codec convolutions may round a few LSB apart (tests/test_service.py)
        assert np.abs(pcm16(audio) - pcm16(audio_of(default))).max() < 300
    warnings = [r.getMessage() for r in caplog.records if r.name == "realtime.voices"]
    assert len(warnings) == 2 and HOSTED_ID in warnings[0] and "another-hosted-voice" in warnings[1]


# --- the refusal log -------------------------------------------------------------------------

def test_refusals_are_logged_at_most_once_a_second_per_code(caplog):
    now = [100.0]
    limiter = RefusalLog(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="realtime.refused"):
        for i in range(20):
            now[0] += 0.04
            limiter.refused("invalid_field", f"bad {i}")
            limiter.refused("busy", "full")
        now[0] += 1.0
        limiter.refused("invalid_field", "bad again")
    assert [r.getMessage() for r in caplog.records] == ["refused invalid_field: bad 0", "refused busy: full",
                     "refused invalid_field: bad again (and 19 more invalid_field refusals since the last logged one)"]


def test_a_burst_of_bad_requests_logs_one_line_per_code(srv, caplog, monkeypatch):
    monkeypatch.setattr(errors, "_refusals", RefusalLog())  # nothing logged before this test counts

    async def burst():
        async with httpx.AsyncClient(timeout=30) as http:
            return await asyncio.gather(
                *[session(srv.ws_url, {**HOSTED, "opus_bitrate": 1}) for _ in range(10)],
                *[http.post(f"{srv.http_url}/v1/tts", json={"text": "Hi.", "reference_id": f"nope-{i}"}) for i in range(10)],
            )

    with caplog.at_level(logging.WARNING, logger="realtime.refused"):
        t0 = time.monotonic()
        results = run(burst())
        elapsed = time.monotonic() - t0
        lines = [r.getMessage() for r in caplog.records if r.name == "realtime.refused"]
    assert all(e[-1]["reason"] == "error" for e in results[:10]) and all(r.status_code == 404 for r in results[10:])
    for code, reason in (("invalid_field", "opus_bitrate"), ("unknown_voice", "'nope-")):
        mine = [line for line in lines if line.startswith(f"refused {code}: ")]
        assert mine and reason in mine[0]
        assert len(mine) == 1 if elapsed < 1 else len(mine) <= 1 + int(elapsed), (elapsed, lines)


def test_condition_on_previous_chunks_changes_what_follows(srv):
    """True: a turn is spoken with the earlier ones in the model's context; False: alone.
    The same seed gives the same first turn either way and a different second one."""
    turns = [{"event": "text", "text": "One."}, {"event": "flush"}, {"event": "text", "text": "Two."}, {"event": "stop"}]

    def by_turn(condition: bool) -> list[np.ndarray]:
        events = run(session(srv.ws_url, {**HOSTED, "condition_on_previous_chunks": condition}, *turns))
        return [pcm16(b"".join(e["audio"] for e in events if e["event"] == "audio" and e["turn"] == t)) for t in (1, 2)]

    (first, second), (first_alone, second_alone) = by_turn(True), by_turn(False)
    assert len(first) == len(second) == len(second_alone) == FRAMES * HOP
    assert np.abs(first - first_alone).max() < 300  # rounding only
    assert np.abs(second - second_alone).max() > 3000  # other tokens
