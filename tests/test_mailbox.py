"""The engine -> event loop mailbox: events from worker threads run on the loop in the
order they were posted, a burst costs one wake-up, and a failing callback is logged
without dropping the events after it."""

from __future__ import annotations

import asyncio
import threading

from realtime.mailbox import LoopMailbox


def test_events_arrive_in_order_with_one_wakeup_per_burst():
    async def main():
        box = LoopMailbox(asyncio.get_running_loop())
        seen: list[tuple[int, int]] = []
        done = asyncio.Event()

        def burst():
            for i in range(500):
                box.post(seen.append, (0, i))
            box.post(done.set)

        t = threading.Thread(target=burst)
        t.start()
        await asyncio.wait_for(done.wait(), 5)
        t.join()
        return box, seen

    box, seen = asyncio.run(main())
    assert seen == [(0, i) for i in range(500)]
    assert box.delivered == 501
    assert box.wakeups < 100  # most of the burst was queued behind one pending wake-up


def test_a_failing_callback_does_not_drop_the_others(caplog):
    async def main():
        box = LoopMailbox(asyncio.get_running_loop())
        seen = []
        done = asyncio.Event()

        def fail():
            raise RuntimeError("boom")

        def post_all():
            box.post(seen.append, 1)
            box.post(fail)
            box.post(seen.append, 2)
            box.post(done.set)

        threading.Thread(target=post_all).start()
        await asyncio.wait_for(done.wait(), 5)
        return seen

    assert asyncio.run(main()) == [1, 2]
    assert "engine event callback failed" in caplog.text


def test_posting_after_the_loop_closed_is_harmless():
    loop = asyncio.new_event_loop()
    box = LoopMailbox(loop)
    loop.close()
    box.post(print, "never")  # no exception: the server is shutting down
