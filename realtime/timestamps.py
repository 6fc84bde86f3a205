"""Word timestamps as the hosted Fish API sends them: the engine's word timings
(engine.WordTiming: seconds of a turn's engine audio) -> alignment snapshots on the timeline
of the audio the client received, for `WS /v1/tts/live/with-timestamp` and
`POST /v1/tts/stream/with-timestamp`.

What the public docs say, and what is matched here:
  https://docs.fish.audio/api-reference/endpoint/openapi-v1/text-to-speech-stream-with-timestamps
  (and its OpenAPI schema TTSTimestampStreamEvent in https://docs.fish.audio/api-reference/openapi.json)
  https://docs.fish.audio/api-reference/endpoint/openapi-v1/text-to-speech-live-with-timestamps
- each audio event has `content` (str: the text chunk the alignment describes),
  `alignment` ({segments: [{text, start, end}], audio_duration} or null), `chunk_seq` (int
  >= 0) and `chunk_audio_offset_sec` (number >= 0); times in seconds (floats).
- `alignment` is the cumulative snapshot of chunk `chunk_seq` (it replaces the previous
  one, never appends); null before the chunk's first snapshot. `start`/`end` are seconds
  from the chunk's start; `chunk_audio_offset_sec` is the chunk's start in the whole audio.
- `chunk_seq` and `chunk_audio_offset_sec` never decrease; an event may be labelled with a
  chunk while its bytes are the next chunk's audio.
- a trailing audio event with empty bytes may carry a final correction.
Where we chose:
- a text chunk is one segment the engine speaks (realtime/segmenter.py); `chunk_seq` counts
  them over the whole connection (0, 1, ...), across turns.
- the timeline is the decoded audio of every byte sent on the connection, all turns in a
  row (mp3: LAME's encoder delay included, as decoders play it). Times are after prosody
  `speed` and resampling, and a word is in a snapshot only once its audio has been sent
  (bytes held back for the 1,024-byte minimum, or inside a codec, are not heard yet).
- a segment's `text` is the word with its leading and trailing punctuation removed, as the
  docs' example shows (`long.` -> `long`); words of only punctuation are left out.
- `audio_duration` is the chunk's audio sent so far; once the next chunk has begun, up to
  its start; a turn's last chunk ends with the turn's audio (its encoder tail included).
- after a chunk's final snapshot, no event names an earlier chunk (chunk_seq never drops).
"""

from __future__ import annotations

import unicodedata
from collections import deque
from dataclasses import dataclass, field

ROUND = 4  # decimals of the seconds sent (0.1 ms)
NO_CHUNK = {"content": "", "alignment": None, "chunk_seq": 0, "chunk_audio_offset_sec": 0.0}


def display_word(word: str) -> str:
    """`Hello,` -> `Hello`; `"don't"` -> `don't`; `--` -> ``."""
    def is_mark(ch: str) -> bool:
        return unicodedata.category(ch)[0] in "PSZ"

    start, end = 0, len(word)
    while start < end and is_mark(word[start]):
        start += 1
    while end > start and is_mark(word[end - 1]):
        end -= 1
    return word[start:end]


@dataclass(slots=True)
class Word:
    """A word on the client's timeline: seconds from the start of its turn's audio."""

    index: int
    text: str
    start: float
    end: float

    def as_dict(self) -> dict:
        return {"text": self.text, "start": round(self.start, ROUND), "end": round(self.end, ROUND)}


@dataclass(slots=True)
class _Chunk:
    seq: int
    turn: int
    text: str
    first_word: int  # the turn's index of its first word
    n_words: int
    start: int | None = None  # encoder input samples (engine rate) where its audio begins
    end: int | None = None  # ... where it ends (its segment ended)
    final: bool = False  # its final snapshot was queued: no event names it any more
    sent: tuple | None = None  # the last snapshot sent, as compared: (segments, final duration)
    snapshot: dict | None = None  # the last snapshot sent (events may repeat it)


