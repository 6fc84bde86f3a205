"""engine/timeshare.py: a thread's time by phase, read consistently from another thread."""

from __future__ import annotations

import threading
import time

import pytest

from engine.timeshare import Phases


def test_every_second_goes_to_exactly_one_phase():
    p = Phases("idle", "work")
    t0 = time.perf_counter()
    time.sleep(0.03)
    p.to("work")
    time.sleep(0.05)
    p.to("work")  # staying in a phase changes nothing
    s = p.seconds  # the phase in progress counts up to now
    assert s["idle"] == pytest.approx(0.03, abs=0.02) and s["work"] == pytest.approx(0.05, abs=0.02)
    assert sum(s.values()) == pytest.approx(time.perf_counter() - t0, abs=0.005)
    assert p.snapshot("decode").keys() == {"decode_idle_seconds", "decode_work_seconds"}
    with pytest.raises(KeyError):
        p.to("sleep")
    with pytest.raises(ValueError):
        Phases("a", "a")


def test_a_reader_on_another_thread_never_sees_time_twice():
    t0 = time.perf_counter()
    p = Phases("a", "b")
    stop = threading.Event()

    def switch():
        while not stop.is_set():
            p.to("b")
            p.to("a")

    t = threading.Thread(target=switch)
    t.start()
    try:
        for _ in range(2000):
            before = time.perf_counter()
            total = sum(p.seconds.values())
            assert before - t0 - 0.01 <= total <= time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
