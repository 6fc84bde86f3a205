"""Word timestamps (issue 51): which word of a segment's text each frame speaks.

A segment's words are the whitespace-separated pieces of the text Engine.say() received.
Each maps to a span of the segment's text tokens (the prompt's tokens of the normalized
text). An aligner per segment turns what each frame attends to into a monotonic path over
those tokens, hence word start/end frames; the engine hands finished words (WordTiming)
to the stream, which releases each one to its sink once the audio up to its end has been
delivered (WordClock).

Times: frame k of a segment is the audio [k hop + L, (k + 1) hop + L) of that segment, L
the codec's lookahead in samples (engine/codec/streaming.py: a segment's audio is its
frames' L samples later, then drained at its end, n hop + L in all); a turn's segments
follow each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.text import normalize_text


@dataclass(frozen=True, slots=True)
class WordTiming:
    index: int  # the word's place in its turn, from 0; the segments of one turn continue the count
    text: str  # the word as Engine.say() received it (punctuation kept)
    start: float  # seconds from the turn's first audio sample (the engine's audio)
    end: float


def word_token_spans(text: str, encode: Callable[[str], list[int]]) -> tuple[list[str], list[tuple[int, int]], int]:
    """The whitespace words of `text`, each one's [first, last + 1) among the tokens of
    normalize_text(text), and that token count. Each word's end is found in the normalized
    text (words normalize one by one as the whole does, spaces aside) and the tokens of the
    text up to there are counted, so BPE pieces that cross no space map exactly; a word that
    normalizes to nothing (an emoji) is an empty span where it stood."""
    words = text.split()
    norm = normalize_text(text)
    spans, cursor, count = [], 0, 0
    for word in words:
        piece = normalize_text(word)
        at = norm.find(piece, cursor) if piece else -1
        if at < 0:  # nothing to find: an empty span at the cursor
            spans.append((count, count))
            continue
        first = count if at == cursor else len(encode(norm[:at]))
        cursor = at + len(piece)
        count = len(encode(norm[:cursor]))
        spans.append((min(first, count), count))
    total = len(encode(norm)) if norm else 0
    return words, spans, total


class SegmentAligner:
    """One segment: frames in (each with its attention over the segment's text tokens, or
    None), word timings out as they complete. Placeholder estimator for now: a word's
    frames are the segment's frames in proportion to its characters, known at the end."""

    def __init__(self, words: list[str], spans: list[tuple[int, int]], n_tokens: int, first_index: int,
                 offset_samples: int, hop: int, lag: int, sample_rate: int) -> None:
        """`offset_samples`: where the segment's audio starts in its turn; `lag`: the codec's
        delay in samples (its lookahead, drained at the segment's end)."""
        self.words, self.spans, self.n_tokens = words, spans, n_tokens
        self.first_index = first_index
        self.offset, self.hop, self.lag, self.rate = offset_samples, hop, lag, sample_rate
        self.frames = 0
        self.done = False

    def frame(self, attention: np.ndarray | None) -> list[tuple[int, WordTiming]]:
        """One emitted frame; returns the words it completed as (end sample, timing)."""
        self.frames += 1
        return []

    def finish(self) -> list[tuple[int, WordTiming]]:
        """The segment ended: every word not handed out yet."""
        self.done = True
        lengths = np.array([max(1, len(w)) for w in self.words], dtype=np.float64)
        edges = np.concatenate([[0.0], np.cumsum(lengths)]) / lengths.sum() * self.frames
        return [self._timing(i, edges[i], edges[i + 1]) for i in range(len(self.words))]

    @property
    def end_sample(self) -> int:
        """The segment's audio, drained, in samples of its turn."""
        return self.offset + self.frames * self.hop + self.lag

    def _timing(self, i: int, start_frame: float, end_frame: float) -> tuple[int, WordTiming]:
        s = self.offset + round(start_frame * self.hop) + self.lag
        e = self.offset + round(end_frame * self.hop) + self.lag
        return e, WordTiming(self.first_index + i, self.words[i], s / self.rate, e / self.rate)


class WordClock:
    """A stream's finished words, released to its sink as their audio is delivered. Words
    are added by the prefill and decode threads and released on the codec thread (the one
    that calls on_audio), hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[int, int, WordTiming]] = []  # (turn, end sample, timing)
        self._delivered: dict[int, int] = {}  # turn -> its samples delivered so far

    def add(self, turn: int, words: list[tuple[int, WordTiming]]) -> None:
        if words:
            with self._lock:
                self._pending += [(turn, end, w) for end, w in words]

    def delivered(self, turn: int, samples: int) -> list[WordTiming]:
        """`samples` more of `turn`'s audio went out: the words now heard to their end."""
        with self._lock:
            total = self._delivered[turn] = self._delivered.get(turn, 0) + samples
            for old in [t for t in self._delivered if t < turn]:
                del self._delivered[old]
            return self._take(lambda t, end: t == turn and end <= total)

    def drop_below(self, turn: int) -> None:
        """Turns below `turn` were cancelled: their words are never sent."""
        with self._lock:
            self._take(lambda t, end: t < turn)

    def _take(self, due) -> list[WordTiming]:
        out = [w for t, end, w in self._pending if due(t, end)]
        if out:
            self._pending = [p for p in self._pending if not due(p[0], p[1])]
        return out
