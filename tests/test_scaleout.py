"""Three CPU replicas behind a real HAProxy, started as an operator would: `python -m
realtime.replicas --replicas 3 --device cpu` (leastconn, health checks on /v1/ready, a
503 retried on another replica). Real WebSocket clients through the balancer show:
connections spread over the replicas; a full replica gets no new connection while the
others take them; a replica drained with SIGTERM finishes its turn while the next
connections go elsewhere; a killed replica costs only its own connections, which close at
once and reconnect to another.

Where a connection landed is read from each replica's /metrics (realtime_sessions_active).
The tests share one set of replicas and run in file order: the drain and the kill end two.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgpack
import pytest
import websockets

from server import free_port, kill_launched

ROOT = Path(__file__).resolve().parent.parent
HOP = 2048  # samples per frame of the tiny model's codec: a frame is 2 * HOP bytes of PCM
MAX_CONNECTIONS = 4
LONG = 300  # frames: a turn of seconds for the tiny model on a CPU

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                                reason="needs haproxy (scripts/setup.sh installs it)")


class Fleet:
    def __init__(self, proc: subprocess.Popen, port: int, replicas: list[tuple[int, int]], run_dir: Path) -> None:
        self.proc, self.port, self.run_dir = proc, port, run_dir
        self.pids = [pid for pid, _ in replicas]
        self.ports = [port for _, port in replicas]
        self.url = f"ws://127.0.0.1:{port}/v1/tts/live"

    def active(self) -> list[int | None]:
        """Live connections per replica (None: the replica is gone)."""
        out = []
        for port in self.ports:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                out.append(None)
                continue
            out.append(int(re.search(r"^realtime_sessions_active (\d+)$", text, re.M)[1]))
        return out

    def busy(self, i: int) -> int:
        """Connections replica i refused for want of room."""
        text = httpx.get(f"http://127.0.0.1:{self.ports[i]}/metrics", timeout=5).text
        found = re.search(r'^realtime_errors_total\{code="busy"\} (\d+)$', text, re.M)
        return int(found[1]) if found else 0

    def ready(self, i: int) -> int:
        return httpx.get(f"http://127.0.0.1:{self.ports[i]}/v1/ready", timeout=5).status_code


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("replicas")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime.replicas", "--replicas", "3", "--device", "cpu", "--port", str(port),
         "--run-dir", str(run_dir), "--", "--model", "tiny", "--no-demo", "--voices-dir", str(run_dir / "voices"),
         "--max-connections", str(MAX_CONNECTIONS), "--drain-timeout", "60"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines = []
    try:
        while not (lines and lines[-1].startswith("ready:")):
            line = proc.stdout.readline()
            assert line, "the launcher stopped:\n" + "".join(lines)
            lines.append(line)
        replicas = [(int(m[1]), int(m[2])) for m in re.finditer(r"^replica \d+: pid (\d+), http://[^:]+:(\d+)",
                                                                "".join(lines), re.M)]
        assert len(replicas) == 3 and [p for _, p in replicas] == [port + 1, port + 2, port + 3]
        yield Fleet(proc, port, replicas, run_dir)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        kill_launched(proc, "".join(lines))


async def started(url: str, **request):
    ws = await websockets.connect(url, max_size=None)
    await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", **request}}))
    assert msgpack.unpackb(await ws.recv())["event"] == "ready"
    return ws


async def speaking(url: str, frames: int = LONG):
    """A connection in the middle of a long turn: (socket, its events so far)."""
    ws = await started(url, max_new_tokens=frames, ignore_end=True)
    await ws.send(msgpack.packb({"event": "text", "text": "A long turn that is in flight."}))
    await ws.send(msgpack.packb({"event": "flush"}))
    events = [msgpack.unpackb(await ws.recv())]
    while events[-1]["event"] != "audio":
        events.append(msgpack.unpackb(await ws.recv()))
    return ws, events


async def until_turn_end(ws, events: list[dict]) -> list[dict]:
    while events[-1]["event"] != "turn_end":
        events.append(msgpack.unpackb(await ws.recv()))
    return events


def audio_bytes(events) -> int:
    return sum(len(e["audio"]) for e in events if e["event"] == "audio")


async def close_all(sockets) -> None:
    await asyncio.gather(*(ws.close() for ws in sockets))
    await asyncio.sleep(0.3)


def test_connections_spread_over_the_replicas(fleet):
    async def main():
        sockets = [await started(fleet.url) for _ in range(6)]
        spread = fleet.active()
        await close_all(sockets)
        return spread

    assert asyncio.run(main()) == [2, 2, 2]  # least connections first
    assert fleet.active() == [0, 0, 0]


def test_a_full_replica_gets_no_new_connection_while_the_others_take_them(fleet):
    """Replica 0 is filled directly (past the balancer, which cannot count those): its
    /v1/ready says 503 and every connection through the balancer lands on the other two,
    none refused (before the balancer's check saw it full, its 503 is retried elsewhere;
    after, it is not tried at all); once one of its connections leaves, it takes new ones
    again."""
    async def main():
        direct = f"ws://127.0.0.1:{fleet.ports[0]}/v1/tts/live"
        filled = [await started(direct) for _ in range(MAX_CONNECTIONS)]
        full = fleet.ready(0), fleet.active()
        through = [await started(fleet.url) for _ in range(3)]  # at once: replica 0's 503 is retried elsewhere
        await asyncio.sleep(2.5)  # the balancer's check (every second) has seen it full
        refused = fleet.busy(0)
        through += [await started(fleet.url) for _ in range(3)]
        refused_later = fleet.busy(0) - refused  # the balancer no longer even tries it
        while_full = fleet.active()
        await close_all(filled[:1])
        await asyncio.sleep(2.5)  # the balancer's check (every second) sees it ready again
        back = fleet.ready(0), await started(fleet.url)
        after = fleet.active()
        await close_all([*filled[1:], *through, back[1]])
        return full, refused_later, while_full, back[0], after

    (ready0, before), refused_later, while_full, ready_again, after = asyncio.run(main())
    assert ready0 == 503 and before == [MAX_CONNECTIONS, 0, 0]
    assert refused_later == 0
    assert while_full == [MAX_CONNECTIONS, 3, 3]
    assert ready_again == 200 and after == [MAX_CONNECTIONS, 3, 3]  # the new one went to replica 0 (it has fewest)


def test_a_drained_replica_finishes_its_turn_and_the_next_connections_go_elsewhere(fleet):
    async def main():
        turns = [await speaking(fleet.url) for _ in range(3)]  # one per replica
        spread = fleet.active()
        os.kill(fleet.pids[1], signal.SIGTERM)
        await asyncio.sleep(0.5)
        during = fleet.ready(1)
        newcomers = [await started(fleet.url) for _ in range(4)]
        where = fleet.active()
        ends = await asyncio.gather(*(until_turn_end(ws, events) for ws, events in turns))
        await close_all([ws for ws, _ in turns] + newcomers)
        return spread, during, where, ends

    spread, during, where, ends = asyncio.run(main())
    assert spread == [1, 1, 1] and during == 503
    assert where[1] == 1 and where[0] + where[2] == 2 + 4  # no newcomer on the draining replica
    for events in ends:  # every turn spoken whole, the drained replica's too
        assert audio_bytes(events) == 2 * LONG * HOP and not [e for e in events if e["event"] == "error"]
    deadline = time.monotonic() + 30
    while fleet.active()[1] is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fleet.active()[1] is None  # it exited once its turn was spoken


def test_a_killed_replica_costs_only_its_own_connections_which_reconnect_at_once(fleet):
    """SIGKILL: no drain, no `finish`. The balancer closes that replica's connections at
    once (the client sees the socket close, not a hang); the other replica's turn goes on
    to its end; the cut client reconnects through the balancer and is served."""
    async def main():
        turns = {}
        for _ in range(2):  # one on each replica that is left
            before = fleet.active()
            turn = await speaking(fleet.url)
            turns[landed(before, fleet.active())] = turn
        os.kill(fleet.pids[2], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(until_turn_end(*turns[2]), 10)
        closed_after = time.monotonic() - t0
        again, head = await speaking(fleet.url, 20)  # at once: no wait for a health check
        reconnect = time.monotonic() - t0
        survivor = await until_turn_end(*turns[0])
        redo = await until_turn_end(again, head)
        await close_all([turns[0][0], again])
        return sorted(turns), closed_after, reconnect, survivor, redo

    replicas, closed_after, reconnect, survivor, redo = asyncio.run(main())
    assert replicas == [0, 2]
    assert closed_after < 5 and reconnect < 10
    assert audio_bytes(survivor) == 2 * LONG * HOP and not [e for e in survivor if e["event"] == "error"]
    assert audio_bytes(redo) == 2 * 20 * HOP
    assert fleet.active() == [0, None, None]


def landed(before: list[int | None], after: list[int | None]) -> int:
    """The replica whose connections went up by one."""
    return next(i for i, (b, a) in enumerate(zip(before, after)) if b is not None and a == b + 1)
