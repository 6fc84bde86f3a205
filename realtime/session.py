"""One live WebSocket connection: protocol state, text buffering, turns, audio out.

States: AWAITING_START -> PREPARING (voice prefilling; text is already accepted) ->
READY -> STOPPING (after `stop`: the rest is spoken) -> FINISHED.

Turns: text accumulates into the current turn; `flush` (or `stop`) closes it and the
next text opens a new one. Each turn is cut into segments (realtime/segmenter.py) that
the engine speaks in order. `cancel` drops every unfinished turn: from then on, no audio
of those turns is sent. All methods run on the event loop; engine callbacks arrive from
engine threads and are moved onto the loop through its mailbox (realtime/mailbox.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, deque
from dataclasses import replace
from enum import Enum

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.engine import EngineFailed, Refused
from realtime import protocol as P
from realtime.audio_out import AudioEncoder
from realtime.errors import concurrency_fields, log_refusal
from realtime.mailbox import LoopMailbox
from realtime.segmenter import TextSegmenter
from realtime.services import Services
from realtime.timestamps import Alignment

log = logging.getLogger("realtime.session")

DRAINING = "the server is shutting down"


class State(Enum):
    AWAITING_START = "awaiting_start"
    PREPARING = "preparing"
    READY = "ready"
    STOPPING = "stopping"
    FINISHED = "finished"


class EngineSink:
    """Engine callbacks (worker threads) -> the session's event loop, through the loop's
    mailbox (realtime/mailbox.py: one wake-up for a burst of events of all sessions)."""

    def __init__(self, session: "LiveSession", mailbox: LoopMailbox) -> None:
        self._session, self._post = session, mailbox.post

    def on_ready(self, voice_cached: bool, prefill_ms: float) -> None:
        self._post(self._session.on_ready, voice_cached, prefill_ms)

    def on_audio(self, turn: int, pcm: np.ndarray) -> None:
        self._post(self._session.on_audio, turn, pcm)

    def on_segment_end(self, turn: int, reason: str) -> None:
        self._post(self._session.on_segment_end, turn, reason)

    def on_words(self, turn: int, words: list) -> None:  # only for word_timestamps streams
        self._post(self._session.on_words, turn, words)

    def on_error(self, code: str, message: str) -> None:
        self._post(self._session.on_engine_error, code, message)


class LiveSession:
    def __init__(self, ws: WebSocket, services: Services, timestamps: bool = False) -> None:
        self.ws = ws
        # /v1/tts/live/with-timestamp: audio events carry the alignment (realtime/timestamps.py)
        self.timestamps = timestamps
        self.alignment: Alignment | None = None  # words and audio positions (both paths)
        self.svc = services
        self.limits = services.config.limits
        self.id = uuid.uuid4().hex[:16]
        self.state = State.AWAITING_START
        self.handle = None
        self.request: P.TTSRequest | None = None
        self.encoder: AudioEncoder | None = None
        self.segmenter: TextSegmenter | None = None
        self.turn = 1
        self.sent: Counter[int] = Counter()  # segments handed to the engine, per turn
        self.done: Counter[int] = Counter()  # segments the engine finished, per turn
        self.closed_turns: set[int] = set()  # flushed: no more text joins them
        self.cancelled: set[int] = set()
        # receipt of the client event that handed the turn's first segment to the engine
        # (its flush, as a rule): where the turn's TTFA and every chunk's gen_ms start
        self.turn_started: dict[int, float] = {}
        self._no_audio_yet: set[int] = set()  # turns started whose first audio event is not sent
        self._received_at = time.perf_counter()  # the client event being handled
        self.ready_at: float | None = None
        self.turn_audio: Counter[int] = Counter()  # output samples per turn
        self.pending_chars = 0  # handed to the engine, not yet spoken
        self._segment_chars: deque[int] = deque()  # lengths of unfinished segments, in order
        self.seq = 0
        self._samples_sent = 0  # encoder output samples already announced in audio events
        self.opened_at = time.perf_counter()
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._out_bytes = 0
        self._closing = False
        self._done = asyncio.Event()
        self._draining = False  # the service drains (LiveSession.drain)
        self._close_code = 1000

    # --- connection ------------------------------------------------------------------------

    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        try:
            await self._receive_loop()
        except WebSocketDisconnect:
            pass
        except P.ProtocolError as e:
            self._fail(e.code, e.message)
        except Exception as e:  # a bug must end this session only, never the server
            log.exception("session %s failed", self.id)
            self._fail(P.ErrorCode.INTERNAL, f"internal error: {type(e).__name__}")
        finally:
            self._release_engine()
            if not self._closing:
                self._closing = True
                self._out.put_nowait(None)
            await writer

    async def _receive_loop(self) -> None:
        while not self._closing:
            timeout = self._receive_timeout()
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout=timeout)
            except asyncio.TimeoutError:
                if self._busy():
                    continue
                if self.state is State.AWAITING_START:
                    raise P.ProtocolError(P.ErrorCode.TIMEOUT, f"no 'start' within {timeout:g} s of connecting") from None
                raise P.ProtocolError(P.ErrorCode.TIMEOUT, f"no message for {timeout:g} s") from None
            self._received_at = time.perf_counter()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            if self._closing:
                # closed while this message was on its way (the client went away under a
                # send, or the session failed from an engine event): its engine stream is
                # released already, so nothing it asks for can be done
                return
            data = message.get("bytes")
            if data is None:
                raise P.ProtocolError(P.ErrorCode.BAD_MESSAGE, "frames must be binary MessagePack, got a text frame")
            self._handle(P.parse_client_event(data, self.limits))

    def _receive_timeout(self) -> float:
        if self.state is State.AWAITING_START:
            return self.svc.config.start_timeout_s
        if self.state is State.PREPARING:
            # the wait that begins now outlasts the prefill: after `ready` it is the idle
            # wait, so no longer than that (a silent client was kept ready_timeout_s more)
            return min(self.svc.config.ready_timeout_s, self.svc.config.idle_timeout_s)
        return self.svc.config.idle_timeout_s

    def _busy(self) -> bool:
        return self.state in (State.PREPARING, State.STOPPING) or self.pending_chars > 0

    async def _writer(self) -> None:
        while (item := await self._out.get()) is not None:
            self._out_bytes -= len(item)
            try:
                await self.ws.send_bytes(item)
            except Exception:  # the client went away; the receive side notices too
                self._closing = True
                break
        try:
            await self.ws.close(code=self._close_code)
        except Exception:
            pass
        self._release_engine()
        self._done.set()

    def _send(self, event: dict) -> None:
        if self._closing:
            return
        data = P.pack(event)
        if self._out_bytes + len(data) > self.svc.config.max_pending_audio_bytes:
            self._fail(P.ErrorCode.TOO_LARGE, "the client is not reading its audio fast enough", slow_reader=True)
            return
        self._enqueue(data)

    def _enqueue(self, data: bytes) -> None:
        self._out_bytes += len(data)
        self._out.put_nowait(data)

    def _fail(self, code: P.ErrorCode, message: str, slow_reader: bool = False) -> None:
        """Send error + finish{error}, then close. The rest of the server carries on.
        The two events go out whatever audio is waiting (they are the client's only
        word on why the stream ended); for a client that does not read its audio, the
        audio still waiting is dropped first, so they come next and the memory is freed."""
        if self._closing:
            return
        self.svc.metrics.errors[code.value] += 1
        log_refusal(code.value, message)
        if slow_reader:
            while not self._out.empty():
                self._out_bytes -= len(self._out.get_nowait())
        error = P.error_event(code, message)
        if code is P.ErrorCode.BUSY and not self._draining:  # no capacity: the hosted Fish API's fields too
            error |= concurrency_fields(self.svc.engine.config.max_streams)
        if self.timestamps:  # the docs' example for this endpoint reads the message from `error`
            error.setdefault("error", message)
        for event in (error, P.finish_event("error", message)):
            self._enqueue(P.pack(event))
        self._finish()

    def _finish(self) -> None:
        self.state = State.FINISHED
        self._closing = True
        self._release_engine()
        self._out.put_nowait(None)

    def drain(self) -> None:
        """The service shuts down (Services.drain): the turns in flight (text handed over,
        or received and waiting for its flush) are spoken to their end, then `finish {stop}`
        and a close with 1001 (going away); a connection with nothing in flight finishes at
        once. One that has not sent `start` gets `busy`: its request was never taken."""
        self._draining = True
        self._close_code = 1001
        if self.state is State.AWAITING_START:
            self._fail(P.ErrorCode.BUSY, f"{DRAINING}: connect to another replica or try again")
        else:
            self._maybe_finish_drained()

    def cut(self, message: str) -> None:
        """The drain's time is up: error {busy} + finish {error}, whatever is in flight."""
        self._fail(P.ErrorCode.BUSY, message)

    def _maybe_finish_drained(self) -> None:
        if not self._draining or self._closing or self.state not in (State.PREPARING, State.READY):
            return
        if self.segmenter.buffered_chars == 0 and self._all_done():
            self.state = State.STOPPING  # as if the client sent `stop`: the encoder's tail, then finish
            self._maybe_finish()

    def _release_engine(self) -> None:
        if self.handle is not None:
            self.svc.engine.close(self.handle)  # frees the KV slot within one step
            self.handle = None

    # --- client events -----------------------------------------------------------------------

    def _handle(self, event: P.ClientEvent) -> None:
        if isinstance(event, P.Start):
            self._start(event.request)
            return
        if self.state is State.AWAITING_START:
            raise P.ProtocolError(P.ErrorCode.OUT_OF_ORDER, f"'{type(event).__name__.lower()}' before 'start'")
        if self.state is State.STOPPING:
            raise P.ProtocolError(P.ErrorCode.OUT_OF_ORDER, f"'{type(event).__name__.lower()}' after 'stop'")
        if isinstance(event, P.Text):
            self._text(event.text)
        elif isinstance(event, P.Flush):
            self._flush()
        elif isinstance(event, P.Stop):
            self._flush()
            self.state = State.STOPPING
            self._maybe_finish()
        elif isinstance(event, P.Cancel):
            self._cancel()
        self._maybe_finish_drained()  # a flush of nothing, or a cancel, may leave nothing in flight

    def _start(self, req: P.TTSRequest) -> None:
        if self.state is not State.AWAITING_START:
            raise P.ProtocolError(P.ErrorCode.OUT_OF_ORDER, "'start' was already received")
        voice = self.svc.resolve_voice(req)  # raises ProtocolError(UNKNOWN_VOICE)
        try:
            self.encoder = AudioEncoder(
                req.format, req.output_rate, self.svc.engine.sample_rate, req.mp3_bitrate, req.opus_bitrate,
                speed=req.prosody.speed if req.prosody else 1.0,
                volume_db=req.prosody.volume if req.prosody else 0.0,
            )
        except ValueError as e:
            raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, str(e)) from None
        self.segmenter = TextSegmenter(req.chunk_length, min(req.min_chunk_length, req.chunk_length), req.latency)
        self.request = req
        self.alignment = Alignment(self.svc.engine.sample_rate, req.output_rate,
                                   req.prosody.speed if req.prosody else 1.0, self.encoder.decoder_delay)
        params = self.svc.stream_params(req)
        if self.timestamps:
            params = replace(params, word_timestamps=True)
        try:
            self.handle = self.svc.engine.open(voice, params, EngineSink(self, self.svc.mailbox()))
        except Refused as e:
            raise P.ProtocolError(P.ErrorCode.BUSY, f"server busy: {e}") from None
        except EngineFailed as e:
            raise P.ProtocolError(P.ErrorCode.INTERNAL, str(e)) from None
        self.state = State.PREPARING
        if req.text:
            self._text(req.text)

    def _text(self, text: str) -> None:
        if self.segmenter.buffered_chars + self.pending_chars + len(text) > self.limits.max_buffered_chars:
            raise P.ProtocolError(P.ErrorCode.TOO_LARGE, f"more than {self.limits.max_buffered_chars} characters are waiting to be spoken")
        self._say(self.segmenter.push(text))

    def _say(self, segments: list[str]) -> None:
        for segment in segments:
            self.svc.engine.say(self.handle, self.turn, segment)
            if self.timestamps:
                self.alignment.segment(self.turn, segment)
            self.sent[self.turn] += 1
            self.pending_chars += len(segment)
            self._segment_chars.append(len(segment))
            if self.turn not in self.turn_started:
                self.turn_started[self.turn] = self._received_at
                self._no_audio_yet.add(self.turn)

    def _flush(self) -> None:
        self._say(self.segmenter.flush())
        if self.sent[self.turn]:
            self.closed_turns.add(self.turn)
            self._maybe_end_turn(self.turn)
            self.turn += 1

    def _cancel(self) -> None:
        self.svc.engine.cancel(self.handle)
        current_has_text = bool(self.sent[self.turn] or self.segmenter.buffered_chars)
        self.segmenter.clear()
        dropped = [t for t in self.sent if t not in self.cancelled and self.done[t] < self.sent[t]]
        if current_has_text and self.turn not in dropped:
            dropped.append(self.turn)
        self.cancelled.update(dropped)
        self._no_audio_yet.difference_update(dropped)
        self.pending_chars = 0
        self._segment_chars.clear()
        heard = self._heard(dropped)  # before the audio still in the encoder is dropped
        pos = self.encoder.samples_in
        if self.encoder.discard():  # audio of the dropped turns still inside the encoder: discarded
            self.alignment.restart(self.encoder.samples_in, self._encoder_seconds())
        else:
            self.alignment.drop_unsent(self._encoder_seconds(), pos)
        if current_has_text:
            self.turn += 1
        self._send(P.cancelled_event(sorted(dropped), self.turn) | heard)

    def _heard(self, dropped: list[int]) -> dict:
        """What the client was sent of the dropped turns: `audio_seconds`; with timestamps,
        `last_word`, the last word whose audio it has, and their final snapshots."""
        a = self.alignment
        a.set_released(self._encoder_seconds())
        heard = {"audio_seconds": round(a.seconds_since(dropped), 4)}
        if not self.timestamps:
            return heard
        words = [(t, w) for t in sorted(dropped) for w in a.turn_words(t)]
        heard["last_word"] = None if not words else words[-1][1].as_dict() | {"turn": words[-1][0]}
        for t in dropped:
            a.end_turn(t, cancelled=True)
        self._send_snapshots()
        return heard

    # --- engine events (on the loop) ---------------------------------------------------------

    def on_ready(self, voice_cached: bool, prefill_ms: float) -> None:
        if self.state is not State.PREPARING and self.state is not State.STOPPING:
            return
        if self.state is State.PREPARING:
            self.state = State.READY
        self.ready_at = time.perf_counter()
        self.svc.metrics.open_to_ready.observe(self.ready_at - self.opened_at)
        req = self.request
        self._send(P.ready_event(self.id, req.output_rate, req.format, voice_cached, prefill_ms))

    def on_audio(self, turn: int, pcm: np.ndarray) -> None:
        if self._closing or turn in self.cancelled:
            return
        self.alignment.audio(turn, len(pcm), self.encoder.samples_in)
        data = self.encoder.encode(pcm)
        self.turn_audio[turn] += len(pcm)
        self.svc.metrics.audio_seconds += len(pcm) / self.svc.engine.sample_rate
        if data:  # an encoder may hold the first chunks back (MP3 lookahead): no event, no TTFA
            self._send_audio(data, turn)

    def _send_audio(self, data: bytes, turn: int, tail: bool = False) -> None:
        now = time.perf_counter()
        started = self.turn_started.get(turn, self.opened_at)
        self.seq += 1
        samples = self.encoder.samples_out - self._samples_sent  # audio in this chunk
        self._samples_sent = self.encoder.samples_out
        gen_ms = 0.0 if tail else (now - started) * 1000
        event = P.audio_event(data, turn, self.seq, samples, self.request.output_rate, gen_ms)
        if self.timestamps:
            self.alignment.set_released(self._encoder_seconds())
            snapshots = self.alignment.take()
            event |= snapshots[0][1]
            self._send(event | {"time": round((now - self.opened_at) * 1000, 1)})
            self._send_snapshots(snapshots[1:])
        else:
            self._send(event)
        if turn in self._no_audio_yet and not self._closing:
            # TTFA as DESIGN.md and latency_bench define it: the turn's flush to its first
            # non-empty audio event; a flush sent before `ready` counts from `ready` (the
            # voice prefill is open-to-ready's, not hidden in TTFA)
            self._no_audio_yet.discard(turn)
            self.svc.metrics.ttfa.observe(now - max(started, self.ready_at or started))

    def on_words(self, turn: int, words: list) -> None:
        if not self._closing and turn not in self.cancelled:
            self.alignment.words(turn, words)

    def _encoder_seconds(self) -> float:
        return self.encoder.released_samples / self.request.output_rate

    def _send_snapshots(self, snapshots: list | None = None) -> None:
        """Snapshots no audio event carries, each in an audio event with empty audio (the
        docs' trailing correction): a chunk's final words, a turn's end."""
        if snapshots is None:
            self.alignment.set_released(self._encoder_seconds())
            snapshots = self.alignment.take(repeat=False)
        now = time.perf_counter()
        for turn, fields in snapshots:
            self.seq += 1
            event = P.audio_event(b"", turn, self.seq, 0, self.request.output_rate, 0.0) | fields
            self._send(event | {"time": round((now - self.opened_at) * 1000, 1)})

    def on_segment_end(self, turn: int, reason: str) -> None:
        if self._closing:
            return
        self.done[turn] += 1
        if turn not in self.cancelled:
            self.alignment.segment_end(turn)
            # segments of a stream finish in the order they were handed over
            self.pending_chars -= self._segment_chars.popleft() if self._segment_chars else 0
            self._maybe_end_turn(turn)
        self._maybe_finish()
        self._maybe_finish_drained()

    def on_engine_error(self, code: str, message: str) -> None:
        try:
            error = P.ErrorCode(code)
        except ValueError:
            error = P.ErrorCode.INTERNAL
        self._fail(error, message)

    # --- completion ----------------------------------------------------------------------

    def _all_done(self) -> bool:
        return all(self.done[t] >= n for t, n in self.sent.items() if t not in self.cancelled)

    def _maybe_end_turn(self, turn: int) -> None:
        if turn in self.closed_turns and turn not in self.cancelled and self.done[turn] >= self.sent[turn]:
            # the turn's last samples may sit in the encoder (a partial Opus packet, LAME's
            # lookahead, the resampler's filter): push them out before saying it ended
            if tail := self.encoder.drain():
                self._send_audio(tail, turn, tail=True)
            if self.timestamps:
                self.alignment.end_turn(turn)
                self._send_snapshots()
            self._send(P.turn_end_event(turn, self.turn_audio[turn] / self.svc.engine.sample_rate))

    def _maybe_finish(self) -> None:
        if self.state is not State.STOPPING or not self._all_done() or self._closing:
            return
        tail = self.encoder.flush()
        if tail:
            self._send_audio(tail, self.turn - 1, tail=True)
        if self.timestamps:  # the encoder's tail is the last turn's audio
            self.alignment.close()
            self._send_snapshots()
        self._send(P.finish_event("stop", DRAINING if self._draining else None))
        self._finish()
