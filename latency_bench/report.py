"""Aggregating a level's connections, and the table and PNG outputs (JSON: jsonfile.py)."""

from __future__ import annotations

import math
from pathlib import Path

from latency_bench.stats import ConnectionResult, summary, underruns


def aggregate(concurrency: int, results: list[ConnectionResult], wall_s: float, hop_s: float) -> dict:
    turns = [t for r in results for t in r.turns]
    ttfa = [t.ttfa for t in turns if t.ttfa is not None]
    ready = [r.open_to_ready for r in results if r.open_to_ready is not None]
    ready_cached = [r.open_to_ready for r in results if r.open_to_ready is not None and r.voice_cached]
    ready_uncached = [r.open_to_ready for r in results if r.open_to_ready is not None and r.voice_cached is False]
    under = [underruns(t.chunks) for t in turns if not t.cancelled]
    gaps = [g for t in turns for g in t.gaps()]
    rates = [r for t in turns if not t.cancelled and (r := t.decode_rate(hop_s)) is not None]
    chunks = [c for t in turns for c in t.chunks]
    audio_s = sum(d for _, d in chunks)
    if chunks:
        span = max(a for a, _ in chunks) - min(t.flush_at for t in turns)
    else:
        span = wall_s
    return {
        "concurrency": concurrency,
        "connections": len(results),
        "turns": len(turns),
        "errors": sum(len(r.errors) for r in results),
        "error_samples": [e for r in results for e in r.errors][:5],
        "ttfa_s": summary(ttfa),
        "open_to_ready_s": summary(ready),
        "open_to_ready_cached_s": summary(ready_cached),
        "open_to_ready_uncached_s": summary(ready_uncached),
        "underruns": sum(u.count for u in under),
        "underrun_ms": 1000 * sum(u.total_s for u in under),
        # those that began within the turn's first 0.5 s of audio (its start), and where all began
        "underruns_first_half_s": sum(a < 0.5 for u in under for a in u.at_audio_s),
        "underrun_at_audio_s": summary([a for u in under for a in u.at_audio_s]),
        "chunk_gap_s": summary(gaps),
        "stream_frames_per_s": summary(rates),
        "frames_per_s": audio_s / hop_s / span if span > 0 else math.nan,
        "audio_s_per_s": audio_s / span if span > 0 else math.nan,
        "audio_s": audio_s,
        "wall_s": wall_s,
    }


def ms(x: float | None) -> str:
    """Seconds as whole milliseconds; '-' for a missing figure (None or NaN)."""
    return "-" if x is None or x != x else f"{1000 * x:.0f}"


def table(levels: list[dict], title: str) -> str:
    head = (f"{'c':>4} {'TTFA p50':>9} {'p90':>6} {'p99':>6} {'max':>6} {'ready p50':>10} {'p99':>6} "
            f"{'underruns':>9} {'ms':>7} {'at start':>8} {'frames/s':>9} {'per stream':>10} {'audio s/s':>9} {'errors':>6}")
    lines = [title, head]
    for lv in levels:
        t, r = lv["ttfa_s"], lv["open_to_ready_s"]
        lines.append(
            f"{lv['concurrency']:>4} {ms(t['p50']):>9} {ms(t['p90']):>6} {ms(t['p99']):>6} {ms(t['max']):>6} "
            f"{ms(r['p50']):>10} {ms(r['p99']):>6} {lv['underruns']:>9} {lv['underrun_ms']:>7.0f} "
            f"{lv.get('underruns_first_half_s', '-'):>8} {lv['frames_per_s']:>9.1f} {lv['stream_frames_per_s']['p50']:>10.1f} {lv['audio_s_per_s']:>9.2f} {lv['errors']:>6}"
        )
    lines.append("(times in ms; at start = underruns in a turn's first 0.5 s of audio; frames/s over all streams;"
                 " per stream = median decode rate of a turn)")
    return "\n".join(lines)


def ratios(main: list[dict], baseline: list[dict]) -> list[dict]:
    by_c = {lv["concurrency"]: lv for lv in baseline}
    out = []
    for lv in main:
        b = by_c.get(lv["concurrency"])
        if b is None:
            continue
        out.append({
            "concurrency": lv["concurrency"],
            "ttfa_p50_speedup": b["ttfa_s"]["p50"] / lv["ttfa_s"]["p50"] if lv["ttfa_s"]["p50"] else math.nan,
            "frames_per_s_ratio": lv["frames_per_s"] / b["frames_per_s"] if b["frames_per_s"] else math.nan,
        })
    return out


def plot(path: Path, runs: dict[str, list[dict]], title: str) -> None:
    """TTFA percentiles and throughput against concurrency, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, levels in runs.items():
        c = [lv["concurrency"] for lv in levels]
        for q, style in (("p50", "-o"), ("p90", "--"), ("p99", ":")):
            ax1.plot(c, [1000 * (lv["ttfa_s"][q] or math.nan) for lv in levels], style, label=f"{name} {q}")
        ax2.plot(c, [lv["frames_per_s"] for lv in levels], "-o", label=f"{name} all streams")
        ax2.plot(c, [lv["stream_frames_per_s"]["p50"] * lv["concurrency"] for lv in levels], ":", label=f"{name} per stream x c")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("TTFA (ms)")
    ax2.set_ylabel("frames / s")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
