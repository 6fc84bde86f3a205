"""API keys: who may use the service, over HTTP and WebSocket alike."""

from __future__ import annotations

import hmac

from realtime.config import ServiceConfig


def _bearer(headers) -> str | None:
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def authorized(config: ServiceConfig, headers, query) -> bool:
    if not config.api_keys:
        return True
    # browsers cannot set headers on a WebSocket: the demo page passes ?api_key=
    key = _bearer(headers) or query.get("api_key")
    return key is not None and any(hmac.compare_digest(key, k) for k in config.api_keys)
