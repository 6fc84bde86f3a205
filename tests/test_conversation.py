"""latency_bench.conversation: the open-loop workload (Poisson arrivals, the steady-state
start), the capacity search and a level's verdict without a server; then short runs
against the tiny model on the CPU (a level, the synchronized burst, a capacity ladder)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from latency_bench.capacity import search, verdict
from latency_bench.conv_report import kv_bytes_per_conversation, kv_pages, open_counts, table
from latency_bench.loadgen import Workload
from latency_bench.openloop import ConversationLoad, Gate, lifetime_s, plan_level, poisson_times, turn_s
from latency_bench.serverproc import service, sizing_args

TINY_SERVER = [*sizing_args(8), "--ignore-end"]
SHORT = ["--max-new-tokens", "12", "--fixed-frames", "--seed", "3"]


def test_poisson_arrivals_are_seeded_and_exponential():
    rng = random.Random(7)
    expected, t = [], 0.0
    while (t := t + rng.expovariate(2.0)) < 5.0:
        expected.append(t)
    assert poisson_times(2.0, 5.0, random.Random(7)) == expected  # exactly the seeded draws
    long = poisson_times(10.0, 1000.0, random.Random(1))
    assert abs(len(long) - 10_000) < 300  # rate x duration, within 3 standard deviations
    assert all(0 < a < b < 1000.0 for a, b in zip(long, long[1:]))


def test_a_level_offers_its_number_of_conversations():
    """Little's law: with each turn taking its planned time, the planned conversations
    are open N at once on average, from the first second on (the steady-state start)."""
    w = Workload(url="ws://x", text_mode="tokens", max_new_tokens=50, fixed_frames=True)
    load = ConversationLoad(20, turns=4, user_talk_s=(2.0, 6.0), duration_s=600.0, seed=5)
    life, turn = lifetime_s(w, load), turn_s(w, load)
    assert life == pytest.approx(4 * turn + 3 * 4.0)
    plans = plan_level(load, life)
    assert plans == plan_level(load, life)  # a seed repeats the level
    assert plan_level(ConversationLoad(20, seed=6, duration_s=600.0), life) != plans
    spans = [(p.arrive_s, p.arrive_s + p.first_turn_s + p.turns * turn + sum(p.talk_s)) for p in plans]
    assert open_counts(spans, 0.0, 600.0)["mean"] == pytest.approx(20, rel=0.15)
    assert open_counts(spans, 0.0, 10.0)["mean"] == pytest.approx(20, rel=0.5)  # no ramp from zero
    assert all(p.turns == 4 and 2.0 <= min(p.talk_s) <= max(p.talk_s) <= 6.0 for p in plans if p.first_turn_s == 0)


def test_open_counts_integrate_over_the_window():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 20.0)]
    c = open_counts(spans, 0.0, 10.0)
    assert c["max"] == 2 and c["mean"] == pytest.approx((2 + 2 + 5) / 10)
    assert open_counts([(0.0, 1.0), (1.0, 2.0)], 0.0, 2.0)["max"] == 1  # one ends as the next opens


def test_the_user_answers_when_the_audio_has_played_out():
    """The next turn waits for playback, not arrival: a 0.1 s chunk at 0 and a late 0.2 s
    one at 0.5 have played out at 0.7."""
    from latency_bench.stats import underruns

    assert underruns([(0.0, 0.1), (0.5, 0.2)]).play_end == pytest.approx(0.7)
    assert underruns([(0.0, 0.3), (0.1, 0.3)]).play_end == pytest.approx(0.6)
    assert underruns([]).play_end is None


def test_capacity_ladder_stops_at_the_first_level_that_fails():
    s = search(lambda n: n <= 40, levels=[16, 32, 64, 128])
    assert s.capacity == 32 and s.failed_at == 64 and s.tried == [(16, True), (32, True), (64, False)]
    first = search(lambda n: False, levels=[16, 32])
    assert first.capacity is None and first.tried == [(16, False)]


def test_capacity_search_doubles_then_bisects():
    s = search(lambda n: n <= 100, start=8, max_level=1024, resolution=0.125)
    assert [n for n, _ in s.tried] == [8, 16, 32, 64, 128, 96, 112, 104]
    assert s.capacity == 96 and s.failed_at == 104  # within 1/8 of 96
    exact = search(lambda n: n <= 100, start=8, resolution=0.0)
    assert exact.capacity == 100 and exact.failed_at == 101
    assert search(lambda n: True, start=8, max_level=64).tried[-1] == (64, True)
    assert search(lambda n: True, start=8, max_level=64).failed_at is None


def _level(**kw):
    level = {"ttfa_s": {"p99": 0.1}, "underruns": 0, "underrun_ms": 0.0, "refusals": 0, "errors": 0, "errors_by_code": {}}
    return {**level, **kw}


def test_a_level_holds_only_within_the_bound_without_underruns_or_refusals():
    assert verdict(_level(), 0.15) == (True, "")
    assert verdict(_level(ttfa_s={"p99": 0.2}), 0.15) == (False, "TTFA p99 200 ms > 150 ms")
    assert verdict(_level(underruns=2, underrun_ms=40.0), 0.15)[1] == "2 underrun(s), 40 ms"
    assert verdict(_level(refusals=1, errors_by_code={"busy": 1}), 0.15)[1] == "1 conversation(s) refused"
    assert verdict(_level(ttfa_s={"p99": float("nan")}), 0.15) == (False, "no turn was measured")


def test_kv_pages_are_reported_when_the_service_exports_them():
    """The gauges as /metrics renders them and shares.parse_engine reads them back (the
    pool's size, the gauge engine_kv_pages, comes back as "kv_pages"): the table's KV pages are the most in
    use, not the pool, and a level's KV bytes per open conversation are the mean in use
    over the mean open."""
    from latency_bench.shares import parse_engine
    from realtime.metrics import Metrics

    assert kv_pages([{"decode_steps": 3.0}]) is None  # a KV cache of whole rows: no pages
    assert kv_bytes_per_conversation([{"decode_steps": 3.0}], 4.0) is None
    samples = [parse_engine(Metrics().render({"kv_pages_total": 64, "kv_pages_used": used, "kv_page_bytes": 2**20}))
               for used in (10, 30)]
    pages = kv_pages(samples)
    assert pages["kv_pages_used"] == {"mean": 20.0, "max": 30.0, "n": 2} and pages["kv_pages"]["max"] == 64.0
    assert kv_bytes_per_conversation(samples, 4.0) == 5 * 2**20
    assert kv_bytes_per_conversation(samples, 0.0) is None and kv_bytes_per_conversation(samples, float("nan")) is None
    level = {"conversations": 4, "open": {"mean": 4.0, "max": 5}, "ttfa_s": {"p50": 0.05, "p90": 0.07, "p99": 0.09},
             "underruns": 0, "underrun_ms": 0.0, "refusals": 0, "errors": 0, "cut": 0, "agent_talk_share": 0.5,
             "frames_per_s": 40.0, "kv_pages": pages, "kv_bytes_per_conversation": 5 * 2**20, "verdict": "held"}
    row = table([level], "t").splitlines()[2].split()
    assert row[-3:] == ["30", "5.00", "held"]
    assert table([{**level, "kv_pages": None, "kv_bytes_per_conversation": None}], "t").splitlines()[2].split()[-3:] \
        == ["-", "-", "held"]


def test_the_gate_releases_everyone_at_once_and_a_leaver_holds_nobody():
    async def go():
        gate, woke = Gate(3), []

        async def party(i):
            await gate.wait()
            woke.append(i)

        tasks = [asyncio.create_task(party(i)) for i in range(2)]
        await asyncio.sleep(0.01)
        assert woke == []  # two of three arrived
        gate.leave()  # the third failed: the two go
        await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        assert sorted(woke) == [0, 1]
        # the next round needs the two that are left
        lone = asyncio.create_task(gate.wait())
        await asyncio.sleep(0.01)
        assert not lone.done()
        await asyncio.wait_for(asyncio.gather(lone, gate.wait()), 1.0)

    asyncio.run(go())


@pytest.fixture(scope="module")
def tiny_url(tmp_path_factory):
    with service("tiny", "cpu", TINY_SERVER, tmp_path_factory.mktemp("conv") / "server.log") as (url, *_):
        yield url


def test_a_short_conversation_run_reports_every_field(tmp_path):
    from latency_bench.conversation import main

    out = tmp_path / "conv"
    assert main(["--model", "tiny", "--device", "cpu", "--conversations", "3", "--conv-turns", "2",
                 "--user-talk", "0.2,0.4", "--duration", "8", *SHORT, "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["startup_s"] > 0 and data["meta"]["seed"] == 3
    (lv,) = data["levels"]
    assert lv["errors"] == 0 and lv["refusals"] == 0 and lv["errors_by_code"] == {}
    assert lv["arrived"] >= 3 and lv["completed"] >= 1 and lv["completed"] + lv["cut"] == lv["arrived"]
    assert 0 < lv["open"]["mean"] <= lv["open"]["max"] <= lv["arrived"]
    assert lv["turns"] >= 2 and 0 < lv["ttfa_s"]["p50"] <= lv["ttfa_s"]["p90"] <= lv["ttfa_s"]["p99"] < 5
    assert 0 < lv["agent_talk_share"] < 1 and 0 < lv["agent_duty"] < 1
    assert lv["underruns"] >= 0 and lv["underrun_ms"] >= 0 and lv["frames_per_s"] > 0
    assert lv["kv_pages"]["kv_pages_used"]["max"] > 0 and lv["kv_bytes_per_conversation"] > 0
    assert lv["engine_shares"]["decode_steps"] > 0 and lv["verdict"]
    assert (out / "conversations.png").stat().st_size > 10_000


def test_sync_flush_sends_every_flush_within_a_few_ms(tiny_url, tmp_path):
    from latency_bench.conversation import main

    out = tmp_path / "burst"
    assert main(["--url", tiny_url, "--sync-flush", "--conversations", "3", "--conv-turns", "2", "--think", "0.1",
                 *SHORT, "--out", str(out)]) == 0
    (b,) = json.loads((out / "results.json").read_text())["bursts"]
    assert b["errors"] == 0 and b["turns"] == 6 and b["ttfa_s"]["n"] == 6 and b["ttfa_s"]["p50"] > 0
    assert len(b["flush_spread_s"]) == 2 and max(b["flush_spread_s"]) < 0.02  # the barrier, not the ramp


def test_find_capacity_stops_at_the_first_failing_level(tiny_url, tmp_path):
    from latency_bench.conversation import main

    out = tmp_path / "capacity"
    assert main(["--url", tiny_url, "--find-capacity", "--levels", "2,3", "--ttfa-p99-bound-ms", "0.001",
                 "--conv-turns", "2", "--user-talk", "0.2,0.4", "--duration", "3", *SHORT, "--no-plot",
                 "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["capacity"]["conversations"] is None and data["capacity"]["failed_at"] == 2
    assert data["capacity"]["tried"] == [[2, False]] and len(data["levels"]) == 1
    assert data["levels"][0]["verdict"].startswith("failed: TTFA p99")
