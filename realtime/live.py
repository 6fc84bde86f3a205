"""The WebSocket endpoints: the live TTS handshake (API key, connection limit) before a
session (realtime/session.py) takes the connection, and a clear refusal on any other path.

Shared objects reach them through `websocket.app.state.services` (realtime/app.py)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.websockets import WebSocket

from realtime.auth import authorized
from realtime.errors import busy_response, draining_response, error_json, unauthorized_response
from realtime.services import Services
from realtime.session import LiveSession


async def live(ws: WebSocket) -> None:
    await _live(ws, timestamps=False)


async def live_with_timestamp(ws: WebSocket) -> None:
    """The same session, each audio event with the alignment (realtime/timestamps.py)."""
    await _live(ws, timestamps=True)


async def _live(ws: WebSocket, timestamps: bool) -> None:
    svc: Services = ws.app.state.services
    m, limit = svc.metrics, svc.config.max_connections
    if not authorized(svc.config, ws.headers, ws.query_params):
        m.errors["unauthorized"] += 1
        await _deny(ws, unauthorized_response())
        return
    if svc.draining:
        await _deny(ws, draining_response())
        return
    if m.sessions_active >= limit:
        await _deny(ws, busy_response(f"server busy: {limit} connections are open (--max-connections)", limit, m))
        return
    m.sessions_active += 1  # counted before the first await: no two handshakes take the last place
    m.sessions_total += 1
    session = LiveSession(ws, svc, timestamps)
    try:
        await ws.accept()
        svc.admit(session)
        await session.run()
    finally:
        svc.forget(session)
        m.sessions_active -= 1


async def unknown_path(ws: WebSocket) -> None:
    path = ws.url.path[:200]  # the client's own path, echoed back (bounded)
    await _deny(ws, error_json("not_found", f"no WebSocket endpoint at {path}; the live TTS endpoints are "
                               "/v1/tts/live and /v1/tts/live/with-timestamp", 404))


async def _deny(ws: WebSocket, response: Response) -> None:
    """Refuse a WebSocket handshake with this HTTP response (a JSON body saying why; the
    ASGI denial-response extension, which uvicorn has); without it, the plain close before
    accept, which clients see as 403."""
    try:
        await ws.send_denial_response(response)
    except RuntimeError:  # the server lacks the extension
        await ws.close(code=1008)
