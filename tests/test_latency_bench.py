"""latency_bench: statistics on synthetic timelines, the regression gate, and a real
(small) sweep against the service on the CPU."""

from __future__ import annotations

import copy
import json
import math

import pytest

from latency_bench.gate import compare
from latency_bench.report import aggregate
from latency_bench.loadgen import ConnectionResult
from latency_bench.stats import TurnRecord, percentile, summary, underruns

HOP_S = 2048 / 44100


def test_percentiles():
    xs = [5, 1, 4, 2, 3]
    assert percentile(xs, 0) == 1 and percentile(xs, 50) == 3 and percentile(xs, 100) == 5
    assert percentile(xs, 25) == 2 and percentile([1, 2], 50) == 1.5
    assert math.isnan(percentile([], 50)) and percentile([7], 99) == 7
    s = summary([0.1, 0.2, 0.3, 0.4])
    assert s["n"] == 4 and s["max"] == 0.4 and abs(s["mean"] - 0.25) < 1e-12


def test_no_underrun_when_chunks_arrive_before_they_are_needed():
    # 100 ms chunks arriving every 50 ms: always ahead
    chunks = [(0.05 * i, 0.1) for i in range(10)]
    assert underruns(chunks).count == 0


def test_underruns_count_each_stall_and_its_length():
    # play 0.1 s from t=0; next chunk at 0.3 (stalled 0.2 s); then in time; then late by 0.05
    chunks = [(0.0, 0.1), (0.3, 0.1), (0.35, 0.1), (0.55, 0.1)]
    u = underruns(chunks)
    assert u.count == 2 and abs(u.total_s - 0.25) < 1e-9
    # the first ran dry after 0.1 s of audio (the turn's start), the second after 0.3 s
    assert [round(a, 9) for a in u.at_audio_s] == [0.1, 0.3]


def test_playback_resumes_from_the_late_chunk():
    # after a stall, the schedule restarts at the late arrival: the next chunk on time is no underrun
    u = underruns([(0.0, 0.1), (0.5, 0.2), (0.65, 0.1)])
    assert u.count == 1 and abs(u.total_s - 0.4) < 1e-9


def test_turn_record_ttfa_gaps_and_decode_rate():
    t = TurnRecord(flush_at=1.0, chunks=[(1.05, HOP_S), (1.10, 2 * HOP_S), (1.15, 2 * HOP_S)])
    assert abs(t.ttfa - 0.05) < 1e-12 and [round(g, 3) for g in t.gaps()] == [0.05, 0.05]
    assert abs(t.decode_rate(HOP_S) - 4 / 0.10) < 1e-9  # 4 frames after the first chunk in 0.1 s
    assert TurnRecord(flush_at=0.0).ttfa is None


def test_aggregate_of_a_synthetic_level():
    results = []
    for i in range(4):
        turns = [TurnRecord(flush_at=0.0, chunks=[(0.05 + 0.01 * i, HOP_S), (0.08, HOP_S), (1.0, HOP_S)])]
        results.append(ConnectionResult(i, open_to_ready=0.1 * (i + 1), turns=turns, voice_cached=i > 0))
    level = aggregate(4, results, wall_s=1.0, hop_s=HOP_S)
    assert level["turns"] == 4 and level["errors"] == 0
    assert abs(level["ttfa_s"]["p50"] - 0.065) < 1e-9
    assert level["underruns"] == 4  # every turn stalls before its third chunk
    assert level["open_to_ready_uncached_s"]["n"] == 1 and level["open_to_ready_cached_s"]["n"] == 3
    assert abs(level["audio_s"] - 12 * HOP_S) < 1e-9


def _results(fps, ttfa):
    return {"runs": {"engine": [
        {"concurrency": c, "stream_frames_per_s": {"p50": f}, "ttfa_s": {"p50": t}}
        for c, f, t in zip((1, 16, 64), fps, ttfa)
    ]}}


def test_gate_passes_within_tolerance_and_fails_beyond():
    ref = _results([70.0, 45.0, 20.0], [0.08, 0.28, 0.34])
    assert compare(ref, _results([67.0, 43.0, 19.5], [0.087, 0.30, 0.37])) == []
    bad = compare(ref, _results([60.0, 45.0, 20.0], [0.08, 0.40, 0.34]))
    assert len(bad) == 2 and "c=1: per-stream frames/s" in bad[0] and "c=16: TTFA p50" in bad[1]
    assert compare(ref, {"runs": {"engine": []}}) == ["no concurrency level in common with the reference"]


def test_frozen_reference_is_well_formed():
    from pathlib import Path

    folder = Path(__file__).parent.parent / "latency_bench" / "reference" / "h200-s2pro"
    load = json.loads((folder / "load.json").read_text())
    assert {1, 16, 64} <= {lv["concurrency"] for lv in load["runs"]["engine"]}  # the levels
    assert compare(load, copy.deepcopy(load)) == []  # the reference passes its own gate
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["gpu"].startswith("NVIDIA H200") and meta["commit"]


@pytest.mark.slow
def test_cpu_sweep_writes_table_json_and_plot(tmp_path):
    from latency_bench.__main__ import main

    out = tmp_path / "bench"
    assert main(["--model", "tiny", "--device", "cpu", "--concurrency", "1,2", "--turns", "2",
                 "--max-new-tokens", "12", "--fixed-frames", "--think", "0.05", "--ramp", "0.1",
                 "--baseline", "naive", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert set(data["runs"]) == {"engine", "naive"} and len(data["ratios_vs_naive"]) == 2
    for lv in data["runs"]["engine"]:
        assert lv["errors"] == 0 and lv["turns"] == 2 * lv["concurrency"]
        assert lv["ttfa_s"]["p50"] > 0 and lv["frames_per_s"] > 0
    assert (out / "ttfa_throughput.png").stat().st_size > 10_000


def test_gpu_side_benchmarks_need_no_service_packages():
    """The GPU machine's image lacks websockets, starlette, uvicorn, msgpack and PyAV unless
    their wheels travel: the engine, kernel and profiling benchmarks must run without them
    (an engine bench call there failed on `import websockets` once)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('websockets', 'starlette', 'uvicorn', 'msgpack', 'av'): sys.modules[m] = None\n"
            "import latency_bench.engine_bench, latency_bench.kernel_bench, latency_bench.kernel_sweep\n"
            "import latency_bench.profile_step, latency_bench.profile_codec\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
