"""The service raises its own limit on open files: started with a soft limit of 512 (below
the 1,024 connections it admits by default), it still holds 600 connections at once."""

from __future__ import annotations

import asyncio
import resource
from pathlib import Path

import httpx
import pytest
import websockets

from server import service_process

CONNECTIONS = 600


def low_soft_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))


async def hold_connections(url: str, n: int) -> int:
    """Open n WebSocket connections, each waiting to send `start`; how many opened."""
    async def one():
        return await websockets.connect(url, open_timeout=60)
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    opened = [ws for ws in results if not isinstance(ws, BaseException)]
    await asyncio.gather(*(ws.close() for ws in opened))
    return len(opened)


def test_service_raises_its_open_file_limit_to_hold_its_connections(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024 + 256:
        pytest.skip(f"hard limit on open files {hard} is too low for this test")
    if soft < 2 * CONNECTIONS:  # this process holds the clients' ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard) if hard != resource.RLIM_INFINITY else 4096, hard))
    with service_process(tmp_path, preexec_fn=low_soft_limit) as (proc, port):
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(l for l in limits.splitlines() if l.startswith("Max open files"))
        assert int(line.split()[3]) >= 1024 + 256, line
        opened = asyncio.run(hold_connections(f"ws://127.0.0.1:{port}/v1/tts/live", CONNECTIONS))
        assert opened == CONNECTIONS
        assert httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200
        assert proc.poll() is None
