"""The stall sampler (`--debug stalls`) names what blocked the event loop."""

from __future__ import annotations

import asyncio
import logging
import time

from realtime.config import parse_args
from realtime.metrics import Metrics
from realtime.stalls import StallSampler, watch_loop_lag


def block_the_loop_for(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        sum(range(1000))


def test_a_blocked_loop_is_reported_with_its_stack(caplog):
    async def main():
        sampler = StallSampler(report_s=0.5)
        sampler.start()
        beat = asyncio.get_running_loop().create_task(watch_loop_lag(Metrics(), sampler))
        await asyncio.sleep(0.05)
        block_the_loop_for(0.3)
        await asyncio.sleep(0.7)
        beat.cancel()
        sampler.stop()

    with caplog.at_level(logging.WARNING, logger="realtime.stalls"):
        asyncio.run(main())
    assert "stalls in the last" in caplog.text
    assert "event-loop: block_the_loop_for@test_stalls.py" in caplog.text


def test_the_flag_is_off_by_default():
    assert not parse_args([]).debug_stalls and parse_args(["--debug", "stalls"]).debug_stalls
