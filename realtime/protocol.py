"""Every message of the live TTS protocol, in one place.

Wire-compatible with the Fish Audio live TTS API: WebSocket `/v1/tts/live`, every frame
a binary MessagePack map with an `event` key. `/v1/tts/live/with-timestamp` is the same
session whose audio events also carry the hosted API's word alignment (TIMESTAMP_FIELDS,
realtime/timestamps.py, realtime/TIMESTAMPS.md).

Client -> server
    start  {request: TTSRequest}   first, once: names the voice and the audio format
    text   {text: str}             buffered, cut into segments (sentences, chunk_length)
    flush  {}                      speak the buffered text now (ends a turn)
    stop   {}                      speak what is left, then `finish {reason: stop}`
    cancel {}                      extension (barge-in): drop the current turn's text and
                                   audio; acknowledged by `cancelled`; the voice stays ready
Server -> client
    audio  {audio: bytes, ...}     encoded audio; extension keys: turn, seq (1, 2, ...),
                                   samples (audio in this chunk, at sample_rate), sample_rate,
                                   gen_ms (ms since the service received the event that
                                   handed the turn's first segment to the engine: its flush,
                                   as a rule; 0 on a turn's encoder tail)
    finish {reason: stop|error, message?}
    extensions (Fish clients ignore unknown events):
    ready     {session_id, sample_rate, format, voice_cached, prefill_ms}
    turn_end  {turn, audio_seconds}  all audio of a flushed turn was sent
    cancelled {turn, turns, next_turn, audio_seconds, last_word?}  after `cancel`: `turns`
                                   were dropped (no more of their audio follows), `turn` is
                                   the highest of them, text sent next belongs to
                                   `next_turn`; audio_seconds: their audio sent to the
                                   client; last_word (timestamp path): {text, start, end,
                                   turn}, the last word fully sent, or null
    error     {code, message}        always followed by finish {reason: error}
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack

from realtime.segmenter import LATENCIES

FORMATS = ("pcm", "wav", "opus", "mp3")
SAMPLE_RATES = {
    "pcm": (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    "wav": (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    "mp3": (16000, 22050, 24000, 32000, 44100, 48000),
    "opus": (48000,),
}
DEFAULT_SAMPLE_RATE = {"pcm": 44100, "wav": 44100, "mp3": 44100, "opus": 48000}
MP3_BITRATES = (64, 128, 192)
OPUS_BITRATES = (-1000, 24, 32, 48, 64)  # kbps; -1000 = the encoder's automatic choice
MAX_FEATURES = 16  # `features` items (the hosted API's switches, e.g. "quality-guard")


class ErrorCode(str, Enum):
    BAD_MESSAGE = "bad_message"  # not msgpack, not a map, no event
    UNKNOWN_EVENT = "unknown_event"
    OUT_OF_ORDER = "out_of_order"  # text before start, a second start, ...
    INVALID_FIELD = "invalid_field"  # wrong type or out of range
    TOO_LARGE = "too_large"  # frame, text or buffer over its limit
    BAD_AUDIO = "bad_audio"  # undecodable reference audio
    UNKNOWN_VOICE = "unknown_voice"  # reference_id not stored
    BUSY = "busy"  # no capacity for another stream
    TIMEOUT = "timeout"  # idle for too long
    INTERNAL = "internal"


class ProtocolError(Exception):
    """An error the client is told, with its code: a bad message, or a request the service
    cannot serve (unknown voice, busy). Live sessions send it as `error` + `finish`; HTTP
    endpoints answer with its status (realtime/errors.py)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class Limits:
    """What a client may send. Every limit is configurable (see realtime/config.py)."""

    max_message_bytes: int = 16 * 2**20  # one WebSocket frame / HTTP body
    max_text_chars: int = 10_000  # one text event
    max_buffered_chars: int = 100_000  # text received but not yet spoken
    max_references: int = 8
    max_reference_bytes: int = 10 * 2**20  # encoded audio of one reference
    max_reference_seconds: float = 30.0
    max_reference_text_chars: int = 2_000
    max_new_tokens: int = 2048  # frames per segment (~95 s of audio)


@dataclass(slots=True)
class ReferenceAudio:
    audio: bytes
    text: str


@dataclass(slots=True)
class Prosody:
    speed: float = 1.0  # 0.5 .. 2.0
    volume: float = 0.0  # dB, -20 .. 20


@dataclass(slots=True)
class TTSRequest:
    """The Fish `TTSRequest`, validated. Fields are the SDK's, with its defaults, and the
    hosted API's (`normalize_loudness`, `features`: accepted, no effect here); `top_k`,
    `seed` and `ignore_end` (benchmarks with random weights) are extensions."""

    text: str = ""
    chunk_length: int = 200
    format: str = "mp3"
    sample_rate: int | None = None
    mp3_bitrate: int = 128
    opus_bitrate: int = 32  # kbps (sent in bit/s or kbit/s: see _opus_bitrate)
    references: list[ReferenceAudio] = field(default_factory=list)
    reference_id: str | None = None
    normalize: bool = True
    latency: str = "balanced"  # normal | balanced | low (realtime/segmenter.py)
    prosody: Prosody | None = None
    normalize_loudness: bool | None = None  # top-level or in prosody; no effect here
    features: tuple[str, ...] = ()  # no effect here
    top_p: float = 0.7
    temperature: float = 0.7
    max_new_tokens: int = 1024
    repetition_penalty: float = 1.2
    min_chunk_length: int = 50
    condition_on_previous_chunks: bool = True
    early_stop_threshold: float = 1.0  # no effect here
    top_k: int = 30
    seed: int | None = None
    ignore_end: bool = False  # fixed-length mode: always max_new_tokens frames per segment

    @property
    def output_rate(self) -> int:
        return self.sample_rate or DEFAULT_SAMPLE_RATE[self.format]


