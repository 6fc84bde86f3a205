"""Faults against a real server: what the client at fault sees, and that the others go on.

- a client that does not read: cut off with `too_large` while the client beside it hears
  its audio at the usual pace (test_service covers the freed slot and the HTTP case);
- a client that vanishes without a close frame (TCP reset, or silence): its engine stream
  is freed (/v1/health `streams`), at once or after the idle timeout;
- an engine worker thread that stops: every stream, whatever its state (speaking, ready,
  waiting for a stream, an HTTP request), hears `internal`; health turns 503 (test_service
  covers each thread and a lost device);
- out of device memory in a prefill: that request hears `busy`, and the engine goes on;
- a full or read-only voices folder: `POST /v1/voices` fails with a JSON reason, leaving no
  partial voice; a corrupt stored voice at start-up is logged and skipped.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import pathlib
import socket
import struct
import time

import httpx
import msgpack
import numpy as np
import pytest
import torch
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from engine.audio import wav_bytes
from engine.engine import EngineConfig
from server import bundle, running_server
from test_service import HOP, RATE, TEXT, audio_of, expect_error, session

LONG = {"format": "pcm", "max_new_tokens": 1500}


def open_streams(http_url: str) -> int:
    """Engine streams open, as /v1/health reports them."""
    streams = httpx.get(f"{http_url}/v1/health").json()["streams"]
    return sum(n for phase, n in streams.items() if phase != "closed")


def wait_for(condition, timeout: float, what) -> float:
    """Seconds until condition() held (fails after timeout, saying what())."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, f"not within {timeout} s: {what()}"
        time.sleep(0.05)
    return time.monotonic() - t0


async def async_wait_for(condition, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def first_audio(url: str, request: dict, text: str = "Talk for a long while please."):
    """A connection whose turn is being spoken: (websocket, events up to its first audio)."""
    ws = await websockets.connect(url, max_size=None)
    await ws.send(msgpack.packb({"event": "start", "request": request}))
    await ws.send(msgpack.packb({"event": "text", "text": text}))
    await ws.send(msgpack.packb({"event": "flush"}))
    events = []
    while (e := msgpack.unpackb(await ws.recv()))["event"] != "audio":
        events.append(e)
    return ws, events + [e]


# --- a client that does not read --------------------------------------------------------------

def test_a_slow_reader_is_cut_off_while_the_client_beside_it_hears_its_audio_promptly(tmp_path):
    # ~95 s of audio, made in ~15 s here; the slow reader is cut once the socket buffers
    # on its way hold ~700 frames of its turn (~6 s here), while this one is spoken
    frames = 2000
    with running_server(tmp_path, engine=EngineConfig(max_running=2, max_queued=2, max_len=4096), ignore_end=True,
                        max_pending_audio_bytes=256 << 10) as s:
        errors = s.services.metrics.errors

        async def normal():
            arrivals, events = [], []
            async with websockets.connect(s.ws_url, max_size=None) as ws:
                await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "max_new_tokens": frames}}))
                assert msgpack.unpackb(await ws.recv())["event"] == "ready"
                await ws.send(msgpack.packb({"event": "text", "text": "I am the one beside it."}))
                await ws.send(msgpack.packb({"event": "stop"}))
                async for frame in ws:
                    events.append(msgpack.unpackb(frame))
                    arrivals.append((time.monotonic(), events[-1]["event"], errors["too_large"]))
            return events, arrivals

        async def main():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its side fills at once
            sock.connect(("127.0.0.1", s.port))
            slow = await websockets.connect(s.ws_url, sock=sock, max_size=None, max_queue=1)
            await slow.send(msgpack.packb({"event": "start", "request": LONG}))
            await slow.send(msgpack.packb({"event": "text", "text": "Talk for a long while please."}))
            await slow.send(msgpack.packb({"event": "flush"}))
            engine = s.services.engine
            await async_wait_for(lambda: engine.stats()["streams_decoding"] == 1, 10, "the slow reader's turn")
            beside = await normal()  # while the slow one reads nothing
            await async_wait_for(lambda: errors["too_large"] == 1, 30, "the slow reader cut off")
            async with asyncio.timeout(30):
                tail = [msgpack.unpackb(f) async for f in slow]
            return beside, tail

        (events, arrivals), tail = asyncio.run(main())
    assert [e["event"] for e in tail[-2:]] == ["error", "finish"] and tail[-2]["code"] == "too_large"
    assert len(audio_of(events)) == 2 * frames * HOP and events[-1] == {"event": "finish", "reason": "stop"}
    audio = [(t, cut) for t, kind, cut in arrivals if kind == "audio"]
    assert audio[0][1] == 0 < audio[-1][1]  # the cut came while this turn was spoken
    gaps = np.diff([t for t, _ in audio])
    played = frames * HOP / RATE
    print(f"\nbeside a slow reader: {len(audio)} chunks, largest gap {gaps.max() * 1000:.0f} ms, "
          f"{played:.1f} s of audio in {audio[-1][0] - audio[0][0]:.1f} s")
    assert gaps.max() < 1.0  # never a second without audio (a chunk is 1-4 frames, 46-186 ms)
    assert audio[-1][0] - audio[0][0] < played  # faster than it plays


