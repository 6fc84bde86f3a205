"""`python -m realtime.replicas`: one service process per GPU (or N on the CPU) on
consecutive ports, behind HAProxy, in one command; the local form of a deployment
(deploy/README.md).

    python -m realtime.replicas                          # one replica per visible GPU
    python -m realtime.replicas --replicas 3 --device cpu -- --model default
    python -m realtime.replicas --no-balancer            # the replicas only; prints their ports

Each replica is `python -m realtime` with one GPU visible (CUDA_VISIBLE_DEVICES): no state
crosses replicas. HAProxy (Debian's `haproxy`) listens on --port and sends each new
WebSocket to the replica with the fewest connections among those whose GET /v1/ready
says 200 (checked every second); a replica's 503 (full, draining) is retried on another.
Arguments after `--` go to every replica. SIGTERM or Ctrl-C drains every replica
(--drain-timeout), then stops the balancer. A replica that exits is reported, not
restarted (in production Kubernetes restarts it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HAPROXY_CONFIG = """\
# written by python -m realtime.replicas (deploy/README.md, "HAProxy")
# no maxconn: HAProxy derives it from the file descriptor limit (ulimit -n)
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    # an upgraded WebSocket: the service closes idle ones itself (--idle-timeout, 300 s)
    timeout tunnel 1h
    # a replica that refuses (503: full or draining) or cannot be reached: try another
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend realtime
    bind {host}:{port}
    default_backend replicas

backend replicas
    balance leastconn
    option httpchk
    http-check send meth GET uri /v1/ready
    http-check expect status 200
    default-server check inter {check_ms}ms fall 1 rise 1
{servers}
"""


def haproxy_config(host: str, port: int, replicas: list[tuple[str, int]], check_ms: int = 1000) -> str:
    """The balancer's configuration: least connections over `replicas` ((host, port)),
    health-checked on /v1/ready; WebSocket upgrades pass through HTTP mode."""
    servers = "\n".join(f"    server r{i} {h}:{p}" for i, (h, p) in enumerate(replicas))
    return HAPROXY_CONFIG.format(host=host, port=port, check_ms=check_ms, servers=servers)


def pin_gpu(device: str, environ=os.environ) -> str:
    """`cuda:N` -> `cuda`, with GPU N the only one this process sees (CUDA_VISIBLE_DEVICES):
    every thread then uses it as its current device (the engine's worker threads, the
    executor's, Triton's launches), not GPU 0. Runs before CUDA is initialized."""
    m = re.fullmatch(r"cuda:(\d+)", device)
    if m is None:
        return device
    n, visible = int(m[1]), environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    if ids is not None and n >= len(ids):
        raise ValueError(f"--device {device}: CUDA_VISIBLE_DEVICES={visible!r} shows {len(ids)} GPUs")
    environ["CUDA_VISIBLE_DEVICES"] = ids[n] if ids is not None else str(n)
    return "cuda"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    import torch  # only here: the launcher itself needs no GPU

    return [str(i) for i in range(torch.cuda.device_count())]


@dataclass(slots=True)
class Replica:
    index: int
    port: int
    gpu: str | None  # its CUDA_VISIBLE_DEVICES; None on the CPU
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    reported: bool = False  # its exit was reported

    def describe(self, host: str) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "cpu"
        return f"replica {self.index}: pid {self.proc.pid}, http://{host}:{self.port}, {where}, log {self.log}"


@dataclass(slots=True)
class Plan:
    replicas: list[Replica]
    host: str  # the replicas' bind address
    service_args: list[str]
    cpu_threads: int | None  # per CPU replica, unless the service arguments set it
    failed: bool = False  # a replica did not start
    balancer: subprocess.Popen | None = field(default=None, repr=False)


def plan(args: argparse.Namespace, run_dir: Path) -> Plan:
    gpus = [] if args.device == "cpu" else visible_gpus()
    if args.device == "cuda" and not gpus:
        raise SystemExit("--device cuda: no GPU is visible")
    n = args.replicas or len(gpus) or 1
    if gpus and n > len(gpus):
        raise SystemExit(f"{n} replicas but {len(gpus)} GPUs: one replica per GPU (--device cpu for CPU replicas)")
    first = args.port + (0 if args.no_balancer else 1)
    replicas = [Replica(i, first + i, gpus[i] if gpus else None, run_dir / f"replica-{i}.log") for i in range(n)]
    host = args.host if args.no_balancer else "127.0.0.1"
    threads = None
    if not gpus and "--cpu-threads" not in args.service_args:  # the cores shared out, half each as one process takes
        threads = max(1, (os.cpu_count() or 2) // (2 * n))
    return Plan(replicas, host, args.service_args, threads)


def replica_command(r: Replica, p: Plan) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of replica r: its port, and its one GPU as `cuda`."""
    cmd = [sys.executable, "-m", "realtime", "--host", p.host, "--port", str(r.port),
           "--device", "cpu" if r.gpu is None else "cuda"]
    if r.gpu is None and p.cpu_threads:
        cmd += ["--cpu-threads", str(p.cpu_threads)]
    env = dict(os.environ)
    if r.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = r.gpu
    return [*cmd, *p.service_args], env