# --- decoding and validating ----------------------------------------------------------------

def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_FIELD, message)


def _int(d: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"{key} must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise _bad(f"{key} must be in [{lo}, {hi}], got {v}")
    return v


def _float(d: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(f"{key} must be a number, got {type(v).__name__}")
    if not (math.isfinite(v) and lo <= v <= hi):
        raise _bad(f"{key} must be in [{lo}, {hi}], got {v}")
    return float(v)


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"{key} must be a boolean, got {type(v).__name__}")
    return v


def _str(d: dict, key: str, default: str | None, max_chars: int, choices: tuple | None = None) -> str | None:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise _bad(f"{key} must be a string, got {type(v).__name__}")
    if len(v) > max_chars:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{key} is longer than {max_chars} characters")
    if choices is not None and v not in choices:
        raise _bad(f"{key} must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _choice(d: dict, key: str, default: int, choices: tuple) -> int:
    v = _int(d, key, default, min(choices), max(choices))
    if v not in choices:
        raise _bad(f"{key} must be one of {', '.join(map(str, choices))}, got {v}")
    return v


def _opus_bitrate(d: dict) -> int:
    """-1000 (automatic) or a bitrate in bit/s, as the hosted API takes it (24000 ... 64000);
    kbit/s (24 ... 64) as the SDK 1.x sends it. Returns kbps (OPUS_BITRATES)."""
    v = _int(d, "opus_bitrate", 32, -1000, 64_000)
    kbps = v / 1000 if v >= 1000 else v
    if kbps not in OPUS_BITRATES:
        raise _bad(f"opus_bitrate must be -1000 (automatic) or one of 24000, 32000, 48000, 64000 bit/s "
                   f"(24, 32, 48, 64 in kbit/s), got {v}")
    return int(kbps)


def _features(d: dict) -> tuple[str, ...]:
    v = d.get("features")
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(f, str) and len(f) <= 64 for f in v):
        raise _bad("features must be a list of names (strings of at most 64 characters)")
    if len(v) > MAX_FEATURES:
        raise _bad(f"features must have at most {MAX_FEATURES} items")
    return tuple(v)


def _references(d: dict, limits: Limits, json_body: bool) -> list[ReferenceAudio]:
    refs = d.get("references")
    if refs is None:
        return []
    if not isinstance(refs, list):
        raise _bad("references must be a list")
    if len(refs) > limits.max_references:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"at most {limits.max_references} references are allowed")
    out = []
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise _bad(f"references[{i}] must be a map with audio and text")
        audio = ref.get("audio")
        if json_body and isinstance(audio, str):
            try:
                audio = base64.b64decode(audio, validate=True)
            except ValueError:
                raise _bad(f"references[{i}].audio is not valid base64") from None
        if not isinstance(audio, (bytes, bytearray)) or not audio:
            raise _bad(f"references[{i}].audio must be non-empty bytes")
        if len(audio) > limits.max_reference_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"references[{i}].audio is larger than {limits.max_reference_bytes} bytes"
            )
        text = _str(ref, "text", None, limits.max_reference_text_chars)
        if not text or not text.strip():
            raise _bad(f"references[{i}].text must be the transcript of the audio")
        out.append(ReferenceAudio(bytes(audio), text))
    return out


def _prosody(d: dict) -> Prosody | None:
    p = d.get("prosody")
    if p is None:
        return None
    if not isinstance(p, dict):
        raise _bad("prosody must be a map with speed and volume")
    return Prosody(speed=_float(p, "speed", 1.0, 0.5, 2.0), volume=_float(p, "volume", 0.0, -20.0, 20.0))


def _normalize_loudness(d: dict) -> bool | None:
    """In prosody (the hosted schema) or at the top level (as some integrations send it)."""
    p = d.get("prosody")
    return _bool(d, "normalize_loudness", _bool(p, "normalize_loudness", None) if isinstance(p, dict) else None)