# --- a client that vanishes -------------------------------------------------------------------

class RawClient:
    """A blocking WebSocket client on a plain socket (websockets' sans-I/O protocol), so that
    it can vanish as a crashed client or a dead network does: no close frame, only a TCP
    reset (`reset`) or nothing at all."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/tts/live"), max_size=None)
        self.proto.send_request(self.proto.connect())
        self.events: list[dict] = []
        self._flush()
        while self.proto.state is State.CONNECTING:
            self._read(10)
        assert self.proto.state is State.OPEN, self.proto.handshake_exc

    def _flush(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                self.sock.sendall(data)

    def _read(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 16)
        self.proto.receive_data(data) if data else self.proto.receive_eof()
        for ev in self.proto.events_received():
            if isinstance(ev, Frame) and ev.opcode is Opcode.BINARY:
                self.events.append(msgpack.unpackb(ev.data))
        self._flush()  # pongs, the close reply
        return bool(data)

    def send(self, event: dict) -> None:
        self.proto.send_binary(msgpack.packb(event))
        self._flush()

    def until(self, kind: str, timeout: float = 30) -> None:
        while not any(e["event"] == kind for e in self.events):
            assert self._read(timeout), f"closed before {kind!r}: {self.events}"

    def reset(self) -> None:
        """Gone without a close frame or a FIN: SO_LINGER 0 makes close() send a TCP reset."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def test_clients_that_vanish_without_a_close_frame_free_their_streams(tmp_path):
    idle_timeout = 2.0
    with running_server(tmp_path, engine=EngineConfig(max_running=2, max_queued=2, max_len=2048), ignore_end=True,
                        idle_timeout_s=idle_timeout) as s:
        crashed = RawClient(s.port)  # mid-turn: its socket is reset
        crashed.send({"event": "start", "request": LONG})
        crashed.send({"event": "text", "text": "Talk for a long while please."})
        crashed.send({"event": "flush"})
        crashed.until("audio")
        silent = RawClient(s.port)  # between turns: it just stops (a dead network, no FIN, no reset)
        silent.send({"event": "start", "request": {"format": "pcm"}})
        silent.until("ready")
        assert open_streams(s.http_url) == 2
        crashed.reset()
        health = lambda: httpx.get(f"{s.http_url}/v1/health").json()["streams"]  # noqa: E731
        freed = wait_for(lambda: open_streams(s.http_url) == 1, idle_timeout, health)
        served = asyncio.run(session(s.ws_url, {"format": "pcm", "max_new_tokens": 12}, *TEXT))
        closed = wait_for(lambda: open_streams(s.http_url) == 0, idle_timeout + 5, health)
        while silent._read(5):  # what the server said before closing it
            pass
    print(f"\nreset mid-turn: stream freed in {freed:.2f} s; silent: freed {closed:.1f} s later "
          f"(idle timeout {idle_timeout:g} s)")
    assert len(audio_of(served)) == 2 * 12 * HOP and served[-1] == {"event": "finish", "reason": "stop"}
    expect_error(silent.events, "timeout", f"no message for {idle_timeout:g} s")


# --- an engine worker thread stops ------------------------------------------------------------

