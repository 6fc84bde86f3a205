"""Event-loop stalls: how long (always), and what the process was doing meanwhile
(`--debug-stalls`).

- `watch_loop_lag` (a task on the loop, always on): how late the loop wakes a 10 ms
  sleeper, the worst of every 5 s on /metrics and logged past 50 ms. It is also the
  heartbeat the sampler below watches.

With `--debug-stalls` (StallSampler):
- GC pauses: `gc.callbacks` times every collection; pauses over 20 ms are counted by
  generation and logged with the worst one.
- Stack samples: a watchdog thread samples every thread's stack each 5 ms while the
  loop's heartbeat is more than 50 ms old, and every 5 s logs the most frequent
  (thread, innermost frames) seen during stalls. A thread stuck in C code that holds
  the GIL shows up as the watchdog missing its own samples (logged as "sampler late").

The sampler is off by default: sampling costs a little GIL time itself.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections import Counter

log = logging.getLogger("realtime.stalls")


class StallSampler:
    def __init__(self, stale_s: float = 0.05, period_s: float = 0.005, report_s: float = 5.0) -> None:
        self.stale_s, self.period_s, self.report_s = stale_s, period_s, report_s
        self.heartbeat = time.perf_counter()
        self.samples: Counter[str] = Counter()
        self.sampler_late = 0  # samples that came > 20 ms late (some thread held the GIL in C)
        self.gc_pauses: Counter[int] = Counter()
        self.gc_worst = (0.0, -1)
        self._gc_start = 0.0
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()

    # gc.callbacks
    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_start
        if pause > 0.02:
            self.gc_pauses[info["generation"]] += 1
            if pause > self.gc_worst[0]:
                self.gc_worst = (pause, info["generation"])

    def beat(self, now: float) -> None:
        """Called on the loop (by watch_loop_lag) each time it wakes."""
        self._loop_thread = threading.get_ident()
        self.heartbeat = now

    def _watch(self) -> None:
        last_report = last = time.perf_counter()
        while not self._stop.wait(self.period_s):
            now = time.perf_counter()
            if now - last > self.period_s + 0.02:
                self.sampler_late += 1
            last = now
            if now - self.heartbeat > self.stale_s:
                names = {t.ident: t.name for t in threading.enumerate()}
                for ident, frame in sys._current_frames().items():
                    if ident == threading.get_ident():
                        continue
                    name = "event-loop" if ident == self._loop_thread else names.get(ident, str(ident))
                    top = traceback.extract_stack(frame)[-3:]
                    where = " < ".join(f"{f.name}@{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(top))
                    self.samples[f"{name}: {where}"] += 1
            if now - last_report >= self.report_s:
                self._report(now - last_report)
                last_report = now

    def _report(self, span: float) -> None:
        if self.samples or self.gc_pauses or self.sampler_late:
            log.warning(
                "stalls in the last %.0f s: GC pauses > 20 ms by generation %s (worst %.0f ms, gen %d); sampler late %d times",
                span, dict(self.gc_pauses), 1000 * self.gc_worst[0], self.gc_worst[1], self.sampler_late,
            )
            for where, n in self.samples.most_common(8):
                log.warning("  %4d samples  %s", n, where)
        self.samples.clear()
        self.gc_pauses.clear()
        self.gc_worst = (0.0, -1)
        self.sampler_late = 0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._watch, name="stall-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


async def watch_loop_lag(metrics, sampler: StallSampler | None = None, period_s: float = 0.01,
                         report_s: float = 5.0) -> None:
    """How late the event loop wakes a 10 ms sleeper: every audio chunk, text message and
    engine event waits that long. Kept on `metrics.loop_lag_max_s` (worst of the last
    report period) and logged when it passes 50 ms; each wake-up is the sampler's
    heartbeat."""
    worst, since = 0.0, time.perf_counter()
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        now = time.perf_counter()
        if sampler is not None:
            sampler.beat(now)
        worst = max(worst, now - t - period_s)
        if now - since >= report_s:
            metrics.loop_lag_max_s = worst
            if worst > 0.05:
                log.warning("event loop lag up to %.0f ms in the last %.0f s", 1000 * worst, now - since)
            worst, since = 0.0, now
