"""KV pages (engine/pages.py) and the scheduler's use of them: allocation, sharing of a
voice's pages, copy on write, rollback, idle eviction, waiting for pages; and 10,000
random operations through the scheduler that end with every page back in the pool, none
freed twice."""

from __future__ import annotations

import random

import pytest

from engine.pages import PagePool, VoiceCache, VoicePages
from engine.scheduler import Phase, Scheduler, Segment


def test_pool_hands_out_the_lowest_pages_all_or_nothing_and_refuses_a_double_free():
    pool = PagePool(6, 16)
    assert pool.capacity == 5 and pool.free == 5 and pool.pages_for(33) == 3
    a = pool.alloc(3)
    assert a == [1, 2, 3] and pool.used == 3
    assert pool.alloc(3) is None and pool.free == 2  # all or nothing
    pool.retain(a[:1])
    assert pool.shared(1) and not pool.shared(2)
    pool.release(a)
    assert pool.free == 4 and pool.refs[1] == 1  # still held once
    pool.release([1])
    with pytest.raises(RuntimeError, match="double free"):
        pool.release([1])
    with pytest.raises(RuntimeError, match="double free"):
        pool.release([0])  # the scratch page is never handed out nor returned


def test_voice_cache_keeps_voices_within_its_budget_and_gives_back_unused_ones():
    pool = PagePool(20, 16)
    cache = VoiceCache(pool, max_pages=6)
    voices = []
    for key in "abc":
        pages = pool.alloc(3)
        voices.append(VoicePages(tuple(pages), 40))
        cache.put(key, voices[-1])
        pool.release(pages)  # the prefilling stream closed: the cache holds them alone
    assert "a" not in cache and "b" in cache and "c" in cache and cache.pages == 6  # a was least recent
    assert pool.used == 6
    pool.retain(voices[2].pages)  # a stream speaks with c
    cache.get("b")
    cache.reclaim(pool.capacity)  # as much as possible: b goes, c is in use
    assert "b" not in cache and "c" in cache and pool.used == 3


def _voice_ready(s: Scheduler, stream, length=40):
    work = s.next_prefill()
    assert work.kind == "voice" and work.stream is stream
    s.voice_done(stream, length)


def test_streams_of_one_voice_share_its_pages_and_copy_the_last_one_before_writing():
    s = Scheduler(max_running=4, max_queued=0, max_len=512, max_streams=4, pool=PagePool(40, 16))
    a = s.open("a", 50)
    _voice_ready(s, a, 40)  # 40 positions: pages 0-1 full, page 2 holds 8
    voice = a.voice
    s.voices.put("v", voice)
    b = s.open("b", 50)
    s.voice_done(s.next_prefill().stream, voice)  # b takes the cached voice: no new page
    assert b.pages == a.pages == list(voice.pages) and s.pool.used == 3
    s.say(b, Segment(1, "Hello there."))
    work = s.next_prefill()
    # b writes from position 40, inside the voice's last page: its own copy of it first
    (shared, copy), = work.copies
    assert shared == voice.pages[2] and b.pages[:2] == list(voice.pages[:2]) and b.pages[2] == copy
    assert work.pages == b.pages and len(b.pages) == s.pool.pages_for(40 + s._room_needed(b, work.segment))
    assert s.pool.refs[voice.pages[0]] == 3  # a, b and the cache


def test_a_segment_waits_for_pages_and_goes_once_another_ends():
    pool = PagePool(1 + 16, 16)
    s = Scheduler(max_running=4, max_queued=0, max_len=512, max_streams=4, pool=pool)
    a, b = s.open("a", 50), s.open("b", 50)
    _voice_ready(s, a, 16)
    _voice_ready(s, b, 16)
    s.say(a, Segment(1, "x" * 60))  # reserves 16 + 24 + 60 + 50 positions: 10 pages, 9 of them new
    wa = s.next_prefill()
    assert wa.stream is a and pool.free == 16 - 2 - 9
    s.say(b, Segment(1, "y" * 90))
    assert s.next_prefill() is None and b.phase is Phase.PREFILLING  # no room: it waits, queued
    assert s.segment_done(a, wa, 10)
    assert s.frame(a, wa.segment.id, "f0", True).segment_done  # a ends at once: its spare pages return
    wb = s.next_prefill()
    assert wb is not None and wb.stream is b


