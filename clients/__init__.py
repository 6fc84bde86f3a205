"""clients: asyncio client library and CLI (`python -m clients speak ...`) of the live TTS
service. They speak to the service only through its public protocol."""

from clients.client import (
    DEFAULT_URL, AudioChunk, Cancelled, ChunkAlignment, Event, Finished, ReadyInfo, Speech, SpeechResult, TurnEnd,
    TurnTiming, VoiceSession, Word, connect,
)
from clients.errors import (
    BadReferenceAudio, ClientTimeout, ConnectFailed, ConnectionLost, InternalServerError, InvalidRequest,
    RequestTooLarge, ServerBusy, ServerTimeout, Unauthorized, UnknownVoice, VoiceServiceError,
)

__all__ = [
    "DEFAULT_URL", "AudioChunk", "Cancelled", "Event", "Finished", "ReadyInfo", "Speech", "SpeechResult",
    "TurnEnd", "TurnTiming", "VoiceSession", "Word", "ChunkAlignment", "connect",
    "BadReferenceAudio", "ClientTimeout", "ConnectFailed", "ConnectionLost", "InternalServerError",
    "InvalidRequest", "RequestTooLarge", "ServerBusy", "ServerTimeout", "Unauthorized", "UnknownVoice",
    "VoiceServiceError",
]
