"""Typed errors of the client. Every one is a `VoiceServiceError` with a `code` and a message.

Server-side codes (the `error {code, message}` event of realtime/protocol.py) map to one class
each; the client adds its own codes for what happens around the protocol: the handshake
refused (`unauthorized`, `handshake`), no connection (`connection_failed`), the connection
dropped without `finish` (`disconnected`) and a client-side wait that ran out (`client_timeout`).
"""

from __future__ import annotations


class VoiceServiceError(Exception):
    """The server (or the connection to it) ended the session with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidRequest(VoiceServiceError):
    """The server rejected what was sent: a bad field, an out-of-order or unknown event,
    a malformed message, something over a limit, or undecodable reference audio."""


class RequestTooLarge(InvalidRequest):
    """A text event, the buffered text, a reference or a message is over a server limit."""


class BadReferenceAudio(InvalidRequest):
    """The reference audio could not be decoded (or is empty or too long)."""


class UnknownVoice(VoiceServiceError):
    """`reference_id` names no voice stored on the server."""


class ServerBusy(VoiceServiceError):
    """The server has no capacity for another stream; try again later."""


class Unauthorized(VoiceServiceError):
    """The API key is missing or wrong (the WebSocket handshake was refused)."""


class ServerTimeout(VoiceServiceError):
    """The server closed the session: it had nothing from the client for too long."""


class InternalServerError(VoiceServiceError):
    """The server failed while handling this session."""


class ConnectFailed(VoiceServiceError):
    """No WebSocket connection could be made (refused, unreachable, bad URL, bad handshake)."""


class ConnectionLost(VoiceServiceError):
    """The connection ended without a `finish` event."""


class ClientTimeout(VoiceServiceError):
    """The client waited longer than its timeout for the server (handshake, `ready`, an ack
    or the next event)."""


_BY_CODE: dict[str, type[VoiceServiceError]] = {
    "bad_message": InvalidRequest,
    "unknown_event": InvalidRequest,
    "out_of_order": InvalidRequest,
    "invalid_field": InvalidRequest,
    "too_large": RequestTooLarge,
    "bad_audio": BadReferenceAudio,
    "unknown_voice": UnknownVoice,
    "busy": ServerBusy,
    "timeout": ServerTimeout,
    "internal": InternalServerError,
    "unauthorized": Unauthorized,
}


def error_from_code(code: str, message: str) -> VoiceServiceError:
    """The typed error for a server error code; unknown codes give the base class."""
    return _BY_CODE.get(code, VoiceServiceError)(code, message)
