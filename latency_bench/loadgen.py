"""Simulated voice-agent connections, driven only through the public WebSocket protocol.

Each connection opens, sends `start` with a voice, waits for `ready` (open-to-ready), then
plays several turns: text as whole sentences or as LLM-like token pieces at a set pace,
a `flush`, and the turn's audio (TTFA, chunk gaps, underruns of a real-time player);
optionally it barges in (`cancel`) mid-turn. Between turns it thinks for a while.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import msgpack
import websockets

from latency_bench.stats import ConnectionResult, TurnRecord, summary

SENTENCES = [
    "Thanks for calling, how can I help you today?",
    "Your order shipped this morning and should arrive on Thursday.",
    "I can move the appointment to three thirty if that works better for you.",
    "The account balance is one hundred and twenty four dollars and fifty cents.",
    "Sure, let me check that for you, it will only take a moment.",
    "The weather tomorrow looks sunny with a light breeze from the west.",
    "Please hold on while I connect you to the right department.",
    "Is there anything else I can help you with before we finish?",
]


@dataclass(slots=True)
class Workload:
    url: str
    turns: int = 3
    text_mode: str = "sentences"  # "sentences" (whole + flush) or "tokens" (paced pieces + flush)
    tokens_per_s: float = 30.0
    think_s: float = 0.3
    max_new_tokens: int = 200
    fixed_frames: bool = False  # ignore end-of-speech: every turn is max_new_tokens frames
    format: str = "pcm"
    sample_rate: int | None = None
    reference_id: str | None = None
    reference: tuple[bytes, str] | None = None  # inline (audio, transcript)
    barge_in_after_s: float | None = None  # cancel this long after a turn's first audio
    api_key: str | None = None
    hop_length: int = 2048
    codec_rate: int = 44100
    timeout_s: float = 300.0

    def request(self, seed: int) -> dict:
        req = {"text": "", "format": self.format, "max_new_tokens": self.max_new_tokens,
               "latency": "balanced", "seed": seed, "ignore_end": self.fixed_frames}
        if self.sample_rate:
            req["sample_rate"] = self.sample_rate
        if self.reference_id:
            req["reference_id"] = self.reference_id
        elif self.reference:
            req["references"] = [{"audio": self.reference[0], "text": self.reference[1]}]
        return req


class _Progress:
    def __init__(self) -> None:
        self.turns_done = 0
        self.errors = 0
        self.active = 0


def _pieces(text: str) -> list[str]:
    """LLM-like token pieces: 2 to 5 characters, spaces wherever they fall."""
    rng, out, i = random.Random(len(text)), [], 0
    while i < len(text):
        n = rng.randint(2, 5)
        out.append(text[i : i + n])
        i += n
    return out


def connect(w: Workload):
    """The WebSocket connection of one simulated client (an async context manager)."""
    headers = {"Authorization": f"Bearer {w.api_key}"} if w.api_key else None
    # no permessage-deflate: audio does not compress (the service declines it too)
    return websockets.connect(w.url, additional_headers=headers, max_size=None, compression=None)


async def run_connection(index: int, w: Workload, delay_s: float, progress: _Progress) -> ConnectionResult:
    result = ConnectionResult(index)
    await asyncio.sleep(delay_s)
    progress.active += 1
    try:
        async with asyncio.timeout(w.timeout_s):
            async with connect(w) as ws:
                await _converse(ws, index, w, result, progress)
    except Exception as e:  # every failure is counted, none stops the run
        result.errors.append(f"{type(e).__name__}: {e}"[:200])
        progress.errors += 1
    finally:
        progress.active -= 1
    return result


async def _converse(ws, index: int, w: Workload, result: ConnectionResult, progress: _Progress) -> None:
    await open_session(ws, w, index, result)
    rng = random.Random(index)
    for turn in range(1, w.turns + 1):
        await speak_turn(ws, w, SENTENCES[(index + turn) % len(SENTENCES)], result)
        progress.turns_done += 1
        if turn < w.turns:
            await asyncio.sleep(w.think_s * rng.uniform(0.5, 1.5))
    await close_session(ws, result)


async def open_session(ws, w: Workload, seed: int, result: ConnectionResult) -> None:
    """`start`, then wait for `ready` (open-to-ready: the voice prefill)."""
    opened = time.perf_counter()
    await ws.send(msgpack.packb({"event": "start", "request": w.request(seed=seed)}))
    event = await _next(ws, result)
    if event.get("event") != "ready":
        raise RuntimeError(f"expected ready, got {event}")
    result.open_to_ready = time.perf_counter() - opened
    result.voice_cached = event.get("voice_cached")


async def send_text(ws, w: Workload, text: str) -> None:
    """A turn's text: whole, or as token pieces at the workload's pace."""
    if w.text_mode == "tokens":
        for piece in _pieces(text):
            await ws.send(msgpack.packb({"event": "text", "text": piece}))
            await asyncio.sleep(1.0 / w.tokens_per_s)
    else:
        await ws.send(msgpack.packb({"event": "text", "text": text}))


async def flush_and_receive(ws, w: Workload, result: ConnectionResult, record: TurnRecord | None = None) -> TurnRecord:
    """`flush` the text sent, then receive the turn's audio up to its `turn_end`; fills
    `record` (the caller may hold it, to see a turn cut short) or a new one."""
    record = TurnRecord(flush_at=0.0) if record is None else record
    record.flush_at = time.perf_counter()
    await ws.send(msgpack.packb({"event": "flush"}))
    await _receive_turn(ws, w, record, result)
    return record


async def speak_turn(ws, w: Workload, text: str, result: ConnectionResult) -> TurnRecord:
    await send_text(ws, w, text)
    record = await flush_and_receive(ws, w, result)
    result.turns.append(record)
    return record


async def close_session(ws, result: ConnectionResult) -> None:
    await ws.send(msgpack.packb({"event": "stop"}))
    while (await _next(ws, result)).get("event") != "finish":
        pass


async def _receive_turn(ws, w: Workload, record: TurnRecord, result: ConnectionResult) -> None:
    cancelled = False
    heard = 0.0  # seconds of audio received this turn
    while True:
        event = await _next(ws, result)
        kind = event.get("event")
        if kind == "audio" and event.get("audio"):
            now = time.perf_counter()
            rate = event.get("sample_rate") or w.codec_rate
            seconds = event.get("samples", len(event["audio"]) // 2) / rate
            record.chunks.append((now, seconds))
            heard += seconds  # a running sum: re-summing every chunk per event grows with the turn
            record.frames = round(heard * w.codec_rate / w.hop_length)
            if w.barge_in_after_s is not None and not cancelled and now - record.chunks[0][0] >= w.barge_in_after_s:
                await ws.send(msgpack.packb({"event": "cancel"}))
                cancelled = True
        elif kind == "turn_end":
            return
        elif kind == "cancelled":
            record.cancelled = True
            return
        elif kind in ("error", "finish"):
            raise RuntimeError(f"server ended the connection: {event.get('message', event)}")


async def _next(ws, result: ConnectionResult) -> dict:
    event = msgpack.unpackb(await ws.recv())
    if event.get("event") == "error":
        result.errors.append(f"{event.get('code')}: {event.get('message')}")
    return event


async def run_level(concurrency: int, w: Workload, ramp_s: float, report_every_s: float = 1.0, log=print):
    """Run `concurrency` connections (arrivals spread over `ramp_s`); returns their results,
    the wall time of the level and the summary of this client's event-loop lags (seconds;
    None if the level ended before the first was taken)."""
    progress = _Progress()
    start = time.perf_counter()
    tasks = [
        asyncio.create_task(run_connection(i, w, ramp_s * i / max(1, concurrency), progress))
        for i in range(concurrency)
    ]
    done = asyncio.gather(*tasks)
    lags: list[float] = []
    monitor = asyncio.create_task(_loop_lag(lags))
    while not done.done():
        await asyncio.wait([done], timeout=report_every_s)
        if log:
            log(f"  c={concurrency}: {time.perf_counter() - start:5.1f}s active={progress.active} "
                f"turns={progress.turns_done}/{concurrency * w.turns} errors={progress.errors}")
    monitor.cancel()
    lag = summary(lags) if lags else None
    if log and lag:
        log(f"  c={concurrency}: client event-loop lag p99 {1000 * lag['p99']:.1f} ms, "
            f"max {1000 * lag['max']:.1f} ms (a busy client would delay its own timestamps)")
    return done.result(), time.perf_counter() - start, lag


async def _loop_lag(lags: list[float], period_s: float = 0.01) -> None:
    """How late this process's event loop wakes a 10 ms sleeper: if the load generator
    itself were saturated, its receive times (TTFA, chunk gaps) would be late too."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        lags.append(max(0.0, time.perf_counter() - t - period_s))


