"""latency_bench.idle against the tiny model on the CPU: connections held idle and ready
with one cached voice, a sample of them speaking, and the ladder stopping at the first
level the service refuses."""

from __future__ import annotations

import json

import pytest

from latency_bench.idle import main, verdict
from latency_bench.serverproc import service

QUICK = ["--rate", "100", "--hold", "0.3", "--synthetic-reference", "2", "--max-new-tokens", "6", "--fixed-frames"]


def test_idle_connections_are_held_and_a_sample_speaks(tmp_path):
    out = tmp_path / "idle"
    assert main(["--model", "tiny", "--device", "cpu", "--connections", "24", "--speakers", "4", *QUICK,
                 "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    (lv,) = data["levels"]
    assert lv["ready"] == lv["held"] == 24 and lv["refusals"] == lv["errors"] == lv["lost"] == 0, lv["error_samples"]
    assert lv["open_to_ready_s"]["n"] == 24 and 0 < lv["open_to_ready_s"]["p50"] <= lv["open_to_ready_s"]["p99"]
    assert lv["speakers"] == lv["speakers_with_audio"] == 4 and lv["ttfa_s"]["n"] == 4 and lv["ttfa_s"]["p50"] > 0
    assert lv["voice_cached"] >= 20  # one voice: the first connections prefill it, the rest find it cached
    view = lv["server"]
    assert view["sessions_active"] == 24 and view["rss_bytes"] > 0
    assert view["streams"]["idle"] == 24 and view["kv_pages"]["pages_used"] > 0
    assert 0 < lv["kv_bytes_per_idle_connection"] < view["kv_pages"]["page_bytes"] * 4  # the voice's pages are shared
    assert data["capacity"] == {"connections": 24, "failed_at": None, "tried": [[24, True]]}
    assert data["meta"]["fd_limit"] > 0 and data["meta"]["startup_s"] > 0


def test_the_ladder_stops_at_the_first_level_with_a_refusal(tmp_path):
    with service("tiny", "cpu", ["--max-connections", "6", "--ignore-end"], tmp_path / "server.log") as (url, *_):
        assert main(["--url", url, "--connections", "4,8,12", "--speakers", "2", *QUICK,
                     "--out", str(tmp_path / "idle")]) == 0
    data = json.loads((tmp_path / "idle" / "results.json").read_text())
    assert data["capacity"] == {"connections": 4, "failed_at": 8, "tried": [[4, True], [8, False]]}
    refused = data["levels"][1]
    assert refused["refusals"] == 2 and refused["errors_by_code"] == {"busy": 2} and refused["held"] == 6
    assert refused["verdict"].startswith("failed: 2 refused")


def _level(**kw):
    level = {"connections": 10, "held": 10, "refusals": 0, "errors": 0, "lost": 0, "speakers": 2,
             "speakers_with_audio": 2}
    return {**level, **kw}


@pytest.mark.parametrize("kw, why", [
    ({}, ""),
    ({"lost": 1, "held": 9}, "1 closed by the service while idle; 9 of 10 held"),
    ({"speakers_with_audio": 1}, "1 of 2 speakers got no audio"),
])
def test_a_level_holds_with_every_connection_held_and_every_speaker_heard(kw, why):
    assert verdict(_level(**kw)) == (not why, why)
