"""The one error body of every HTTP response and refused WebSocket handshake:
`{"error": code, "message": why}` with the status that code maps to (a refusal for want of
capacity, `busy`, has the hosted Fish API's shape instead, plus ours: busy_response); and
the server's log of every refusal (these, and a live session's `error` event),
rate-limited per code."""

from __future__ import annotations

import logging
import threading
import time

from starlette.responses import JSONResponse

from realtime import protocol as P
from realtime.metrics import Metrics

HTTP_STATUS = {
    P.ErrorCode.BAD_MESSAGE: 400, P.ErrorCode.INVALID_FIELD: 400, P.ErrorCode.UNKNOWN_EVENT: 400,
    P.ErrorCode.OUT_OF_ORDER: 400, P.ErrorCode.TOO_LARGE: 413, P.ErrorCode.BAD_AUDIO: 400,
    P.ErrorCode.UNKNOWN_VOICE: 404, P.ErrorCode.BUSY: 503, P.ErrorCode.TIMEOUT: 408, P.ErrorCode.INTERNAL: 500,
}


log = logging.getLogger("realtime.refused")
MAX_LOGGED_CHARS = 300  # of a message: they can quote what the client sent


class RefusalLog:
    """Logs a refusal at most once per `interval` seconds per code, so a misbehaving client
    (or a burst of busy) cannot flood the log; the next line logged for a code says how
    many were left out since the last. Called from the event loops of every server in the
    process (tests run several), hence the lock."""

    def __init__(self, interval: float = 1.0, clock=time.monotonic) -> None:
        self.interval, self._clock = interval, clock
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}
        self._lock = threading.Lock()

    def refused(self, code: str, message: str) -> None:
        now = self._clock()
        with self._lock:
            last = self._last.get(code)
            if last is not None and now - last < self.interval:
                self._left_out[code] = self._left_out.get(code, 0) + 1
                return
            self._last[code] = now
            left_out = self._left_out.pop(code, 0)
        more = f" (and {left_out} more {code} refusals since the last logged one)" if left_out else ""
        log.warning("refused %s: %s%s", code, message[:MAX_LOGGED_CHARS], more)


_refusals = RefusalLog()


def log_refusal(code: str, message: str) -> None:
    """Every request refused with an error (HTTP, a WebSocket handshake, a live session's
    `error` event) is logged here, with its code and reason."""
    _refusals.refused(code, message)
# the hosted Fish API's answer past a concurrency limit: {"error": FISH_BUSY, "max_concurrency": N}
FISH_BUSY = "Concurrency limit exceeded"


def concurrency_fields(limit: int) -> dict:
    """What a Fish client looks for in a refusal for want of capacity (a `busy` error event
    carries it too)."""
    return {"error": FISH_BUSY, "max_concurrency": limit}


def error_json(error: str, message: str, status: int) -> JSONResponse:
    log_refusal(error, message)
    return JSONResponse({"error": error, "message": message}, status_code=status)


def error_response(code: P.ErrorCode, message: str, metrics: Metrics | None = None) -> JSONResponse:
    if metrics is not None:
        metrics.errors[code.value] += 1
    return error_json(code.value, message, HTTP_STATUS[code])


def busy_response(message: str, limit: int, metrics: Metrics | None = None) -> JSONResponse:
    """503 with the Fish body, our code as `code` and why as `message` (503, not Fish's 429:
    this replica is full, so a load balancer or client should try another)."""
    if metrics is not None:
        metrics.errors[P.ErrorCode.BUSY.value] += 1
    body = {**concurrency_fields(limit), "code": P.ErrorCode.BUSY.value, "message": message}
    return JSONResponse(body, status_code=HTTP_STATUS[P.ErrorCode.BUSY])


def draining_response() -> JSONResponse:
    """New work while the service drains (SIGTERM, Services.drain): 503, so that a client or
    load balancer tries another replica."""
    return error_json("draining", "the server is shutting down: connect to another replica or try again", 503)


def unauthorized_response() -> JSONResponse:
    """A missing or wrong API key, on HTTP and on a refused WebSocket handshake alike."""
    return error_json("unauthorized", "missing or wrong API key", 401)
