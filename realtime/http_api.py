"""The HTTP endpoints: one-shot TTS, health, readiness, metrics, stored voices.

Shared objects reach them through `request.app.state.services` (realtime/app.py)."""

from __future__ import annotations

import asyncio
import errno
import json

import msgpack
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from engine.voice import ReferenceInput
from realtime import protocol as P
from realtime.audio_out import finalize_wav
from realtime.auth import authorized
from realtime.errors import busy_response, draining_response, error_json, error_response, unauthorized_response
from realtime.oneshot import synthesize, synthesize_sse
from realtime.readiness import capacity, not_ready_reason
from realtime.services import Services
from realtime.voices import VoiceStoreError, VoiceStoreFull, VoiceStoreUnwritable

MEDIA_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "opus": "audio/ogg", "pcm": "audio/L16"}


def _services(request: Request) -> Services:
    return request.app.state.services


def _authorized(request: Request) -> bool:
    return authorized(_services(request).config, request.headers, request.query_params)


async def tts(request: Request) -> Response:
    return await _tts(request, sse=False)


async def tts_stream_with_timestamp(request: Request) -> Response:
    """POST /v1/tts/stream/with-timestamp: the hosted API's Server-Sent Events of audio
    (base64) and word alignment (realtime/oneshot.py, synthesize_sse); errors as /v1/tts."""
    return await _tts(request, sse=True)


async def _tts(request: Request, sse: bool) -> Response:
    svc = _services(request)
    svc.metrics.http_requests += 1
    if not _authorized(request):
        return unauthorized_response()
    if svc.draining:
        return draining_response()
    try:
        data, is_json = await _read_body(request, svc.config.limits)
        req = P.parse_request(data, svc.config.limits, is_json)
    except P.ProtocolError as e:
        return error_response(e.code, e.message, svc.metrics)
    chunks = synthesize_sse(svc, req) if sse else synthesize(svc, req)
    try:
        first = await chunks.__anext__()
    except P.ProtocolError as e:
        if e.code is P.ErrorCode.BUSY:
            return busy_response(e.message, svc.engine.config.max_streams, svc.metrics)
        return error_response(e.code, e.message, svc.metrics)
    except StopAsyncIteration:
        first = b""
    media = "text/event-stream" if sse else MEDIA_TYPES[req.format]
    if not sse and request.query_params.get("stream", "true").lower() == "false":
        body = first + b"".join([c async for c in chunks])
        return Response(finalize_wav(body) if req.format == "wav" else body, media_type=media)

    async def body():
        yield first
        try:
            async for chunk in chunks:
                yield chunk
        except P.ProtocolError:
            return  # headers are sent: the response just ends early

    return StreamingResponse(body(), media_type=media, headers={"Cache-Control": "no-cache"} if sse else None)


async def health(request: Request) -> Response:
    svc = _services(request)
    engine = svc.engine
    b = engine.bundle
    failed = engine.failure is not None  # a worker thread stopped: 503, so a supervisor restarts it
    status = "error" if failed else "draining" if svc.draining else "ok"  # draining: SIGTERM, Services.drain
    stats = engine.stats()
    return JSONResponse({
        "status": status, **({"error": engine.failure} if failed else {}),
        "model": b.name, "device": str(b.device), "dtype": str(b.dtype).replace("torch.", ""),
        "sample_rate": engine.sample_rate, "max_running": stats["decode_max_batch"], "max_streams": stats["max_streams"],
        "streams": {k[8:]: v for k, v in stats.items() if k.startswith("streams_")},
        # the KV page pool: pages of `page_size` positions, `page_bytes` each
        "kv_pages": {k[3:]: v for k, v in stats.items() if k.startswith("kv_")},
    }, status_code=200 if status == "ok" else 503)


async def ready(request: Request) -> Response:
    """Readiness (realtime/readiness.py): 200 while one more conversation fits, else 503
    with why; for load balancers and Kubernetes, no API key needed (as /v1/health)."""
    reason = not_ready_reason(_services(request))
    if reason is None:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    svc = _services(request)
    stats = svc.engine.stats()
    cap = capacity(svc, stats, not_ready_reason(svc) is None)
    return PlainTextResponse(svc.metrics.render(stats, cap), media_type="text/plain; version=0.0.4")


