"""A real uvicorn server on a free port, in a background thread, for integration tests.

    with running_server(model="tiny", api_keys={"k"}) as srv:
        srv.ws_url, srv.http_url, srv.app
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import uvicorn

from engine.bundle import load_bundle
from engine.engine import Engine, EngineConfig
from realtime.app import build_app, uvicorn_options
from realtime.config import ServiceConfig

_BUNDLES: dict = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bundle(model: str = "tiny"):
    if model not in _BUNDLES:  # loading is the slow part: share it across servers
        _BUNDLES[model] = load_bundle(model, "cpu")
    return _BUNDLES[model]


@dataclass
class Server:
    port: int
    app: object
    thread: threading.Thread
    server: uvicorn.Server
    config: ServiceConfig = field(repr=False)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/tts/live"

    @property
    def services(self):
        return self.app.state.services


@contextlib.contextmanager
def running_server(tmp_path: Path, model: str = "tiny", engine: EngineConfig | None = None,
                   ignore_end: bool = False, **overrides):
    """`ignore_end`: the benchmark setting of fixed-length segments (random weights)."""
    port = free_port()
    config = replace(ServiceConfig(port=port, model=model, voices_dir=tmp_path / "voices"), **overrides)
    config = replace(config, engine=replace(engine or config.engine,
                                            bench=replace((engine or config.engine).bench, ignore_end=ignore_end)))
    eng = Engine(bundle(model), config.engine)
    app = build_app(config, eng)
    uv = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **uvicorn_options(config),
    ))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield Server(port, app, thread, uv, config)
    finally:
        uv.should_exit = True
        thread.join(timeout=20)


ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def service_process(tmp_path: Path, *args: str, preexec_fn=None):
    """`python -m realtime` (tiny, CPU) as its own process, its log in tmp_path/service.log,
    healthy before it is yielded: (process, port). Killed at the end if still running."""
    port = free_port()
    log = open(tmp_path / "service.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime", "--model", "tiny", "--device", "cpu", "--port", str(port), "--no-demo",
         "--voices-dir", str(tmp_path / "voices"), *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200:
                    break
            time.sleep(0.2)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def kill_launched(launcher: subprocess.Popen, output: str) -> None:
    """A `python -m realtime.replicas` run's launcher and every replica its output named
    ("replica N: pid P"), killed: nothing outlives a test."""
    if launcher.poll() is None:
        launcher.kill()
    for pid in re.findall(r"^replica \d+: pid (\d+)", output, re.M):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
