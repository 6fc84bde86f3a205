"""Engine threads -> the event loop, with one wake-up per burst of events.

The codec thread delivers audio for many streams at once (one decode call covers every
stream with pending frames). `loop.call_soon_threadsafe` per event wakes the loop for
each of them, and every wake-up has to take the GIL back from the decode, prefill and
codec threads; at 64 connections that was thousands of wake-ups a second. The mailbox
queues events and wakes the loop once for all that arrive before it runs; events keep
their order (FIFO over all sessions, as call_soon_threadsafe would), and one failing
callback is logged without dropping the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any, Callable

log = logging.getLogger("realtime.mailbox")


class LoopMailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[Callable[..., Any], tuple]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self.wakeups = 0  # loop wake-ups asked for (for tests and diagnosis)
        self.delivered = 0

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the loop soon (callable from any thread)."""
        with self._lock:
            self._items.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
            self.wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for fn, args in items:
            try:
                fn(*args)
            except Exception:  # one session's failure must not drop the other sessions' events
                log.exception("engine event callback failed")
        self.delivered += len(items)