async def list_voices(request: Request) -> Response:
    if not _authorized(request):
        return unauthorized_response()
    return JSONResponse({"voices": _services(request).voices.list()})


async def create_voice(request: Request) -> Response:
    svc = _services(request)
    if not _authorized(request):
        return unauthorized_response()
    try:
        data, json_body = await _read_body(request, svc.config.limits)
        name, voice_id, refs = _voice_fields(data, svc.config.limits, json_body)
        inputs = [ReferenceInput(r.text, audio=r.audio) for r in refs]
        codes = await asyncio.get_running_loop().run_in_executor(None, svc.engine.encode_references, inputs)
        voice = svc.voices.add(name, [(r.text, c) for r, c in zip(refs, codes)], voice_id)
    except P.ProtocolError as e:
        return error_response(e.code, e.message, svc.metrics)
    except VoiceStoreError as e:
        return error_response(P.ErrorCode.INVALID_FIELD, str(e), svc.metrics)
    except VoiceStoreFull as e:
        return error_response(P.ErrorCode.TOO_LARGE, str(e), svc.metrics)
    except VoiceStoreUnwritable as e:
        return storage_error(e)
    except ValueError as e:  # AudioError: undecodable, empty or too long reference audio
        return error_response(P.ErrorCode.BAD_AUDIO, str(e), svc.metrics)
    return JSONResponse(voice.summary(), status_code=201)


def _voice_fields(data: object, limits: P.Limits, json_body: bool) -> tuple[str, str | None, list[P.ReferenceAudio]]:
    """POST /v1/voices body -> (name, id or None, references)."""
    if not isinstance(data, dict):
        raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "body must be a map")
    name = data.get("name") or "voice"
    if not isinstance(name, str) or len(name) > 128:
        raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "name must be a string of at most 128 characters")
    voice_id = data.get("id")
    if voice_id is not None and not isinstance(voice_id, str):
        raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "id must be a string")
    refs = P.parse_request({"references": data.get("references")}, limits, json_body).references
    if not refs:
        raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "a voice needs at least one reference")
    return name, voice_id, refs


async def voice(request: Request) -> Response:
    """GET or DELETE /v1/voices/{voice_id}."""
    svc = _services(request)
    if not _authorized(request):
        return unauthorized_response()
    voice_id = request.path_params["voice_id"]
    if request.method == "DELETE":
        try:
            deleted = svc.voices.delete(voice_id)
        except VoiceStoreUnwritable as e:
            return storage_error(e)
        return Response(status_code=204) if deleted else error_response(
            P.ErrorCode.UNKNOWN_VOICE, f"no stored voice with id {voice_id!r}")
    stored = svc.voices.get(voice_id)
    if stored is None:
        return error_response(P.ErrorCode.UNKNOWN_VOICE, f"no stored voice with id {voice_id!r}")
    return JSONResponse(stored.summary())


def storage_error(e: VoiceStoreUnwritable) -> Response:
    """The voices folder could not be written: 507 (Insufficient Storage) for a full disk or
    quota, 500 otherwise (read-only, permissions); the store is unchanged."""
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    return error_json("storage", str(e), 507 if full else 500)


async def _read_body(request: Request, limits: P.Limits) -> tuple[object, bool]:
    """The body as (data, is_json), read up to the size limit."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_message_bytes:
        raise P.ProtocolError(P.ErrorCode.TOO_LARGE, f"body larger than {limits.max_message_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_message_bytes:
            raise P.ProtocolError(P.ErrorCode.TOO_LARGE, f"body larger than {limits.max_message_bytes} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            return json.loads(body), True
        except ValueError:
            raise P.ProtocolError(P.ErrorCode.BAD_MESSAGE, "body is not valid JSON") from None
    try:
        return msgpack.unpackb(bytes(body), raw=False, strict_map_key=True), False
    except Exception:
        raise P.ProtocolError(P.ErrorCode.BAD_MESSAGE, "body is not valid MessagePack (send application/msgpack or application/json)") from None
