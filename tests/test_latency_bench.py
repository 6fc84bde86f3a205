"""latency_bench: statistics on synthetic timelines, the regression gate, and a real
(small) sweep against the service on the CPU."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from latency_bench.gate import compare
from latency_bench.report import aggregate
from latency_bench.stats import ConnectionResult, TurnRecord, percentile, summary, underruns

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


def test_gate_takes_the_median_of_a_repeated_level():
    ref = _results([70.0, 45.0, 20.0], [0.08, 0.28, 0.34])
    slow_first = _results([70.0, 45.0, 15.0], [0.08, 0.28, 0.50])  # c=64 fails alone
    again = _results([70.0, 45.0, 20.0], [0.08, 0.28, 0.34])["runs"]["engine"][2]
    assert len(compare(ref, slow_first)) == 2
    twice = copy.deepcopy(slow_first)
    twice["runs"]["engine"].append(again)  # 64 twice: medians 17.5 frames/s, 0.42 s
    failures = compare(ref, twice)
    assert [line.split(":")[0] for line in failures] == ["c=64", "c=64"]
    assert all(line.endswith("(median of 2 runs)") for line in failures)
    three = copy.deepcopy(twice)
    three["runs"]["engine"].append(copy.deepcopy(again))  # medians 20.0, 0.34: passes
    assert compare(ref, three) == []
    # the order of the repeats does not decide it
    three["runs"]["engine"].reverse()
    assert compare(ref, three) == []


def test_side_by_side_gives_current_over_base_per_level():
    """latency_bench.ab: the acceptance run's table, a repeated level by its median."""
    from latency_bench.ab import side_by_side

    def run(levels):
        return {"runs": {"engine": [{"concurrency": c, "frames_per_s": f, "ttfa_s": {"p50": p50, "p99": p99}}
                                    for c, f, p50, p99 in levels]}}

    base = run([(1, 100.0, 0.020, 0.030), (64, 4000.0, 0.060, 0.100)])
    current = run([(1, 110.0, 0.020, 0.030), (64, 3000.0, 0.090, 0.400), (64, 4400.0, 0.066, 0.110),
                   (64, 5000.0, 0.050, 0.090)])
    rows = {tuple(line.split()[:3]): line.split()[-1] for line in side_by_side(base, current).splitlines()[1:-1]}
    assert rows[("1", "frames/s", "100.0")] == "1.10x"
    assert rows[("64", "frames/s", "4000.0")] == "1.10x"  # the median of three runs: 4,400
    assert rows[("64", "TTFA", "p50")] == "1.10x" and rows[("64", "TTFA", "p99")] == "1.10x"


@pytest.mark.parametrize("card", ["cpu-tiny", "h100-s2pro", "h200-s2pro"])
def test_frozen_reference_is_well_formed(card):
    """Each card's frozen load references pass their own gate, and meta.json says which
    card, day, commit and command made every one of them."""
    from pathlib import Path

    folder = Path(__file__).parent.parent / "latency_bench" / "reference" / card
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["card"] and meta["date"].startswith("2026-") and meta["commit"]
    files = sorted(p.name for p in folder.glob("load*.json"))
    assert files and sorted(meta["command"]) == files
    for name in files:
        load = json.loads((folder / name).read_text())
        if card != "cpu-tiny":
            assert {1, 16, 64} <= {lv["concurrency"] for lv in load["runs"]["engine"]}  # the levels
        assert compare(load, copy.deepcopy(load)) == []  # a reference passes its own gate


