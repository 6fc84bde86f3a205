"""The scheduler alone (plain Python), driven the way the engine's threads drive it,
with a fake model that says end-of-speech after a set number of frames."""

from __future__ import annotations

import pytest

from engine.scheduler import Phase, Refused, Scheduler, Segment

END = "END"


class FakeEngine:
    """Replays the engine's calls: prefill work in order, decode steps read one step late;
    `second_frame`: the prefill thread makes each segment's second frame too (the
    engine's default, EngineConfig.prefill_second_frame)."""

    def __init__(self, sched: Scheduler, end_after: dict[int, int] | None = None, prompt_len: int = 10,
                 second_frame: bool = False) -> None:
        self.s = sched
        self.second_frame = second_frame
        self.end_after = end_after or {}  # stream id -> frames before end-of-speech
        self.prompt_len = prompt_len
        self.emitted: dict[int, list] = {}
        self.ends: dict[int, list] = {}
        self.prefills: list = []
        self.pending = None

    def _frame(self, stream, n):
        limit = self.end_after.get(stream.id)
        return END if limit is not None and n >= limit else f"f{n}"

    def _record(self, stream, turn, frame, outcome):
        if outcome.emit:
            self.emitted.setdefault(stream.id, []).append((turn, frame))
        if outcome.segment_done:
            self.ends.setdefault(stream.id, []).append((turn, outcome.reason))

    def prefill_all(self):
        while (work := self.s.next_prefill()) is not None:
            self.prefills.append((work.kind, work.stream.id, work.start, work.closing, work.restart))
            if work.kind == "voice":
                self.s.voice_done(work.stream, 100)
            elif self.s.segment_done(work.stream, work, self.prompt_len, second_frame=self.second_frame):
                for n in range(2 if self.second_frame else 1):
                    frame = self._frame(work.stream, n)
                    self._record(work.stream, work.segment.turn, frame,
                                 self.s.frame(work.stream, work.segment.id, frame, frame == END))
                if self.second_frame:
                    self.s.second_frame_done(work.stream)

    def step(self):
        """Launch a step for the current batch, then read the previous one."""
        batch = self.s.decode_batch()
        launched = None
        if batch:
            segments = [(s.current.id, s.current.turn) for s in batch]
            frames = [self._frame(s, s.steps + 1) for s in batch]
            self.s.step_launched(batch)
            launched = (batch, segments, frames)
        if self.pending:
            b, segs, frames = self.pending
            for s, (seg_id, turn), frame in zip(b, segs, frames):
                self._record(s, turn, frame, self.s.frame(s, seg_id, frame, frame == END))
            self.s.step_read(b)
        self.pending = launched
        return bool(batch)

    def run(self, max_steps=1000):
        for _ in range(max_steps):
            self.prefill_all()
            if not self.step() and self.pending is None and not self.s.segment_work and not self.s.voice_work:
                return
        raise AssertionError("did not settle")


