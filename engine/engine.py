"""The serving engine: the scheduler, the runner and three worker threads.

- prefill thread: voice prefixes when a stream opens (a cached voice's pages are shared
  at once, ahead of waiting segments), text segments as they arrive; samples each
  segment's first frame, hands it to the codec, then makes its second frame (one frame
  step of the prefill's batch);
- decode thread: one batched step for every decoding stream, launched before the
  previous step is read (the host reads frames one step late);
- codec thread: code frames to PCM, batched across streams.

The public methods (open / say / cancel / close) are called from the service's event
loop; they only update the scheduler under a lock and wake the threads, never wait for
model work. Results go to each stream's sink from the worker threads; the sink must hand
them to its own thread (the service uses one mailbox per event loop, realtime/mailbox.py).

Word timestamps (StreamParams.word_timestamps, engine/alignment.py): every decode step
reads the chosen heads' attention over each row's text with its frames; the thread that
emits a frame aligns it, and the codec thread hands each word to the sink (on_words)
once the audio up to its end went out.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from engine.alignment import ALIGN_TOKENS, AlignHeads, SegmentAligner, WordClock, WordTiming
from engine.audio import AudioError, load_reference
from engine.bundle import ModelBundle
from engine.codec_worker import CodecWorker
from engine.gpu_errors import device_lost
from engine.kernel_plan import REFERENCE, build_plan
from engine.kv_sizing import plan_kv, wanted_running
from engine.pages import PagePool, VoiceCache, VoicePages
from engine.prompt import Reference, Voice
from engine.runner import MAX_PREFILL_BATCH, RowPages, Runner
from engine.sampling import SamplingParams
from engine.scheduler import FrameOutcome, PrefillWork, Refused, Scheduler, Segment, Stream
from engine.settings import BenchSettings, EngineConfig
from engine.timeshare import Phases
from engine.voice import LRUBytes, ReferenceInput, VoiceInput

log = logging.getLogger("engine")

__all__ = ["BenchSettings", "Engine", "EngineConfig", "EngineError", "EngineFailed", "Refused", "StreamParams",
           "StreamSink", "VoiceInput", "WordTiming"]


@dataclass(slots=True)
class StreamParams:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    frame_budget: int = 1024  # frames per segment (max_new_tokens)
    condition_on_previous: bool = True  # keep earlier segments in the context
    word_timestamps: bool = False  # the sink's on_words gets each word's timing (issue 51)


class StreamSink(Protocol):
    """Called from engine threads."""

    def on_ready(self, voice_cached: bool, prefill_ms: float) -> None: ...
    def on_audio(self, turn: int, pcm: np.ndarray) -> None: ...  # float32 at the codec rate
    def on_segment_end(self, turn: int, reason: str) -> None: ...  # "end" | "budget" | "context"
    def on_error(self, code: str, message: str) -> None: ...
    # only for streams with word_timestamps: the words finished or corrected since the last
    # call (a later one with the same index replaces it), once their audio is delivered
    def on_words(self, turn: int, words: list[WordTiming]) -> None: ...


class EngineError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class EngineFailed(Exception):
    """One of the engine's worker threads stopped: no stream can be served until a restart."""


