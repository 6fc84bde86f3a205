"""Word timestamps on the wire (issue 51): `WS /v1/tts/live/with-timestamp` and
`POST /v1/tts/stream/with-timestamp`, read by a client written from the public Fish docs,
against a real server with the default voice.

The docs' client (https://docs.fish.audio/api-reference/endpoint/openapi-v1/text-to-speech-live-with-timestamps
and .../text-to-speech-stream-with-timestamps): concatenate every audio payload; store each
non-null `alignment` by `chunk_seq`, replacing the one before; add `chunk_audio_offset_sec`
to each segment's `start` and `end`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re

import av
import httpx
import msgpack
import numpy as np
import pytest
import websockets

from server import running_server

RATE = 44100
FRAME_S = 2048 / RATE  # one engine frame of audio: the tolerance of "the same length"
TEXT = ("The quick brown fox jumps over the lazy dog. Then it runs into the forest, "
        "where nobody can find it again. Good night!")
SECOND = "A second turn follows, with its own words."


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("ts"), model="default") as s:
        yield s


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 240))


def expected_words(text: str) -> list[str]:
    return [w for w in (re.sub(r"^\W+|\W+$", "", p) for p in text.split()) if w]


def decoded_seconds(data: bytes, fmt: str, rate: int = RATE) -> float:
    if fmt == "pcm":
        return len(data) / 2 / rate
    try:
        with av.open(io.BytesIO(data)) as c:
            frames = list(c.decode(audio=0))
    except av.error.EOFError:  # the headers only, so far
        return 0.0
    return sum(f.samples for f in frames) / frames[0].sample_rate if frames else 0.0


# --- a client written from the docs -----------------------------------------------------------

class DocClient:
    """What a user reading the docs writes: every field read as the docs name it."""

    def __init__(self) -> None:
        self.audio = bytearray()
        self.alignments: dict[int, dict] = {}
        self.offsets: dict[int, float] = {}
        self.contents: dict[int, str] = {}
        self.events: list[dict] = []
        self.last_seq, self.last_offset = -1, -1.0

    def on_event(self, event: dict, audio: bytes) -> None:
        self.events.append(event)
        self.audio += audio
        content, alignment = event["content"], event["alignment"]
        seq, offset = event["chunk_seq"], event["chunk_audio_offset_sec"]
        assert isinstance(content, str)
        assert isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0
        assert isinstance(offset, (int, float)) and offset >= 0
        assert seq >= self.last_seq and offset >= self.last_offset  # both never decrease
        self.last_seq, self.last_offset = seq, offset
        self.offsets[seq], self.contents[seq] = offset, content
        if alignment is None:
            return
        assert set(alignment) == {"segments", "audio_duration"}
        assert isinstance(alignment["audio_duration"], (int, float)) and alignment["audio_duration"] >= 0
        for s in alignment["segments"]:
            assert set(s) == {"text", "start", "end"} and isinstance(s["text"], str) and s["text"]
            assert isinstance(s["start"], (int, float)) and isinstance(s["end"], (int, float))
        before = self.alignments.get(seq)
        if before is not None:  # a newer snapshot of the same chunk: the words so far, maybe more
            assert [s["text"] for s in alignment["segments"][:len(before["segments"])]] == \
                [s["text"] for s in before["segments"]]
        self.alignments[seq] = alignment
        # a word is announced once its audio is here (this event's bytes included)
        heard = self.seconds()
        for s in alignment["segments"]:
            assert offset + s["end"] <= heard + 0.005, (s, offset, heard)

    def seconds(self) -> float:
        return decoded_seconds(bytes(self.audio), self.fmt) if self.audio else 0.0

    def timeline(self) -> list[dict]:
        return [{"text": s["text"], "start": s["start"] + self.offsets[seq], "end": s["end"] + self.offsets[seq]}
                for seq in sorted(self.alignments) for s in self.alignments[seq]["segments"]]


async def speak_ws(url: str, request: dict, turns: list[str], cancel_after_words: int = 0) -> tuple[DocClient, list]:
    client = DocClient()
    client.fmt = request.get("format", "mp3")
    others = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(msgpack.packb({"event": "start", "request": {"text": ""} | request}))
        for i, text in enumerate(turns):
            await ws.send(msgpack.packb({"event": "text", "text": text}))
            await ws.send(msgpack.packb({"event": "flush" if i + 1 < len(turns) or cancel_after_words else "stop"}))
        async for frame in ws:
            message = msgpack.unpackb(frame)
            if message["event"] == "audio":
                client.on_event(message, message["audio"])
                if cancel_after_words and sum(len(a["segments"]) for a in client.alignments.values()) >= cancel_after_words:
                    cancel_after_words = 0
                    await ws.send(msgpack.packb({"event": "cancel"}))
            else:
                others.append(message)
                if message["event"] == "cancelled":
                    await ws.send(msgpack.packb({"event": "stop"}))
                if message["event"] == "finish":
                    break
    return client, others


def check_timeline(client: DocClient, texts: list[str]) -> list[dict]:
    words = client.timeline()
    assert [w["text"] for w in words] == expected_words(" ".join(texts))  # each word once, in order
    for a, b in zip(words, words[1:]):
        assert a["start"] < a["end"] <= b["start"] + 1e-3
    total = client.seconds()
    assert words[-1]["end"] <= total + 1e-3
    last = max(client.alignments)
    # the last chunk's audio ends with the audio: within one frame
    assert abs(client.offsets[last] + client.alignments[last]["audio_duration"] - total) < FRAME_S
    return words


# --- WebSocket -----------------------------------------------------------------------------------

def test_ws_every_field_from_the_docs(srv):
    url = srv.ws_url + "/with-timestamp"
    client, others = run(speak_ws(url, {"format": "pcm", "chunk_length": 100, "temperature": 0}, [TEXT, SECOND]))
    words = check_timeline(client, [TEXT, SECOND])
    assert len(client.alignments) >= 3  # TEXT is cut into several chunks at chunk_length 100
    assert "".join(client.contents[s] for s in sorted(client.contents)).replace(" ", "") == (TEXT + SECOND).replace(" ", "")
    # the chunk that starts the second turn starts after the first turn's audio
    turn_end = next(e for e in others if e["event"] == "turn_end")
    second = min(s for s in client.contents if client.contents[s] == SECOND)
    assert client.offsets[second] >= turn_end["audio_seconds"] - 1e-3
    assert [e["event"] for e in others][-1] == "finish"
    assert words[0]["start"] < 0.5
    # the optional `time` field: server session time in ms, never decreasing
    times = [e["time"] for e in client.events]
    assert times == sorted(times) and times[0] > 0


def test_ws_times_follow_speed_and_format(srv):
    url = srv.ws_url + "/with-timestamp"
    base, _ = run(speak_ws(url, {"format": "pcm", "temperature": 0, "seed": 3}, [TEXT]))
    fast, _ = run(speak_ws(url, {"format": "wav", "sample_rate": 24000, "temperature": 0, "seed": 3,
                                 "prosody": {"speed": 1.5}}, [TEXT]))
    opus, _ = run(speak_ws(url, {"format": "opus", "temperature": 0, "seed": 3}, [TEXT]))
    b, f = check_timeline(base, [TEXT]), check_timeline(fast, [TEXT])
    check_timeline(opus, [TEXT])
    assert abs(fast.seconds() - base.seconds() / 1.5) < FRAME_S
    for x, y in zip(b, f):  # the same speech (greedy), 1.5 times as fast (the last end may be
        # clamped to the audio sent at the turn's end: atempo holds ~40 ms back until the finish)
        assert abs(y["start"] - x["start"] / 1.5) < 0.005 and abs(y["end"] - x["end"] / 1.5) < FRAME_S


def test_ws_bad_input_gets_the_same_errors(srv):
    async def main():
        url = srv.ws_url + "/with-timestamp"
        out = []
        for frames in ([msgpack.packb({"event": "text", "text": "hi"})],
                       [msgpack.packb({"event": "start", "request": {"format": "flac"}})],
                       [b"\xc1 not msgpack"]):
            async with websockets.connect(url) as ws:
                for f in frames:
                    await ws.send(f)
                out.append([msgpack.unpackb(m) async for m in ws])
        return out

    for events, code in zip(run(main()), ("out_of_order", "invalid_field", "bad_message")):
        assert [e["event"] for e in events] == ["error", "finish"] and events[0]["code"] == code
        assert events[0]["error"] == events[0]["message"]  # where the docs' example reads it


def test_plain_path_is_unchanged(srv):
    """No timestamp field reaches /v1/tts/live clients; the official SDK reads it as before."""
    from fishaudio import FishAudio, TTSConfig

    client = FishAudio(api_key="anything", base_url=srv.http_url)
    data = b"".join(client.tts.stream_websocket(iter(["Hello there, ", "plain path."]), format="pcm",
                                                config=TTSConfig(max_new_tokens=40)))
    assert len(data) > 0

    async def raw():
        async with websockets.connect(srv.ws_url) as ws:
            await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 40}}))
            await ws.send(msgpack.packb({"event": "text", "text": "Plain words."}))
            await ws.send(msgpack.packb({"event": "stop"}))
            return [msgpack.unpackb(m) async for m in ws]

    audio = [e for e in run(raw()) if e["event"] == "audio"]
    assert audio and all(set(e) == {"event", "audio", "turn", "seq", "samples", "sample_rate", "gen_ms"} for e in audio)
    assert all(len(e["audio"]) > 1024 for e in audio if e["gen_ms"] > 0)  # all but the encoder's tails


# --- barge-in --------------------------------------------------------------------------------

def test_cancel_says_what_was_heard(srv):
    client, others = run(speak_ws(srv.ws_url + "/with-timestamp", {"format": "pcm", "chunk_length": 100},
                                  [TEXT + " " + TEXT], cancel_after_words=3))
    cancelled = next(e for e in others if e["event"] == "cancelled")
    heard = client.seconds()
    assert cancelled["turns"] == [1] and abs(cancelled["audio_seconds"] - heard) < FRAME_S
    words = client.timeline()
    last = cancelled["last_word"]
    assert last["turn"] == 1 and last["text"] == words[-1]["text"] and last["end"] <= cancelled["audio_seconds"] + 1e-3
    assert abs(last["end"] - words[-1]["end"]) < 1e-3
    assert len(words) < len(expected_words(TEXT))  # cut before the end: only words heard are there
    # the plain path reports the position too (no words: the engine was not asked for them)

    async def plain():
        async with websockets.connect(srv.ws_url) as ws:
            await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
            await ws.send(msgpack.packb({"event": "text", "text": TEXT}))
            await ws.send(msgpack.packb({"event": "flush"}))
            got = 0
            async for m in ws:
                e = msgpack.unpackb(m)
                if e["event"] == "audio":
                    got += len(e["audio"])
                    if got > RATE:  # half a second of pcm
                        await ws.send(msgpack.packb({"event": "cancel"}))
                if e["event"] == "cancelled":
                    return e, got

    e, got = run(plain())
    assert "last_word" not in e and abs(e["audio_seconds"] - got / 2 / RATE) < FRAME_S


# --- HTTP (Server-Sent Events) ----------------------------------------------------------------

def sse(srv, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{srv.http_url}/v1/tts/stream/with-timestamp", timeout=240, **kw,
                      **({"json": body} if "content" not in kw else {}))


@pytest.mark.parametrize("fmt", ["wav", "opus"])
def test_sse_every_field_from_the_docs(srv, fmt):
    client = DocClient()
    client.fmt = fmt
    with httpx.stream("POST", f"{srv.http_url}/v1/tts/stream/with-timestamp", timeout=240,
                      json={"text": TEXT, "format": fmt, "chunk_length": 100, "temperature": 0}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():  # as the docs' Python example parses it
            if not line or not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            assert set(event) == {"audio_base64", "content", "alignment", "chunk_seq", "chunk_audio_offset_sec"}
            client.on_event(event, base64.b64decode(event["audio_base64"]))
    check_timeline(client, [TEXT])


def test_sse_msgpack_body_and_errors(srv):
    body = msgpack.packb({"text": "Short and sweet.", "format": "pcm"})
    r = sse(srv, {}, content=body, headers={"content-type": "application/msgpack"})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events and events[-1]["alignment"]["segments"][-1]["text"] == "sweet"
    for bad, code in (({"text": ""}, "invalid_field"), ({"text": "x", "format": "flac"}, "invalid_field"),
                      ({"text": "x", "prosody": {"speed": 9}}, "invalid_field")):
        r = sse(srv, bad)
        assert r.status_code == 400 and r.json()["error"] == code, r.text
    r = sse(srv, {}, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_message"


def test_new_paths_need_the_key(tmp_path):
    with running_server(tmp_path, model="tiny", api_keys=frozenset({"k"})) as s:
        r = httpx.post(f"{s.http_url}/v1/tts/stream/with-timestamp", json={"text": "hi"})
        assert r.status_code == 401

        async def ws():
            with pytest.raises(websockets.InvalidStatus) as info:
                async with websockets.connect(s.ws_url + "/with-timestamp"):
                    pass
            return info.value.response.status_code

        assert run(ws()) == 401


# --- the project's client and CLI ---------------------------------------------------------------

def test_client_gives_each_turns_words(srv):
    from clients import connect

    async def main():
        async with connect(srv.ws_url, timestamps=True, format="pcm", temperature=0) as session:
            first = await session.speak(TEXT)
            second = await session.speak(SECOND)
            words = []
            async for chunk in session.speak(TEXT + " " + TEXT):
                words = session.words(chunk.turn)
                if len(words) >= 2:
                    break
            cancelled = await session.cancel()
            return first, second, cancelled, words

    first, second, cancelled, words = run(main())
    for result, text in ((first, TEXT), (second, SECOND)):
        assert [w.text for w in result.words] == expected_words(text)
        assert 0 <= result.words[0].start < 0.5  # on the turn's own timeline
        assert result.words[-1].end <= len(result.audio) / 2 / RATE + 1e-3
    assert cancelled.audio_seconds > 0 and cancelled.last_word is not None
    assert cancelled.last_word.end <= cancelled.audio_seconds + 1e-3
    assert [w.text for w in words] == expected_words(TEXT)[:len(words)]


def test_cli_prints_the_words(srv, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "x.wav"
    p = subprocess.run([sys.executable, "-m", "clients", "speak", "--url", srv.ws_url, "--text", SECOND,
                        "--format", "wav", "--out", str(out), "--timestamps", "--quiet"],
                       capture_output=True, timeout=240)
    assert p.returncode == 0, p.stderr.decode()
    lines = [line.split() for line in p.stderr.decode().splitlines()]
    assert [w for _, _, w in lines] == expected_words(SECOND)
    times = [float(t) for start, end, _ in lines for t in (start, end)]
    assert times == sorted(times) and times[-1] <= decoded_seconds(out.read_bytes(), "wav") + 1e-3


# --- the encoder's count of what the client can play --------------------------------------------

@pytest.mark.parametrize("fmt,rate,speed", [("pcm", 44100, 1.0), ("wav", 24000, 1.5), ("opus", 48000, 1.0),
                                            ("mp3", 44100, 1.0), ("mp3", 24000, 0.75)])
def test_encoder_counts_the_samples_a_decoder_plays(fmt, rate, speed):
    """AudioEncoder.released_samples: the decoded length of the bytes returned so far, at every
    step (held bytes not counted), codec delay and padding included."""
    from realtime.audio_out import AudioEncoder

    enc = AudioEncoder(fmt, rate, RATE, speed=speed)
    x = (np.random.default_rng(0).random(RATE * 2, dtype=np.float32) - 0.5) * 0.1
    out = b""
    for i in range(0, x.size, 2048):
        out += enc.encode(x[i:i + 2048])
        if i == 20 * 2048 and fmt in ("pcm", "wav"):
            assert enc.released_samples == round(decoded_seconds(out, fmt, rate) * rate)
    out += enc.drain()
    for i in range(0, RATE, 2048):
        out += enc.encode(x[i:i + 2048])
    out += enc.flush()
    assert enc.released_samples == round(decoded_seconds(out, fmt, rate) * rate)
    assert enc.samples_in > x.size + RATE  # the drain's padding is input too


# --- odd orders of events ---------------------------------------------------------------------------

def test_random_turns_flushes_and_cancels_keep_the_snapshots_consistent(srv):
    """Turns, empty flushes, cancels (before, during and after audio) in random orders: every
    event still reads as the docs say (DocClient's checks), and the connection finishes."""
    import random

    rng = random.Random(51)
    words = expected_words(TEXT)

    async def one(actions: list[str]) -> tuple[DocClient, list]:
        client = DocClient()
        client.fmt = "pcm"
        others = []
        async with websockets.connect(srv.ws_url + "/with-timestamp", max_size=None) as ws:
            await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": 30,
                                                                       "chunk_length": 100}}))

            async def reader():
                async for frame in ws:
                    m = msgpack.unpackb(frame)
                    if m["event"] == "audio":
                        client.on_event(m, m["audio"])
                    else:
                        others.append(m)

            task = asyncio.create_task(reader())
            for action in actions:
                if action == "text":
                    text = " ".join(rng.sample(words, rng.randint(1, 6))) + rng.choice([". ", ", ", " "])
                    await ws.send(msgpack.packb({"event": "text", "text": text}))
                else:
                    await ws.send(msgpack.packb({"event": action}))
                await asyncio.sleep(rng.choice([0, 0.05, 0.3]))
            await ws.send(msgpack.packb({"event": "stop"}))
            await asyncio.wait_for(task, 120)
        return client, others

    for _ in range(4):
        actions = [rng.choice(["text", "text", "text", "flush", "cancel"]) for _ in range(rng.randint(3, 9))]
        client, others = run(one(actions))
        assert others[-1] == {"event": "finish", "reason": "stop"}, (actions, others[-3:])
        assert not [e for e in others if e["event"] == "error"]
        for e in others:
            if e["event"] == "cancelled":
                assert e["audio_seconds"] >= 0 and (e["last_word"] is None or e["last_word"]["text"])