@pytest.mark.slow
def test_cpu_sweep_writes_table_json_and_plot(tmp_path):
    from latency_bench.__main__ import main

    out = tmp_path / "bench"
    assert main(["--model", "tiny", "--device", "cpu", "--concurrency", "1,2", "--turns", "2",
                 "--max-new-tokens", "12", "--fixed-frames", "--think", "0.05", "--ramp", "0.1",
                 "--baseline", "naive", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert set(data["runs"]) == {"engine", "naive"} and len(data["ratios_vs_naive"]) == 2
    # each server's start-up (launch to first healthy answer) is recorded beside its runs
    assert 0 < data["meta"]["engine_startup_s"] < 900 and 0 < data["meta"]["naive_startup_s"] < 900
    for lv in data["runs"]["engine"]:
        assert lv["errors"] == 0 and lv["turns"] == 2 * lv["concurrency"]
        assert lv["ttfa_s"]["p50"] > 0 and lv["frames_per_s"] > 0
        assert 0 <= lv["client_loop_lag_s"]["p99"] <= lv["client_loop_lag_s"]["max"]  # the client's own lag
        # where the time went: every frame after a turn's first two (the prefill thread's)
        # came from a decode step, and the decode thread's phases account for the level's
        # wall time
        s = lv["engine_shares"]
        assert s["decode_steps"] * s["mean_batch"] == pytest.approx(lv["turns"] * 10)
        assert 1 <= s["mean_batch"] <= lv["concurrency"] and s["codec_frames_per_call"] >= 1
        assert 0 < s["decode_busy"] <= 1 and 0 < s["prefill_busy"] <= 1 and 0 < s["codec_busy"] <= 1
        assert s["decode_gpu_ms_per_step"] == 0 and s["codec_gpu_share"] == 0  # no GPU here
        phases_ms = sum(s["decode_ms_per_step"].values())
        assert 0.8 * s["step_interval_ms"] < phases_ms < 1.05 * s["step_interval_ms"]
    assert (out / "ttfa_throughput.png").stat().st_size > 10_000


def test_gpu_side_benchmarks_need_no_service_packages():
    """The GPU machine's image lacks websockets, starlette, uvicorn, msgpack and PyAV unless
    their wheels travel: the engine, kernel and profiling benchmarks, the gate and the
    report must run without them (an engine bench call there failed on `import
    websockets` once)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('websockets', 'starlette', 'uvicorn', 'msgpack', 'av'): sys.modules[m] = None\n"
            "import latency_bench.engine_bench, latency_bench.kernel_bench, latency_bench.attention_bench\n"
            "import latency_bench.profile_step, latency_bench.profile_codec, latency_bench.launch_count\n"
            "import latency_bench.gate, latency_bench.report\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_kernel_table_smoke_writes_the_gemms_and_the_mlp_block(tmp_path):
    """latency_bench.kernel_bench --smoke (interpreter): each FP8 GEMM row and the MLP
    block are timed against cuBLAS's baselines and written (the GPU's `kernels` part)."""
    from latency_bench.kernel_bench import main

    assert main(["--smoke", "--m", "1", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "kernel_bench.json").read_text())
    assert table["rows"] and all(r["us"]["fp8"] > 0 for r in table["rows"])
    assert table["mlp"]["us"]["fp8"] > 0 and table["mlp"]["us"]["bf16"] > 0


def test_engine_shares_from_two_scrapes_of_metrics():
    """The engine's counters as /metrics renders them, parsed back and turned into a
    level's per-step times and thread shares."""
    from latency_bench.shares import level_shares, metrics_url, parse_engine, shares_line
    from realtime.metrics import Metrics

    def page(steps, rows, gpu, wait, idle, codec_idle, frames, calls):
        stats = {"decode_steps": steps, "decode_rows": rows, "decode_gpu_seconds": gpu, "decode_wait_seconds": wait,
                 "decode_idle_seconds": idle, "prefill_idle_seconds": idle, "codec_idle_seconds": codec_idle,
                 "codec_gpu_seconds": gpu / 4, "codec_frames": frames, "codec_calls": calls, "frames": frames,
                 "codec_padded_frames": frames // 4, "streams_decoding": 3}
        return Metrics().render(stats)

    before = parse_engine(page(100, 400, 1.0, 0.5, 2.0, 1.0, 500, 50))
    after = parse_engine(page(300, 1200, 2.6, 1.5, 2.2, 1.5, 1300, 150))
    assert before["decode_steps"] == 100 and before["streams_decoding"] == 3
    s = level_shares(before, after, wall_s=2.0)
    assert s["decode_steps"] == 200 and s["mean_batch"] == 4
    assert s["step_interval_ms"] == pytest.approx(10) and s["decode_gpu_ms_per_step"] == pytest.approx(8)
    assert s["decode_ms_per_step"]["wait"] == pytest.approx(5) and s["decode_busy"] == pytest.approx(0.9)
    assert s["codec_busy"] == pytest.approx(0.75) and s["codec_gpu_share"] == pytest.approx(0.2)
    assert s["codec_frames_per_call"] == 8 and s["codec_gpu_ms_per_frame"] == pytest.approx(0.5)
    assert s["codec_padding"] == pytest.approx(200 / 1000)  # 200 padded frames beside 800 decoded
    assert "step 10.00 ms (GPU 8.00" in shares_line(s) and "20% padding" in shares_line(s)
    assert level_shares(before, before, 2.0) is None  # nothing decoded
    assert level_shares({"decode_steps": 1}, {"decode_steps": 5}, 2.0) is None  # a build without the counters
    assert metrics_url("ws://127.0.0.1:8765/v1/tts/live") == "http://127.0.0.1:8765/metrics"
    assert metrics_url("wss://tts.example/v1/tts/live") == "https://tts.example/metrics"


def test_codec_flops_a_frame_do_not_depend_on_the_call_shape():
    """profile_codec --flops: the streaming decoder's arithmetic per frame is the same for
    one frame a row as for four (no work redone on the conv histories), and the convs
    carry it; counted on the CPU."""
    from engine.codec.config import codec_preset
    from engine.codec.model import Codec
    from latency_bench.profile_codec import flops_per_frame

    torch.manual_seed(0)
    codec = Codec(codec_preset("tiny")).eval()
    four, one = flops_per_frame(codec, batch=2, frames=4), flops_per_frame(codec, batch=3, frames=1)
    assert four["total"] > 0 and abs(four["total"] - one["total"]) <= 1e-6 * four["total"]
    assert four["by_op"]["convolution"] == max(four["by_op"].values())
    assert abs(sum(four["by_op"].values()) - four["total"]) <= 1e-6 * four["total"]


def test_engine_bench_shared_prefix_gives_every_stream_one_voice_prompt():
    """engine_bench --shared-prefix N: each decode stream's first N positions are one
    voice's prompt; its rows point at the voice's full pages and hold their own copy of
    the partly filled last one (as the engine does), or (the baseline) each row holds a
    copy of every page."""
    from engine.bundle import load_bundle
    from engine.runner import Runner
    from latency_bench.engine_bench import prepare_batch

    def voice_kv(runner, row):  # the row's first 40 positions' keys, read through its page table
        kv = runner.state.kv
        pages = kv.page_table[row, :3].long()
        return kv.k[:, pages].flatten(1, 2)[:, :40]

    bundle = load_bundle("tiny", "cpu", torch.float32)
    shared = Runner(bundle, 4, 256)
    table = shared.state.kv.page_table
    prepare_batch(shared, 3, 100, shared_prefix=40)  # pages of 16: two full, the third holds 8 positions
    assert voice_kv(shared, 0).abs().sum() > 0
    for row in (1, 2):
        assert table[row, :2].tolist() == table[0, :2].tolist() and table[row, 2] != table[0, 2]
        assert torch.equal(voice_kv(shared, row), voice_kv(shared, 0))
    own = Runner(bundle, 4, 256)
    prepare_batch(own, 3, 100, shared_prefix=40, share=False)
    rows = own.state.kv.page_table[:3, :3].tolist()
    assert len({p for row in rows for p in row}) == 9  # nobody shares a page
    assert all(torch.equal(voice_kv(own, row), voice_kv(own, 0)) for row in (1, 2))


def test_results_name_the_commit_and_say_when_the_tree_differs_from_it(tmp_path):
    """A result's meta.commit is HEAD's hash, marked "+changes" when tracked files were
    edited (the GPU machine measures a copy of the working tree, not always HEAD)."""
    import subprocess

    from latency_bench.__main__ import git_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git_commit(str(tmp_path))
    assert len(head) >= 7 and "+" not in head
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(str(tmp_path)) == head + "+changes"
