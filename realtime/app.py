"""The Starlette application: its routes, the shared objects and the engine's lifetime.

    WS     /v1/tts/live        live TTS (realtime/live.py -> realtime/session.py; messages in realtime/protocol.py)
    WS     /v1/tts/live/with-timestamp   the same, audio events with word timestamps (realtime/timestamps.py)
    POST   /v1/tts             whole request, audio streamed back (msgpack or JSON body)
    POST   /v1/tts/stream/with-timestamp   the same as Server-Sent Events with word timestamps
    GET    /v1/health          liveness and model info (503 once the engine failed, or while draining)
    GET    /v1/ready           readiness: 200 while one more conversation fits (realtime/readiness.py)
    GET    /metrics            Prometheus text
    GET    /v1/voices          stored voices
    POST   /v1/voices          store a voice: {name, id?, references: [{audio, text}]}
    GET    /v1/voices/{id}
    DELETE /v1/voices/{id}
    GET    /                   the browser demo (clients/web, realtime/demo.py)

The endpoints (realtime/http_api.py, realtime/live.py) are plain module functions; what
they share (config, engine, metrics, stored voices) is one `Services` on `app.state.services`.
`DrainingServer` runs it: on SIGTERM the service drains (Services.drain) before uvicorn stops.
"""

from __future__ import annotations

import asyncio
import gc
import signal
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute

from engine.engine import Engine
from realtime import http_api, live
from realtime.config import ServiceConfig
from realtime.demo import demo_routes, web_dir
from realtime.metrics import Metrics
from realtime.services import Services
from realtime.stalls import StallSampler, watch_loop_lag
from realtime.voices import VoiceStore

ROUTES = [
    WebSocketRoute("/v1/tts/live", live.live),
    WebSocketRoute("/v1/tts/live/with-timestamp", live.live_with_timestamp),
    Route("/v1/tts", http_api.tts, methods=["POST"]),
    Route("/v1/tts/stream/with-timestamp", http_api.tts_stream_with_timestamp, methods=["POST"]),
    Route("/v1/health", http_api.health),
    Route("/v1/ready", http_api.ready),
    Route("/metrics", http_api.metrics),
    Route("/v1/voices", http_api.list_voices, methods=["GET"]),
    Route("/v1/voices", http_api.create_voice, methods=["POST"]),
    Route("/v1/voices/{voice_id}", http_api.voice, methods=["GET", "DELETE"]),
]


def build_app(config: ServiceConfig, engine: Engine) -> Starlette:
    """`engine` is started and stopped with the application. With the demo on, a missing
    demo page raises here (RuntimeError), before the server listens."""
    voices = VoiceStore(config.voices_dir, engine.bundle.config.num_codebooks, config.max_voices)
    routes = list(ROUTES)
    if config.demo_page:
        web = web_dir()
        routes += demo_routes(web)
    routes.append(WebSocketRoute("/{path:path}", live.unknown_path))  # last: every other WebSocket path
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.services = Services(config, engine, Metrics(), voices)
    if config.demo_page:
        app.state.demo_page = web / "index.html"
    return app


@asynccontextmanager
async def lifespan(app: Starlette):
    svc: Services = app.state.services
    svc.engine.start()
    # Everything loaded so far (the model's modules, imported code) lives as long as
    # the process: out of the collector's sight, so that full collections only walk
    # what serving allocates.
    gc.collect()
    gc.freeze()
    sampler = StallSampler() if svc.config.debug_stalls else None
    if sampler is not None:
        sampler.start()
    watch = asyncio.create_task(watch_loop_lag(svc.metrics, sampler))
    try:
        yield
    finally:
        watch.cancel()
        if sampler is not None:
            sampler.stop()
        await asyncio.get_running_loop().run_in_executor(None, svc.engine.stop)
        gc.unfreeze()  # back in the collector's sight: an in-process server (tests) frees them


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM draining the service first (Services.drain): uvicorn's
    own shutdown closes every WebSocket at once (1012), losing the turns in flight. While
    the drain runs, the listener stays open (new connections hear 503 `draining`, and
    health says so); then uvicorn's shutdown runs as usual, HTTP responses in flight
    getting what is left of --drain-timeout, and the process exits 0. A second SIGTERM, or
    SIGINT, stops at once as uvicorn does."""

    def __init__(self, config: uvicorn.Config, services: Services) -> None:
        super().__init__(config)
        self.services = services
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_asked = False
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        # a signal handler: it only schedules the drain on the loop
        if sig != signal.SIGTERM or self._drain_asked or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._drain_asked = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self.drain())  # (kept: a task nobody holds may be collected)

    async def drain(self) -> None:
        """Drain, then let uvicorn shut down (also callable without a signal)."""
        self._drain_asked = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.services.config.drain_timeout_s
        await self.services.drain()
        self.config.timeout_graceful_shutdown = max(1.0, deadline - loop.time())  # read by uvicorn's shutdown
        self.should_exit = True


def uvicorn_options(config: ServiceConfig) -> dict:
    """How the service runs under uvicorn (the service's main and the tests' server).

    No permessage-deflate: audio does not compress, and zlib on every audio message was
    what saturated the event loop at 64 connections on an H200 (--debug-stalls: the loop
    was in permessage_deflate.encode through its stalls of up to 0.9 s)."""
    return dict(
        loop="uvloop", http="httptools", ws="websockets-sansio", ws_max_size=config.limits.max_message_bytes,
        ws_per_message_deflate=False,
    )