def test_an_idle_context_is_evicted_for_a_new_turn_and_its_next_turn_starts_from_the_voice():
    pool = PagePool(1 + 16, 16)
    s = Scheduler(max_running=4, max_queued=0, max_len=512, max_streams=4, pool=pool)
    a, b = s.open("a", 50), s.open("b", 50)
    _voice_ready(s, a, 16)
    _voice_ready(s, b, 16)
    s.say(a, Segment(1, "x" * 60))
    wa = s.next_prefill()
    assert s.segment_done(a, wa, 90)
    for n in range(5):
        s.frame(a, wa.segment.id, f"f{n}", False)
    s.frame(a, wa.segment.id, "end", True)  # a ended: context 16 + 90 + 5 positions, idle
    assert a.phase is Phase.IDLE and a.position == 111 and len(a.pages) == 7
    s.say(b, Segment(1, "y" * 80))  # needs 10 more pages: only a's context can give them
    wb = s.next_prefill()
    assert wb is not None and s.evicted_contexts == 1
    assert a.pages == list(a.voice.pages) and a.position == 16 and a.closing is None
    s.say(a, Segment(2, "Again."))
    s.segment_done(b, wb, 100)
    s.frame(b, wb.segment.id, "end", True)
    wa2 = s.next_prefill()
    assert wa2.stream is a and wa2.start == 16 and wa2.closing is None


def test_cancel_returns_the_turns_pages_once_the_step_in_flight_is_read():
    pool = PagePool(1 + 40, 16)
    s = Scheduler(max_running=4, max_queued=0, max_len=512, max_streams=4, pool=pool)
    a = s.open("a", 500)
    _voice_ready(s, a, 16)
    s.say(a, Segment(1, "Hi."))
    w = s.next_prefill()
    s.segment_done(a, w, 10)
    s.frame(a, w.segment.id, "f0", False)
    for _ in range(200):  # decode far past the reservation: pages are added as it goes
        batch = s.decode_batch()
        s.step_launched(batch)
        s.frame(a, w.segment.id, "f", False)
        s.step_read(batch)
    assert len(a.pages) == pool.pages_for(26 + 200 + 1) and s.table_updates
    batch = s.decode_batch()
    s.step_launched(batch)  # one step in flight
    s.cancel(a)
    assert len(a.pages) > 1  # the step in flight may still write them
    s.step_read(batch)
    assert a.pages == [a.pages[0]] and a.position == 16 and pool.used == 1


def test_a_stream_the_pool_has_no_page_for_ends_its_segment_with_the_frames_it_has():
    pool = PagePool(1 + 6, 16)  # the voice's page and the 5 its first segment reserves
    s = Scheduler(max_running=4, max_queued=0, max_len=512, max_streams=4, pool=pool, admit_positions=64)
    a = s.open("a", 500)
    _voice_ready(s, a, 16)
    s.say(a, Segment(1, "Hi."))
    w = s.next_prefill()
    assert w is not None and pool.free == 0
    s.segment_done(a, w, 10)
    s.frame(a, w.segment.id, "f0", False)
    steps = 0
    while batch := s.decode_batch():
        s.step_launched(batch)
        assert not s.frame(a, w.segment.id, "f", False).segment_done
        s.step_read(batch)
        steps += 1
    # no frame in flight when the page ran out: the decode thread is told to end the segment
    assert s.cut_now == [(a, 1)] and s.page_cuts == 1 and a.phase is Phase.IDLE
    assert steps == 6 * 16 - 26 and a.position == 26 + steps and a.closing.cut_frame == "f"
    # with a step in flight instead, that step's frame ends it, as a budget would
    s.say(a, Segment(2, "Hi."))
    w = s.next_prefill()
    s.segment_done(a, w, 10)
    s.frame(a, w.segment.id, "f0", False)
    pending = None
    for _ in range(200):
        batch = s.decode_batch()
        if batch:
            s.step_launched(batch)
        if pending:
            outcome = s.frame(a, w.segment.id, "f", False)
            s.step_read(pending)
            if outcome.segment_done:
                break
        pending = batch
    assert outcome.reason == "context" and s.page_cuts == 2 and a.phase is Phase.IDLE