def start_replica(r: Replica, p: Plan) -> None:
    cmd, env = replica_command(r, p)
    with open(r.log, "wb") as log:
        r.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_drain_with_parent,
                                  start_new_session=True)  # Ctrl-C reaches the launcher only: it drains them


def _drain_with_parent() -> None:
    """In the child: SIGTERM (a drain) when the launcher dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own shutdown still stops them
        pass


def wait_ready(replicas: list[Replica], host: str, timeout_s: float) -> None:
    """Until every replica's /v1/ready says 200; raises RuntimeError if one exits first."""
    deadline = time.monotonic() + timeout_s
    waiting = list(replicas)
    while waiting:
        for r in list(waiting):
            if r.proc.poll() is not None:
                raise RuntimeError(f"replica {r.index} exited with {r.proc.returncode} while starting; see {r.log}")
            if ready(probe_host(host), r.port):
                waiting.remove(r)
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"replicas {[r.index for r in waiting]} not ready after {timeout_s:g} s")
        time.sleep(0.2)


def wait_balancer(balancer: subprocess.Popen, host: str, port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready(probe_host(host), port):
        if balancer.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the balancer did not start; see haproxy.log in the run folder")
        time.sleep(0.1)


def probe_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through $http_proxy


def ready(host: str, port: int) -> bool:
    try:
        with _DIRECT.open(f"http://{host}:{port}/v1/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:  # refused, 503 (HTTPError), timeout
        return False


def start_balancer(host: str, port: int, replicas: list[Replica], run_dir: Path, check_ms: int) -> subprocess.Popen:
    haproxy = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)
    if haproxy is None:
        raise SystemExit("haproxy is not installed (apt-get install haproxy), or run with --no-balancer")
    cfg = run_dir / "haproxy.cfg"
    cfg.write_text(haproxy_config(host, port, [("127.0.0.1", r.port) for r in replicas], check_ms))
    subprocess.run([haproxy, "-c", "-q", "-f", str(cfg)], check=True)
    log = open(run_dir / "haproxy.log", "wb")
    return subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_drain_with_parent, start_new_session=True)


class Stop(Exception):
    """SIGTERM or SIGINT: drain and stop."""


def _stop(signum, frame) -> None:
    raise Stop()


def supervise(replicas: list[Replica], balancer: subprocess.Popen | None) -> None:
    """Report replicas that exit; return once every one has, or raise Stop on a signal."""
    while True:
        for r in replicas:
            if r.proc.poll() is not None and not r.reported:
                r.reported = True
                print(f"replica {r.index} (port {r.port}) exited with {r.proc.returncode}", flush=True)
        if all(r.reported for r in replicas):
            return
        if balancer is not None and balancer.poll() is not None:
            print(f"the balancer exited with {balancer.returncode}", flush=True)
            return
        time.sleep(0.2)


