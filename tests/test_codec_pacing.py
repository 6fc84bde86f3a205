"""The codec worker's pacing alone (plain Python, a fake clock): which held frames go out
when, in which calls, as the worker drives it (hold, take what is due, report it sent)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.codec_pacing import BUSY_FIRST_FRAMES, CHUNKS, Pacer, chunk_sizes

FRAME_S = 0.125  # exact in binary, as the leads below are


@dataclass(frozen=True)
class F:
    slot: int
    turn: int
    i: int = 0  # which frame of the stream, for readable assertions


def pacer(**kw) -> tuple[Pacer, list[float]]:
    now = [0.0]
    return Pacer(FRAME_S, clock=lambda: now[0], **kw), now


def send(p: Pacer, *frames: F) -> list[F]:
    """Hold the frames, then do what the worker does: take the due ones and send them."""
    for f in frames:
        assert p.hold(f) == []
    due = p.take_due()
    if due:
        p.sent([list(chunk) for _, chunks in p.rounds(list(due)) for chunk in chunks])
    return due


def test_chunk_sizes_are_powers_of_two_up_to_the_largest_offered():
    assert CHUNKS == chunk_sizes(4) == (4, 2, 1)
    assert chunk_sizes(8) == (8, 4, 2, 1) and chunk_sizes(1) == (1,)
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="largest codec chunk"):
            chunk_sizes(bad)


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="first audio"):
        pacer(first_frames=3)
    with pytest.raises(ValueError, match="first audio"):
        pacer(max_chunk=2, first_frames=4)
    with pytest.raises(ValueError, match="busy_streams"):
        pacer(max_chunk=1, busy_streams=3)  # no two-frame chunk to wait for
    with pytest.raises(ValueError, match="busy_streams"):
        pacer(busy_streams=-1)


def test_frames_go_out_at_once_until_the_lead_passes_the_hold_then_four_at_a_time():
    p, now = pacer(hold_lead_s=0.4)
    s = [F(0, 1, i) for i in range(12)]
    for i in range(4):  # leads 0, 0.125, 0.25, 0.375 s before each: at most the hold, due
        assert send(p, s[i]) == [s[i]]
    assert p.deadline() is None  # nothing held
    assert send(p, s[4]) == []  # 0.5 s ahead: held for a full chunk, or until the lead is 0.4
    assert p.deadline() == pytest.approx(0.1)
    assert send(p, s[5]) == [] and send(p, s[6]) == []
    assert send(p, s[7]) == s[4:8]  # a full chunk goes out although still ahead
    assert send(p, s[8]) == [] and p.deadline() == pytest.approx(0.6)  # 1 s ahead
    now[0] += 0.59
    assert p.take_due() == [] and p.deadline() == pytest.approx(0.01)
    now[0] += 0.02
    assert p.deadline() == 0.0 and send(p) == [s[8]]  # the lead ran down: out alone


def test_without_a_hold_every_frame_is_due_at_once():
    p, _ = pacer(hold_lead_s=None)
    for i in range(6):
        assert send(p, F(0, 1, i)) == [F(0, 1, i)]
    assert p.deadline() is None


def test_a_backlog_goes_out_one_chunk_per_stream_a_round():
    p, _ = pacer(hold_lead_s=None)
    for i in range(9):
        p.hold(F(0, 1, i))
    p.hold(F(1, 1))
    assert p.take_due() == [F(0, 1, i) for i in range(4)] + [F(1, 1)]
    assert p.deadline() == 0.0  # the rest is still due: the worker looks at its queue first
    assert p.take_due() == [F(0, 1, i) for i in range(4, 8)]
    assert p.take_due() == [F(0, 1, 8)] and p.take_due() == [] and p.deadline() is None


def test_a_turns_first_audio_waits_for_first_frames():
    p, _ = pacer(first_frames=2)
    assert send(p, F(0, 1, 0)) == [] and p.deadline() is None  # no timer: the next frame comes by the queue
    assert send(p, F(0, 1, 1)) == [F(0, 1, 0), F(0, 1, 1)]
    assert send(p, F(0, 1, 2)) == [F(0, 1, 2)]  # 0.2 s ahead: later frames as usual
    p.ended(0)  # the segment ended: the next turn waits again
    assert send(p, F(0, 2, 0)) == []
    assert p.take([0]) == [F(0, 2, 0)]  # ... unless it ends first (the worker flushes it)


def test_a_busy_pacer_starts_turns_on_two_frames():
    p, _ = pacer(busy_streams=3)
    for slot in range(3):  # 0, 1, 2 start while fewer than 3 streams speak: one frame
        assert p.first_frames_now() == 1 and send(p, F(slot, 1)) == [F(slot, 1)]
    assert p.first_frames_now() == BUSY_FIRST_FRAMES == 2
    assert send(p, F(3, 1, 0)) == [] and send(p, F(3, 1, 1)) == [F(3, 1, 0), F(3, 1, 1)]
    for slot in range(3):
        p.ended(slot)
    assert p.first_frames_now() == 1 and send(p, F(0, 2)) == [F(0, 2)]


def test_a_new_turn_hands_back_the_previous_turns_frames_first():
    p, _ = pacer(first_frames=2)
    p.hold(F(0, 1, 0))
    assert p.hold(F(0, 2, 0)) == [F(0, 1, 0)]  # the worker decodes these before the new turn's
    assert p.held == {0: [F(0, 2, 0)]}


def test_rounds_take_each_streams_next_chunk_smallest_calls_first():
    p, _ = pacer()
    run = [F(0, 1, i) for i in range(7)] + [F(1, 1)] + [F(2, 1, i) for i in range(2)]
    assert list(p.rounds(run)) == [
        (1, [[F(1, 1)]]),
        (2, [[F(2, 1, 0), F(2, 1, 1)]]),
        (4, [[F(0, 1, i) for i in range(4)]]),
        (2, [[F(0, 1, 4), F(0, 1, 5)]]),
        (1, [[F(0, 1, 6)]]),
    ]
    streams = [F(s, 1, i) for i in range(4) for s in (3, 1)]  # two streams' frames interleaved
    assert list(p.rounds(streams)) == [(4, [[F(3, 1, i) for i in range(4)], [F(1, 1, i) for i in range(4)]])]


def test_a_lead_counts_the_current_turns_frames_from_its_first_audio():
    p, now = pacer()
    p.sent([[F(0, 1, 0), F(0, 1, 1)]])
    assert p.leads[0].turn == 1 and p.leads[0].frames == 2 and p.leads[0].started == 0.0
    now[0] += 1.0
    p.sent([[F(0, 1, 2), F(0, 2, 0)]])  # a chunk across a turn switch starts the new turn's lead
    assert (p.leads[0].turn, p.leads[0].frames, p.leads[0].started) == (2, 1, 1.0)