def parse_request(d: Any, limits: Limits, json_body: bool = False) -> TTSRequest:
    """Validate a TTSRequest map (msgpack, or JSON with base64 reference audio).
    Unknown keys are ignored, as a newer client may send more."""
    if not isinstance(d, dict):
        raise _bad("request must be a map")
    fmt = _str(d, "format", "mp3", 8, FORMATS)
    req = TTSRequest(
        text=_str(d, "text", "", limits.max_text_chars),
        chunk_length=_int(d, "chunk_length", 200, 100, 300),
        format=fmt,
        sample_rate=_int(d, "sample_rate", None, 1, 10**6),
        mp3_bitrate=_choice(d, "mp3_bitrate", 128, MP3_BITRATES),
        opus_bitrate=_opus_bitrate(d),
        references=_references(d, limits, json_body),
        reference_id=_str(d, "reference_id", None, 128),
        normalize=_bool(d, "normalize", True),
        latency=_str(d, "latency", "balanced", 16, LATENCIES),
        prosody=_prosody(d),
        normalize_loudness=_normalize_loudness(d),
        features=_features(d),
        top_p=_float(d, "top_p", 0.7, 0.0, 1.0),
        temperature=_float(d, "temperature", 0.7, 0.0, 2.0),
        # the SDK default, within the operator's limit (omitting the field must not pass it)
        max_new_tokens=_int(d, "max_new_tokens", min(1024, limits.max_new_tokens), 1, limits.max_new_tokens),
        repetition_penalty=_float(d, "repetition_penalty", 1.2, 0.5, 2.0),
        min_chunk_length=_int(d, "min_chunk_length", 50, 0, 300),
        condition_on_previous_chunks=_bool(d, "condition_on_previous_chunks", True),
        early_stop_threshold=_float(d, "early_stop_threshold", 1.0, 0.0, 1.0),
        top_k=_int(d, "top_k", 30, 0, 128),
        seed=_int(d, "seed", None, 0, 2**31 - 1),
        ignore_end=_bool(d, "ignore_end", False),
    )
    if req.sample_rate is not None and req.sample_rate not in SAMPLE_RATES[fmt]:
        raise _bad(f"sample_rate {req.sample_rate} is not supported for {fmt}; use one of {SAMPLE_RATES[fmt]}")
    if req.references and req.reference_id:
        raise _bad("give either references or reference_id, not both")
    return req


# --- client events ----------------------------------------------------------------------------

@dataclass(slots=True)
class Start:
    request: TTSRequest


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Flush:
    pass


@dataclass(slots=True)
class Stop:
    pass


@dataclass(slots=True)
class Cancel:
    pass


ClientEvent = Start | Text | Flush | Stop | Cancel


def unpack(frame: bytes, limits: Limits) -> dict:
    if len(frame) > limits.max_message_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message larger than {limits.max_message_bytes} bytes")
    try:
        data = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=limits.max_message_bytes)
    except Exception as e:  # msgpack raises several unrelated exception types
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"message is not valid MessagePack ({type(e).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message must be a map with a string 'event'")
    return data


def parse_client_event(frame: bytes, limits: Limits) -> ClientEvent:
    data = unpack(frame, limits)
    event = data["event"]
    if event == "start":
        return Start(parse_request(data.get("request"), limits))
    if event == "text":
        text = data.get("text")
        if not isinstance(text, str):
            raise _bad("text must be a string")
        if len(text) > limits.max_text_chars:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"text event longer than {limits.max_text_chars} characters")
        return Text(text)
    if event == "flush":
        return Flush()
    if event == "stop":
        return Stop()
    if event == "cancel":
        return Cancel()
    raise ProtocolError(ErrorCode.UNKNOWN_EVENT, f"unknown event {event[:40]!r}")


# --- server events --------------------------------------------------------------------------

def pack(event: dict) -> bytes:
    return msgpack.packb(event, use_bin_type=True)


# what /v1/tts/live/with-timestamp adds to each audio event (and each SSE event of
# POST /v1/tts/stream/with-timestamp); `time` (ms since the connection opened) is WS only
TIMESTAMP_FIELDS = ("content", "alignment", "chunk_seq", "chunk_audio_offset_sec")


def audio_event(audio: bytes, turn: int, seq: int, samples: int, sample_rate: int, gen_ms: float) -> dict:
    return {
        "event": "audio", "audio": audio, "turn": turn, "seq": seq,
        "samples": samples, "sample_rate": sample_rate, "gen_ms": round(gen_ms, 2),
    }


def ready_event(session_id: str, sample_rate: int, fmt: str, voice_cached: bool, prefill_ms: float) -> dict:
    return {
        "event": "ready", "session_id": session_id, "sample_rate": sample_rate, "format": fmt,
        "voice_cached": voice_cached, "prefill_ms": round(prefill_ms, 2),
    }


def turn_end_event(turn: int, audio_seconds: float) -> dict:
    return {"event": "turn_end", "turn": turn, "audio_seconds": round(audio_seconds, 4)}


def cancelled_event(turns: list[int], next_turn: int) -> dict:
    """turns: every turn whose remaining audio was dropped (maybe none); `turn` is the
    highest of them (0 when none); next_turn: the turn the next text belongs to."""
    return {"event": "cancelled", "turn": max(turns, default=0), "turns": turns, "next_turn": next_turn}


def error_event(code: ErrorCode, message: str) -> dict:
    return {"event": "error", "code": code.value, "message": message}


def finish_event(reason: str, message: str | None = None) -> dict:
    event = {"event": "finish", "reason": reason}
    if message:
        event["message"] = message
    return event
