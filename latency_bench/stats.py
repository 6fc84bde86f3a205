"""Statistics of a load test: percentiles, and the playback model behind underruns.

Definitions (see DESIGN.md, "Measuring"):
- TTFA: from sending the `flush` that ends a turn's text to the first non-empty audio.
- Underrun: the client plays a turn's audio at real time from its first chunk; whenever
  the next chunk has not arrived by the time the audio before it has played out, that is
  an underrun, lasting until it arrives (playback then resumes from there).
- Decode rate of a stream: frames received per second between a turn's first and last
  chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


@dataclass(slots=True)
class Underruns:
    count: int = 0
    total_s: float = 0.0
    # where each one began, in seconds of the turn's audio played before it (0.046: the
    # first frame ran out before the second arrived): tells turn starts from later stalls
    at_audio_s: list[float] = field(default_factory=list)
    play_end: float | None = None  # when the last chunk has played out (None: no audio)


def underruns(chunks: list[tuple[float, float]]) -> Underruns:
    """chunks: (arrival time s, audio duration s) in arrival order, for one turn.

    Playback starts when the first chunk arrives; each chunk starts playing when the
    previous one has finished, or when it arrives if that is later (an underrun)."""
    result = Underruns()
    play_end = None
    played = 0.0  # audio seconds of the chunks before this one
    for arrival, duration in chunks:
        if play_end is None:
            play_end = arrival + duration
            played = duration
            continue
        if arrival > play_end + 1e-9:
            result.count += 1
            result.total_s += arrival - play_end
            result.at_audio_s.append(played)
            play_end = arrival + duration
        else:
            play_end += duration
        played += duration
    result.play_end = play_end
    return result


@dataclass(slots=True)
class TurnRecord:
    flush_at: float  # when the flush ending the turn's text was sent
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (arrival, seconds)
    frames: int = 0
    cancelled: bool = False

    @property
    def ttfa(self) -> float | None:
        return self.chunks[0][0] - self.flush_at if self.chunks else None

    @property
    def audio_seconds(self) -> float:
        return sum(d for _, d in self.chunks)

    def gaps(self) -> list[float]:
        return [b[0] - a[0] for a, b in zip(self.chunks, self.chunks[1:])]

    def decode_rate(self, hop_seconds: float) -> float | None:
        """Frames per second while this turn's audio was being produced."""
        if len(self.chunks) < 2:
            return None
        span = self.chunks[-1][0] - self.chunks[0][0]
        frames_after_first = (self.audio_seconds - self.chunks[0][1]) / hop_seconds
        return frames_after_first / span if span > 0 else None


@dataclass(slots=True)
class ConnectionResult:
    """One simulated connection's measurements (latency_bench/loadgen.py fills it); kept
    here, beside TurnRecord, so that aggregating results needs no network packages."""

    index: int
    open_to_ready: float | None = None
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    voice_cached: bool | None = None
