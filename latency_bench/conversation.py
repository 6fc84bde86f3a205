"""`python -m latency_bench.conversation`: open-loop conversations, and the capacity search.

    # what one GPU carries: conversations arrive (Poisson), 4 turns each, the user talks
    # 2-6 s between turns; raise the level until TTFA p99 > 150 ms or any underrun
    python -m latency_bench.conversation --model s2-pro --find-capacity --levels 16,32,64,128,256 --out out/conv

    # one offered level against a running service
    python -m latency_bench.conversation --url ws://host:8765/v1/tts/live --conversations 100

    # the burst: 64 connections flush every turn at once (an asyncio barrier)
    python -m latency_bench.conversation --model s2-pro --sync-flush --conversations 64

Writes <out>/results.json, <out>/conversations.png (unless --no-plot) and prints a table.
The closed loop (`python -m latency_bench`) is unchanged; see latency_bench/openloop.py for
the workload and latency_bench/capacity.py for when a level holds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

from latency_bench.__main__ import capacity_line, run_meta, synthetic_reference
from latency_bench.capacity import Search, search, verdict
from latency_bench.conv_report import aggregate_burst, aggregate_level, burst_table, plot, table
from latency_bench.jsonfile import write_json
from latency_bench.loadgen import Workload, add_target_args, add_turn_args
from latency_bench.openloop import ConversationLoad, lifetime_s, offered_rate, plan_level, run_burst, run_level
from latency_bench.serverproc import service, sizing_args
from latency_bench.shares import shares_line


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _talk(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latency_bench.conversation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    add_turn_args(p, text_mode="tokens")
    p.add_argument("--conversations", default="16", help="offered concurrent conversations, comma-separated levels "
                   "(with --sync-flush: connections)")
    p.add_argument("--conv-turns", type=int, default=4, help="turns per conversation")
    p.add_argument("--user-talk", type=_talk, default=(2.0, 6.0), help="seconds the user talks between turns: lo,hi (uniform)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per level; conversations open then are cut")
    p.add_argument("--seed", type=int, default=0, help="arrivals, turn counts and talk times (a run repeats)")
    p.add_argument("--turn-audio", type=float, help="seconds of audio a turn has, for the arrival rate "
                   "(default: max-new-tokens frames with --fixed-frames, else the text at 15 characters/s)")
    p.add_argument("--find-capacity", action="store_true", help="raise the level until one fails; report the last that held")
    p.add_argument("--levels", help="the ladder --find-capacity walks (default: double from --start-level, then bisect)")
    p.add_argument("--start-level", type=int, default=8)
    p.add_argument("--max-level", type=int, default=512)
    p.add_argument("--resolution", type=float, default=0.125, help="bisect until the gap is this share of the level")
    p.add_argument("--ttfa-p99-bound-ms", type=float, default=150.0, help="a level holds with TTFA p99 at most this")
    p.add_argument("--sync-flush", action="store_true", help="the burst: every connection flushes each turn at once")
    p.add_argument("--think", type=float, default=1.0, help="--sync-flush: seconds between a turn's audio and the next")
    p.add_argument("--max-running", type=int, help="the decode batch cap of a started service (default: the "
                   "service's); its --max-connections and --max-queued follow the top level plus 4 standard "
                   "deviations of its Poisson count (each open conversation holds a stream)")
    p.add_argument("--out", default="out/conversation")
    p.add_argument("--title", default="")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    if a.find_capacity and a.sync_flush:
        p.error("--find-capacity and --sync-flush are separate runs")
    return a


def connections_for(level: int) -> int:
    """Open connections to allow for `level` offered conversations: the number open is
    Poisson(level) in steady state, so mean + 4 standard deviations (and 2 spare) rarely
    refuses one."""
    return level + math.ceil(4 * math.sqrt(level)) + 2


class Bench:
    """One run's levels against one service URL."""

    def __init__(self, a: argparse.Namespace, url: str) -> None:
        self.a = a
        reference = synthetic_reference(a.synthetic_reference) if a.synthetic_reference else None
        self.w = Workload(url=url, text_mode=a.text_mode, tokens_per_s=a.tokens_per_s, max_new_tokens=a.max_new_tokens,
                          fixed_frames=a.fixed_frames, format=a.format, reference_id=a.voice, reference=reference,
                          api_key=a.api_key)
        self.levels: list[dict] = []
        self.bound_s = a.ttfa_p99_bound_ms / 1000

    def load(self, level: float) -> ConversationLoad:
        a = self.a
        return ConversationLoad(level, a.conv_turns, a.user_talk, a.duration, a.seed, a.turn_audio)

    def level(self, conversations: float) -> dict:
        if self.levels:
            time.sleep(1.0)  # the last level's cut conversations free their streams first
        load = self.load(conversations)
        life = lifetime_s(self.w, load)
        plans = plan_level(load, life)
        log(f"[conversations] {conversations:g} offered: {len(plans)} conversations, {offered_rate(load, life):.2f}/s "
            f"arriving, {life:.1f} s each (estimated), {load.duration_s:g} s")
        run = asyncio.run(run_level(plans, self.w, load.duration_s, log=log))
        lv = aggregate_level(conversations, run, self.w.hop_length / self.w.codec_rate)
        lv["lifetime_estimate_s"], lv["arrival_rate_per_s"] = life, offered_rate(load, life)
        held, why = verdict(lv, self.bound_s)
        lv["held"], lv["verdict"] = held, "held" if held else f"failed: {why}"
        if lv.get("engine_shares"):
            log(f"[conversations] {conversations:g}: {shares_line(lv['engine_shares'])}")
        log(f"[conversations] {conversations:g}: {lv['verdict']}")
        self.levels.append(lv)
        return lv

    def capacity(self) -> Search:
        a = self.a
        ladder = _ints(a.levels) if a.levels else None
        return search(lambda n: self.level(n)["held"], ladder, a.start_level, a.max_level, a.resolution)

    def bursts(self) -> list[dict]:
        out = []
        for n in _ints(self.a.conversations):
            log(f"[burst] {n} connections, {self.a.conv_turns} synchronized turns")
            results = asyncio.run(run_burst(n, self.w, self.a.conv_turns, self.a.think))
            out.append(aggregate_burst(n, results))
        return out


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def top_level(a: argparse.Namespace) -> int:
    if a.find_capacity:
        return max(_ints(a.levels)) if a.levels else a.max_level
    return max(_ints(a.conversations))