def test_admission_queue_refusal_and_lowest_free_slot():
    s = Scheduler(max_running=2, max_queued=1, max_len=4096)
    a, b = s.open("a", 50), s.open("b", 50)
    c = s.open("c", 50)
    assert (a.slot, b.slot, c.slot) == (0, 1, None) and c.phase is Phase.QUEUED
    with pytest.raises(Refused, match="all 2 streams are busy and 1 are already waiting"):
        s.open("d", 50)
    s.close(a)
    # a's voice prefill had not started: its slot is free at once and c is admitted into it
    assert a.phase is Phase.CLOSED and c.slot == 0 and c.phase is Phase.PREFILLING
    work = s.next_prefill()
    assert work.stream is b  # the prefill thread takes b's voice ...
    s.close(b)  # ... and b closes meanwhile: its slot is held until that prefill lands
    assert b.phase is not Phase.CLOSED and 1 not in s.free_slots
    s.voice_done(b, 100)
    assert b.phase is Phase.CLOSED and s.free_slots == [1]


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_segments_are_spoken_in_order_with_positions_and_closings(second):
    s = Scheduler(max_running=4, max_queued=0, max_len=4096)
    e = FakeEngine(s, prompt_len=10, second_frame=second)
    st = s.open("x", frame_budget=5)
    e.prefill_all()
    assert st.phase is Phase.IDLE and st.position == 100  # the voice prefix
    s.say(st, Segment(1, "First segment."))
    s.say(st, Segment(1, "Second segment."))
    e.run()
    # budget 5: f0 from the prefill + 4 decode steps, per segment; then the closing joins the next prompt
    assert [f for _, f in e.emitted[st.id]] == ["f0", "f1", "f2", "f3", "f4"] * 2
    assert e.ends[st.id] == [(1, "budget"), (1, "budget")]
    segment_prefills = [p for p in e.prefills if p[0] == "segment"]
    assert segment_prefills[0][2:] == (100, None, False)
    # segment 1: prompt 100..110, frames f0..f3 fed, f4 cut -> the next prompt starts at 114 with f4 in its closing
    assert segment_prefills[1][2] == 114 and segment_prefills[1][3].cut_frame == "f4"
    assert st.position == 114 + 10 + 4


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_end_of_speech_is_seen_one_step_late_and_the_extra_frame_dropped(second):
    s = Scheduler(max_running=2, max_queued=0, max_len=4096)
    e = FakeEngine(s, end_after={1: 3}, second_frame=second)
    st = s.open("x", frame_budget=50)
    e.prefill_all()
    s.say(st, Segment(1, "Hi."))
    e.run()
    assert [f for _, f in e.emitted[st.id]] == ["f0", "f1", "f2"]  # nothing after the end
    assert e.ends[st.id] == [(1, "end")]
    assert st.position == 100 + 10 + 3 and st.closing.cut_frame is None and st.phase is Phase.IDLE


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_streams_join_and_leave_the_batch_independently(second):
    s = Scheduler(max_running=3, max_queued=0, max_len=4096)
    e = FakeEngine(s, end_after={1: 2, 2: 6}, second_frame=second)
    a, b = s.open("a", 20), s.open("b", 20)
    e.prefill_all()
    s.say(a, Segment(1, "short"))
    s.say(b, Segment(1, "longer"))
    e.prefill_all()
    sizes = []
    for _ in range(3):
        e.step()
        sizes.append(len(s.decode_batch()))
    c = s.open("c", 4)  # joins mid-flight
    e.prefill_all()
    s.say(c, Segment(1, "late"))
    e.run()
    assert sizes[0] == 2 and 1 in sizes  # a left after its end, b kept going
    assert len(e.emitted[a.id]) == 2 and len(e.emitted[b.id]) == 6 and len(e.emitted[c.id]) == 4


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_cancel_while_decoding_rolls_the_context_back_to_before_the_turn(second):
    s = Scheduler(max_running=2, max_queued=0, max_len=4096)
    e = FakeEngine(s, second_frame=second)
    st = s.open("x", 100)
    e.prefill_all()
    s.say(st, Segment(1, "Turn one."))
    e.run(max_steps=2000)
    after_turn_one = (st.position, st.closing)
    s.say(st, Segment(2, "Turn two, interrupted."))
    s.say(st, Segment(2, "Its second segment."))
    e.prefill_all()
    e.step()
    e.step()
    s.cancel(st)
    assert st.phase is Phase.IDLE and not st.segments and not s.decode_batch()
    assert (st.position, st.closing) == after_turn_one
    emitted = len(e.emitted[st.id])
    e.step()  # the in-flight step is read: its frame is dropped
    assert len(e.emitted[st.id]) == emitted and st.inflight == 0
    s.say(st, Segment(3, "Turn three."))
    e.run(max_steps=2000)
    assert e.emitted[st.id][-1][0] == 3


def test_a_quick_voice_goes_before_segments_and_a_slow_one_after():
    s = Scheduler(max_running=3, max_queued=0, max_len=4096)
    talking = s.open("talking", 10)
    s.voice_done(s.next_prefill().stream, 100)
    cached, uncached = s.open("cached", 10), s.open("uncached", 10)
    s.say(talking, Segment(1, "Hello."))
    quick = lambda stream: stream.owner == "cached"  # noqa: E731
    assert [(w.kind, w.stream.owner) for w in s.next_prefills(4, quick)] == [("voice", "cached")]
    assert [(w.kind, w.stream.owner) for w in s.next_prefills(4, quick)] == [("segment", "talking")]
    assert [(w.kind, w.stream.owner) for w in s.next_prefills(4, quick)] == [("voice", "uncached")]
    assert cached.prefill_busy and uncached.prefill_busy