class EngineStream:
    """The engine's handle of one stream; also the owner the codec worker reports to."""

    def __init__(self, voice: VoiceInput, params: StreamParams, sink: StreamSink) -> None:
        self.voice = voice
        self.params = params
        self.sink = sink
        self.closed = False
        self.segments = 0
        self.sched: Stream | None = None
        self.timing: dict[int, list[float]] = {}  # turn -> [say, prefill start, prefill end] (log_timing)
        self.latest_turn = 0  # highest turn handed to say()
        self.dropped_below = 0  # audio of turns below this was cancelled
        # word timestamps: the words waiting for their audio, the current segment's aligner
        # and each turn's (next word index, audio samples of its segments so far)
        self.clock = WordClock() if params.word_timestamps else None
        self.aligner: SegmentAligner | None = None
        self.aligner_turn = -1
        self.turn_words: dict[int, tuple[int, int]] = {}

    @functools.cached_property
    def voice_key(self) -> str:
        """The voice's content hash (VoiceInput.key hashes every reference's audio), made
        once: the prefill thread asks for it while ordering its work and again to prefill."""
        return self.voice.key

    def sampling_for_next_segment(self) -> SamplingParams:
        # a different noise stream per segment, still reproducible from the seed
        p = self.params.sampling
        self.segments += 1
        seed = (p.seed * 1_000_003 + self.segments * 7919) % 2**31
        return SamplingParams(p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.ras, seed, p.allow_end)

    def wanted(self, turn: int) -> bool:
        return not self.closed and turn >= self.dropped_below

    def drop_turns(self) -> None:
        """Every turn handed over so far is dropped: no more of its audio is delivered."""
        self.dropped_below = self.latest_turn + 1
        if self.clock is not None:
            self.clock.drop_below(self.dropped_below)

    # codec worker callbacks
    def audio(self, turn: int, pcm: np.ndarray) -> None:
        if self.wanted(turn):
            t = self.timing.pop(turn, None)
            if t is not None:
                now = time.perf_counter()
                log.info("turn %d: say->prefill %.1f ms, prefill %.1f ms, prefill->audio %.1f ms",
                         turn, 1000 * (t[1] - t[0]), 1000 * (t[2] - t[1]), 1000 * (now - t[2]))
            self.sink.on_audio(turn, pcm)
            self._words(turn, len(pcm))

    def segment_end(self, turn: int, reason: str) -> None:
        if self.wanted(turn):
            self._words(turn, 0)  # the segment's last words, before its end
            self.sink.on_segment_end(turn, reason)

    def _words(self, turn: int, samples: int) -> None:
        if self.clock is not None:
            words = self.clock.delivered(turn, samples)
            if words and self.wanted(turn):
                self.sink.on_words(turn, words)


def _error_of(e: Exception, step: str) -> tuple[str, str]:
    """(code, message) that the streams of a failed prefill or decode step hear. Out of
    device memory is `busy`, not `internal`: the allocation of this batch failed, the next
    one may fit, and the engine goes on (gpu_errors.device_lost is false for it)."""
    if isinstance(e, AudioError):
        return "bad_audio", str(e)
    if isinstance(e, torch.OutOfMemoryError):
        log.warning("%s ran out of device memory: %s", step, e)
        return "busy", f"the {step} ran out of device memory; try again"
    if isinstance(e, EngineError):
        return e.code, e.message
    log.exception("%s failed", step, exc_info=e)
    return "internal", f"{step} failed: {e}"