def add_target_args(p) -> None:
    """The service a load run drives: a running one (--url) or one it starts (--model)."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running service's ws://.../v1/tts/live")
    where.add_argument("--model", help="start the service with this model (default | preset | folder)")
    p.add_argument("--device", default="auto")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra argument for the started service: any `python -m latency_bench.server` option, e.g. "
                        "--server-arg=--quant=fp8 or --server-arg=--limit=new-tokens=4096")
    p.add_argument("--api-key")


def add_turn_args(p, text_mode: str) -> None:
    """What each turn sends and asks for (Workload's fields)."""
    p.add_argument("--text-mode", choices=["sentences", "tokens"], default=text_mode)
    p.add_argument("--tokens-per-s", type=float, default=30.0, help="pace of token pieces in tokens mode")
    p.add_argument("--max-new-tokens", type=int, default=200, help="frames per turn (the cap)")
    p.add_argument("--fixed-frames", action="store_true", help="ignore end-of-speech: every turn is max-new-tokens frames "
                   "(random weights never say when to stop; a started service also gets --ignore-end)")
    p.add_argument("--format", default="pcm")
    p.add_argument("--voice", help="a stored voice id (reference_id)")
    p.add_argument("--synthetic-reference", type=float, default=0.0,
                   help="seconds of a generated reference (with a matching-length transcript) for a ~300-token voice prompt at 10 s")