def test_a_connection_waits_in_the_queue_while_no_first_segment_fits():
    pool = PagePool(1 + 16, 16)  # 256 positions: one stream's first segment (ADMIT_POSITIONS)
    s = Scheduler(max_running=4, max_queued=2, max_len=512, max_streams=4, pool=pool)
    a = s.open("a", 50)
    _voice_ready(s, a, 16)
    s.say(a, Segment(1, "x" * 100))
    w = s.next_prefill()
    b = s.open("b", 50)
    assert b.phase is Phase.QUEUED and b.slot is None  # a row is free, pages are not
    s.segment_done(a, w, 120)
    s.frame(a, w.segment.id, "end", True)
    s.close(a)
    assert b.phase is Phase.PREFILLING and b.slot is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ten_thousand_random_operations_leak_no_page_and_free_none_twice(seed):
    rng = random.Random(seed)
    pool = PagePool(1 + 24, 16)  # fewer than three full contexts
    s = Scheduler(max_running=3, max_queued=4, max_len=256, max_streams=6, pool=pool,
                  voices=VoiceCache(pool, 12), admit_positions=64)
    voices = {}
    streams, inflight, turn, spoken, grown = [], [], 0, 0, 0
    for _ in range(10_000):
        op = rng.random()
        live = [st for st in streams if st.live]
        if op < 0.05 and len(live) < 10:
            try:
                streams.append(s.open(rng.choice("vw"), rng.choice([5, 40, 300]), rng.random() < 0.2))
            except Exception:
                pass
        elif op < 0.07 and live:
            s.close(rng.choice(live))
        elif op < 0.19 and live:
            turn += 1
            s.say(rng.choice(live), Segment(turn, "x" * rng.randrange(1, 40)))
        elif op < 0.21 and live:
            s.cancel(rng.choice(live))
        elif op < 0.36:
            work = s.next_prefill()
            if work is not None and work.kind == "voice":
                key = work.stream.owner
                if key in s.voices:
                    s.voice_done(work.stream, s.voices.get(key))
                else:
                    pages = s.take_voice_pages(work.stream, rng.randrange(10, 60))
                    if pages is not None:
                        voice = VoicePages(tuple(pages), len(pages) * 16 - rng.randrange(0, 16))
                        s.voices.put(key, voice)
                        s.voice_done(work.stream, voice)
            elif work is not None:
                ok = s.ensure_room(work.stream, work.start + 20)
                if not ok or rng.random() < 0.05:
                    s.prefill_failed(work.stream)
                elif s.segment_done(work.stream, work, 19):
                    spoken += 1
                    s.frame(work.stream, work.segment.id, "f0", rng.random() < 0.05)
        else:
            batch = s.decode_batch()
            grown += len(s.table_updates)
            s.table_updates.clear()
            s.cut_now.clear()
            if batch:
                s.step_launched(batch)
                inflight.append((batch, [b.current.id for b in batch]))
            if inflight and (rng.random() < 0.7 or len(inflight) > 1):
                done, ids = inflight.pop(0)
                for st, seg in zip(done, ids):
                    s.frame(st, seg, "f", rng.random() < 0.005)
                s.step_read(done)
        # every page is held as often as it is referenced
        held = [0] * pool.num_pages
        for st in s.streams.values():
            for p in st.pages:
                held[p] += 1
        for v in s.voices._items.values():
            for p in v.pages:
                held[p] += 1
        held[0] = 1
        assert held == pool.refs
    for done, ids in inflight:
        s.step_read(done)
    for st in list(s.streams.values()):
        s.close(st)
    while (work := s.next_prefill()) is not None:  # voices and segments taken before the closes
        if work.kind == "voice":
            s.voice_done(work.stream, 20)
        else:
            s.prefill_failed(work.stream)
    s.voices.reclaim(pool.capacity)
    # the run went through what it should: contexts evicted, segments cut for pages, restarts
    assert s.evicted_contexts > 20 and s.page_cuts > 2 and spoken > 200 and grown > 10
    assert not s.streams and pool.free == pool.capacity and pool.refs[1:] == [0] * pool.capacity