def cpu_threads_auto() -> int:
    """Half the cores this process may run on (EngineConfig.cpu_threads), at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


class Engine:
    def __init__(self, bundle: ModelBundle, config: EngineConfig | None = None) -> None:
        self.bundle = bundle
        self.config = config or EngineConfig()
        c, bench = self.config, self.config.bench
        naive = bench.naive  # the baseline: eager (no CUDA graphs), no pipelining, no holding
        plan = REFERENCE if c.reference_kernels else build_plan(
            bundle.model, bundle.device, bundle.dtype, c.kv_quant, gemv_on=bench.gemv and not naive,
            pdl_on=bench.pdl and not naive)
        # the codec's per-stream state first: the KV pool is sized from what memory is left
        self.codec = CodecWorker(bundle.codec, c.max_streams, max_batch=wanted_running(c, bundle.device),
                                 hold_lead_s=None if naive else c.codec_hold_lead_s,
                                 max_chunk=c.codec_max_chunk, first_frames=c.codec_first_frames,
                                 busy_streams=0 if naive else c.codec_busy_streams,
                                 kernels=False if c.reference_kernels else None)
        self.kv_plan = kv = plan_kv(c, bundle.config, bundle.device, bundle.dtype)
        running = kv.max_running
        # the word-timestamp readout runs for every stream (its cost does not depend on who
        # asks); only streams with word_timestamps align on the host
        mc = bundle.config
        self.align_heads = AlignHeads.for_model(bundle.name, mc.n_layer, mc.n_head) if bench.alignment else None
        self.runner = Runner(bundle, running, c.max_len, plan, streams=c.max_streams, pages=kv.pages,
                             page_size=kv.page_size, kv_quant=c.kv_quant, cuda_graphs=False if naive else None,
                             align_heads=self.align_heads)
        self.pool = PagePool(kv.pages, kv.page_size)
        self.voices = VoiceCache(self.pool, max(1, c.voice_cache_bytes // kv.page_bytes))
        self.sched = Scheduler(running, c.max_queued, self.runner.max_len, serial=naive, max_streams=c.max_streams,
                               pool=self.pool, voices=self.voices)
        log.info("KV: %d pages of %d positions (%.2f GiB), %d open streams, up to %d decoding", kv.pages - 1,
                 kv.page_size, kv.pool_bytes / 2**30, c.max_streams, running)
        self.codec.on_error = lambda owner, e: owner.sink.on_error("internal", f"audio decoding failed: {e}")
        # why the engine cannot serve (a worker thread stopped), None while it can: open()
        # refuses new streams with it, and the service's health check reports it
        self.failure: str | None = None
        self.codes_cache = LRUBytes(256 << 20, lambda t: t.numel() * t.element_size())
        self.im_end_id = bundle.config.im_end_id
        self.sample_rate = bundle.codec.sample_rate
        self.hop_length = bundle.codec.hop_length
        self._lock = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._guard(self._prefill_loop), name="prefill", daemon=True),
            threading.Thread(target=self._guard(self._decode_loop), name="decode", daemon=True),
        ]
        self.steps = 0
        self.frames = 0
        self.prefills = 0
        self.decode_rows = 0  # streams summed over decode steps (mean batch = rows / steps)
        # each worker thread's host time by phase (engine/timeshare.py)
        self.decode_phases = Phases("idle", "schedule", "launch", "wait", "emit")
        self.prefill_phases = Phases("idle", "voice", "segments")
        self.started_at = time.monotonic()
        self.warm = False  # set by start(): graphs captured (above), the codec warmed up, threads running

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> "Engine":
        if self.bundle.device.type == "cpu":  # before the engine's threads first run an op
            torch.set_num_threads(self.config.cpu_threads or cpu_threads_auto())
        self.codec.warm_up()
        self.codec.start(self._guard)
        for t in self._threads:
            t.start()
        self.warm = True
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        self.codec.stop()

    def _guard(self, loop):
        def run():
            try:
                loop()
            except Exception as e:  # a crashed worker must be loud, not silent
                log.exception("engine thread %s crashed", threading.current_thread().name)
                self._failed(threading.current_thread().name, e)  # (logged: not raised again)

        return run

    def _failed(self, thread: str, e: Exception) -> None:
        """A worker thread stopped: every open stream gets an error event now (none of them
        would hear anything again) and open() refuses new ones, instead of clients waiting
        forever on a service that still reports itself healthy."""
        with self._lock:
            if self.failure is None:
                self.failure = f"the engine's {thread} thread stopped ({type(e).__name__}: {e}); restart the service"
            owners = [s.owner for s in self.sched.streams.values()]
            self._lock.notify_all()
        for owner in owners:
            try:
                owner.sink.on_error("internal", self.failure)
            except Exception:  # one sink must not keep the others from hearing it
                log.exception("reporting the engine's failure to a stream failed")

    # --- public API (event loop) ------------------------------------------------------

    def open(self, voice: VoiceInput, params: StreamParams, sink: StreamSink) -> EngineStream:
        """Admit a stream and start prefilling its voice. Raises Refused when full and
        EngineFailed once a worker thread has stopped."""
        handle = EngineStream(voice, params, sink)
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            handle.sched = self.sched.open(handle, params.frame_budget, not params.condition_on_previous)
            self._lock.notify_all()
        return handle

    def say(self, handle: EngineStream, turn: int, text: str) -> None:
        if not text.strip():
            raise ValueError("say() needs text")
        if self.config.log_timing and turn not in handle.timing:
            handle.timing[turn] = [time.perf_counter()]
        with self._lock:
            handle.latest_turn = max(handle.latest_turn, turn)
            self.sched.say(handle.sched, Segment(turn, text))
            self._lock.notify_all()

    def cancel(self, handle: EngineStream) -> None:
        """Barge-in: drop every turn handed over so far; no more of their audio arrives
        (queued codec work for them is skipped)."""
        handle.drop_turns()
        with self._lock:
            self.sched.cancel(handle.sched)
            slot = handle.sched.slot
            self._lock.notify_all()
        if slot is not None:  # the audio the codec holds back is the dropped turns'
            self.codec.cut(slot)

    def close(self, handle: EngineStream) -> None:
        handle.closed = True
        with self._lock:
            self.sched.close(handle.sched)
            self._lock.notify_all()

    def can_open(self) -> bool:
        """Started, not failed, and open() would take one more stream now (admitted, or
        queued for KV pages) instead of refusing it."""
        with self._lock:
            return self.warm and self.failure is None and self.sched.can_open()

    def encode_references(self, refs: list[ReferenceInput]) -> list[torch.Tensor]:
        """Reference audio -> codes [C, frames] (blocking; call it off the event loop)."""
        return [self._reference_codes(r) for r in refs]

    def stats(self) -> dict:
        with self._lock:
            counts = self.sched.counts()
            pages = self.sched.page_counts()
            voices = (len(self.voices), self.voices.hits, self.voices.misses)
        return {
            **{f"streams_{k}": v for k, v in counts.items()},
            "max_streams": self.config.max_streams,
            "decode_max_batch": self.sched.max_running,
            "up": int(self.failure is None),  # 0 once a worker thread stopped (Engine.failure)
            "decode_steps": self.steps,
            "frames": self.frames,
            "prefills": self.prefills,
            "codec_queue": self.codec.depth(),
            # KV pages (engine/pages.py): the pool, in use, free, held by cached voices; idle
            # contexts taken back and segments cut for want of a page (counters)
            "kv_pages_total": pages["total"],
            "kv_pages_used": pages["used"],
            "kv_pages_free": pages["free"],
            "kv_pages_voice_cache": pages["voice_cache"],
            "kv_page_bytes": self.kv_plan.page_bytes,
            "kv_page_size": self.kv_plan.page_size,
            "kv_evicted_contexts": pages["evicted_contexts"],
            "kv_page_cuts": pages["page_cuts"],
            "voice_cache_entries": voices[0],
            "voice_cache_bytes": pages["voice_cache"] * self.kv_plan.page_bytes,
            "voice_cache_hits": voices[1],
            "voice_cache_misses": voices[2],
            # where the time goes (counters; latency_bench turns them into a level's shares)
            "decode_rows": self.decode_rows,
            "decode_gpu_seconds": round(self.runner.decode_gpu_s, 6),
            **self.decode_phases.snapshot("decode"),
            **self.prefill_phases.snapshot("prefill"),
            "codec_calls": self.codec.calls,
            "codec_frames": self.codec.frames_decoded,
            "codec_padded_frames": self.codec.frames_padded,
            "codec_gpu_seconds": round(self.codec.gpu_s, 6),
            **self.codec.phases.snapshot("codec"),
        }

    # --- prefill thread ---------------------------------------------------------------

    def _prefill_loop(self) -> None:
        limit = 1 if self.config.bench.naive else MAX_PREFILL_BATCH
        phases = self.prefill_phases
        while True:
            phases.to("idle")
            with self._lock:
                works = []
                while not self._stopping and not (works := self.sched.next_prefills(limit, self._voice_cached)):
                    self._lock.wait(0.5)
                if self._stopping:
                    return
            if works[0].kind == "voice":
                phases.to("voice")
                self._guarded(works[0], self._prefill_voice)
            else:
                phases.to("segments")
                self._prefill_segments(works)

    def _voice_cached(self, stream: Stream) -> bool:
        """The stream's voice prompt is in the voice cache: ready needs no device work (the
        scheduler takes such voices before segments). Called under the lock."""
        return stream.owner.voice_key in self.voices

    def _guarded(self, work: PrefillWork, fn) -> bool:
        """Run one stream's prefill step; a failure ends that stream's work with an error
        event and never the thread."""
        try:
            fn(work, work.stream.owner)
            return True
        except Exception as e:
            self._fail_work(work, e)
            if device_lost(e):
                raise  # the thread's guard: the engine stops serving (Engine._failed)
            return False

    def _fail_work(self, work: PrefillWork, e: Exception) -> None:
        handle: EngineStream = work.stream.owner
        code, message = _error_of(e, "prefill")
        with self._lock:
            self.sched.prefill_failed(work.stream)
            self._lock.notify_all()
        if not handle.closed:
            handle.sink.on_error(code, message)

    def _reference_codes(self, ref: ReferenceInput) -> torch.Tensor:
        if ref.codes is not None:
            return ref.codes
        key = ref.key()
        codes = self.codes_cache.get(key)
        if codes is None:
            codec = self.bundle.codec
            wav = load_reference(ref.audio, codec.sample_rate, max_seconds=self.config.max_reference_seconds)
            codes = self.runner.encode_audio(codec, wav)
            self.codes_cache.put(key, codes)
        return codes

    def _prefill_voice(self, work: PrefillWork, handle: EngineStream) -> None:
        t0 = time.perf_counter()
        stream = work.stream
        self.codec.reset(stream.slot)  # queued before any of this stream's frames
        with self._lock:  # a cached voice's pages are shared with the stream at once
            voice = self.voices.get(handle.voice_key)
            if voice is not None:
                self.sched.voice_done(stream, voice)
                self._lock.notify_all()
        cached = voice is not None
        if not cached:
            refs = [Reference(r.text, self._reference_codes(r)) for r in handle.voice.references]
            tokens = self.bundle.prompts.voice_prefix(Voice(refs))
            if tokens.shape[1] + 256 > self.runner.max_len:
                raise EngineError("too_large", f"the voice prompt ({tokens.shape[1]} tokens) leaves no room in the context")
            with self._lock:
                pages = self.sched.take_voice_pages(stream, tokens.shape[1])
            if pages is None:  # back in the voice queue until pages are freed
                return
            self.runner.prefill_prefix(stream.slot, tokens, pages)
            voice = VoicePages(tuple(pages), tokens.shape[1])
            with self._lock:
                self.voices.put(handle.voice_key, voice)
                self.sched.voice_done(stream, voice)
                self._lock.notify_all()
        self.prefills += 1
        if not handle.closed:
            handle.sink.on_ready(cached, (time.perf_counter() - t0) * 1000)

    def _segment_tokens(self, work: PrefillWork) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """The previous turn's closing (if any) + this segment's prompt, [1 + C, T], and
        where its text is: (row, first KV position, tokens up to ALIGN_TOKENS)."""
        prompts = self.bundle.prompts
        pieces = []
        if work.closing is not None:
            if work.closing.cut_frame is not None:
                pieces.append(torch.from_numpy(np.asarray(work.closing.cut_frame))[:, None])
            pieces.append(prompts.segment_end())
        pieces.append(prompts.segment(work.segment.text))
        tokens = torch.cat(pieces, dim=1)
        first, n = prompts.segment_text_span(pieces[-1])
        text_at = work.start + tokens.shape[1] - pieces[-1].shape[1] + first
        return tokens, (work.stream.slot, text_at, min(n, ALIGN_TOKENS))

    def _prefill_segments(self, works: list[PrefillWork]) -> None:
        """Prefill segments of several streams in one batch (one stream's bad segment is
        reported to it alone and left out of the batch)."""
        items = []
        for work in works:
            prepared = {}

            def prepare(work, handle, prepared=prepared):
                tokens, span = self._segment_tokens(work)
                self.runner.check_room(work.start, tokens.shape[1])
                with self._lock:  # the prompt and its first two frames' positions
                    if not self.sched.ensure_room(work.stream, work.start + tokens.shape[1] + 1):
                        raise EngineError("busy", "the KV cache is full: no room for this segment")
                    pages = list(work.stream.pages)
                prepared["item"] = (work, tokens, handle.sampling_for_next_segment(), pages, span)

            if self._guarded(work, prepare):
                items.append(prepared["item"])
        if not items:
            return
        rows = [RowPages(w.stream.slot, pages, w.copies) for w, _, _, pages, _ in items]
        spans = [span for *_, span in items] if self.align_heads is not None else []
        items = [item[:3] for item in items]
        timings = [w.stream.owner.timing.get(w.segment.turn) for w, _, _ in items]
        for t in timings:
            if t is not None:
                t.append(time.perf_counter())
        try:
            frames = self.runner.prefill_segments([(w.stream.slot, w.start, tok, p) for w, tok, p in items], rows,
                                                  spans)
        except Exception as e:  # the whole batch failed: every stream in it hears why
            for work, _, _ in items:
                self._fail_work(work, e)
            if device_lost(e):
                raise
            return
        for t in timings:
            if t is not None:
                t.append(time.perf_counter())
        if self.config.log_timing:
            t0 = next((t[-2] for t in timings if t is not None), None)
            log.info("prefill batch: %d segments, %d tokens at most, %.1f ms", len(items),
                     max(tok.shape[1] for _, tok, _ in items), 1000 * (time.perf_counter() - t0) if t0 else -1)
        self.prefills += len(items)
        emitted, joined = [], []
        second = self.config.bench.prefill_second_frame and not self.config.bench.naive
        with self._lock:
            for (work, tokens, _), frame in zip(items, frames):
                if self.sched.segment_done(work.stream, work, tokens.shape[1], second_frame=second):
                    is_end = int(frame[0]) == self.im_end_id
                    outcome = self.sched.frame(work.stream, work.segment.id, frame, is_end)
                    emitted.append((work.stream, work.segment.turn, frame, outcome, work.segment, None))
                    if second:
                        joined.append((work, work.start + tokens.shape[1]))
            self._lock.notify_all()
        self._emit(emitted)  # the first frames go to the codec before the second ones are made
        if joined:
            self._second_frames(joined)

    def _second_frames(self, joined: list[tuple[PrefillWork, int]]) -> None:
        """Each joined segment's second frame (work, its end position), made here on the
        prefill thread; the decode thread takes the streams over from the third frame."""
        streams = [work.stream for work, _ in joined]
        t0 = time.perf_counter()
        try:
            frames = self.runner.second_frames([s.slot for s in streams], [end for _, end in joined])
        except Exception as e:  # as a failed decode step: these streams lose their turns in progress
            with self._lock:
                for stream in streams:
                    self.sched.second_frame_done(stream)
            self._fail_decoding(streams, e)
            return
        if self.config.log_timing:
            log.info("second frames: %d segments, %.1f ms", len(streams), 1000 * (time.perf_counter() - t0))
        emitted = []
        with self._lock:
            for (work, _), frame in zip(joined, frames):
                outcome = self.sched.frame(work.stream, work.segment.id, frame, int(frame[0]) == self.im_end_id)
                self.sched.second_frame_done(work.stream)
                if outcome.emit or outcome.segment_done:
                    emitted.append((work.stream, work.segment.turn, frame, outcome, work.segment, None))
            self._lock.notify_all()
        self._emit(emitted)

    def _emit(self, emitted: list[tuple[Stream, int, np.ndarray, FrameOutcome, Segment | None, object]]) -> None:
        """Frames (stream, turn, frame, outcome, segment, alignment data) to the codec worker:
        the emitted ones as one queue item (one codec call for all of them), then the segment
        ends. Their words go to each stream's WordClock first, so they wait there when the
        audio comes."""
        for stream, turn, _, outcome, seg, attention in emitted:
            if stream.owner.clock is not None:
                self._align(stream.owner, turn, outcome, seg, attention)
        frames = [(s.owner, s.slot, turn, frame[1:]) for s, turn, frame, outcome, _, _ in emitted if outcome.emit]
        self.frames += len(frames)
        if frames:
            self.codec.frames(frames)
        for stream, turn, _, outcome, _, _ in emitted:
            if outcome.segment_done:
                self.codec.end(stream.owner, stream.slot, turn, outcome.reason)

    def _align(self, handle: EngineStream, turn: int, outcome: FrameOutcome, seg: Segment | None, attention) -> None:
        """One emitted frame (or a segment's end) of a stream with word timestamps."""
        if not handle.wanted(turn):
            handle.aligner = None
            return
        aligner = handle.aligner
        if aligner is None or handle.aligner_turn != turn:
            if seg is None:  # a cut segment that had no frame: no words to time
                return
            for old in [t for t in handle.turn_words if t < turn]:
                del handle.turn_words[old]
            index, offset = handle.turn_words.get(turn, (0, 0))
            aligner = handle.aligner = SegmentAligner(seg.text, self.bundle.tokenizer.encode, index, offset,
                                                      self.hop_length, self.codec.drain_samples, self.sample_rate)
            handle.aligner_turn = turn
        words = aligner.frame(attention) if outcome.emit else []
        if outcome.segment_done:
            words += aligner.finish()
            handle.turn_words[turn] = (aligner.first_index + len(aligner.words), aligner.end_sample)
            handle.aligner = None
        handle.clock.add(turn, words)

    # --- decode thread ----------------------------------------------------------------

    def _decode_loop(self) -> None:
        pending = None
        phases = self.decode_phases
        while True:
            phases.to("schedule")
            cut: list[tuple[Stream, int]] = []
            with self._lock:
                batch = self.sched.decode_batch()
                while not self._stopping and not batch and pending is None:
                    cut += self._take_cuts()
                    phases.to("idle")
                    self._lock.wait(0.5)
                    phases.to("schedule")
                    batch = self.sched.decode_batch()
                if self._stopping:
                    return
                cut += self._take_cuts()
                updates, self.sched.table_updates = self.sched.table_updates, []
                launched = None
                if batch:
                    segments = [s.current for s in batch]
                    self.sched.step_launched(batch)
                    slots = [s.slot for s in batch]
                    kv_len = max(s.prompt_end + s.steps for s in batch)
            if cut:  # segments the pool had no page for, ended with the frames they had
                self._emit([(s, turn, None, FrameOutcome(emit=False, segment_done=True, reason="context"), None, None)
                            for s, turn in cut])
            try:
                if batch:
                    phases.to("launch")
                    launched = (self.runner.launch(slots, kv_len, updates), batch, segments)
                    self.steps += 1
                    self.decode_rows += len(batch)
                if pending is not None:
                    self._read_step(*pending)
                pending = launched
                if self.config.bench.naive and pending is not None:  # host sync after every step
                    self._read_step(*pending)
                    pending = None
            except Exception as e:  # one failed step must not stall every stream
                # the streams of this step and of the one in flight with it
                failed = {id(st): st for st in [*batch, *(pending[1] if pending is not None else [])]}
                self._fail_decoding(list(failed.values()), e)
                pending = None
                if device_lost(e):
                    raise

    def _take_cuts(self) -> list[tuple[Stream, int]]:
        cut, self.sched.cut_now = self.sched.cut_now, []
        if cut:
            log.warning("the KV pool had no page for %d decoding streams: their segments end early", len(cut))
        return cut

    def _fail_decoding(self, streams: list[Stream], e: Exception) -> None:
        """A decode step raised: the streams it held (in the failed step, or in the step
        in flight with it) hear an `internal` error (`busy` for out of device memory: _error_of)
        and lose their turns in progress, as a barge-in would drop them; the loop goes on for
        everyone else and for their next turns."""
        code, message = _error_of(e, "decode")
        with self._lock:
            for stream in streams:
                stream.owner.drop_turns()
            slots = [s.slot for s in streams if s.slot is not None]
            self.sched.step_failed(streams)
            self._lock.notify_all()
        for slot in slots:  # as at a barge-in: the audio the codec holds back is the dropped turns'
            self.codec.cut(slot)
        for stream in streams:
            handle = stream.owner
            if not handle.closed:
                handle.sink.on_error(code, message)

    def _read_step(self, handle, batch: list[Stream], segments: list[Segment]) -> None:
        self.decode_phases.to("wait")  # for the GPU to finish the step
        frames = self.runner.read(handle)
        # [batch, T], read only when a stream of the batch aligns its words on the host
        aligning = any(stream.owner.clock is not None for stream in batch)
        readout = self.runner.read_alignment(handle) if aligning else None
        self.decode_phases.to("emit")  # the frames to the scheduler and the codec's queue
        emitted = []
        with self._lock:
            for row, stream in enumerate(batch):
                seg = segments[row]
                frame = frames[row]
                outcome = self.sched.frame(stream, seg.id, frame, int(frame[0]) == self.im_end_id)
                if outcome.emit or outcome.segment_done:
                    emitted.append((stream, seg.turn, frame, outcome, seg, None if readout is None else readout[row]))
            self.sched.step_read(batch)
            self._lock.notify_all()
        self._emit(emitted)
