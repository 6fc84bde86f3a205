"""latency_bench.soak: three minutes of mixed traffic (turns spoken, cancelled and abandoned
mid-turn, stored voices made and deleted, one-shot HTTP) against the tiny model on the
CPU, and the verdict that would catch a leak."""

from __future__ import annotations

import argparse
import json

import pytest

from latency_bench.soak import Soak, Tally, evaluate, main

QUICK = ["--fixed-frames", "--max-new-tokens", "8", "--voice-seconds", "2", "--sample-every", "3"]


@pytest.mark.slow
def test_three_minutes_of_mixed_traffic_leave_no_leak(tmp_path):
    out = tmp_path / "soak"
    code = main(["--model", "tiny", "--device", "cpu", "--duration", "180", "--clients", "4", *QUICK, "--out", str(out)])
    r = json.loads((out / "results.json").read_text())
    assert code == 0 and r["passed"], {k: c for k, c in r["checks"].items() if c["passed"] is not True}
    measured = {k for k, c in r["checks"].items() if c["passed"] is not None}
    assert measured == set(r["checks"]) - {"device_growth"}  # a CPU has no device memory
    turns = r["turns"]
    assert turns["turn_end"] > 100 and turns["cancelled"] > 10 and turns["disconnected"] > 10, turns
    assert r["voices"]["created"] == r["voices"]["deleted"] > 5 and r["http_ok"] > 20
    assert r["errors_by_code"] == {} and r["server_errors_by_code"] == {}, r["errors_by_code"]
    assert len(r["samples"]) > 40 and all(s.get("status") == "ok" for s in r["samples"])


def _soak(rss: list[float], rest_warm: dict | None = None, rest_end: dict | None = None, **tally) -> dict:
    """The verdict on a made-up run of 100 s (warm-up 20 s, main 80 s), one RSS sample a second."""
    a = argparse.Namespace(duration=100.0)
    s = Soak(a, None, "http://x", 1, tally=Tally(**tally))
    s.samples = [{"phase": "main", "phase_t": float(t), "rss_bytes": v} for t, v in enumerate(rss)]
    rest = {"fds": 20, "threads": 10, "streams": 0, "sessions_active": 0, "rss_bytes": 1, "kv_pages_used": 0}
    return evaluate(s, {**rest, **(rest_warm or {})}, {**rest, **(rest_end or {})}, {})


def test_the_verdict_catches_growth_leaked_fds_and_unaccounted_turns():
    from collections import Counter

    flat = [1000.0] * 80
    ok = _soak(flat, turns=Counter(turn_end=5))
    assert ok["passed"] and ok["rss"]["growth"] == 0.0
    # the first 20 s after warm-up against the last 20 s: 1000 -> 1100 is +10%
    leak = _soak([1000.0] * 20 + [1050.0] * 40 + [1100.0] * 20, turns=Counter(turn_end=5))
    assert not leak["passed"] and leak["checks"]["rss_growth"]["passed"] is False
    assert abs(leak["rss"]["growth"] - 0.10) < 1e-9
    fds = _soak(flat, rest_end={"fds": 25}, turns=Counter(turn_end=5))
    assert fds["checks"]["fds_at_rest"] == {"passed": False, "seen": "20 -> 25 (+4 allowed)"}
    lost = _soak(flat, turns=Counter(turn_end=5, unaccounted=1))
    assert not lost["passed"] and lost["checks"]["unaccounted_turns"]["passed"] is False
    internal = _soak(flat, turns=Counter(turn_end=5), errors=Counter(internal=1))
    assert internal["checks"]["internal_errors"]["passed"] is False
    assert _soak(flat)["checks"]["turns_spoken"]["passed"] is False  # no traffic at all is no pass
