"""`POST /v1/tts`: a whole request at once, audio streamed back as the response body;
`POST /v1/tts/stream/with-timestamp`: the same audio as Server-Sent Events, each with the
alignment (realtime/timestamps.py).

The same engine path as a live connection: the text is cut into segments, spoken in one
stream, and each encoded chunk is written to the response as soon as it exists."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np

from engine.engine import EngineFailed, Refused
from realtime import protocol as P
from realtime.audio_out import AudioEncoder
from realtime.mailbox import LoopMailbox
from realtime.segmenter import TextSegmenter
from realtime.services import Services
from realtime.timestamps import NO_CHUNK, Alignment


class _QueueSink:
    """Engine callbacks -> an asyncio queue, through the loop's mailbox (as live sessions).

    The response is written only as fast as the client reads it, so the audio waiting in
    the queue is counted (on the loop) against `limit` bytes
    (ServiceConfig.max_pending_audio_bytes, as a live connection's): past it, the waiting
    audio is dropped, `on_overflow` closes the engine stream (its KV slot is free at
    once) and the response ends where the client stopped reading."""

    def __init__(self, queue: asyncio.Queue, mailbox: LoopMailbox, limit: int) -> None:
        self._queue, self._mailbox, self._limit = queue, mailbox, limit
        self.pending = 0  # bytes of PCM in the queue (loop side only)
        self.overflowed = False
        self.on_overflow = lambda: None

    def _put(self, item) -> None:
        self._mailbox.post(self._deliver, item)

    def _deliver(self, item) -> None:  # on the loop
        if self.overflowed:
            return
        if item[0] == "audio":
            self.pending += item[1].nbytes
            if self.pending > self._limit:
                self.overflowed = True
                while not self._queue.empty():
                    self._queue.get_nowait()
                self.pending = 0
                self.on_overflow()
                item = ("error", (P.ErrorCode.TOO_LARGE.value, "the client is not reading its audio fast enough"))
        self._queue.put_nowait(item)

    def taken(self, item) -> None:
        if item[0] == "audio":
            self.pending -= item[1].nbytes

    def on_ready(self, voice_cached: bool, prefill_ms: float) -> None:
        pass

    def on_audio(self, turn: int, pcm: np.ndarray) -> None:
        self._put(("audio", pcm))

    def on_segment_end(self, turn: int, reason: str) -> None:
        self._put(("end", reason))

    def on_words(self, turn: int, words: list) -> None:
        self._put(("words", words))

    def on_error(self, code: str, message: str) -> None:
        self._put(("error", (code, message)))


def segments_of(req: P.TTSRequest) -> list[str]:
    seg = TextSegmenter(req.chunk_length, min(req.min_chunk_length, req.chunk_length), req.latency)
    return seg.push(req.text) + seg.flush()


async def synthesize(svc: Services, req: P.TTSRequest) -> AsyncIterator[bytes]:
    """Encoded audio chunks for the whole request. Raises ProtocolError before the first
    chunk for errors a client caused (the HTTP status can still say so), and after it for
    an engine error (the response then ends early)."""
    async for data, _ in _synthesize(svc, req, timestamps=False):
        if data:
            yield data


async def synthesize_sse(svc: Services, req: P.TTSRequest) -> AsyncIterator[bytes]:
    """The hosted API's timestamp stream: one `data: {json}` Server-Sent Event per encoded
    chunk, {audio_base64, content, alignment, chunk_seq, chunk_audio_offset_sec}, then an
    event with empty audio for each snapshot no chunk carried (the final corrections).
    Errors as synthesize()."""
    async for data, snapshots in _synthesize(svc, req, timestamps=True):
        for i, (_, fields) in enumerate(snapshots or [(1, NO_CHUNK)]):
            audio = base64.b64encode(data if i == 0 else b"").decode("ascii")
            yield b"data: " + json.dumps({"audio_base64": audio} | fields).encode() + b"\n\n"


async def _synthesize(svc: Services, req: P.TTSRequest, timestamps: bool) -> AsyncIterator[tuple[bytes, list]]:
    """(encoded chunk, alignment snapshots for it: realtime/timestamps.py, Alignment.take)."""
    segments = segments_of(req)
    if not segments:
        raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "text is empty")
    encoder = AudioEncoder(
        req.format, req.output_rate, svc.engine.sample_rate, req.mp3_bitrate, req.opus_bitrate,
        speed=req.prosody.speed if req.prosody else 1.0, volume_db=req.prosody.volume if req.prosody else 0.0,
    )
    voice = svc.resolve_voice(req)
    queue: asyncio.Queue = asyncio.Queue()
    sink = _QueueSink(queue, svc.mailbox(), svc.config.max_pending_audio_bytes)
    params = svc.stream_params(req)
    align = None
    if timestamps:
        params = replace(params, word_timestamps=True)
        align = Alignment(svc.engine.sample_rate, req.output_rate, req.prosody.speed if req.prosody else 1.0,
                          encoder.decoder_delay)

    def snapshots(repeat: bool = True) -> list:
        if align is None:
            return []
        align.set_released(encoder.released_samples / req.output_rate)
        return align.take(repeat)

    try:
        handle = svc.engine.open(voice, params, sink)
    except Refused as e:
        raise P.ProtocolError(P.ErrorCode.BUSY, f"server busy: {e}") from None
    except EngineFailed as e:
        raise P.ProtocolError(P.ErrorCode.INTERNAL, str(e)) from None

    def overflow() -> None:
        svc.metrics.errors[P.ErrorCode.TOO_LARGE.value] += 1
        svc.engine.close(handle)

    sink.on_overflow = overflow
    try:
        for text in segments:
            svc.engine.say(handle, 1, text)
            if align is not None:
                align.segment(1, text)
        remaining = len(segments)
        while remaining:
            item = await queue.get()
            sink.taken(item)
            kind, value = item
            if kind == "audio":
                svc.metrics.audio_seconds += len(value) / svc.engine.sample_rate
                if align is not None:
                    align.audio(1, len(value), encoder.samples_in)
                if data := encoder.encode(value):
                    yield data, snapshots()
            elif kind == "words":
                align.words(1, value)
            elif kind == "end":
                remaining -= 1
                if align is not None:
                    align.segment_end(1)
            else:
                code, message = value
                raise P.ProtocolError(P.ErrorCode(code) if code in P.ErrorCode._value2member_map_ else P.ErrorCode.INTERNAL, message)
        tail = encoder.flush()
        if align is not None:
            align.close()
        if tail or (extra := snapshots(repeat=False)):
            yield tail, snapshots() if tail else extra  # the last snapshots: an empty chunk carries them
    finally:
        svc.engine.close(handle)
