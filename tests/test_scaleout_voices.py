"""Stored voices across replicas: two real servers sharing one --voices-dir (as replicas
on a ReadWriteMany volume or a host folder do). A voice stored through one is listed and
spoken by the other; deleted through one, it is gone from both; stored again under the
same id, the other speaks the new one; two replicas storing one id at once keep one."""

from __future__ import annotations

import asyncio
import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgpack
import numpy as np
import websockets

from engine.audio import wav_bytes
from server import running_server

RATE = 44100


def reference(hz: float, seconds: float = 1.0) -> str:
    t = np.arange(int(RATE * seconds)) / RATE
    return base64.b64encode(wav_bytes((0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), RATE)).decode()


def store(url: str, voice_id: str, name: str, seconds: float = 1.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/voices", json={"name": name, "id": voice_id,
                                                "references": [{"audio": reference(200, seconds), "text": "A hum."}]},
                      timeout=60)


def listed(url: str) -> dict[str, str]:
    return {v["id"]: v["name"] for v in httpx.get(f"{url}/v1/voices").json()["voices"]}


async def speak(ws_url: str, voice_id: str) -> list[dict]:
    async with websockets.connect(ws_url, max_size=None) as ws:
        await ws.send(msgpack.packb({"event": "start", "request": {"format": "pcm", "reference_id": voice_id,
                                                                   "max_new_tokens": 4}}))
        await ws.send(msgpack.packb({"event": "text", "text": "In the stored voice."}))
        await ws.send(msgpack.packb({"event": "stop"}))
        return [msgpack.unpackb(f) async for f in ws]


def test_a_voice_stored_on_one_replica_is_spoken_and_deleted_on_another(tmp_path):
    with running_server(tmp_path, ignore_end=True) as a, running_server(tmp_path, ignore_end=True) as b:
        assert a.config.voices_dir == b.config.voices_dir
        assert store(a.http_url, "shared", "first").status_code == 201
        assert listed(b.http_url) == {"shared": "first"}
        assert httpx.get(f"{b.http_url}/v1/voices/shared").json()["references"][0]["frames"] == 22
        spoken = asyncio.run(speak(b.ws_url, "shared"))
        assert spoken[0]["event"] == "ready" and spoken[-1] == {"event": "finish", "reason": "stop"}
        assert sum(len(e["audio"]) for e in spoken if e["event"] == "audio") > 0

        dup = store(b.http_url, "shared", "again")  # the id is taken, whichever replica is asked
        assert dup.status_code == 400 and "already exists" in dup.json()["message"]

        assert httpx.delete(f"{b.http_url}/v1/voices/shared").status_code == 204
        assert listed(a.http_url) == {} and httpx.get(f"{a.http_url}/v1/voices/shared").status_code == 404
        gone = asyncio.run(speak(a.ws_url, "shared"))
        assert [e.get("code") for e in gone if e["event"] == "error"] == ["unknown_voice"]
        assert httpx.delete(f"{a.http_url}/v1/voices/shared").status_code == 404

        assert store(b.http_url, "shared", "second", seconds=2.0).status_code == 201  # the same id, a new voice
        assert listed(a.http_url) == {"shared": "second"}
        assert httpx.get(f"{a.http_url}/v1/voices/shared").json()["references"][0]["frames"] == 44


def test_two_replicas_storing_one_id_at_once_keep_one_voice(tmp_path):
    with running_server(tmp_path) as a, running_server(tmp_path) as b:
        for round_ in range(3):
            voice_id = f"race-{round_}"
            with ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(lambda s: store(s.http_url, voice_id, s.http_url), (a, b)))
            assert sorted(r.status_code for r in answers) == [201, 400], [r.text for r in answers]
            winner = next(r.json()["name"] for r in answers if r.status_code == 201)
            assert listed(a.http_url)[voice_id] == listed(b.http_url)[voice_id] == winner
        assert sorted(p.name for p in a.config.voices_dir.iterdir()) == ["race-0", "race-1", "race-2"]  # no leftovers
