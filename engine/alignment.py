"""Word timestamps (issue 51): which word of a segment's text each frame speaks.

A segment's words are the whitespace-separated pieces of the text Engine.say() received.
Each maps to a span of the segment's text tokens (the prompt's tokens of the normalized
text). Inside every decode step (CUDA graph included, no host sync), the chosen heads of
the slow transformer read their attention over each row's text span (AlignProbe,
kernels/text_attention.py; the span is device state set at the segment's prefill), and
the host reads it with the step's frames. An aligner per segment turns it into a
monotonic path over the tokens, hence word start/end frames; the engine hands finished
words (WordTiming) to the stream, which releases each one to its sink once the audio up
to its end has been delivered (WordClock). The heads are the model's (AlignHeads).

Times: frame k of a segment is the audio [k hop + L, (k + 1) hop + L) of that segment, L
the codec's lookahead in samples (engine/codec/streaming.py: a segment's audio is its
frames' L samples later, then drained at its end, n hop + L in all); a turn's segments
follow each other.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from engine.text import normalize_text
from kernels.text_attention import text_attention, text_attention_reference

# text tokens of a segment the readout reads (a segment's first 256: ~200 characters with the
# default voice's byte-level tokenizer, ~1,000 with a BPE one); words past them are spread
# over the segment's remaining frames at its end
ALIGN_TOKENS = 256
HEADS_FILE = "alignment_heads.json"  # beside a checkpoint's config.json


@dataclass(frozen=True, slots=True)
class WordTiming:
    index: int  # the word's place in its turn, from 0; the segments of one turn continue the count
    text: str  # the word as Engine.say() received it (punctuation kept)
    start: float  # seconds from the turn's first audio sample (the engine's audio)
    end: float


@dataclass(frozen=True, slots=True)
class AlignHeads:
    """The (layer, query head) pairs whose attention over the text is read each step."""

    heads: tuple[tuple[int, int], ...]
    source: str  # the heads file, or the fallback rule

    @classmethod
    def for_model(cls, folder: str | Path | None, n_layer: int, n_head: int) -> "AlignHeads":
        """The heads recorded beside the checkpoint (`alignment_heads.json`: {"heads":
        [[layer, head], ...]}), else the fallback: every head of the middle layer (without
        a calibration the monotonic heads are unknown; on the default voice that layer's
        average gives a median word-start error of 49 ms against its chosen heads' 25)."""
        path = Path(folder) / HEADS_FILE if folder is not None else None
        if path is not None and path.is_file():
            heads = tuple((int(layer), int(head)) for layer, head in json.loads(path.read_text())["heads"])
            if not heads or any(not (0 <= layer < n_layer and 0 <= head < n_head) for layer, head in heads):
                raise ValueError(f"{path}: heads must be [layer, head] pairs within {n_layer} layers x {n_head} heads")
            return cls(heads, str(path))
        return cls(tuple((n_layer // 2, h) for h in range(n_head)), f"fallback: every head of layer {n_layer // 2}")


class AlignProbe:
    """One decode step's readout (DecodeMeta.align): each selected layer's attention, as it
    runs, adds its heads' text softmaxes (kernels/text_attention.py) into `out` [B, T], the
    step's extra output that the host reads with its frames. Built per step (and per graph
    capture), so no state survives a step but `out`."""

    def __init__(self, by_module: dict[int, Tensor], slots: Tensor, spans: Tensor, page_table: Tensor, out: Tensor,
                 kernel: bool, pdl: bool) -> None:
        self.by_module, self.slots, self.spans, self.page_table, self.out = by_module, slots, spans, page_table, out
        self.kernel, self.pdl = kernel, pdl
        self.first = True

    def read(self, attention: torch.nn.Module, q: Tensor, k_cache: Tensor) -> None:
        """q [B, 1, H, D] of a layer whose keys are in k_cache; nothing unless it is selected."""
        heads = self.by_module.get(id(attention))
        if heads is None:
            return
        q = q[:, 0]
        args = (q, k_cache, self.page_table, self.slots, self.spans, heads, self.out.shape[1])
        if self.kernel and k_cache.dtype != torch.uint8:
            probs = text_attention(*args, pdl=self.pdl)
        else:
            probs = text_attention_reference(*args)
        if self.first:
            torch.sum(probs, 1, out=self.out)
            self.first = False
        else:
            self.out.add_(probs.sum(1))


def word_token_spans(text: str, encode: Callable[[str], list[int]]) -> tuple[list[str], list[tuple[int, int]], int]:
    """The whitespace words of `text`, each one's [first, last + 1) among the tokens of
    normalize_text(text), and that token count. Each word is found in the normalized text
    (words normalize one by one as the whole does, spaces aside) and the tokens up to its
    start and end are counted: byte offsets for a byte-level tokenizer (one token a byte),
    else the encoding of the text up to there, so BPE pieces that cross no space map
    exactly (a space opening a piece joins the word after it). A word that normalizes to
    nothing (an emoji) is an empty span where it stood."""
    words = text.split()
    norm = normalize_text(text)
    total = len(encode(norm)) if norm else 0
    if total == len(norm.encode()):
        def count(prefix: str) -> int:
            return len(prefix.encode())
    else:
        def count(prefix: str) -> int:
            return len(encode(prefix)) if prefix else 0
    spans, cursor, end = [], 0, 0
    for word in words:
        piece = normalize_text(word)
        at = norm.find(piece, cursor) if piece else -1
        if at < 0:  # nothing to find: an empty span at the cursor
            spans.append((end, end))
            continue
        first = max(end, count(norm[:at].rstrip() if total != len(norm.encode()) else norm[:at]))
        cursor = at + len(piece)
        end = max(first, count(norm[:cursor]))
        spans.append((first, end))
    return words, spans, total


# the path moves at most this many text tokens a frame (a frame is 46 ms: ~1 character of
# speech at the default voice's rate, a fraction of a BPE token)
MAX_ADVANCE = 6
# a word ends this many frames after the path passed its last letter or digit, unless the
# next word starts before: a pause after it is then a gap, not part of the word
END_SLACK = 2


class SegmentAligner:
    """One segment: frames in, each with the readout's attention over the segment's text
    tokens (AlignProbe, summed over the chosen heads), word timings out as they complete.

    The path: each frame's text position is the argmax of its attention within
    MAX_ADVANCE tokens ahead of the last frame's (never backwards), from the first token
    (the prefill's frames, which have no readout, stay there). A word starts at the first
    frame whose position reaches its first token (words reached in the same frame share it
    in equal parts) and ends where the next one starts, or END_SLACK frames after the path
    passed its last letter, whichever is first; once that frame is seen its timing is
    final: the path is never revised. The last word ends with the segment (the attention
    reaches the text's end before its last syllables are spoken): it is sent END_SLACK
    frames after the path passed its last letter, ending there, and corrected (the same
    index, its end the segment's) when the segment ends. Words still open then end with it
    too; words the path never reached (a segment cut at its frame budget) share the frames
    after the last reached one's start by their characters. A segment without any readout
    (the readout off) is all such words."""

    def __init__(self, text: str, encode: Callable[[str], list[int]], first_index: int, offset_samples: int,
                 hop: int, lag: int, sample_rate: int) -> None:
        """`text` as say() got it, `encode` the tokenizer's; `offset_samples`: where the
        segment's audio starts in its turn; `lag`: the codec's delay in samples (its
        lookahead, drained at the segment's end)."""
        self.text, self.encode = text, encode
        self.words: list[str] | None = None  # with spans etc., made at the first readout (off the prefill's path)
        self.first_index = first_index
        self.offset, self.hop, self.lag, self.rate = offset_samples, hop, lag, sample_rate
        self.frames = 0
        self.pos = 0
        self.starts: list[float] = []  # start frame of the words reached so far
        self.passed: dict[int, int] = {}  # word -> the first frame past its last letter
        self.sent = 0  # words handed out (final)
        self.provisional: tuple[int, WordTiming] | None = None  # the last word, sent before its end was known
        self.readouts = 0

    def frame(self, attention: np.ndarray | None) -> list[tuple[int, WordTiming]]:
        """One emitted frame; returns the words it completed as (end sample, timing)."""
        k = self.frames
        self.frames += 1
        if attention is None and self.words is None:  # a prefill frame: the path stays on the first token
            return []
        if self.words is None and k > 0:  # the prefill frames before it reached what the first token starts
            self._prepare()
            self._reach(0)
        self._prepare()
        if attention is not None and self.n_tokens:
            self.readouts += 1
            ahead = attention[self.pos : min(self.n_tokens, self.pos + MAX_ADVANCE + 1)]
            if ahead.size:
                self.pos += int(np.argmax(ahead))
        self._reach(k)
        for i in range(self.sent, len(self.starts)):
            if i not in self.passed and self.pos > self.last_letter[i]:
                self.passed[i] = k
        out = []
        while self.sent < len(self.starts):
            i = self.sent
            slack = self.passed[i] + END_SLACK if i in self.passed and i + 1 < len(self.words) else None
            if i + 1 < len(self.starts):
                end = self.starts[i + 1] if slack is None else min(self.starts[i + 1], slack)
            elif slack is not None and self.frames >= slack:
                end = slack
            else:
                break
            out.append(self._timing(i, self.starts[i], end))
            self.sent += 1
        last = len(self.words) - 1
        if (self.sent == last < len(self.starts) and self.provisional is None and last in self.passed
                and self.frames >= self.passed[last] + END_SLACK):
            # the last word is spoken: sent now (a barge-in knows it was heard), its end
            # corrected at the segment's end
            self.provisional = self._timing(last, self.starts[last], self.passed[last] + END_SLACK)
            out.append(self.provisional)
        return out

    def finish(self) -> list[tuple[int, WordTiming]]:
        """The segment ended: every word not handed out yet."""
        self._prepare()
        n = self.frames
        starts = list(self.starts)
        if len(starts) < len(self.words):  # words never reached share what is left by their characters
            base = max(0, len(starts) - 1) if self.readouts else 0  # the last reached word shares too
            lo = starts[base] if base < len(starts) else 0.0
            share = [max(1, len(w)) for w in self.words[base:]]
            edges = lo + np.concatenate([[0.0], np.cumsum(share)]) / sum(share) * max(0.0, n - lo)
            starts = starts[:base] + [float(e) for e in edges[:-1]]
        out = []
        for i in range(self.sent, len(self.words)):
            end = starts[i + 1] if i + 1 < len(self.words) else n
            if i in self.passed and i + 1 < len(self.words):
                end = min(end, self.passed[i] + END_SLACK)
            timing = self._timing(i, starts[i], max(starts[i], min(end, n)))
            if timing != self.provisional:
                out.append(timing)
        self.sent = len(self.words)
        return out

    def _reach(self, k: int) -> None:
        """The words the path reached in frame k start there, in equal parts of it."""
        reached = len(self.starts)
        newly = 0
        while reached + newly < len(self.words) and self.spans[reached + newly][0] <= self.pos:
            newly += 1
        self.starts += [k + j / newly for j in range(newly)]

    def _prepare(self) -> None:
        if self.words is None:
            self.words, self.spans, n_tokens = word_token_spans(self.text, self.encode)
            self.n_tokens = min(n_tokens, ALIGN_TOKENS)
            # each word's last letter or digit token (its last token if it has none)
            self.last_letter = [a + max([i for i, ch in enumerate(_token_chars(w, b - a)) if ch.isalnum()]
                                        or [b - a - 1]) for w, (a, b) in zip(self.words, self.spans)]

    @property
    def end_sample(self) -> int:
        """The segment's audio, drained, in samples of its turn."""
        return self.offset + self.frames * self.hop + self.lag

    def _timing(self, i: int, start_frame: float, end_frame: float) -> tuple[int, WordTiming]:
        s = self.offset + round(start_frame * self.hop) + self.lag
        e = self.offset + round(end_frame * self.hop) + self.lag
        return e, WordTiming(self.first_index + i, self.words[i], s / self.rate, e / self.rate)


def _token_chars(word: str, tokens: int) -> str:
    """The word's characters, one per token where the tokenizer is byte-level (the
    default voice's); otherwise the word spread over its tokens (which one holds the last
    letter is then approximate)."""
    norm = normalize_text(word)
    if len(norm.encode()) == tokens:  # byte-level: one token a byte
        return "".join(ch * len(ch.encode()) for ch in norm)
    if tokens <= 0:
        return ""
    return "".join(norm[min(len(norm) - 1, i * len(norm) // tokens)] for i in range(tokens)) if norm else "x" * tokens


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