def test_a_stopped_engine_thread_fails_streams_in_every_state(tmp_path):
    """test_service runs each thread's crash with one speaking stream; here the decode thread
    stops while one stream speaks, one is ready between turns, one waits for a free stream
    and an HTTP request waits too: each hears `internal` at once, none hangs."""
    with running_server(tmp_path, engine=EngineConfig(max_running=2, max_streams=2, max_queued=2, max_len=2048),
                        ignore_end=True) as s:
        engine = s.services.engine

        def broken(*args, **kwargs):
            raise RuntimeError("injected fault")

        async def until_close(ws):
            return [msgpack.unpackb(f) async for f in ws]

        async def main():
            speaking, head = await first_audio(s.ws_url, LONG)
            ready = await websockets.connect(s.ws_url, max_size=None)
            await ready.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
            assert msgpack.unpackb(await ready.recv())["event"] == "ready"
            waiting = await websockets.connect(s.ws_url, max_size=None)
            await waiting.send(msgpack.packb({"event": "start", "request": {"format": "pcm"}}))
            async with httpx.AsyncClient(timeout=30) as http:
                oneshot = asyncio.create_task(http.post(f"{s.http_url}/v1/tts", json={"text": "Waiting.", "format": "pcm"}))
                await async_wait_for(lambda: engine.stats()["streams_queued"] == 2, 10, "two streams waiting")
                t0 = time.monotonic()
                engine.sched.decode_batch = broken
                async with asyncio.timeout(10):
                    ends = await asyncio.gather(until_close(speaking), until_close(ready), until_close(waiting))
                    response = await oneshot
            return ends, response, time.monotonic() - t0

        (speaking, ready, waiting), response, took = asyncio.run(main())
        for events in (speaking, ready, waiting):
            expect_error(events, "internal", "the engine's decode thread stopped (RuntimeError: injected fault)")
        assert [e["event"] for e in waiting] == ["error", "finish"]  # it never became ready
        assert response.status_code == 500 and "restart the service" in response.json()["message"]
        assert took < 5
        health = httpx.get(f"{s.http_url}/v1/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        refused = asyncio.run(session(s.ws_url, {"format": "pcm"}))
        expect_error(refused, "internal", "restart the service")


# --- out of device memory ---------------------------------------------------------------------

def test_out_of_memory_in_a_prefill_is_busy_for_that_request_and_the_engine_goes_on(tmp_path):
    """torch.OutOfMemoryError from the runner's prefill (once): the request in that prefill
    hears `busy` (with the Fish concurrency fields: retry later), the stream already speaking
    is untouched, the engine is not marked failed, and the next requests are served."""
    with running_server(tmp_path, engine=EngineConfig(max_running=4, max_queued=2, max_len=2048),
                        ignore_end=True) as s:
        engine = s.services.engine
        prefill = engine.runner.prefill_segments
        failures = []

        def out_of_memory_once(*args, **kwargs):
            if len(failures) < 1:
                failures.append(1)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            return prefill(*args, **kwargs)

        async def main():
            speaking, head = await first_audio(s.ws_url, {"format": "pcm", "max_new_tokens": 200})
            engine.runner.prefill_segments = out_of_memory_once
            victim = await session(s.ws_url, {"format": "pcm", "max_new_tokens": 12}, *TEXT)
            failures.clear()  # and once more, for an HTTP request
            http = await asyncio.to_thread(httpx.post, f"{s.http_url}/v1/tts", json={"text": "Hi.", "format": "pcm"})
            rest = []
            while not rest or rest[-1]["event"] != "turn_end":
                rest.append(msgpack.unpackb(await speaking.recv()))
            await speaking.close()
            after = await session(s.ws_url, {"format": "pcm", "max_new_tokens": 12}, *TEXT)
            return head + rest, victim, http, after

        speaking, victim, http, after = asyncio.run(main())
        expect_error(victim, "busy", "the prefill ran out of device memory; try again")
        busy = next(e for e in victim if e["event"] == "error")
        assert busy["error"] == "Concurrency limit exceeded" and busy["max_concurrency"] == engine.config.max_streams
        assert http.status_code == 503 and http.json()["code"] == "busy" and "device memory" in http.json()["message"]
        assert sum(len(e["audio"]) for e in speaking if e["event"] == "audio") == 2 * 200 * HOP
        assert [e["event"] for e in speaking if e["event"] != "audio"] == ["ready", "turn_end"]
        assert len(audio_of(after)) == 2 * 12 * HOP and after[-1] == {"event": "finish", "reason": "stop"}
        assert engine.failure is None and httpx.get(f"{s.http_url}/v1/health").json()["status"] == "ok"


# --- the voices folder ------------------------------------------------------------------------

REF = wav_bytes((0.3 * np.sin(2 * np.pi * 200 * np.arange(RATE // 2) / RATE)).astype(np.float32), RATE)


def add_voice(http_url: str, voice_id: str) -> httpx.Response:
    return httpx.post(f"{http_url}/v1/voices", headers={"content-type": "application/msgpack"}, timeout=30,
                      content=msgpack.packb({"id": voice_id, "references": [{"audio": REF, "text": "A hum."}]}))


def stored(http_url: str) -> list[str]:
    return sorted(v["id"] for v in httpx.get(f"{http_url}/v1/voices").json()["voices"])


def test_a_full_disk_refuses_a_new_voice_with_507_and_leaves_nothing_of_it(tmp_path, monkeypatch):
    import realtime.voices

    def disk_full(path, array):  # part of the file is written, then the disk is full
        pathlib.Path(path).write_bytes(b"\x93NUMPY partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with running_server(tmp_path) as s:
        assert add_voice(s.http_url, "kept").status_code == 201
        monkeypatch.setattr(realtime.voices.np, "save", disk_full)
        r = add_voice(s.http_url, "new")
        assert r.status_code == 507 and r.json()["error"] == "storage"
        assert "No space left on device" in r.json()["message"]
        assert stored(s.http_url) == ["kept"] and os.listdir(tmp_path / "voices") == ["kept"]
        monkeypatch.undo()  # space again: the same voice goes in
        assert add_voice(s.http_url, "new").status_code == 201 and stored(s.http_url) == ["kept", "new"]


def test_a_read_only_voices_folder_refuses_changes_and_keeps_its_voices(tmp_path, monkeypatch):
    with running_server(tmp_path) as s:
        assert add_voice(s.http_url, "kept").status_code == 201
        folder = tmp_path / "voices"
        folder.chmod(0o555)
        try:
            probe = folder / ".probe"
            try:
                probe.mkdir()  # root ignores the mode: a read-only file system instead
                probe.rmdir()
                for name in ("mkdir", "rename"):
                    def read_only(*args, **kwargs):
                        raise OSError(errno.EROFS, "Read-only file system")
                    monkeypatch.setattr(pathlib.Path, name, read_only)
            except PermissionError:
                pass
            r = add_voice(s.http_url, "new")
            gone = httpx.delete(f"{s.http_url}/v1/voices/kept")
            monkeypatch.undo()
        finally:
            folder.chmod(0o755)
        for response in (r, gone):
            assert response.status_code == 500 and response.json()["error"] == "storage"
            assert any(why in response.json()["message"] for why in ("Read-only file system", "Permission denied"))
        assert stored(s.http_url) == ["kept"] and os.listdir(folder) == ["kept"]
        assert json.loads((folder / "kept" / "voice.json").read_text())["id"] == "kept"


def test_a_corrupt_stored_voice_is_logged_and_skipped_at_start_up(tmp_path, caplog):
    from realtime.voices import VoiceStore

    folder = tmp_path / "voices"
    codebooks = bundle("tiny").config.num_codebooks
    store = VoiceStore(folder, codebooks)
    for voice_id in ("good", "no-codes", "wrong-shape"):
        store.add(voice_id, [("A hum.", torch.randint(0, 8, (codebooks, 10)))], voice_id)
    (folder / "no-codes" / "ref0.npy").unlink()
    np.save(folder / "wrong-shape" / "ref0.npy", np.zeros((codebooks + 1, 10), np.int16))
    (folder / "garbled").mkdir()
    (folder / "garbled" / "voice.json").write_text("{not json")
    (folder / ".interrupted.tmp").mkdir()  # a write the process did not finish
    (folder / ".interrupted.tmp" / "voice.json").write_text("{")
    with caplog.at_level(logging.ERROR, logger="realtime.voices"), running_server(tmp_path, ignore_end=True) as s:
        assert stored(s.http_url) == ["good"]
        events = asyncio.run(session(s.ws_url, {"format": "pcm", "reference_id": "good", "max_new_tokens": 4}, *TEXT))
    assert events[0]["event"] == "ready" and events[-1] == {"event": "finish", "reason": "stop"}
    skipped = sorted(r.getMessage().split()[2].rsplit("/", 1)[1] for r in caplog.records)
    assert skipped == ["garbled", "no-codes", "wrong-shape"], [r.getMessage() for r in caplog.records]
