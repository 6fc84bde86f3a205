"""The host side of word timestamps (engine/alignment.py), on made-up readouts: words map
to their tokens (byte-level and BPE-like tokenizers), the monotonic path gives each word
its first frame, a pause after a word is a gap, the last word ends with the segment, words
never reached share what is left, and the WordClock releases a word only once its audio
is out."""

from __future__ import annotations

import re

import numpy as np

from engine.alignment import ALIGN_TOKENS, MAX_ADVANCE, AlignHeads, SegmentAligner, WordClock, WordTiming, \
    word_token_spans

HOP, LAG, RATE = 1000, 250, 10_000  # 0.1 s frames, a 25 ms codec lag


def byte_encode(text: str) -> list[int]:
    return list(text.encode())


def bpe_encode(text: str) -> list[int]:
    """One token per space-led piece, as a GPT-style BPE splits words (a piece per word)."""
    return [hash(p) % 1000 for p in re.findall(r" ?[^ ]+| +", text)]


def test_words_map_to_their_tokens_with_either_tokenizer():
    words, spans, total = word_token_spans("Hi  there, big \U0001f600 world!", byte_encode)
    assert words == ["Hi", "there,", "big", "\U0001f600", "world!"] and total == len("Hi there, big world!")
    assert spans == [(0, 2), (3, 9), (10, 13), (13, 13), (14, 20)]
    words, spans, total = word_token_spans("Hi  there, big world!", bpe_encode)
    assert spans == [(0, 1), (1, 2), (2, 3), (3, 4)] and total == 4


def walk(text: str, path: list[int]) -> list[np.ndarray | None]:
    """Readouts whose argmax is path[k] (None for the two prefill frames)."""
    n = len(text.encode())
    rows = []
    for k, p in enumerate(path):
        row = np.full(ALIGN_TOKENS, 0.01, np.float32)
        row[p] = 1.0
        rows.append(None if k < 2 else row)
    return rows


def run(text: str, path: list[int]) -> tuple[list[tuple[int, WordTiming]], list[list]]:
    al = SegmentAligner(text, byte_encode, 0, 0, HOP, LAG, RATE)
    per_frame = [al.frame(a) for a in walk(text, path)]
    return [w for f in per_frame for w in f] + al.finish(), per_frame


def test_the_path_gives_each_word_its_first_frame_and_pauses_are_gaps():
    # "ab cd ef": a=0 b=1 ' '=2 c=3 d=4 ' '=5 e=6 f=7; the path dwells on ' ' (5) in a pause
    path = [0, 0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 6, 7, 8, 8, 8]
    out, per_frame = run("ab cd ef.", path)
    words = [w for _, w in out]
    assert [w.text for w in words] == ["ab", "cd", "ef.", "ef."] and [w.index for w in words] == [0, 1, 2, 2]
    t = lambda f: (f * HOP + LAG) / RATE  # noqa: E731
    assert words[0].start == t(0) and words[0].end == t(4)  # cd starts at frame 4
    assert words[1].start == t(4) and words[1].end == t(6 + 2)  # passed 'd' at frame 6: ends 2 frames on
    # the last one: sent 2 frames after the path passed 'f' (at frame 13, onto '.'), then
    # corrected to end with the segment (same index)
    assert words[2].start == t(11) and words[2].end == t(15)
    assert words[3].index == 2 and words[3].start == t(11) and words[3].end == t(len(path))
    # each word is handed out at the frame that settles its end, never earlier than that frame
    sent = [[w.index for _, w in f] for f in per_frame]
    assert sent.index([0]) == 4 and sent.index([1]) == 7 and sent.index([2]) == 14
    assert all(end == round(w.end * RATE) for end, w in out)


def test_the_path_never_goes_back_nor_jumps_too_far():
    text = "one two three four five"
    # frame 3 looks back at 0, frame 4 far ahead (18, out of reach): the path holds; the
    # last frame's peak is MAX_ADVANCE ahead, as far as a frame may move
    path = [0, 0, 4, 0, 18, 5, 6, 8, 8 + MAX_ADVANCE]
    out, _ = run(text, path)
    al = SegmentAligner(text, byte_encode, 0, 0, HOP, LAG, RATE)
    positions = []
    for a in walk(text, path):
        al.frame(a)
        positions.append(al.pos)
    assert positions == [0, 0, 4, 4, 4, 5, 6, 8, 8 + MAX_ADVANCE]
    words = [w for _, w in out]
    assert all(a.start < a.end <= b.start for a, b in zip(words, words[1:])), words


def test_words_skipped_in_one_frame_share_it_and_words_never_reached_share_the_rest():
    out, _ = run("a b c dd ee ff gg", [0, 0, 2, 6, 6])  # frame 3 reaches 'c' and 'dd' at once
    words = [w for _, w in out]
    assert [w.index for w in words] == list(range(7))
    assert all(w.start < w.end for w in words) and all(a.end <= b.start for a, b in zip(words, words[1:]))
    assert words[2].start == (3 * HOP + LAG) / RATE and words[3].start == (3.5 * HOP + LAG) / RATE
    assert words[-1].end == (5 * HOP + LAG) / RATE  # 'ee ff gg' never reached: squeezed into the last frames


def test_without_any_readout_words_spread_over_the_frames_by_characters():
    al = SegmentAligner("aaaa b cc", byte_encode, 5, 20_000, HOP, LAG, RATE)
    assert all(al.frame(None) == [] for _ in range(10))
    words = [w for _, w in al.finish()]
    assert [w.index for w in words] == [5, 6, 7]
    ends = [(w.end * RATE - 20_000 - LAG) / HOP for w in words]
    assert np.allclose(ends, [10 * 4 / 7, 10 * 5 / 7, 10], atol=1e-3)
    assert al.end_sample == 20_000 + 10 * HOP + LAG


def test_the_clock_releases_words_once_their_audio_is_out_and_drops_cancelled_turns():
    clock = WordClock()
    w = [WordTiming(i, f"w{i}", i / 10, (i + 1) / 10) for i in range(3)]
    clock.add(1, [(round(x.end * RATE), x) for x in w])
    assert clock.delivered(1, 999) == []
    assert clock.delivered(1, 1) == [w[0]]
    assert clock.delivered(1, 2000) == [w[1], w[2]]
    clock.add(2, [(1000, w[0])])
    clock.add(3, [(1000, w[1])])
    clock.drop_below(3)
    assert clock.delivered(2, 5000) == [] and clock.delivered(3, 5000) == [w[1]]


def test_heads_come_from_the_model_folder_or_the_fallback(tmp_path):
    (tmp_path / "alignment_heads.json").write_text('{"heads": [[1, 2], [0, 0]]}')
    assert AlignHeads.for_model(tmp_path, 4, 4).heads == ((1, 2), (0, 0))
    assert AlignHeads.for_model(tmp_path / "none", 6, 3).heads == ((3, 0), (3, 1), (3, 2))
    assert AlignHeads.for_model("tiny", 2, 2).heads == ((1, 0), (1, 1))