@dataclass(slots=True)
class _Turn:
    start: int | None = None  # encoder input samples where its first audio begins
    pos: int = 0  # encoder input samples after its last audio so far
    words: dict[int, object] = field(default_factory=dict)  # index -> engine WordTiming
    n_words: int = 0  # words of the segments handed to the engine so far
    ended: bool = False  # all its audio was sent (turn end, finish or cancel)
    cancelled: bool = False  # its unsent audio was dropped: only heard words count
    open: deque = field(default_factory=deque)  # its chunks whose segment has not ended, in order
    published: set[int] = field(default_factory=set)  # indices of its words in a snapshot sent


class Alignment:
    """One connection's text chunks, their audio and their words. Without `segment()`
    calls (the plain /v1/tts/live path) it only keeps each turn's audio position.

    The session tells it what it hands to the engine (`segment`), where each engine chunk
    of audio enters the encoder (`audio`), segment ends, the engine's words, and how much
    decoded audio the client has (`released`, seconds: AudioEncoder.released_samples);
    `take()` gives the fields of the next audio event, and of any empty audio events that
    must follow it, snapshots in chunk order."""

    def __init__(self, input_rate: int, output_rate: int, speed: float, decoder_delay: int) -> None:
        self.input_rate, self.output_rate, self.speed = input_rate, output_rate, speed
        self.delay_s = decoder_delay / output_rate
        self.chunks: list[_Chunk] = []
        self.turns: dict[int, _Turn] = {}
        self.released = 0.0  # seconds of decoded audio the client has, on its timeline
        self.out_shift = 0.0  # seconds of encoder output never sent (cancelled audio), in all
        self.in_offset = 0.0  # input seconds less encoder output seconds (the encoder started over)
        self._shifts: list[tuple[int, float]] = []  # (from encoder input sample, the two above summed)
        self._current = 0  # lowest chunk not final: what events are labelled with
        self._last_named: _Chunk | None = None  # the chunk of the last event
        self.closed = False  # every byte is sent (the last file flushed): all words count

    # --- what happens -----------------------------------------------------------------------

    def segment(self, turn: int, text: str) -> None:
        t = self.turns.setdefault(turn, _Turn())
        n = len(text.split())
        self.chunks.append(_Chunk(len(self.chunks), turn, text, t.n_words, n))
        t.open.append(self.chunks[-1])
        t.n_words += n

    def audio(self, turn: int, n: int, pos: int) -> None:
        """n engine samples of `turn` enter the encoder at input sample `pos`."""
        t = self.turns.setdefault(turn, _Turn())
        if t.start is None:
            t.start = pos
        if t.open and t.open[0].start is None:
            t.open[0].start = pos
        t.pos = pos + n

    def segment_end(self, turn: int) -> None:
        t = self.turns.get(turn)
        if t is not None and t.open:
            chunk = t.open.popleft()
            chunk.start = t.pos if chunk.start is None else chunk.start
            chunk.end = t.pos

    def words(self, turn: int, words) -> None:
        t = self.turns.get(turn)
        if t is not None and not t.ended:
            for w in words:  # a later WordTiming with the same index replaces the earlier
                t.words[w.index] = w

    def set_released(self, encoder_seconds: float) -> None:
        self.released = max(self.released, encoder_seconds - self.out_shift)

    def restart(self, pos: int, encoder_seconds: float) -> None:
        """Nothing of the file had been sent and the encoder started over
        (AudioEncoder.discard): the input from sample `pos` on plays from encoder_seconds."""
        self.in_offset = pos / self.input_rate / self.speed - encoder_seconds
        self._shifts.append((pos, self.in_offset + self.out_shift))

    def drop_unsent(self, encoder_seconds: float, pos: int) -> None:
        """Encoder output up to encoder_seconds was thrown away (cancel), its input from
        input sample `pos` on: the client's timeline goes on from what it has. Audio before
        `pos` keeps its times."""
        self.out_shift = encoder_seconds - self.released
        self._shifts.append((pos, self.in_offset + self.out_shift))

    def close(self) -> None:
        """The audio is complete (the encoder flushed): every word gets into its final
        snapshot, its end clamped to the audio's (atempo's output is ~10 ms early)."""
        self.closed = True
        for t in self.turns.values():
            t.ended = True

    def end_turn(self, turn: int, cancelled: bool = False) -> None:
        """All of the turn's audio is sent, or the rest dropped: its chunks get their final
        snapshots."""
        t = self.turns.setdefault(turn, _Turn())
        t.ended = True
        t.cancelled = t.cancelled or cancelled

    # --- times --------------------------------------------------------------------------------

    def _seconds(self, pos: float) -> float:
        """Encoder input sample -> seconds on the client's timeline."""
        shift = next((s for p, s in reversed(self._shifts) if pos >= p), 0.0)
        return pos / self.input_rate / self.speed + self.delay_s - shift

    def turn_words(self, turn: int, heard: bool = True) -> list[Word]:
        """The turn's words (`heard`: those whose audio the client has), in order; seconds
        from the turn's start."""
        t = self.turns.get(turn)
        if t is None or t.start is None:
            return []
        limit = self.released - self._seconds(t.start)  # the turn's audio the client has
        # a turn whose audio is all sent has all its words; atempo's output runs ~10 ms
        # early and holds its last ~40 ms until the file ends: ends are clamped to the audio
        sealed = self.closed or (t.ended and not t.cancelled)
        out = []
        for i in sorted(t.words):
            w = t.words[i]
            text = display_word(w.text)
            start, end = float(w.start) / self.speed, float(w.end) / self.speed  # numpy floats: JSON cannot
            if not text:
                continue
            if sealed or (heard and i in t.published):
                # sealed, or already in a snapshot (a snapshot only grows): a correction that
                # moves its end past the audio sent waits for that audio
                out.append(Word(i, text, min(start, limit), min(end, limit)))
            elif not heard or end <= limit + 1e-6:
                out.append(Word(i, text, start, end))
            else:
                break  # words are heard in order: the rest is not heard yet
        return out

    def seconds_since(self, turns: list[int]) -> float:
        """Seconds of audio the client has from the first of `turns` that has audio on (the
        turns a cancel drops are the last ones: their audio is all that came since)."""
        starts = [self.turns[t].start for t in turns if t in self.turns and self.turns[t].start is not None]
        return max(0.0, self.released - self._seconds(min(starts))) if starts else 0.0

    # --- snapshots ----------------------------------------------------------------------------

    def take(self, repeat: bool = True) -> list[tuple[int, dict]]:
        """(turn, fields) for the audio event about to be sent, then for each empty audio
        event that must follow it (more snapshots, in chunk order). With nothing new, the
        current chunk's latest snapshot again (`repeat`), as the docs allow (NO_CHUNK before
        any chunk was heard; turn None)."""
        pending = []
        while self._current < len(self.chunks):
            chunk = self.chunks[self._current]
            if chunk.start is None:
                if not self.turns[chunk.turn].ended:
                    break
                chunk.final = True  # a cancelled turn's segment that was never heard
                self._current += 1
                continue
            final = self._is_final(chunk)
            snap = self._snapshot(chunk, final)
            state = None if snap is None else (snap["segments"], snap["audio_duration"] if final else None)
            if snap is not None and state != chunk.sent:
                chunk.sent, chunk.snapshot = state, snap
                pending.append((chunk.turn, self._fields(chunk, snap)))
            if not final:
                break
            chunk.final = True
            self._current += 1
            self._forget(chunk)
        last = self._last_named
        if self.closed and last is not None and last.snapshot is not None \
                and all(c.start is None for c in self.chunks[last.seq + 1:]):
            # the encoder's last tail (flush) lengthens the audio of the last chunk heard only
            duration = round(max(0.0, self.released - self._seconds(last.start)), ROUND)
            if duration != last.snapshot["audio_duration"]:
                last.snapshot = last.snapshot | {"audio_duration": duration}
                pending.append((last.turn, self._fields(last, last.snapshot)))
        if not pending and repeat:
            label = self._label()
            # no chunk heard yet (a cancelled turn's encoder tail): the fields are required
            pending.append((label.turn, self._fields(label, label.snapshot)) if label else (None, dict(NO_CHUNK)))
        return pending

    def _forget(self, chunk: _Chunk) -> None:
        """A long connection keeps only what later events need: the text of the last final
        chunk (events may repeat it) and the words of turns not yet final."""
        older = self.chunks[chunk.seq - 1] if chunk.seq >= 1 else None
        if older is not None and older is not self._last_named:
            older.text, older.sent, older.snapshot = "", None, None
        t = self.turns[chunk.turn]
        if t.ended and not t.open and all(c.turn != chunk.turn for c in self.chunks[chunk.seq + 1:]):
            t.words.clear()
            t.published.clear()

    def _label(self) -> _Chunk | None:
        """The chunk events are labelled with when no snapshot is new: the current one if
        its audio began, else the last one an event named."""
        if self._current < len(self.chunks) and self.chunks[self._current].start is not None:
            return self.chunks[self._current]
        return self._last_named

    def _is_final(self, chunk: _Chunk) -> bool:
        """No word of the chunk will change: the audio is complete, or the turn was
        cancelled, or (the next chunk is being heard, or the turn ended) and every word
        of the chunk is heard."""
        t = self.turns[chunk.turn]
        if self.closed or t.cancelled:
            return True
        nxt = self.chunks[chunk.seq + 1] if chunk.seq + 1 < len(self.chunks) else None
        if nxt is not None and nxt.start is not None and nxt.turn == chunk.turn:
            done = self.released >= self._seconds(nxt.start) - 1e-6
        else:
            done = t.ended
        return done and (t.ended or len(self._words_of(chunk, heard=True)) == len(self._words_of(chunk, heard=False)))

    def _words_of(self, chunk: _Chunk, heard: bool) -> list[Word]:
        last = chunk.first_word + chunk.n_words
        # words past the last counted one (the engine split a segment differently) stay in it
        last_of_turn = all(c.turn != chunk.turn for c in self.chunks[chunk.seq + 1:])
        return [w for w in self.turn_words(chunk.turn, heard)
                if w.index >= chunk.first_word and (w.index < last or last_of_turn)]

    def _end_seconds(self, chunk: _Chunk) -> float:
        nxt = self.chunks[chunk.seq + 1] if chunk.seq + 1 < len(self.chunks) else None
        if nxt is not None and nxt.start is not None:
            return min(self.released, self._seconds(nxt.start))
        return self.released

    def _snapshot(self, chunk: _Chunk, final: bool) -> dict | None:
        offset = self._seconds(chunk.start)
        base = self._seconds(self.turns[chunk.turn].start) - offset  # the turn's start, from the chunk's
        words = self._words_of(chunk, heard=True)
        self.turns[chunk.turn].published.update(w.index for w in words)  # sent next, or already
        segments = [
            {"text": w.text, "start": round(base + w.start, ROUND), "end": round(base + w.end, ROUND)}
            for w in words
        ]
        if not segments and not final:
            return None
        return {"segments": segments, "audio_duration": round(max(0.0, self._end_seconds(chunk) - offset), ROUND)}

    def _fields(self, chunk: _Chunk, alignment: dict | None) -> dict:
        self._last_named = chunk
        return {
            "content": chunk.text, "alignment": alignment, "chunk_seq": chunk.seq,
            "chunk_audio_offset_sec": round(max(0.0, self._seconds(chunk.start)), ROUND),
        }
