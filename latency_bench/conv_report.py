"""Aggregating an open-loop conversation level (latency_bench/openloop.py), and its table
and PNG. The statistics are stats.py's: TTFA from the flush, underruns of a real-time
player."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from latency_bench.openloop import LevelRun, flush_spreads
from latency_bench.report import ms
from latency_bench.shares import level_shares
from latency_bench.stats import ConnectionResult, summary, underruns


def open_counts(spans: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    """Mean (time-weighted over [start, end]) and max of how many spans were open at once."""
    events = sorted([(max(a, start), 1) for a, b in spans if b > start and a < end] +
                    [(min(b, end), -1) for a, b in spans if b > start and a < end], key=lambda e: (e[0], e[1]))
    open_, area, peak, last = 0, 0.0, 0, start
    for t, step in events:
        area += open_ * (t - last)
        open_, last = open_ + step, t
        peak = max(peak, open_)
    return {"mean": area / (end - start) if end > start else math.nan, "max": peak}


def aggregate_level(offered: float, run: LevelRun, hop_s: float) -> dict:
    rs = run.results
    opened = [r for r in rs if r.opened_at is not None]
    turns = [t for r in rs for t in r.turns]
    # a turn cut before its first audio counts with the time it had waited (a lower bound):
    # an overloaded level cannot hide its slowest turns by running out of time
    waits = [r.closed_at - r.pending.flush_at for r in rs if r.pending is not None and not r.pending.chunks]
    started = [r.pending for r in rs if r.pending is not None and r.pending.chunks]
    heard = turns + started
    ttfa = [t.ttfa for t in heard] + waits
    under = [underruns(t.chunks) for t in heard if not t.cancelled]
    agent_s = sum(t.audio_seconds for t in heard)
    user_s = sum(r.user_talk_s for r in rs)
    open_s = sum(min(r.closed_at, run.end) - r.opened_at for r in opened)
    window = run.end - run.start
    codes = Counter(c for r in rs for c in r.codes)
    level = {
        "conversations": offered,
        "arrived": len(opened),
        "completed": sum(not r.cut and not r.codes for r in opened),
        "cut": sum(r.cut for r in rs),
        "refusals": sum(r.refused for r in rs),
        "errors": sum(bool(r.codes) and not r.refused for r in rs),
        "errors_by_code": dict(codes),
        "error_samples": [e for r in rs for e in r.errors][:5],
        "open": open_counts([(r.opened_at, r.closed_at) for r in opened], run.start, run.end),
        "turns": len(turns),
        "ttfa_s": summary(ttfa),
        "ttfa_cut_waits": len(waits),
        "open_to_ready_s": summary([r.open_to_ready for r in rs if r.open_to_ready is not None]),
        "underruns": sum(u.count for u in under),
        "underrun_ms": 1000 * sum(u.total_s for u in under),
        "agent_talk_share": agent_s / (agent_s + user_s) if agent_s + user_s > 0 else math.nan,
        "agent_duty": agent_s / open_s if open_s > 0 else math.nan,  # share of open time the agent speaks
        "frames_per_s": agent_s / hop_s / window if window > 0 else math.nan,
        "audio_s_per_s": agent_s / window if window > 0 else math.nan,
        "audio_s": agent_s,
        "wall_s": window,
        "client_loop_lag_s": run.loop_lag_s,
        "kv_pages": kv_pages(run.samples),
    }
    level["kv_bytes_per_conversation"] = kv_bytes_per_conversation(run.samples, level["open"]["mean"])
    if run.before and run.after:
        level["engine_shares"] = level_shares(run.before, run.after, window)
    return level


def kv_pages(samples: list[dict[str, float]]) -> dict | None:
    """Mean and max of each KV-page gauge the service exports (engine_kv_pages_*); None
    while it exports none (a KV cache of whole rows has no pages)."""
    # /metrics renders the engine's stat kv_pages_total as the gauge engine_kv_pages,
    # which shares.parse_engine reads back as "kv_pages"
    keys = sorted({k for s in samples for k in s if k.startswith("kv_pages")})
    if not keys:
        return None
    out = {}
    for k in keys:
        xs = [s[k] for s in samples if k in s]
        out[k] = {"mean": sum(xs) / len(xs), "max": max(xs), "n": len(xs)}
    return out


def kv_bytes_per_conversation(samples: list[dict[str, float]], open_mean: float) -> float | None:
    """KV bytes in use per open conversation over the level: mean(kv_pages_used) x
    kv_page_bytes / mean open conversations; None when the service exports no pages."""
    used = [s["kv_pages_used"] for s in samples if "kv_pages_used" in s]
    page_bytes = next((s["kv_page_bytes"] for s in samples if "kv_page_bytes" in s), None)
    if not used or page_bytes is None or not open_mean > 0:
        return None
    return sum(used) / len(used) * page_bytes / open_mean


def aggregate_burst(n: int, results: list[ConnectionResult]) -> dict:
    turns = [t for r in results for t in r.turns]
    under = [underruns(t.chunks) for t in turns]
    spreads = flush_spreads(results)
    return {
        "connections": n,
        "turns": len(turns),
        "errors": sum(len(r.errors) for r in results),
        "error_samples": [e for r in results for e in r.errors][:5],
        "ttfa_s": summary([t.ttfa for t in turns if t.ttfa is not None]),
        "open_to_ready_s": summary([r.open_to_ready for r in results if r.open_to_ready is not None]),
        "flush_spread_s": spreads,  # per synchronized turn: last flush sent minus first
        "underruns": sum(u.count for u in under),
        "underrun_ms": 1000 * sum(u.total_s for u in under),
    }


def table(levels: list[dict], title: str) -> str:
    head = (f"{'conv':>6} {'open mean':>9} {'max':>4} {'TTFA p50':>9} {'p90':>6} {'p99':>6} {'underruns':>9} "
            f"{'ms':>6} {'refused':>7} {'errors':>6} {'cut':>4} {'talk share':>10} {'frames/s':>9} {'KV pages':>9} "
            f"{'MiB/conv':>8}  held")
    lines = [title, head]
    for lv in levels:
        t, used = lv["ttfa_s"], (lv["kv_pages"] or {}).get("kv_pages_used")
        pages = "-" if not used else f"{used['max']:.0f}"
        per_conv = lv.get("kv_bytes_per_conversation")
        mib = "-" if per_conv is None else f"{per_conv / 2**20:.2f}"
        lines.append(
            f"{lv['conversations']:>6g} {lv['open']['mean']:>9.1f} {lv['open']['max']:>4} {ms(t['p50']):>9} "
            f"{ms(t['p90']):>6} {ms(t['p99']):>6} {lv['underruns']:>9} {lv['underrun_ms']:>6.0f} "
            f"{lv['refusals']:>7} {lv['errors']:>6} {lv['cut']:>4} {lv['agent_talk_share']:>10.2f} "
            f"{lv['frames_per_s']:>9.1f} {pages:>9} {mib:>8}  {lv.get('verdict', '')}")
    lines.append("(conv: offered concurrent conversations; open: measured; TTFA in ms from the flush; talk share: "
                 "the agent's share of talk time; KV pages: most in use; MiB/conv: KV in use per open conversation)")
    return "\n".join(lines)


def burst_table(bursts: list[dict], title: str) -> str:
    lines = [title, f"{'conn':>5} {'TTFA p50':>9} {'p99':>6} {'max':>6} {'flush spread ms':>16} {'underruns':>9} {'errors':>6}"]
    for b in bursts:
        t = b["ttfa_s"]
        spread = f"{1000 * max(b['flush_spread_s']):.1f}" if b["flush_spread_s"] else "-"
        lines.append(f"{b['connections']:>5} {ms(t['p50']):>9} {ms(t['p99']):>6} {ms(t['max']):>6} "
                     f"{spread:>16} {b['underruns']:>9} {b['errors']:>6}")
    return "\n".join(lines)


def plot(path: Path, levels: list[dict], title: str, bound_s: float) -> None:
    """TTFA percentiles and underruns against the offered conversations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(levels, key=lambda lv: lv["conversations"])
    c = [lv["conversations"] for lv in levels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, style in (("p50", "-o"), ("p90", "--"), ("p99", ":o")):
        ax1.plot(c, [1000 * (lv["ttfa_s"][q] if lv["ttfa_s"][q] is not None else math.nan) for lv in levels], style, label=q)
    ax1.axhline(1000 * bound_s, color="r", lw=0.8, label="p99 bound")
    ax1.set_ylabel("TTFA (ms)")
    ax2.plot(c, [lv["underruns"] for lv in levels], "-o", label="underruns")
    ax2.plot(c, [lv["refusals"] for lv in levels], "--x", label="refusals")
    ax2.set_ylabel("count")
    for ax in (ax1, ax2):
        ax.set_xlabel("offered concurrent conversations")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
