"""Service metrics in the Prometheus text format (no client library needed).

Updated on the event loop only; the engine's own counters are read when scraped."""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter, deque
from dataclasses import dataclass

TTFA_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


# engine stats that only grow (besides every "*_seconds" one: time by thread phase)
ENGINE_COUNTERS = ("decode_steps", "frames", "prefills", "voice_cache_hits", "voice_cache_misses",
                   "decode_rows", "codec_calls", "codec_frames", "codec_padded_frames", "kv_evicted_contexts",
                   "kv_page_cuts")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class RecentValues:
    """The values observed over the last `span_s` seconds, for a quantile an autoscaler can
    act on (a histogram's quantile covers the whole run). Bounded: past `max_values` in
    the window the oldest go first (60 s at 1,000 turns a second)."""

    def __init__(self, span_s: float = 60.0, max_values: int = 60_000, clock=time.monotonic) -> None:
        self.span_s, self._clock = span_s, clock
        self._values: deque[tuple[float, float]] = deque(maxlen=max_values)  # (time, value)

    def add(self, value: float) -> None:
        self._values.append((self._clock(), value))

    def quantile(self, q: float) -> float | None:
        """The q-quantile (nearest rank) of the window's values; None when it has none."""
        horizon = self._clock() - self.span_s
        while self._values and self._values[0][0] < horizon:
            self._values.popleft()
        if not self._values:
            return None
        ordered = sorted(v for _, v in self._values)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class WindowedHistogram(Histogram):
    """A histogram that also keeps the last minute's values (RecentValues)."""

    def __init__(self, buckets: tuple[float, ...], span_s: float = 60.0) -> None:
        super().__init__(buckets)
        self.recent = RecentValues(span_s)

    def observe(self, value: float) -> None:
        super().observe(value)
        self.recent.add(value)


@dataclass(slots=True)
class Capacity:
    """What a load balancer and an autoscaler read of one replica (realtime/readiness.py)."""

    ready: bool  # GET /v1/ready would answer 200
    used: float  # 0..1: the busiest of connections, decode batch and wait queue against their limits
    kv_free: float  # 0..1: the KV pool's free pages (idle contexts and unused voices not counted free)


class Metrics:
    def __init__(self) -> None:
        self.sessions_active = 0  # live WebSocket connections (realtime/app.py admits up to --max-connections)
        self.sessions_total = 0
        self.ttfa = WindowedHistogram(TTFA_BUCKETS)
        self.open_to_ready = Histogram(TTFA_BUCKETS)
        self.audio_seconds = 0.0
        self.errors: Counter[str] = Counter()
        self.http_requests = 0
        self.loop_lag_max_s = 0.0  # worst event-loop wake-up delay of the last few seconds
        self._frames: deque[tuple[float, int]] = deque(maxlen=64)  # (time, engine frames) samples

    def frames_per_second(self, engine_frames: int) -> float:
        now = time.monotonic()
        self._frames.append((now, engine_frames))
        while len(self._frames) > 2 and now - self._frames[0][0] > 10.0:
            self._frames.popleft()
        (t0, f0), (t1, f1) = self._frames[0], self._frames[-1]
        return (f1 - f0) / (t1 - t0) if t1 > t0 else 0.0

    def render(self, engine_stats: dict, capacity: Capacity | None = None) -> str:
        lines = [
            "# TYPE realtime_sessions_active gauge", f"realtime_sessions_active {self.sessions_active}",
            "# TYPE realtime_sessions_total counter", f"realtime_sessions_total {self.sessions_total}",
            "# TYPE realtime_http_requests_total counter", f"realtime_http_requests_total {self.http_requests}",
            "# TYPE realtime_ttfa_seconds histogram", *self.ttfa.lines("realtime_ttfa_seconds"),
            "# TYPE realtime_open_to_ready_seconds histogram", *self.open_to_ready.lines("realtime_open_to_ready_seconds"),
            "# TYPE realtime_audio_seconds_total counter", f"realtime_audio_seconds_total {self.audio_seconds:.3f}",
            "# TYPE realtime_errors_total counter",
            *[f'realtime_errors_total{{code="{code}"}} {n}' for code, n in sorted(self.errors.items())],
            "# TYPE realtime_loop_lag_max_seconds gauge", f"realtime_loop_lag_max_seconds {self.loop_lag_max_s:.4f}",
            "# TYPE engine_frames_per_second gauge",
            f"engine_frames_per_second {self.frames_per_second(engine_stats.get('frames', 0)):.2f}",
        ]
        p99 = self.ttfa.recent.quantile(0.99)
        lines += ["# HELP realtime_ttfa_p99_seconds TTFA p99 of the turns of the last 60 s (NaN: none)",
                  "# TYPE realtime_ttfa_p99_seconds gauge",
                  f"realtime_ttfa_p99_seconds {'NaN' if p99 is None else f'{p99:.6f}'}"]
        if capacity is not None:
            lines += capacity_lines(capacity)
        for key, value in sorted(engine_stats.items()):
            kind = "counter" if key in ENGINE_COUNTERS or key.endswith("_seconds") else "gauge"
            # a counter ends in _total; a gauge never does (the stat kv_pages_total is engine_kv_pages)
            name = f"engine_{key}" + ("_total" if kind == "counter" else "")
            if kind == "gauge":
                name = name.removesuffix("_total")
            lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"


def capacity_lines(c: Capacity) -> list[str]:
    return [
        "# HELP realtime_ready 1 while GET /v1/ready answers 200 (one more conversation fits)",
        "# TYPE realtime_ready gauge", f"realtime_ready {int(c.ready)}",
        "# HELP realtime_capacity_used_ratio the busiest of connections, decode batch and wait queue "
        "against their limits (the autoscaling signal)",
        "# TYPE realtime_capacity_used_ratio gauge", f"realtime_capacity_used_ratio {c.used:.4f}",
        "# HELP engine_kv_pages_free_ratio share of the KV page pool that is free",
        "# TYPE engine_kv_pages_free_ratio gauge", f"engine_kv_pages_free_ratio {c.kv_free:.4f}",
    ]
