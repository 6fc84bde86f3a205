"""Cuts streamed text into segments to speak.

Text arrives in pieces of any size (whole sentences, or LLM tokens: fragments of words,
with or without spaces). A segment is cut at a sentence end once it holds at least
`min_chunk_length` characters; in `balanced` latency mode the first segment of a turn may
also end at a clause boundary (comma, semicolon, colon, dash), so speech starts sooner.
In `low` mode (the hosted API's lowest latency) the first segment of a turn ends at the
first sentence or clause end past a few characters, else at the first word boundary past a
few words (either way no later than `balanced` would cut it): speech starts as soon as a
phrase is complete; later segments are cut as in `balanced`. In `normal` mode sentences are
grouped up to `chunk_length` characters, so segments are fewer and longer. Text with no
boundary is cut at a space (or anywhere, for scripts without spaces) once it reaches
`chunk_length`. `flush()` cuts everything buffered.

A Latin sentence end ('.', '!', '?') only counts once the next character is known to be
whitespace ("3.14" is no end), and not after a common abbreviation or an initial ("e.g.",
"Dr.", "J."); CJK/fullwidth ends count at once.
"""

from __future__ import annotations

import re

_SENTENCE = re.compile(r"[.!?\u2026\u061f\u0964][\"'\u201d\u2019)\]]*(?=\s)|[\u3002\uff01\uff1f][\u201d\u300d)\]]*")
# "e.g.", "Dr.", "J." and the like end with a period but rarely end a sentence.
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|mr|mrs|ms|dr|prof|st|jr|sr|no|fig|approx)|(?<![\w.])[a-z])\.$", re.I)
_CLAUSE = re.compile(r"[,;:\u2014\u2013][\"'\u201d\u2019)\]]*(?=\s)|[\uff0c\u3001\uff1b\uff1a]")
_SPACE = re.compile(r"\s")

LATENCIES = ("normal", "balanced", "low")
# `low`, a turn's first segment: the fewest characters before a sentence or clause end
# ("Sure thing," may go alone; "Okay," waits), and before a bare word boundary (about four
# words, ~1.5 s of speech at 15 characters/s: a phrase, not a word, opens the turn)
LOW_PUNCT_CHARS = 8
LOW_WORD_CHARS = 24


class TextSegmenter:
    def __init__(self, chunk_length: int = 200, min_chunk_length: int = 50, latency: str = "balanced") -> None:
        if not 0 <= min_chunk_length <= chunk_length:
            raise ValueError("min_chunk_length must be in [0, chunk_length]")
        if latency not in LATENCIES:
            raise ValueError(f"latency must be one of {', '.join(LATENCIES)}")
        self.chunk_length = chunk_length
        self.min_chunk_length = min_chunk_length
        self.latency = latency
        self._buffer = ""
        self._turn_started = False  # a segment of this turn was cut already

    @property
    def buffered_chars(self) -> int:
        return len(self._buffer)

    def push(self, text: str) -> list[str]:
        """Add text; return the segments that can be spoken now."""
        self._buffer += text
        out = []
        while (cut := self._next_cut()) is not None:
            out.append(self._take(cut))
        return [s for s in out if s]

    def flush(self) -> list[str]:
        """Everything buffered, as segments of at most chunk_length (at boundaries when
        possible); the next text starts a new turn."""
        out = []
        while len(self._buffer.strip()) > self.chunk_length:
            out.append(self._take(self._forced_cut(self.chunk_length)))
        out.append(self._take(len(self._buffer)))
        self._turn_started = False
        return [s for s in out if s]

    def clear(self) -> None:
        self._buffer = ""
        self._turn_started = False

    # --- cutting -------------------------------------------------------------------------

    def _take(self, cut: int) -> str:
        segment, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:].lstrip()
        if segment:
            self._turn_started = True
        return segment

    def _next_cut(self) -> int | None:
        text = self._buffer
        if self.latency == "low" and not self._turn_started and (cut := self._early_cut(text)) is not None:
            return cut
        ends = [m.end() for m in _SENTENCE.finditer(text)
                if self._long_enough(text, m.end()) and not _ABBREVIATION.search(text[: m.end()])]
        if self.latency != "normal":
            if ends:
                return ends[0]
            if not self._turn_started:
                clauses = [m.end() for m in _CLAUSE.finditer(text) if self._long_enough(text, m.end())]
                if clauses:
                    return clauses[0]
        else:
            fitting = [e for e in ends if len(text[:e].strip()) <= self.chunk_length]
            if fitting and len(text.strip()) >= self.chunk_length:
                return fitting[-1]
            if ends and not fitting:
                return ends[0]
        if len(text.strip()) > self.chunk_length:
            return self._forced_cut(self.chunk_length)
        return None

    def _long_enough(self, text: str, end: int, least: int | None = None) -> bool:
        return len(text[:end].strip()) >= max(1, self.min_chunk_length if least is None else least)

    def _early_cut(self, text: str) -> int | None:
        """`low`: the first sentence or clause end past LOW_PUNCT_CHARS, else the first
        word boundary past LOW_WORD_CHARS (both at most min_chunk_length, so `low` never
        cuts later than `balanced`)."""
        least = min(self.min_chunk_length, LOW_PUNCT_CHARS)
        ends = [m.end() for pattern in (_SENTENCE, _CLAUSE) for m in pattern.finditer(text)
                if self._long_enough(text, m.end(), least) and not _ABBREVIATION.search(text[: m.end()])]
        if ends:
            return min(ends)
        least = min(self.min_chunk_length, LOW_WORD_CHARS)
        return next((m.start() for m in _SPACE.finditer(text) if self._long_enough(text, m.start(), least)), None)

    def _forced_cut(self, limit: int) -> int:
        """Best cut at or before `limit` characters: a sentence end, a clause end, a
        space, or (no spaces, e.g. Chinese) the limit itself."""
        text = self._buffer
        head = text[: limit + 1]
        for pattern in (_SENTENCE, _CLAUSE):
            ends = [m.end() for m in pattern.finditer(head) if m.end() <= limit]
            if ends:
                return ends[-1]
        space = head.rfind(" ", 0, limit + 1)
        return space if space > 0 else limit
