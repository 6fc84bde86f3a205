"""The client library and CLI against a real server running the tiny random-weight model.

Every request caps `max_new_tokens` (frames per segment); `ignore_end` makes each segment exactly
that long (random weights may otherwise sample an end of speech at any frame).
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import pytest

from clients import (
    AudioChunk, Cancelled, ClientTimeout, ConnectFailed, ConnectionLost, InvalidRequest, ServerBusy, TurnEnd,
    Unauthorized, UnknownVoice, connect,
)
from engine.engine import EngineConfig
from tests.server import free_port, running_server

ROOT = Path(__file__).resolve().parent.parent
FRAME = 2048  # samples per codec frame at 44.1 kHz
FRAMES = 10  # max_new_tokens in most tests: ~0.46 s of audio per segment
LONG = 80  # a turn still playing when it is cancelled (~0.6 s of decoding on a CPU)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("client")) as srv:
        yield srv


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("client-auth"), api_keys=frozenset({"secret"})) as srv:
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def session(url: str, **fields):
    return connect(url, format="pcm", max_new_tokens=FRAMES, seed=1, ignore_end=True, **fields)


def cli(*args: str, stdin: str | None = None, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REALTIME_API_KEY"}
    env.update(PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "clients", "speak", *args], input=stdin.encode() if stdin is not None else None,
        capture_output=True, cwd=ROOT, env=env, timeout=60,
    )


def decode(data: bytes) -> tuple[int, int]:
    """(sample rate, samples) of an audio file, decoded by PyAV."""
    with av.open(io.BytesIO(data)) as f:
        stream = f.streams.audio[0]
        samples = sum(frame.samples for frame in f.decode(stream))
        return stream.rate, samples


# --- library ------------------------------------------------------------------------------

def test_speak_text_gives_whole_frames_of_pcm(server):
    async def go():
        async with session(server.ws_url) as s:
            assert s.ready.sample_rate == 44100 and s.ready.format == "pcm"
            assert s.ready.open_to_ready_ms > 0 and s.session_id
            return await s.speak("Hello there. How are you today?")

    result = run(go())
    assert result.turn == 1 and not result.cancelled
    assert len(result.audio) == FRAMES * FRAME * 2  # one segment: max_new_tokens frames of s16le mono
    assert sum(c.samples for c in result.chunks) == FRAMES * FRAME
    assert result.audio_seconds == pytest.approx(len(result.audio) / 2 / 44100, abs=1e-3)
    assert result.ttfa_ms is not None and 0 < result.ttfa_ms < 5000
    assert [c.seq for c in result.chunks] == sorted(c.seq for c in result.chunks)


def test_speak_streams_token_pieces_from_an_async_generator(server):
    text = "Well, I think that we should take the long road home tonight, because the view is great."
    sent_last = {}

    async def tokens():
        for i in range(0, len(text), 3):
            yield text[i:i + 3]
            await asyncio.sleep(0.03)
        sent_last["at"] = time.perf_counter()

    async def go():
        async with session(server.ws_url, min_chunk_length=0) as s:
            chunks = [c async for c in s.speak(tokens())]
            return chunks

    chunks = run(go())
    assert chunks and all(isinstance(c, AudioChunk) and c.turn == 1 for c in chunks)
    # the first clause was spoken while the rest of the text was still streaming in
    assert chunks[0].received_at < sent_last["at"]
    assert len(b"".join(c.data for c in chunks)) % (FRAME * 2) == 0


def test_two_turns_in_one_session(server):
    async def go():
        async with session(server.ws_url) as s:
            events = []
            for text in ("First turn.", "Second turn."):
                await s.send_text(text)
                await s.flush()
                async for ev in s.events():
                    events.append(ev)
                    if isinstance(ev, TurnEnd):
                        break
            return events, s.timings

    events, timings = run(go())
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [e.turn for e in ends] == [1, 2]
    for turn in (1, 2):
        audio = b"".join(e.data for e in events if isinstance(e, AudioChunk) and e.turn == turn)
        assert len(audio) > 0 and len(audio) % (FRAME * 2) == 0
        assert ends[turn - 1].audio_seconds == pytest.approx(len(audio) / 2 / 44100, abs=1e-3)
        assert timings[turn].ttfa_ms is not None and timings[turn].ttfa_ms > 0


def test_cancel_mid_turn_drops_its_audio_and_the_next_turn_works(server):
    async def go():
        async with connect(server.ws_url, format="pcm", max_new_tokens=LONG, seed=1, ignore_end=True) as s:
            await s.send_text("This turn is long and will be interrupted by the listener.")
            await s.flush()
            first = await anext(s.audio())  # it is playing
            ack = await s.cancel()
            await s.send_text("Next turn.")
            await s.flush()
            after = []
            async for ev in s.events():
                after.append(ev)
                if isinstance(ev, TurnEnd):
                    break
            return first, ack, after

    first, ack, after = run(go())
    assert first.turn == 1
    assert isinstance(ack, Cancelled) and 1 in ack.turns
    assert isinstance(after[0], Cancelled)
    audio = [e for e in after if isinstance(e, AudioChunk)]
    assert audio and all(e.turn == 2 for e in audio)  # nothing of the cancelled turn
    assert isinstance(after[-1], TurnEnd) and after[-1].turn == 2


def test_barge_in_during_speak_ends_it_and_the_session_goes_on(server):
    async def go():
        async with connect(server.ws_url, format="pcm", max_new_tokens=LONG, seed=1, ignore_end=True) as s:
            speech = s.speak("An answer the user talks over.")
            chunks, barge_in = [], None
            async for chunk in speech:
                chunks.append(chunk)
                if len(chunks) == 2:
                    barge_in = asyncio.create_task(s.cancel())  # the user starts talking
            assert 1 in (await barge_in).turns
            return speech.result, await s.speak("Sure.")

    interrupted, nxt = run(go())
    assert interrupted.cancelled and interrupted.turn == 1 and len(interrupted.chunks) >= 2
    assert interrupted.audio_seconds is None  # the turn never ended
    assert nxt.turn == 2 and not nxt.cancelled and len(nxt.audio) > 0 and nxt.audio_seconds is not None


def test_invalid_field_raises_invalid_request_with_the_servers_message(server):
    with pytest.raises(InvalidRequest) as e:
        run(connect(server.ws_url, format="pcm", max_new_tokens=0))
    assert e.value.code == "invalid_field"
    assert e.value.message == "max_new_tokens must be in [1, 2048], got 0"


def test_unknown_reference_id_raises_unknown_voice(server):
    with pytest.raises(UnknownVoice, match="nobody"):
        run(connect(server.ws_url, reference_id="nobody"))


def test_wrong_api_key_raises_unauthorized(auth_server):
    with pytest.raises(Unauthorized, match="wrong API key"):
        run(connect(auth_server.ws_url, api_key="guess"))

    async def right_key():
        async with session(auth_server.ws_url, api_key="secret") as s:
            return s.ready

    assert run(right_key()).format == "pcm"


def test_a_url_without_the_live_path_says_where_the_endpoint_is(server):
    base = server.ws_url.removesuffix("/v1/tts/live")
    with pytest.raises(ConnectFailed, match="/v1/tts/live") as e:
        run(connect(base))  # ws://host:port, as a newcomer would type it
    assert e.value.code == "not_found" and "HTTP 404" in e.value.message


def test_full_server_raises_server_busy(tmp_path):
    async def go(url):
        async with session(url) as holder:  # takes the only slot
            assert holder.ready
            with pytest.raises(ServerBusy, match="busy"):
                await connect(url, format="pcm")

    with running_server(tmp_path, engine=EngineConfig(max_running=1, max_streams=1, max_queued=0)) as srv:
        run(go(srv.ws_url))


def test_no_server_raises_connect_failed():
    with pytest.raises(ConnectFailed, match="connection refused"):
        run(connect(f"ws://127.0.0.1:{free_port()}/v1/tts/live"))


def test_silence_raises_client_timeout_and_the_session_stays_usable(server):
    async def go():
        async with session(server.ws_url, read_timeout=0.3) as s:
            with pytest.raises(ClientTimeout, match="no event from the server"):
                await anext(s.audio())
            return await s.speak("Still here.")

    assert len(run(go()).audio) > 0


def test_server_going_away_mid_turn_raises_connection_lost(tmp_path):
    async def go(srv):
        async with connect(srv.ws_url, format="pcm", max_new_tokens=400, ignore_end=True) as s:
            await s.send_text("A turn the server will not finish.")
            await s.flush()
            with pytest.raises(ConnectionLost, match="connection was lost"):
                async for _ in s.audio():
                    srv.server.should_exit = True  # uvicorn shuts down

    with running_server(tmp_path) as srv:
        run(go(srv))


# --- CLI ----------------------------------------------------------------------------------

def test_cli_writes_a_wav_file(server, tmp_path):
    out = tmp_path / "hello.wav"
    p = cli("--url", server.ws_url, "--text", "Hello there.", "--format", "wav", "--out", str(out),
            "--max-new-tokens", str(FRAMES), "--seed", "3", "--ignore-end")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == b""
    rate, samples = decode(out.read_bytes())
    assert rate == 44100 and samples == FRAMES * FRAME
    assert b"TTFA" in p.stderr and b"open-to-ready" in p.stderr


def test_cli_reads_lines_from_stdin(server, tmp_path):
    out = tmp_path / "lines.pcm"
    p = cli("--url", server.ws_url, "--stdin", "--tokens", "--token-delay", "0.005", "--format", "pcm",
            "--out", str(out), "--max-new-tokens", str(FRAMES), "--chunk-length", "100",
            stdin="Hello there, this is the first line of text.\nAnd here comes the second line.\n")
    assert p.returncode == 0, p.stderr.decode()
    data = out.read_bytes()
    assert len(data) > 0 and len(data) % (FRAME * 2) == 0


def test_cli_stdout_carries_only_audio(server):
    p = cli("--url", server.ws_url, "--text", "Hello there.", "--format", "wav", "--sample-rate", "16000",
            "--out", "-", "--max-new-tokens", str(FRAMES))
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout[:4] == b"RIFF"
    rate, samples = decode(p.stdout)
    assert rate == 16000 and samples > 0
    assert b"TTFA" in p.stderr


@pytest.mark.parametrize("args, message", [
    (("--voice", "nobody"), "no stored voice with id 'nobody'"),
    (("--max-new-tokens", "0"), "max_new_tokens must be in [1, 2048], got 0"),
])
def test_cli_server_errors_exit_nonzero_with_one_line(server, args, message):
    p = cli("--url", server.ws_url, "--text", "Hi.", "--out", "-", *args)
    assert p.returncode == 1
    assert p.stdout == b""
    lines = p.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_cli_unauthorized_and_refused_exit_nonzero(auth_server):
    p = cli("--url", auth_server.ws_url, "--text", "Hi.", "--out", "-", env_extra={"REALTIME_API_KEY": "nope"})
    assert p.returncode == 1 and "wrong API key" in p.stderr.decode()
    assert len(p.stderr.decode().strip().splitlines()) == 1

    p = cli("--url", f"ws://127.0.0.1:{free_port()}/v1/tts/live", "--text", "Hi.", "--out", "-")
    assert p.returncode == 1 and "connection refused" in p.stderr.decode()
    assert len(p.stderr.decode().strip().splitlines()) == 1
