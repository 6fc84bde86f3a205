"""The Starlette application: routes, authentication, request parsing.

    WS     /v1/tts/live        live TTS (realtime/session.py, protocol in realtime/protocol.py)
    POST   /v1/tts             whole request, audio streamed back (msgpack or JSON body)
    GET    /v1/health          liveness and model info
    GET    /metrics            Prometheus text
    GET    /v1/voices          stored voices
    POST   /v1/voices          store a voice: {name, id?, references: [{audio, text}]}
    GET    /v1/voices/{id}
    DELETE /v1/voices/{id}
    GET    /                   the browser demo (clients/web)
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from engine.engine import Engine
from engine.voice import ReferenceInput
from realtime import protocol as P
from realtime.audio_out import finalize_wav
from realtime.config import ServiceConfig
from realtime.metrics import Metrics
from realtime.oneshot import OneShotError, synthesize
from realtime.services import Services
from realtime.session import LiveSession, SessionError
from realtime.stalls import StallSampler, watch_loop_lag
from realtime.voices import VoiceStore, VoiceStoreError, VoiceStoreFull

WEB_DIR = Path(__file__).resolve().parent.parent / "clients" / "web"
MEDIA_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "opus": "audio/ogg", "pcm": "audio/L16"}
HTTP_STATUS = {
    P.ErrorCode.BAD_MESSAGE: 400, P.ErrorCode.INVALID_FIELD: 400, P.ErrorCode.UNKNOWN_EVENT: 400,
    P.ErrorCode.OUT_OF_ORDER: 400, P.ErrorCode.TOO_LARGE: 413, P.ErrorCode.BAD_AUDIO: 400,
    P.ErrorCode.UNKNOWN_VOICE: 404, P.ErrorCode.BUSY: 503, P.ErrorCode.TIMEOUT: 408, P.ErrorCode.INTERNAL: 500,
}


def _error_json(error: str, message: str, status: int) -> JSONResponse:
    """The one error body of every HTTP response and refused handshake."""
    return JSONResponse({"error": error, "message": message}, status_code=status)


def error_response(code: P.ErrorCode, message: str, metrics: Metrics | None = None) -> JSONResponse:
    if metrics is not None:
        metrics.errors[code.value] += 1
    return _error_json(code.value, message, HTTP_STATUS[code])


def unauthorized_response() -> JSONResponse:
    """A missing or wrong API key, on HTTP and on a refused WebSocket handshake alike."""
    return _error_json("unauthorized", "missing or wrong API key", 401)


async def _deny(ws: WebSocket, response: Response) -> None:
    """Refuse a WebSocket handshake with this HTTP response (a JSON body saying why; the
    ASGI denial-response extension, which uvicorn has); without it, the plain close before
    accept, which clients see as 403."""
    try:
        await ws.send_denial_response(response)
    except RuntimeError:  # the server lacks the extension
        await ws.close(code=1008)


def _bearer(headers) -> str | None:
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def authorized(config: ServiceConfig, headers, query) -> bool:
    if not config.api_keys:
        return True
    # browsers cannot set headers on a WebSocket: the demo page passes ?api_key=
    key = _bearer(headers) or query.get("api_key")
    return key is not None and any(hmac.compare_digest(key, k) for k in config.api_keys)


def build_app(config: ServiceConfig, engine: Engine) -> Starlette:
    """`engine` is started and stopped with the application."""
    voices = VoiceStore(config.voices_dir, engine.bundle.config.num_codebooks, config.max_voices)
    svc = Services(config, engine, Metrics(), voices)

    async def live(ws: WebSocket) -> None:
        if not authorized(config, ws.headers, ws.query_params):
            svc.metrics.errors["unauthorized"] += 1
            await _deny(ws, unauthorized_response())
            return
        m = svc.metrics
        if m.sessions_active >= config.max_connections:
            m.errors[P.ErrorCode.BUSY.value] += 1
            await _deny(ws, _error_json(P.ErrorCode.BUSY.value, f"server busy: {config.max_connections} connections "
                                        "are open (--max-connections)", 503))
            return
        m.sessions_active += 1  # counted before the first await: no two handshakes take the last place
        m.sessions_total += 1
        try:
            await ws.accept()
            await LiveSession(ws, svc).run()
        finally:
            m.sessions_active -= 1

    async def unknown_ws(ws: WebSocket) -> None:
        path = ws.url.path[:200]  # the client's own path, echoed back (bounded)
        await _deny(ws, _error_json("not_found", f"no WebSocket endpoint at {path}; the live TTS endpoint is "
                                    "/v1/tts/live", 404))

    async def tts(request: Request) -> Response:
        svc.metrics.http_requests += 1
        if not authorized(config, request.headers, request.query_params):
            return unauthorized_response()
        try:
            data, is_json = await _read_body(request, config.limits)
            req = P.parse_request(data, config.limits, is_json)
        except P.ProtocolError as e:
            return error_response(e.code, e.message, svc.metrics)
        chunks = synthesize(svc, req)
        try:
            first = await chunks.__anext__()
        except (OneShotError, SessionError) as e:
            return error_response(e.code, e.message, svc.metrics)
        except StopAsyncIteration:
            first = b""
        media = MEDIA_TYPES[req.format]
        if request.query_params.get("stream", "true").lower() == "false":
            body = first + b"".join([c async for c in chunks])
            return Response(finalize_wav(body) if req.format == "wav" else body, media_type=media)

        async def body():
            yield first
            try:
                async for chunk in chunks:
                    yield chunk
            except OneShotError:
                return  # headers are sent: the response just ends early

        return StreamingResponse(body(), media_type=media)

    async def health(request: Request) -> Response:
        b = engine.bundle
        failed = engine.failure is not None  # a worker thread stopped: 503, so a supervisor restarts it
        return JSONResponse({
            "status": "error" if failed else "ok", **({"error": engine.failure} if failed else {}),
            "model": b.name, "device": str(b.device), "dtype": str(b.dtype).replace("torch.", ""),
            "sample_rate": engine.sample_rate, "max_running": engine.config.max_running,
            "streams": {k[8:]: v for k, v in engine.stats().items() if k.startswith("streams_")},
        }, status_code=503 if failed else 200)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(svc.metrics.render(engine.stats()), media_type="text/plain; version=0.0.4")

    async def list_voices(request: Request) -> Response:
        if not authorized(config, request.headers, request.query_params):
            return unauthorized_response()
        return JSONResponse({"voices": svc.voices.list()})

    async def create_voice(request: Request) -> Response:
        if not authorized(config, request.headers, request.query_params):
            return unauthorized_response()
        try:
            data, json_body = await _read_body(request, config.limits)
            if not isinstance(data, dict):
                raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "body must be a map")
            name = data.get("name") or "voice"
            if not isinstance(name, str) or len(name) > 128:
                raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "name must be a string of at most 128 characters")
            voice_id = data.get("id")
            if voice_id is not None and not isinstance(voice_id, str):
                raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "id must be a string")
            refs = P.parse_request({"references": data.get("references")}, config.limits, json_body).references
            if not refs:
                raise P.ProtocolError(P.ErrorCode.INVALID_FIELD, "a voice needs at least one reference")
            inputs = [ReferenceInput(r.text, audio=r.audio) for r in refs]
            codes = await asyncio.get_running_loop().run_in_executor(None, engine.encode_references, inputs)
            voice = svc.voices.add(name, [(r.text, c) for r, c in zip(refs, codes)], voice_id)
        except P.ProtocolError as e:
            return error_response(e.code, e.message, svc.metrics)
        except VoiceStoreError as e:
            return error_response(P.ErrorCode.INVALID_FIELD, str(e), svc.metrics)
        except VoiceStoreFull as e:
            return error_response(P.ErrorCode.TOO_LARGE, str(e), svc.metrics)
        except ValueError as e:  # AudioError: undecodable, empty or too long reference audio
            return error_response(P.ErrorCode.BAD_AUDIO, str(e), svc.metrics)
        return JSONResponse(voice.summary(), status_code=201)

    async def voice(request: Request) -> Response:
        if not authorized(config, request.headers, request.query_params):
            return unauthorized_response()
        voice_id = request.path_params["voice_id"]
        if request.method == "DELETE":
            return Response(status_code=204) if svc.voices.delete(voice_id) else error_response(
                P.ErrorCode.UNKNOWN_VOICE, f"no stored voice with id {voice_id!r}")
        stored = svc.voices.get(voice_id)
        if stored is None:
            return error_response(P.ErrorCode.UNKNOWN_VOICE, f"no stored voice with id {voice_id!r}")
        return JSONResponse(stored.summary())

    async def index(request: Request) -> Response:
        return FileResponse(WEB_DIR / "index.html")

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        # Everything loaded so far (the model's modules, imported code) lives as long as
        # the process: out of the collector's sight, so that full collections only walk
        # what serving allocates.
        gc.collect()
        gc.freeze()
        sampler = StallSampler() if config.debug_stalls else None
        if sampler is not None:
            sampler.start()
        watch = asyncio.create_task(watch_loop_lag(svc.metrics, sampler))
        try:
            yield
        finally:
            watch.cancel()
            if sampler is not None:
                sampler.stop()
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)
            gc.unfreeze()  # back in the collector's sight: an in-process server (tests) frees them

    routes = [
        WebSocketRoute("/v1/tts/live", live),
        Route("/v1/tts", tts, methods=["POST"]),
        Route("/v1/health", health),
        Route("/metrics", metrics),
        Route("/v1/voices", list_voices, methods=["GET"]),
        Route("/v1/voices", create_voice, methods=["POST"]),
        Route("/v1/voices/{voice_id}", voice, methods=["GET", "DELETE"]),
    ]
    if config.demo_page and WEB_DIR.is_dir():
        routes += [Route("/", index), Mount("/static", StaticFiles(directory=WEB_DIR), name="static")]
    routes.append(WebSocketRoute("/{path:path}", unknown_ws))  # last: every other WebSocket path
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.services = svc
    return app


def uvicorn_options(config: ServiceConfig) -> dict:
    """How the service runs under uvicorn (the service's main and the tests' server).

    No permessage-deflate: audio does not compress, and zlib on every audio message was
    what saturated the event loop at 64 connections on an H200 (--debug-stalls: the loop
    was in permessage_deflate.encode through its stalls of up to 0.9 s)."""
    return dict(
        loop="uvloop", http="httptools", ws="websockets-sansio", ws_max_size=config.limits.max_message_bytes,
        ws_per_message_deflate=False,
    )


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
