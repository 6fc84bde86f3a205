"""Asyncio client of the live TTS service. It speaks only the public wire protocol
(realtime/protocol.py): binary MessagePack frames over one WebSocket.

    async with connect(url, format="pcm", reference_id="alice", api_key=key) as session:
        print(session.ready.open_to_ready_ms)
        result = await session.speak("Hello there. How are you?")   # text + flush, all audio
        pcm, ttfa = result.audio, result.ttfa_ms

        async for chunk in session.speak(llm_tokens()):   # text streams while audio arrives
            play(chunk.data)

        await session.cancel()                             # barge-in: drop the current turn

    async with connect(url, timestamps=True) as session:   # /v1/tts/live/with-timestamp
        result = await session.speak("Hello there.")
        for word in result.words:                          # Word(text, start, end), seconds
            print(word.start, word.end, word.text)         # from the turn's first audio

A background task reads every server frame as it arrives (so `received_at` and the timings
are exact even when the caller is slow to consume) and queues typed events: `AudioChunk`,
`TurnEnd`, `Cancelled`, `Finished`. Read them with `events()`, `audio()` or `speak()`, one
reader at a time. Server errors are raised as typed exceptions (clients/errors.py).

Turns are numbered as the server numbers them: a turn is the text between two flushes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from clients.errors import (
    ClientTimeout, ConnectFailed, ConnectionLost, ServerBusy, Unauthorized, VoiceServiceError, error_from_code,
)

DEFAULT_URL = "ws://127.0.0.1:8765/v1/tts/live"
MAX_TEXT_PIECE = 2000  # longer texts are sent as several `text` events (server limit: 10,000 chars)
ACK_TIMEOUT_S = 10.0  # how long cancel() waits for `cancelled`

TextSource = str | Iterable[str] | AsyncIterable[str]


# --- what the server sends, typed ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReadyInfo:
    session_id: str
    sample_rate: int
    format: str
    voice_cached: bool  # the voice prompt was already prefilled by an earlier connection
    prefill_ms: float  # server side: the voice prefill
    open_to_ready_ms: float  # client side: from opening the connection to receiving `ready`


@dataclass(frozen=True, slots=True)
class Word:
    text: str  # the word, without its leading and trailing punctuation
    start: float  # seconds from the start of its turn's audio
    end: float


@dataclass(frozen=True, slots=True)
class ChunkAlignment:
    """The latest alignment snapshot of one text chunk (timestamp sessions)."""

    chunk_seq: int
    turn: int
    content: str  # the chunk's text
    offset: float  # chunk_audio_offset_sec: its start in all the session's audio
    audio_duration: float
    segments: tuple[dict, ...]  # {text, start, end}, seconds from the chunk's start


@dataclass(frozen=True, slots=True)
class AudioChunk:
    data: bytes  # encoded audio in the session's format (pcm: s16le mono); b"": an alignment only
    turn: int
    seq: int  # per session, from 1
    samples: int  # audio in this chunk, at sample_rate
    sample_rate: int
    gen_ms: float  # server side: from the turn's first segment reaching the engine to this chunk
    received_at: float  # time.perf_counter() when the frame arrived
    chunk_seq: int | None = None  # timestamp sessions: the chunk the event's alignment is of


@dataclass(frozen=True, slots=True)
class TurnEnd:
    turn: int
    audio_seconds: float  # audio the server produced for the turn
    received_at: float


@dataclass(frozen=True, slots=True)
class Cancelled:
    turn: int  # the last cancelled turn
    turns: tuple[int, ...]  # every turn whose audio was dropped (empty: nothing was playing)
    received_at: float
    index: int  # this is the session's index-th cancel (from 1)
    audio_seconds: float | None = None  # audio of those turns the server had sent
    last_word: Word | None = None  # timestamp sessions: the last word whose audio was sent


@dataclass(frozen=True, slots=True)
class Finished:
    """`finish {reason: stop}`: everything was spoken; the server closes the connection."""

    received_at: float


Event = AudioChunk | TurnEnd | Cancelled | Finished


@dataclass(slots=True)
class TurnTiming:
    """Client-side times of one turn, all `time.perf_counter()` seconds."""

    turn: int
    first_text_at: float | None = None
    flush_at: float | None = None  # the flush (or stop) that ended the turn's text was sent
    first_audio_at: float | None = None  # first non-empty audio of the turn arrived
    ended_at: float | None = None  # turn_end arrived

    @property
    def ttfa_ms(self) -> float | None:
        """Time to first audio as DESIGN.md defines it: from sending the flush to the first
        audio. None until both happened, or when the audio began before the flush (a
        sentence end let the server start early; see `first_audio_ms`)."""
        if self.flush_at is None or self.first_audio_at is None or self.first_audio_at < self.flush_at:
            return None
        return (self.first_audio_at - self.flush_at) * 1000

    @property
    def first_audio_ms(self) -> float | None:
        """From the turn's first text to its first audio (streamed text, no flush yet)."""
        if self.first_text_at is None or self.first_audio_at is None:
            return None
        return (self.first_audio_at - self.first_text_at) * 1000