def measure(a: argparse.Namespace, url: str) -> dict:
    bench = Bench(a, url)
    if a.sync_flush:
        return {"bursts": bench.bursts()}
    if a.find_capacity:
        s = bench.capacity()
        return {"levels": bench.levels, "capacity": {
            "conversations": s.capacity, "failed_at": s.failed_at, "tried": s.tried,
            "ttfa_p99_bound_s": bench.bound_s, "rule": "TTFA p99 <= bound, no underrun, no refusal, no error"}}
    for n in _ints(a.conversations):
        bench.level(n)
    return {"levels": bench.levels}


def main(argv=None) -> int:
    a = parse_args(argv)
    out = Path(a.out)
    meta = {
        **run_meta("python -m latency_bench.conversation", argv),
        "turns": a.conv_turns, "user_talk_s": list(a.user_talk), "duration_s": a.duration, "seed": a.seed,
        "tokens_per_s": a.tokens_per_s, "text_mode": a.text_mode,
    }
    if a.url:
        data = measure(a, a.url)
    else:
        server_args = [*sizing_args(connections_for(top_level(a)), a.max_running),
                       *(["--ignore-end"] if a.fixed_frames else []), *a.server_arg]
        with service(a.model, a.device, server_args, out / "server.log") as (ws_url, _, health, startup_s, _):
            meta["health"], meta["startup_s"] = health, round(startup_s, 2)
            log(f"server started in {startup_s:.1f} s ({capacity_line(health)})")
            data = measure(a, ws_url)
    data = {"meta": meta, **data}
    write_json(out / "results.json", data)
    report(a, data, out)
    return 0


def report(a: argparse.Namespace, data: dict, out: Path) -> None:
    health = data["meta"].get("health", {})
    title = a.title or f"{health.get('model', a.url)} on {health.get('device', '?')}"
    if "bursts" in data:
        print(burst_table(data["bursts"], f"\n== synchronized flushes: {title} =="))
    else:
        print(table(data["levels"], f"\n== open-loop conversations: {title} =="))
        if not a.no_plot:
            plot(out / "conversations.png", data["levels"], title, a.ttfa_p99_bound_ms / 1000)
    cap = data.get("capacity")
    if cap:
        held = cap["conversations"]
        failed = cap["failed_at"]
        print(f"capacity: {held if held is not None else 'none'} concurrent conversations held "
              f"(TTFA p99 <= {a.ttfa_p99_bound_ms:g} ms, no underrun); "
              + (f"first failing level: {failed}" if failed is not None else "no level failed: a lower bound"))
    print(f"\nwrote {out / 'results.json'}")


if __name__ == "__main__":
    sys.exit(main())