def test_cancel_while_the_segment_prefills():
    s = Scheduler(max_running=2, max_queued=0, max_len=4096)
    st = s.open("x", 10)
    work = s.next_prefill()
    s.voice_done(st, 100)
    s.say(st, Segment(1, "Hello."))
    work = s.next_prefill()  # the prefill thread took it
    s.cancel(st)
    assert st.cancel_pending
    assert s.segment_done(st, work, 10) is False  # lands cancelled: does not join the batch
    assert st.phase is Phase.IDLE and st.position == 100 and not s.decode_batch()


def test_text_said_after_a_cancel_that_lands_during_the_prefill_is_spoken():
    """Found by tests/test_fuzz_protocol.py: the next turn's segment sat in the stream's
    queue for ever (a `stop` after it never finished)."""
    s = Scheduler(max_running=2, max_queued=0, max_len=4096)
    st = s.open("x", 10)
    s.next_prefill()
    s.voice_done(st, 100)
    s.say(st, Segment(1, "Hello."))
    work = s.next_prefill()
    s.cancel(st)
    s.say(st, Segment(2, "Still here?"))
    assert s.segment_done(st, work, 10) is False
    work = s.next_prefill()
    assert work.segment.turn == 2 and work.start == 100


def _second_frame_pending(budget: int = 10):
    """A stream whose segment's first frame was read, the prefill thread still stepping
    it for its second: (scheduler, stream, the segment's prefill work)."""
    s = Scheduler(max_running=1, max_queued=1, max_len=4096)
    st = s.open("x", budget)
    assert s.next_prefill().kind == "voice"
    s.voice_done(st, 100)
    s.say(st, Segment(1, "Hello."))
    work = s.next_prefill()
    assert s.segment_done(st, work, 10, second_frame=True)
    assert s.frame(st, work.segment.id, "f0", False).emit
    return s, st, work


def test_a_stream_being_stepped_by_the_prefill_thread_is_left_out_of_the_decode_batch():
    s, st, work = _second_frame_pending()
    assert st.phase is Phase.DECODING and s.decode_batch() == []  # the slot's state is being written
    assert s.frame(st, work.segment.id, "f1", False).emit
    s.second_frame_done(st)
    assert s.decode_batch() == [st] and st.steps == 1  # the next decode step makes f2 at P0 + 1
    s.step_launched([st])
    assert st.prompt_end + st.steps == 112


def test_close_while_the_prefill_thread_steps_a_stream_holds_its_slot_until_it_is_done():
    s, st, work = _second_frame_pending()
    queued = s.open("y", 10)
    s.close(st)
    assert st.phase is not Phase.CLOSED and queued.phase is Phase.QUEUED  # the GPU still writes the slot
    assert not s.frame(st, work.segment.id, "f1", False).emit
    s.second_frame_done(st)
    assert st.phase is Phase.CLOSED and queued.slot == 0


def test_cancel_while_the_prefill_thread_steps_a_stream():
    s, st, work = _second_frame_pending()
    s.cancel(st)
    assert st.phase is Phase.IDLE and st.position == 100  # rolled back to before the turn
    s.say(st, Segment(2, "Next turn."))
    assert s.next_prefill() is None  # not while the slot's state is being written
    assert not s.frame(st, work.segment.id, "f1", False).emit
    s.second_frame_done(st)
    work = s.next_prefill()
    assert work.segment.turn == 2 and work.start == 100