@dataclass(slots=True)
class SpeechResult:
    turn: int | None  # None: the text was empty, no turn was spoken
    chunks: list[AudioChunk] = field(default_factory=list)
    timing: TurnTiming | None = None
    audio_seconds: float | None = None  # from turn_end
    cancelled: bool = False
    words: list[Word] = field(default_factory=list)  # timestamp sessions: the turn's words heard

    @property
    def audio(self) -> bytes:
        return b"".join(c.data for c in self.chunks)

    @property
    def ttfa_ms(self) -> float | None:
        return self.timing.ttfa_ms if self.timing else None


_END = object()  # queued when the connection is over


class _SpeakDone:
    """Queued by a speak() sender once its text (and flush) is out."""


# --- the session ------------------------------------------------------------------------

class VoiceSession:
    """One live connection. Create it with `connect()`."""

    def __init__(self, ws: ClientConnection, request: dict, opened_at: float, read_timeout: float | None) -> None:
        self._ws = ws
        self.request = request
        self.ready: ReadyInfo | None = None
        self.timings: dict[int, TurnTiming] = {}
        self._opened_at = opened_at
        self._read_timeout = read_timeout
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._ready_evt = asyncio.Event()
        self._ack = asyncio.Event()
        self._ack.set()
        self._last_cancel: Cancelled | None = None
        self._cancels = 0  # cancel events sent
        self._acks = 0  # cancelled events received
        self._cancelled_turns: set[int] = set()
        self._turn = 1  # mirrors the server's turn counter
        self._turn_has_text = False
        self._pending_error: VoiceServiceError | None = None  # `error`, before its `finish`
        self._error: VoiceServiceError | None = None
        self._finished = False
        self._closed = False
        self._senders: set[asyncio.Task] = set()
        # timestamp sessions: the latest snapshot of each chunk (the docs: replace, never append)
        self.alignments: dict[int, ChunkAlignment] = {}
        self._chunk_turn: dict[int, int] = {}  # a chunk's turn: that of the first event naming it
        self._reader = asyncio.create_task(self._read_loop())

    # --- sending ---------------------------------------------------------------------------

    async def send_text(self, text: str) -> int | None:
        """Queue text on the server (it speaks at sentence ends, or at the flush). Returns
        the turn it joined, None for whitespace-only text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        await self._settle()
        turn = None
        if text.strip():
            turn = self._turn
            self._turn_has_text = True
            timing = self._timing(turn)
            timing.first_text_at = timing.first_text_at or time.perf_counter()
        for i in range(0, len(text), MAX_TEXT_PIECE):
            await self._send({"event": "text", "text": text[i:i + MAX_TEXT_PIECE]})
        return turn

    async def flush(self) -> int | None:
        """End the current turn: the server speaks its buffered text now. Returns the turn."""
        return await self._end_turn({"event": "flush"})

    async def stop(self) -> int | None:
        """Speak what is left, then the server sends `finish` and closes: read the rest with
        `audio()` or `events()`, which end there."""
        return await self._end_turn({"event": "stop"})

    async def cancel(self) -> Cancelled:
        """Barge-in: drop every unfinished turn. Returns the server's acknowledgement; from
        then on no audio of those turns is yielded (audio read while the ack is on its way
        is held back, then dropped). The voice stays ready for the next turn."""
        for task in list(self._senders):
            task.cancel()  # a speak() still streaming text would start a new turn
        await self._settle()
        self._ack.clear()
        self._cancels += 1
        await self._send({"event": "cancel"})
        await self._wait(self._ack, ACK_TIMEOUT_S, "the 'cancelled' acknowledgement")
        self._raise_if_failed()
        return self._last_cancel

    async def _end_turn(self, event: dict) -> int | None:
        await self._settle()
        turn = self._turn if self._turn_has_text else None
        if turn is not None:
            self._timing(turn).flush_at = time.perf_counter()
            self._turn += 1
            self._turn_has_text = False
        await self._send(event)
        return turn

    async def _send(self, event: dict) -> None:
        self._raise_if_failed()
        if self._closed or self._finished:
            why = "closed" if self._closed else "finished (the server closes it after 'stop')"
            raise ConnectionLost("disconnected", f"the session is {why}")
        try:
            await self._ws.send(msgpack.packb(event, use_bin_type=True))
        except ConnectionClosed:
            await asyncio.wait({self._reader}, timeout=1.0)  # let it read the server's error
            self._raise_if_failed()
            raise ConnectionLost("disconnected", "the connection closed") from None

    async def _settle(self) -> None:
        """Wait for a pending cancel's ack: until then the server's turn number is unknown."""
        if not self._ack.is_set():
            await self._wait(self._ack, ACK_TIMEOUT_S, "the 'cancelled' acknowledgement")

    # --- speaking --------------------------------------------------------------------------

    def speak(self, text: TextSource, flush: bool = True) -> "Speech":
        """Stream `text` (a str, or sync/async iterable of pieces such as LLM tokens) while
        the audio is read concurrently. `await` it for a SpeechResult, or `async for` it for
        the AudioChunks as they arrive. With flush=False the turn stays open: iteration
        ends once the text is sent, and the next speak() continues the same turn."""
        return Speech(self, text, flush)

    # --- receiving -------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """Every event in order, until `Finished` (after `stop()`). Raises the server's error."""
        while (event := await self._next()) is not None:
            if isinstance(event, _SpeakDone):
                continue
            yield event
            if isinstance(event, Finished):
                return

    async def audio(self) -> AsyncIterator[AudioChunk]:
        """The audio chunks of `events()`."""
        async for event in self.events():
            if isinstance(event, AudioChunk):
                yield event

    def words(self, turn: int) -> list[Word]:
        """The turn's words so far (timestamp sessions), on the turn's own timeline: seconds
        from its first audio sample, the start of its audio in `SpeechResult.audio`."""
        chunks = [a for a in self.alignments.values() if a.turn == turn]
        if not chunks:
            return []
        base = min(a.offset for a in chunks)
        return [Word(s["text"], a.offset - base + s["start"], a.offset - base + s["end"])
                for a in sorted(chunks, key=lambda a: a.chunk_seq) for s in a.segments]

    async def _next(self) -> Event | _SpeakDone | None:
        """The next queued item; None once the connection ended cleanly."""
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), self._read_timeout)
            except asyncio.TimeoutError:
                raise ClientTimeout("client_timeout", f"no event from the server for {self._read_timeout:g} s") from None
            if item is _END:
                self._queue.put_nowait(_END)  # the end stays visible to every later read
                self._raise_if_failed()
                return None
            if isinstance(item, AudioChunk):
                if not self._ack.is_set():  # a cancel is on its way: hold the audio until its ack
                    await self._wait(self._ack, ACK_TIMEOUT_S, "the 'cancelled' acknowledgement")
                if item.turn in self._cancelled_turns:
                    continue
            return item

    async def _read_loop(self) -> None:
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    self._dispatch(msgpack.unpackb(frame, raw=False), time.perf_counter())
            reason = "the server closed the connection without 'finish'"
        except ConnectionClosed as e:
            reason = f"the connection was lost ({e})"
        except Exception as e:  # msgpack raises several types; a malformed event, KeyError
            reason = f"the server sent a frame this client cannot read ({type(e).__name__}: {e})"
        if not self._finished and self._error is None:
            self._error = self._pending_error or ConnectionLost(
                "disconnected", "the session is closed" if self._closed else reason)
        self._end()

    def _end(self) -> None:
        self._ready_evt.set()  # wake every waiter; they look at self._error
        self._ack.set()
        self._queue.put_nowait(_END)

    def _dispatch(self, ev: Any, now: float) -> None:
        if not isinstance(ev, dict):
            return
        kind = ev.get("event")
        if kind == "audio":
            self._on_audio(ev, now)
        elif kind == "turn_end":
            self._on_turn_end(ev, now)
        elif kind == "cancelled":
            self._on_cancelled(ev, now)
        elif kind == "ready":
            self._on_ready(ev, now)
        elif kind == "error":
            self._pending_error = error_from_code(str(ev.get("code", "internal")), str(ev.get("message", "")))
        elif kind == "finish":
            self._on_finish(ev, now)
        # unknown events are ignored, as a newer server may send more

    def _on_ready(self, ev: dict, now: float) -> None:
        fmt = ev.get("format", self.request.get("format", "pcm"))
        self.ready = ReadyInfo(
            session_id=str(ev.get("session_id", "")), sample_rate=int(ev.get("sample_rate", 0)), format=fmt,
            voice_cached=bool(ev.get("voice_cached", False)), prefill_ms=float(ev.get("prefill_ms", 0.0)),
            open_to_ready_ms=(now - self._opened_at) * 1000,
        )
        self._ready_evt.set()

    def _on_audio(self, ev: dict, now: float) -> None:
        data = ev.get("audio") or b""
        turn = int(ev.get("turn", 0))
        if data:
            timing = self._timing(turn)
            timing.first_audio_at = timing.first_audio_at or now
        seq = ev.get("chunk_seq")
        if isinstance(seq, int):
            self._on_alignment(seq, turn, ev)
        self._queue.put_nowait(AudioChunk(
            data=data, turn=turn, seq=int(ev.get("seq", 0)), samples=int(ev.get("samples", 0)),
            sample_rate=int(ev.get("sample_rate", self.ready.sample_rate if self.ready else 0)),
            gen_ms=float(ev.get("gen_ms", 0.0)), received_at=now, chunk_seq=seq if isinstance(seq, int) else None,
        ))

    def _on_alignment(self, seq: int, turn: int, ev: dict) -> None:
        turn = self._chunk_turn.setdefault(seq, turn)
        alignment = ev.get("alignment")
        if isinstance(alignment, dict):  # null keeps the snapshot already there
            self.alignments[seq] = ChunkAlignment(
                seq, turn, str(ev.get("content", "")), float(ev.get("chunk_audio_offset_sec", 0.0)),
                float(alignment.get("audio_duration", 0.0)), tuple(alignment.get("segments") or ()))

    def _on_turn_end(self, ev: dict, now: float) -> None:
        turn = int(ev["turn"])
        self._timing(turn).ended_at = now
        self._queue.put_nowait(TurnEnd(turn, float(ev.get("audio_seconds", 0.0)), now))

    def _on_cancelled(self, ev: dict, now: float) -> None:
        last = int(ev.get("turn", 0))
        if "turns" in ev:
            turns = tuple(int(t) for t in ev["turns"])
        else:  # the protocol's minimum: every turn up to `turn` that has not ended
            turns = tuple(t for t in range(1, last + 1) if not self._ended_turn(t) and t not in self._cancelled_turns)
        self._cancelled_turns.update(turns)
        if "next_turn" in ev:  # the server says which turn the next text belongs to
            if int(ev["next_turn"]) == self._turn:
                self.timings.pop(self._turn, None)
            self._turn = int(ev["next_turn"])
        elif self._turn in turns:  # the server moved on to a new turn
            self._turn += 1
        else:  # text still buffered was dropped: the same turn number starts over
            self.timings.pop(self._turn, None)
        self._turn_has_text = False
        self._acks += 1
        word = ev.get("last_word")
        word = Word(str(word["text"]), float(word["start"]), float(word["end"])) if isinstance(word, dict) else None
        seconds = ev.get("audio_seconds")
        self._last_cancel = Cancelled(last, turns, now, self._acks,
                                      float(seconds) if seconds is not None else None, word)
        self._queue.put_nowait(self._last_cancel)
        self._ack.set()

    def _on_finish(self, ev: dict, now: float) -> None:
        if ev.get("reason") == "error":
            self._error = self._pending_error or error_from_code("internal", str(ev.get("message", "server error")))
        else:
            self._finished = True
            self._queue.put_nowait(Finished(now))

    def _ended_turn(self, turn: int) -> bool:
        timing = self.timings.get(turn)
        return timing is not None and timing.ended_at is not None

    def _timing(self, turn: int) -> TurnTiming:
        if turn not in self.timings:
            self.timings[turn] = TurnTiming(turn)
        return self.timings[turn]

    # --- lifecycle -------------------------------------------------------------------------

    async def _start(self, timeout: float) -> None:
        if str(self.request.get("text") or "").strip():
            self._turn_has_text = True
            self._timing(1).first_text_at = time.perf_counter()
        await self._send({"event": "start", "request": self.request})
        await self._wait(self._ready_evt, timeout, "'ready' (the voice prefill)")
        self._raise_if_failed()
        if self.ready is None:
            raise ConnectionLost("disconnected", "the connection closed before 'ready'")

    async def _wait(self, event: asyncio.Event, timeout: float, what: str) -> None:
        try:
            await asyncio.wait_for(event.wait(), max(timeout, 0.001))
        except asyncio.TimeoutError:
            raise ClientTimeout("client_timeout", f"no {what} from the server within {timeout:g} s") from None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def session_id(self) -> str | None:
        return self.ready.session_id if self.ready else None

    @property
    def finished(self) -> bool:
        """`finish {reason: stop}` arrived."""
        return self._finished

    async def close(self) -> None:
        """Close the connection (the server drops whatever it has not sent)."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._senders):
            task.cancel()
        await self._ws.close()
        await asyncio.wait({self._reader}, timeout=5.0)
        if not self._reader.done():
            self._reader.cancel()

    async def __aenter__(self) -> "VoiceSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Speech:
    """One `speak()`: iterate it for AudioChunks, or await it for a SpeechResult. Use once."""

    def __init__(self, session: VoiceSession, text: TextSource, flush: bool) -> None:
        self._session, self._text, self._flush = session, text, flush
        self._done = _SpeakDone()
        self._used = False
        self.result = SpeechResult(turn=None)

    def __await__(self):
        return self._collect().__await__()

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._run()

    async def _collect(self) -> SpeechResult:
        async for _ in self._run():
            pass
        return self.result

    async def _run(self) -> AsyncIterator[AudioChunk]:
        if self._used:
            raise RuntimeError("a speak() result can be consumed once")
        self._used = True
        s = self._session
        cancels_before = s._cancels  # acks of earlier cancels may still be queued
        sender = asyncio.create_task(self._send())
        s._senders.add(sender)
        try:
            while (event := await s._next()) is not None:
                if event is self._done:
                    if sender.done() and not sender.cancelled() and sender.exception() is not None:
                        raise sender.exception()
                    if self.result.turn is None or not self._flush:
                        return
                elif isinstance(event, Cancelled) and event.index > cancels_before:
                    self.result.cancelled = True  # barge-in during this speak()
                    return
                elif isinstance(event, Finished):
                    return
                elif isinstance(event, AudioChunk) and event.turn == self.result.turn:
                    self.result.chunks.append(event)
                    yield event
                elif isinstance(event, TurnEnd) and event.turn == self.result.turn:
                    self.result.audio_seconds = event.audio_seconds
                    return
                # events of other turns belong to no speak(): dropped
        finally:
            sender.cancel()
            s._senders.discard(sender)
            if self.result.turn is not None:
                self.result.timing = s.timings.get(self.result.turn)
                self.result.words = s.words(self.result.turn)

    async def _send(self) -> None:
        s, text = self._session, self._text
        try:
            if isinstance(text, str):
                await self._piece(text)
            elif isinstance(text, AsyncIterable):
                async for piece in text:
                    await self._piece(piece)
            else:
                for piece in text:
                    await self._piece(piece)
            if self._flush:
                await s.flush()
        finally:
            s._queue.put_nowait(self._done)

    async def _piece(self, piece: str) -> None:
        turn = await self._session.send_text(piece)
        if self.result.turn is None:
            self.result.turn = turn


# --- connecting -------------------------------------------------------------------------

class _Connect:
    """`await connect(...)` or `async with connect(...) as session`."""

    def __init__(self, url: str, kwargs: dict) -> None:
        self._url, self._kwargs = url, kwargs
        self._session: VoiceSession | None = None

    def __await__(self):
        return open_session(self._url, **self._kwargs).__await__()

    async def __aenter__(self) -> VoiceSession:
        self._session = await open_session(self._url, **self._kwargs)
        return self._session

    async def __aexit__(self, *exc) -> None:
        await self._session.close()


def connect(url: str = DEFAULT_URL, *, api_key: str | None = None, request: dict | None = None,
            open_timeout: float = 60.0, read_timeout: float | None = None, model: str | None = None,
            timestamps: bool = False, **request_fields: Any) -> _Connect:
    """Open a live session: WebSocket handshake, `start {request}`, wait for `ready`.

    `timestamps`: the `/v1/tts/live/with-timestamp` endpoint (added to a `.../v1/tts/live`
    url): `SpeechResult.words`, `session.words(turn)`, `session.alignments` and
    `Cancelled.last_word` are filled.

    `request` and `request_fields` are TTSRequest fields (format, sample_rate, reference_id,
    references=[(audio_bytes_or_path, transcript)], latency, chunk_length, temperature,
    top_p, max_new_tokens, seed, ...); fields given as None are left out. The format
    defaults to pcm (s16le mono). `open_timeout` bounds handshake + voice prefill;
    `read_timeout` (None: no limit) bounds each wait for the next server event."""
    if timestamps:
        url = timestamp_url(url)
    return _Connect(url, dict(api_key=api_key, request=request, open_timeout=open_timeout,
                              read_timeout=read_timeout, model=model, **request_fields))


def timestamp_url(url: str) -> str:
    """ws://host/v1/tts/live -> ws://host/v1/tts/live/with-timestamp (other urls unchanged)."""
    base, sep, query = url.partition("?")
    if base.rstrip("/").endswith("/v1/tts/live"):
        base = base.rstrip("/") + "/with-timestamp"
    return base + sep + query


