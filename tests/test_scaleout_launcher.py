"""`python -m realtime.replicas` without a GPU or a balancer: the replicas alone on
consecutive ports (what a machine without HAProxy, or with its own balancer, runs), and
how it lays replicas out over GPUs (one each, pinned with CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from realtime.replicas import parse, pin_gpu, plan, replica_command
from server import free_port, kill_launched

ROOT = Path(__file__).resolve().parent.parent


def test_without_a_balancer_the_replicas_serve_on_consecutive_ports_and_drain_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime.replicas", "--no-balancer", "--replicas", "2", "--device", "cpu",
         "--port", str(port), "--run-dir", str(tmp_path), "--", "--model", "tiny", "--no-demo",
         "--voices-dir", str(tmp_path / "voices")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines = []
    try:
        while not (lines and lines[-1].startswith("ready:")):
            lines.append(proc.stdout.readline())
            assert lines[-1], "the launcher stopped:\n" + "".join(lines)
        found = re.findall(r"^replica (\d): pid (\d+), http://127\.0\.0\.1:(\d+), cpu, log (\S+)$", "".join(lines), re.M)
        assert [(i, int(p)) for i, _, p, _ in found] == [("0", port), ("1", port + 1)]
        assert not [line for line in lines if line.startswith("balancer")]
        assert lines[-1] == f"ready: 2 replicas; no balancer: ws://127.0.0.1:PORT/v1/tts/live, ports {port}-{port + 1}\n"
        for _, _, p, log in found:
            assert httpx.get(f"http://127.0.0.1:{p}/v1/ready").json() == {"status": "ready"}
            assert Path(log).parent == tmp_path
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        rest = proc.stdout.read()
        assert "stopping: draining every replica" in rest
        for _, pid, _, _ in found:  # every replica drained and exited
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        kill_launched(proc, "".join(lines))


def test_one_replica_per_visible_gpu_each_pinned_to_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    p = plan(parse(["--port", "9000", "--", "--model", "/m/s2-pro"]), tmp_path)
    assert [(r.gpu, r.port) for r in p.replicas] == [("3", 9001), ("5", 9002)]  # the balancer on 9000
    cmd, env = replica_command(p.replicas[1], p)
    assert cmd[1:] == ["-m", "realtime", "--host", "127.0.0.1", "--port", "9002", "--device", "cuda", "--model",
                       "/m/s2-pro"]
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(SystemExit, match="one replica per GPU"):
        plan(parse(["--replicas", "3"]), tmp_path)
    cpu = plan(parse(["--device", "cpu", "--replicas", "3", "--no-balancer", "--host", "0.0.0.0"]), tmp_path)
    cmd, env = replica_command(cpu.replicas[0], cpu)
    assert cmd[3:9] == ["--host", "0.0.0.0", "--port", "8765", "--device", "cpu"] and "--cpu-threads" in cmd
    assert env.get("CUDA_VISIBLE_DEVICES") == "3,5"  # untouched: the CPU replicas do not use it


def test_the_launcher_keeps_its_own_options(capsys):
    with pytest.raises(SystemExit):
        parse(["--", "--port", "1234"])
    assert "--port: the launcher's own options" in capsys.readouterr().err


def test_device_cuda_n_makes_gpu_n_the_only_one_the_process_sees():
    env: dict[str, str] = {}
    assert pin_gpu("cuda:2", env) == "cuda" and env == {"CUDA_VISIBLE_DEVICES": "2"}
    env = {"CUDA_VISIBLE_DEVICES": "4,6,7"}  # N counts among the GPUs already visible
    assert pin_gpu("cuda:1", env) == "cuda" and env == {"CUDA_VISIBLE_DEVICES": "6"}
    with pytest.raises(ValueError, match="shows 3 GPUs"):
        pin_gpu("cuda:3", {"CUDA_VISIBLE_DEVICES": "4,6,7"})
    assert pin_gpu("cuda", {}) == "cuda" and pin_gpu("cpu", {}) == "cpu" and pin_gpu("auto", {}) == "auto"