def test_a_one_frame_segment_drops_the_prefill_threads_second_frame():
    s, st, work = _second_frame_pending(budget=1)
    # f0 used the whole budget: the segment ended with f0 as its cut frame
    assert st.phase is Phase.IDLE and st.position == 110 and st.closing.cut_frame == "f0"
    assert not s.frame(st, work.segment.id, "f1", False).emit
    s.second_frame_done(st)
    assert s.decode_batch() == [] and st.phase is Phase.IDLE


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_close_releases_the_slot_only_after_in_flight_steps_are_read(second):
    s = Scheduler(max_running=1, max_queued=1, max_len=4096)
    e = FakeEngine(s, second_frame=second)
    a = s.open("a", 100)
    b = s.open("b", 100)
    e.prefill_all()
    s.say(a, Segment(1, "Talking."))
    e.prefill_all()
    e.step()  # launched, not read
    s.close(a)
    assert a.phase is not Phase.CLOSED and b.phase is Phase.QUEUED  # step in flight: slot still held
    e.step()  # reads it
    assert a.phase is Phase.CLOSED and b.slot == 0 and b.phase is Phase.PREFILLING


def test_context_restarts_from_the_voice_prefix_when_full():
    s = Scheduler(max_running=1, max_queued=0, max_len=400)
    e = FakeEngine(s, prompt_len=20)
    st = s.open("x", 100)
    e.prefill_all()
    for turn in range(1, 5):
        s.say(st, Segment(turn, "A sentence of moderate length here."))
        e.run(max_steps=2000)
    restarts = [p for p in e.prefills if p[0] == "segment" and p[4]]
    assert restarts and all(p[2] == 100 and p[3] is None for p in restarts)
    assert st.position <= 400


@pytest.mark.parametrize("second", [False, True], ids=["f1-decoded", "f1-prefilled"])
def test_a_model_that_never_stops_is_cut_at_the_end_of_its_context(second):
    """A segment's frames need KV positions after its prompt; a model that never says
    end-of-speech (untrained, or sampling gone astray) is cut where the KV ends, with
    reason "context", and no step is launched that would write past it (the service
    crashed with an IndexError at position max_len before this bound existed)."""
    max_len = 160
    s = Scheduler(max_running=1, max_queued=0, max_len=max_len)
    e = FakeEngine(s, prompt_len=10, second_frame=second)
    st = s.open("x", frame_budget=1024)  # the service's default budget, far past the KV
    e.prefill_all()
    s.say(st, Segment(1, "Hi."))  # room_needed is small: the prompt starts at 100
    positions = []
    original = s.step_launched

    def launched(batch):
        positions.extend(b.prompt_end + b.steps for b in batch)  # step k feeds at P0 + k - 1
        return original(batch)

    s.step_launched = launched
    e.run()
    assert e.ends[st.id] == [(1, "context")]
    assert len(e.emitted[st.id]) == max_len - 110 + 1  # m frames need positions up to P0 + m - 2
    assert max(positions) == max_len - 1
    # the next segment no longer fits after this one: it restarts from the voice prefix
    s.say(st, Segment(2, "Again."))
    e.run()
    assert e.prefills[-1][2:] == (100, None, True)


def test_each_segment_can_start_from_the_voice_prefix():
    s = Scheduler(max_running=1, max_queued=0, max_len=4096)
    e = FakeEngine(s)
    st = s.open("x", 5, reset_context_each_segment=True)
    e.prefill_all()
    s.say(st, Segment(1, "One."))
    s.say(st, Segment(1, "Two."))
    e.run()
    starts = [p[2] for p in e.prefills if p[0] == "segment"]
    assert starts == [100, 100]


def test_serial_mode_speaks_one_utterance_at_a_time():
    s = Scheduler(max_running=3, max_queued=0, max_len=4096, serial=True)
    e = FakeEngine(s)
    a, b = s.open("a", 4), s.open("b", 4)
    e.prefill_all()
    s.say(a, Segment(1, "First."))
    s.say(b, Segment(1, "Second."))
    e.prefill_all()
    assert a.phase is Phase.DECODING and b.phase is Phase.PREFILLING  # b waits until a is done
    while a.phase is Phase.DECODING:
        assert len(s.decode_batch()) <= 1
        e.step()
    e.run()
    assert len(e.emitted[a.id]) == 4 and len(e.emitted[b.id]) == 4
