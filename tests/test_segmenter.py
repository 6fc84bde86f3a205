"""Text segmentation of streamed text (whole sentences or LLM token pieces)."""

from __future__ import annotations

import pytest

from realtime.segmenter import TextSegmenter

STORY = ("Once upon a time, in a quiet village by the sea, there lived an old fisherman. "
         "Every morning he walked to the harbour; the gulls followed him. Did he mind? Not at all! "
         "He paid 3.50 dollars for coffee, e.g. at the corner shop, and smiled.")


def feed(seg, pieces):
    out = []
    for p in pieces:
        out += seg.push(p)
    return out, seg.flush()


def tokens(text, size=3):
    """LLM-like pieces: fragments of words, spaces wherever they fall."""
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_piece_size_does_not_change_the_segments(size):
    ref = feed(TextSegmenter(200, 20, "normal"), [STORY])
    assert feed(TextSegmenter(200, 20, "normal"), tokens(STORY, size)) == ref


def test_balanced_cuts_the_first_segment_early_at_a_clause():
    early, rest = feed(TextSegmenter(200, 20, "balanced"), tokens(STORY))
    assert early[0] == "Once upon a time, in a quiet village by the sea,"
    assert early[1] == "there lived an old fisherman."
    # later segments end at sentences only; the abbreviation and the decimal are no ends
    assert any(s.startswith("He paid 3.50 dollars for coffee, e.g. at the corner shop") for s in early + rest)
    assert "".join(early + rest).replace(" ", "") == STORY.replace(" ", "")


def test_normal_groups_sentences_up_to_chunk_length():
    segs = sum(feed(TextSegmenter(100, 20, "normal"), tokens(STORY)), [])
    assert all(len(s) <= 100 for s in segs) and len(segs) >= 3
    assert all(s[-1] in ".!?" for s in segs)


def test_short_sentences_wait_for_min_chunk_length_until_flush():
    seg = TextSegmenter(200, 30, "balanced")
    assert seg.push("Hi. Yes. ") == []
    assert seg.push("This sentence is long enough to go. ") == ["Hi. Yes. This sentence is long enough to go."]
    assert seg.push("Ok.") == [] and seg.flush() == ["Ok."]
    assert seg.flush() == []


def test_text_without_boundaries_is_cut_at_chunk_length():
    seg = TextSegmenter(100, 10, "normal")
    out = seg.push("word " * 60)
    assert out and all(len(s) <= 100 for s in out) and all(not s.endswith(" wo") for s in out)
    chinese = TextSegmenter(100, 10, "normal").push("没有标点的长文本" * 20)
    assert chinese and len(chinese[0]) == 100


def test_cjk_sentence_ends_count_without_spaces():
    seg = TextSegmenter(200, 4, "balanced")
    assert seg.push("你好世界。今天天气很好") == ["你好世界。"]
    assert seg.flush() == ["今天天气很好"]


def test_clear_and_validation():
    seg = TextSegmenter(200, 10, "balanced")
    seg.push("Some buffered text")
    seg.clear()
    assert seg.buffered_chars == 0 and seg.flush() == []
    with pytest.raises(ValueError):
        TextSegmenter(100, 200, "normal")
    with pytest.raises(ValueError):
        TextSegmenter(100, 10, "fast")
