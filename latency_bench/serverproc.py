"""Starting the service as a subprocess for a benchmark, and stopping it afterwards.

It runs as `python -m latency_bench.server`: the service with every `python -m realtime`
option plus the benchmark's baselines (`--naive`, `--ignore-end`, ...), which the product's
command line does not have."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


# open connections beyond a load's own a started service allows: a closing connection's
# stream may still be held while its successor opens
CONNECTION_HEADROOM = 8


def sizing_args(connections: int, max_running: int | None = None) -> list[str]:
    """A started service's sizing for a load that holds `connections` open at once: that
    many engine streams (plus CONNECTION_HEADROOM) and as many streams allowed to wait for
    KV pages; the decode batch cap (--max-running) is the service's default unless given."""
    n = connections + CONNECTION_HEADROOM
    running = ["--max-running", str(max_running)] if max_running else []
    return ["--max-connections", str(n), "--max-queued", str(n), *running]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def service(model: str, device: str, extra: list[str], log_path: Path, startup_timeout_s: float = 900.0):
    """Yields (ws_url, http_url, health, startup_s, pid) of a freshly started service;
    startup_s is the wall time from the process's launch to its first healthy answer (model
    load, kernel self-checks, graph capture and warm-up: what a restart costs a deployment)."""
    port = free_port()
    cmd = [sys.executable, "-m", "latency_bench.server", "--port", str(port), "--model", model, "--device", device,
           "--voices-dir", str(log_path.parent / f"voices-{port}"), "--no-demo", *extra]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    http = f"http://127.0.0.1:{port}"
    try:
        launched = time.monotonic()
        deadline = launched + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the service exited with {proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(f"{http}/v1/health", timeout=2) as r:
                    health = json.loads(r.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the service did not start in {startup_timeout_s:.0f} s; see {log_path}")
                time.sleep(0.5)
        yield f"ws://127.0.0.1:{port}/v1/tts/live", http, health, time.monotonic() - launched, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