def shut_down(replicas: list[Replica], balancer: subprocess.Popen | None, drain_s: float) -> None:
    """SIGTERM every replica (each drains its turns in flight), then stop the balancer."""
    for r in replicas:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.terminate()
    deadline = time.monotonic() + drain_s
    for r in replicas:
        if r.proc is None:
            continue
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
    if balancer is not None and balancer.poll() is None:
        balancer.terminate()
        balancer.wait()


def drain_seconds(service_args: list[str]) -> float:
    """How long a replica may take to drain: its --drain-timeout plus a margin."""
    for i, a in enumerate(service_args):
        value = a.partition("=")[2] if a.startswith("--drain-timeout=") else (
            service_args[i + 1] if a == "--drain-timeout" and i + 1 < len(service_args) else None)
        if value is not None:
            return float(value) + 15
    return 30.0 + 15


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m realtime.replicas", description=__doc__.split("\n\n")[0],
                                epilog="arguments after -- go to every replica (python -m realtime --help)")
    p.add_argument("--replicas", type=int, default=None, help="how many (default: one per visible GPU; 1 on a CPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="auto: one replica per GPU if there is one, else the CPU")
    p.add_argument("--host", default="127.0.0.1", help="the balancer's bind address (the replicas' with --no-balancer)")
    p.add_argument("--port", type=int, default=8765, help="the balancer's port; the replicas take the next ones")
    p.add_argument("--no-balancer", action="store_true", help="start the replicas only, from --port on")
    p.add_argument("--check-interval-ms", type=int, default=1000, help="the balancer's /v1/ready checks")
    p.add_argument("--run-dir", type=Path, default=None, help="logs and haproxy.cfg (default: a new temporary folder)")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds for every replica to become ready")
    p.add_argument("service_args", nargs=argparse.REMAINDER)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.service_args[:1] == ["--"]:
        args.service_args = args.service_args[1:]
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be at least 1")
    taken = sorted({a.partition("=")[0] for a in args.service_args} & {"--host", "--port", "--device"})
    if taken:
        parser.error(f"{', '.join(taken)}: the launcher's own options, not the replicas' (before --)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="realtime-replicas-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    p = plan(args, run_dir)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        run(args, p, run_dir)
    finally:  # on any way out, no replica or balancer outlives the launcher
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the drain is bounded (drain_seconds)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        shut_down(p.replicas, p.balancer, drain_seconds(p.service_args))
    return 1 if p.failed else 0


def run(args: argparse.Namespace, p: Plan, run_dir: Path) -> None:
    """Start, wait ready, supervise until a signal or every replica exited."""
    try:
        for r in p.replicas:
            start_replica(r, p)
            print(r.describe(p.host), flush=True)
        wait_ready(p.replicas, p.host, args.start_timeout)
        if not args.no_balancer:  # once they are ready: its first health checks pass
            p.balancer = start_balancer(args.host, args.port, p.replicas, run_dir, args.check_interval_ms)
            print(f"balancer: pid {p.balancer.pid}, HAProxy, config {run_dir / 'haproxy.cfg'}", flush=True)
            wait_balancer(p.balancer, args.host, args.port)
        if p.balancer is not None:
            where = f"live TTS at ws://{args.host}:{args.port}/v1/tts/live"
        else:
            where = f"no balancer: ws://{p.host}:PORT/v1/tts/live, ports {p.replicas[0].port}-{p.replicas[-1].port}"
        print(f"ready: {len(p.replicas)} replicas; {where}", flush=True)
        supervise(p.replicas, p.balancer)
    except Stop:
        print("stopping: draining every replica", flush=True)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        p.failed = True


if __name__ == "__main__":
    sys.exit(main())