async def open_session(url: str, *, api_key: str | None, request: dict | None, open_timeout: float,
                       read_timeout: float | None, model: str | None, **request_fields: Any) -> VoiceSession:
    req = build_request(request, request_fields)
    headers = {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if model:
        headers["model"] = model
    opened_at = time.perf_counter()
    ws = await _handshake(url, headers, open_timeout, bool(api_key))
    session = VoiceSession(ws, req, opened_at, read_timeout)
    try:
        await session._start(open_timeout - (time.perf_counter() - opened_at))
    except BaseException:
        await session.close()
        raise
    return session


async def _handshake(url: str, headers: dict, timeout: float, has_key: bool) -> ClientConnection:
    try:
        return await ws_connect(url, additional_headers=headers, open_timeout=timeout,
                                max_size=None, compression=None)
    except InvalidStatus as e:
        status = e.response.status_code
        if status in (401, 403):
            hint = "wrong API key" if has_key else "an API key is required"
            raise Unauthorized("unauthorized", f"{hint}: the server refused the connection (HTTP {status})") from None
        if status == 503:
            raise ServerBusy("busy", "server busy: the connection was refused (HTTP 503)") from None
        if status == 404:
            raise ConnectFailed("not_found", f"no live TTS endpoint at {url} (HTTP 404): the service's is at the "
                                             "path /v1/tts/live") from None
        raise ConnectFailed("handshake", f"the server refused the WebSocket connection to {url} (HTTP {status})") from None
    except (TimeoutError, asyncio.TimeoutError):
        raise ClientTimeout("client_timeout", f"no WebSocket handshake with {url} within {timeout:g} s") from None
    except (OSError, WebSocketException, ValueError) as e:
        raise ConnectFailed("connection_failed", f"cannot connect to {url}: {_describe(e)}") from None


def _describe(e: Exception) -> str:
    if isinstance(e, ConnectionRefusedError) or "Connect call failed" in str(e):
        return "connection refused (is the server running?)"
    return str(e) or type(e).__name__


def build_request(request: dict | None, fields: dict) -> dict:
    """The `start` request map: `request`, then `fields` (None values left out)."""
    req = dict(request or {})
    req.update({k: v for k, v in fields.items() if v is not None})
    req.setdefault("format", "pcm")
    if req.get("references"):
        req["references"] = [_reference(r) for r in req["references"]]
    return req


def _reference(ref: Any) -> dict:
    """(audio, text) | {audio, text} | an object with .audio and .text -> {audio: bytes, text}.
    audio may be bytes or a file path."""
    if isinstance(ref, dict):
        audio, text = ref.get("audio"), ref.get("text")
    elif isinstance(ref, (tuple, list)) and len(ref) == 2:
        audio, text = ref
    else:
        audio, text = getattr(ref, "audio"), getattr(ref, "text")
    if isinstance(audio, (str, os.PathLike)):
        with open(audio, "rb") as f:
            audio = f.read()
    return {"audio": bytes(audio), "text": text}
