"""The one error body of every HTTP response and refused WebSocket handshake:
`{"error": code, "message": why}` with the status that code maps to."""

from __future__ import annotations

from starlette.responses import JSONResponse

from realtime import protocol as P
from realtime.metrics import Metrics

HTTP_STATUS = {
    P.ErrorCode.BAD_MESSAGE: 400, P.ErrorCode.INVALID_FIELD: 400, P.ErrorCode.UNKNOWN_EVENT: 400,
    P.ErrorCode.OUT_OF_ORDER: 400, P.ErrorCode.TOO_LARGE: 413, P.ErrorCode.BAD_AUDIO: 400,
    P.ErrorCode.UNKNOWN_VOICE: 404, P.ErrorCode.BUSY: 503, P.ErrorCode.TIMEOUT: 408, P.ErrorCode.INTERNAL: 500,
}


def error_json(error: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


def error_response(code: P.ErrorCode, message: str, metrics: Metrics | None = None) -> JSONResponse:
    if metrics is not None:
        metrics.errors[code.value] += 1
    return error_json(code.value, message, HTTP_STATUS[code])


def unauthorized_response() -> JSONResponse:
    """A missing or wrong API key, on HTTP and on a refused WebSocket handshake alike."""
    return error_json("unauthorized", "missing or wrong API key", 401)