@pytest.mark.parametrize("fmt", ["wav", "opus", "mp3"])
def test_a_cancel_before_any_byte_went_out_keeps_the_files_header(fmt):
    """Barge-in while the first audio is still held back (the 1,024-byte minimum, Opus
    packets): the file starts over, so the next turn's bytes still begin with its header;
    once bytes went out, the rest of the file goes on (drain, output dropped)."""
    from realtime.audio_out import AudioEncoder

    rate = 48000 if fmt == "opus" else RATE
    enc = AudioEncoder(fmt, rate, RATE)
    tone = (0.2 * np.sin(np.arange(RATE) * 2 * np.pi * 220 / RATE)).astype(np.float32)
    assert enc.encode(tone[:300]) == b""  # held
    assert enc.discard() is True and enc.released_samples == 0
    out = b"".join(enc.encode(tone[i:i + 2048]) for i in range(0, RATE, 2048))
    assert decoded_seconds(out, fmt, rate) == pytest.approx(enc.released_samples / rate)  # none of the first 300
    assert enc.discard() is False  # bytes went out: drained, its output not sent
    out += enc.encode(tone[:4096]) + enc.flush()
    assert decoded_seconds(out, fmt, rate) > 1.0


@pytest.mark.parametrize("sent_before_cancel", [False, True])
def test_times_after_a_cancel_are_those_of_the_audio_sent(sent_before_cancel):
    """The session's bookkeeping on its own (real encoder, engine-like word timings): a turn
    cancelled with its audio held back (the file starts over) or partly sent (the rest is
    dropped), then a turn with a click: the click's word is where the click is in the bytes
    the client got, at 24 kHz and speed 1.25."""
    from engine import WordTiming
    from realtime.audio_out import AudioEncoder
    from realtime.timestamps import Alignment

    rate, speed = 24000, 1.25
    enc = AudioEncoder("wav", rate, RATE, speed=speed)
    a = Alignment(RATE, rate, speed, enc.decoder_delay)
    sent = b""

    def feed(turn: int, x: np.ndarray) -> bytes:
        out = b""
        for i in range(0, x.size, 2048):
            a.audio(turn, x[i:i + 2048].size, enc.samples_in)
            out += enc.encode(x[i:i + 2048])
        return out

    noise = (np.random.default_rng(1).random(RATE if sent_before_cancel else 300, dtype=np.float32) - 0.5) * 0.01
    a.segment(1, "lost words")
    sent += feed(1, noise)
    assert bool(sent) == sent_before_cancel
    a.set_released(enc.released_samples / rate)  # as the session does at each audio event
    a.end_turn(1, cancelled=True)
    pos = enc.samples_in
    if enc.discard():
        a.restart(enc.samples_in, enc.released_samples / rate)
    else:
        a.drop_unsent(enc.released_samples / rate, pos)
    turn2 = np.zeros(RATE, np.float32)
    turn2[RATE // 2:RATE // 2 + 441] = 0.9  # a 10 ms click at 0.5 s of the turn's engine audio
    a.segment(2, "the click")
    sent += feed(2, turn2)
    a.words(2, [WordTiming(0, "the", 0.0, 0.5), WordTiming(1, "click.", 0.5, 0.51)])
    a.segment_end(2)
    sent += enc.drain()
    a.end_turn(2)
    a.set_released(enc.released_samples / rate)
    snapshots = [f for _, f in a.take()]
    last = snapshots[-1]
    assert last["content"] == "the click" and [s["text"] for s in last["alignment"]["segments"]] == ["the", "click"]
    click_at = last["chunk_audio_offset_sec"] + last["alignment"]["segments"][1]["start"]
    with av.open(io.BytesIO(sent)) as c:
        y = np.concatenate([f.to_ndarray()[0] for f in c.decode(audio=0)])
    assert abs(np.argmax(np.abs(y)) / rate - click_at) < 0.02  # atempo's ~10 ms
    assert abs(last["chunk_audio_offset_sec"] + last["alignment"]["audio_duration"] - y.size / rate) < FRAME_S
