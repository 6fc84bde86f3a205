"""Open-loop conversations, driven through the public WebSocket protocol (loadgen's steps).

Conversations arrive as a Poisson process whose rate makes the offered number of
concurrent conversations N (Little's law: rate = N / mean lifetime). Each lives for K
turns: the agent's text arrives as LLM token pieces, then `flush`; the client plays the
turn's audio in real time; then the user talks for U seconds (uniform in a range) before
the next turn. A level starts in steady state (about N conversations already under way,
each at a random point of its life) and lasts a fixed time: conversations still open at
its end are cancelled and counted as cut.

The burst case (`run_burst`): every connection opens and gets `ready`, then all flush
each turn at once (a gate: an asyncio barrier that a failed connection leaves).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

from latency_bench.loadgen import (SENTENCES, Workload, _loop_lag, _pieces, close_session, connect,
                                   flush_and_receive, open_session, send_text)
from latency_bench.shares import metrics_url, scrape
from latency_bench.stats import ConnectionResult, TurnRecord, summary, underruns

# English speech runs at about 150 words a minute, ~15 characters a second with spaces:
# the lifetime estimate's turn length when end-of-speech decides it (not --fixed-frames)
SPEECH_CHARS_PER_S = 15.0


@dataclass(slots=True)
class ConversationLoad:
    conversations: float  # offered concurrent conversations (the level)
    turns: int = 4
    user_talk_s: tuple[float, float] = (2.0, 6.0)
    duration_s: float = 60.0
    seed: int = 0
    turn_audio_s: float | None = None  # a turn's audio, for the arrival rate (None: estimated)
    open_spread_s: float = 1.0  # the conversations under way at the start connect over this time

    def __post_init__(self) -> None:
        lo, hi = self.user_talk_s
        if self.conversations <= 0 or self.turns < 1 or self.duration_s <= 0:
            raise ValueError("conversations, turns and duration must be positive")
        if not 0 <= lo <= hi:
            raise ValueError(f"user talk must be a range lo,hi with 0 <= lo <= hi, got {lo},{hi}")


@dataclass(slots=True, frozen=True)
class Plan:
    """One conversation, decided before the level starts (seeded)."""

    index: int
    arrive_s: float  # when it connects, from the level's start
    first_turn_s: float  # from arrival until its first turn's text starts (0: the agent speaks first)
    talk_s: tuple[float, ...]  # the user's talk before each turn after the first
    sentence: int  # the first turn's sentence (SENTENCES), the next ones follow

    @property
    def turns(self) -> int:
        return len(self.talk_s) + 1


def turn_s(w: Workload, load: ConversationLoad) -> float:
    """Mean seconds of one turn: its text at the token pace, then its audio played."""
    text = sum(len(_pieces(s)) / w.tokens_per_s if w.text_mode == "tokens" else 0.0 for s in SENTENCES) / len(SENTENCES)
    cap = w.max_new_tokens * w.hop_length / w.codec_rate
    if load.turn_audio_s is not None:
        audio = load.turn_audio_s
    elif w.fixed_frames:
        audio = cap
    else:
        audio = min(cap, sum(len(s) for s in SENTENCES) / len(SENTENCES) / SPEECH_CHARS_PER_S)
    return text + audio


def lifetime_s(w: Workload, load: ConversationLoad) -> float:
    """Mean life of a conversation: K turns and the user's talk between them."""
    return load.turns * turn_s(w, load) + (load.turns - 1) * sum(load.user_talk_s) / 2


def poisson_times(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times of a Poisson process of `rate` per second in [0, duration_s)."""
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def plan_level(load: ConversationLoad, life_s: float) -> list[Plan]:
    """The level's conversations: ~N under way at the start (how many: Poisson(N), as an
    M/G/inf system holds in steady state; each with a random number of turns left and
    a random phase before its next one), then Poisson arrivals at N / life_s."""
    rng = random.Random(load.seed)
    under_way = len(poisson_times(load.conversations, 1.0, rng))
    cycle = life_s / load.turns  # one turn and the user's talk after it, about
    plans = []
    for _ in range(under_way):
        turns = rng.randint(1, load.turns)
        plans.append(_plan(rng, len(plans), rng.uniform(0, load.open_spread_s), rng.uniform(0, cycle), turns, load))
    for t in poisson_times(load.conversations / life_s, load.duration_s, rng):
        plans.append(_plan(rng, len(plans), t, 0.0, load.turns, load))
    return plans


def _plan(rng: random.Random, index: int, arrive: float, first: float, turns: int, load: ConversationLoad) -> Plan:
    talk = tuple(rng.uniform(*load.user_talk_s) for _ in range(turns - 1))
    return Plan(index, arrive, first, talk, rng.randrange(len(SENTENCES)))


@dataclass(slots=True)
class ConversationResult(ConnectionResult):
    opened_at: float | None = None  # when it connected (perf_counter)
    closed_at: float | None = None  # when it ended, or was cut at the level's end
    user_talk_s: float = 0.0  # the user's talk it went through
    pending: TurnRecord | None = None  # the turn flushed and not ended yet
    cut: bool = False  # still open at the level's end
    codes: list[str] = field(default_factory=list)  # error codes ("busy": refused)

    @property
    def refused(self) -> bool:
        return "busy" in self.codes


async def run_conversation(plan: Plan, w: Workload, result: ConversationResult, start: float) -> None:
    await _sleep_until(start + plan.arrive_s)
    result.opened_at = time.perf_counter()
    try:
        async with asyncio.timeout(w.timeout_s):
            async with connect(w) as ws:
                await _converse(ws, plan, w, result)
    except asyncio.CancelledError:
        result.cut = True
        raise
    except Exception as e:  # every failure is counted, none stops the level
        result.codes += [x.split(":", 1)[0] for x in result.errors] or [error_code(e)]
        result.errors.append(f"{type(e).__name__}: {e}"[:200])
    finally:
        result.closed_at = time.perf_counter()


def error_code(e: Exception) -> str:
    """A failure without an `error` event: a refused handshake (503: busy), a timeout, ..."""
    status = getattr(getattr(e, "response", None), "status_code", None)  # websockets' InvalidStatus
    if status is not None:
        return "busy" if status == 503 else f"http_{status}"
    return "client_timeout" if isinstance(e, TimeoutError) else type(e).__name__


async def _converse(ws, plan: Plan, w: Workload, result: ConversationResult) -> None:
    await open_session(ws, w, plan.index, result)
    await _sleep_until(result.opened_at + plan.first_turn_s)
    for turn in range(plan.turns):
        if turn:
            result.user_talk_s += plan.talk_s[turn - 1]
            await asyncio.sleep(plan.talk_s[turn - 1])
        await send_text(ws, w, SENTENCES[(plan.sentence + turn) % len(SENTENCES)])
        result.pending = record = TurnRecord(flush_at=0.0)
        await flush_and_receive(ws, w, result, record)
        result.turns.append(record)
        result.pending = None
        # the user answers once the agent's audio has played out, not when it arrived
        end = underruns(record.chunks).play_end
        if end is not None:
            await _sleep_until(end)
    await close_session(ws, result)


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


@dataclass(slots=True)
class LevelRun:
    """What one level measured: the conversations, the window, the client's own lag and
    the service's /metrics samples (engine stats by name; empty without /metrics)."""

    results: list[ConversationResult]
    start: float
    end: float
    loop_lag_s: dict | None
    samples: list[dict[str, float]]
    before: dict[str, float] | None
    after: dict[str, float] | None


async def run_level(plans: list[Plan], w: Workload, duration_s: float, metrics_every_s: float = 1.0,
                    log=print) -> LevelRun:
    """Run the planned conversations for `duration_s`; those still open then are cut."""
    results = [ConversationResult(p.index) for p in plans]
    metrics = metrics_url(w.url)
    before = await asyncio.to_thread(scrape, metrics)
    samples: list[dict[str, float]] = []
    lags: list[float] = []
    start = time.perf_counter()
    tasks = [asyncio.create_task(run_conversation(p, w, r, start)) for p, r in zip(plans, results)]
    watchers = [asyncio.create_task(_loop_lag(lags)), asyncio.create_task(_sample(metrics, metrics_every_s, samples))]
    while (left := start + duration_s - time.perf_counter()) > 0 and not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=min(1.0, left))
        if log:
            log(_progress(results, time.perf_counter() - start))
    end = time.perf_counter()
    for t in tasks:
        t.cancel()
    await asyncio.wait(tasks, timeout=30)  # each closes its socket: the service frees its slot
    for t in watchers:
        t.cancel()
    after = await asyncio.to_thread(scrape, metrics)
    return LevelRun(results, start, end, summary(lags) if lags else None, samples, before, after)


def _progress(results: list[ConversationResult], elapsed: float) -> str:
    opened = sum(r.opened_at is not None and r.closed_at is None for r in results)
    turns = sum(len(r.turns) for r in results)
    refused = sum(r.refused for r in results)
    errors = sum(bool(r.codes) for r in results) - refused
    return f"  {elapsed:5.1f}s open={opened} turns={turns} refused={refused} errors={errors}"


async def _sample(url: str, every_s: float, out: list[dict[str, float]]) -> None:
    """The service's engine stats every `every_s` (KV pages in use, streams by phase)."""
    while True:
        page = await asyncio.to_thread(scrape, url, 2.0)
        if page is None:
            return  # no /metrics: nothing to sample
        out.append(page)
        await asyncio.sleep(every_s)


class Gate:
    """An asyncio barrier that a failed party leaves, so the others are not held forever."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self._waiting = 0
        self._open = asyncio.Event()

    async def wait(self) -> None:
        self._waiting += 1
        event = self._open
        self._release_if_full()
        await event.wait()

    def leave(self) -> None:
        self.parties -= 1
        self._release_if_full()

    def _release_if_full(self) -> None:
        if self._waiting and self._waiting >= self.parties:
            self._open.set()  # every waiter wakes in the same loop pass
            self._open, self._waiting = asyncio.Event(), 0


async def run_burst(n: int, w: Workload, turns: int, think_s: float) -> list[ConnectionResult]:
    """n connections open and get `ready`; then each turn all flush together (their text
    sent before the gate), play the audio, and think `think_s`."""
    gate = Gate(n)
    results = [ConnectionResult(i) for i in range(n)]
    await asyncio.gather(*(_burst_connection(i, w, turns, think_s, gate, results[i]) for i in range(n)))
    return results


async def _burst_connection(index: int, w: Workload, turns: int, think_s: float, gate: Gate,
                            result: ConnectionResult) -> None:
    try:
        async with asyncio.timeout(w.timeout_s):
            async with connect(w) as ws:
                await open_session(ws, w, index, result)
                for turn in range(turns):
                    await send_text(ws, w, SENTENCES[(index + turn) % len(SENTENCES)])
                    await gate.wait()
                    result.turns.append(await flush_and_receive(ws, w, result))
                    await asyncio.sleep(think_s)
                await close_session(ws, result)
    except Exception as e:
        result.errors.append(f"{type(e).__name__}: {e}"[:200])
    finally:
        gate.leave()


def flush_spreads(results: list[ConnectionResult]) -> list[float]:
    """Per synchronized turn: seconds between the first and the last connection's flush."""
    n = max((len(r.turns) for r in results), default=0)
    out = []
    for k in range(n):
        sent = [r.turns[k].flush_at for r in results if len(r.turns) > k]
        out.append(max(sent) - min(sent))
    return out


def offered_rate(load: ConversationLoad, life_s: float) -> float:
    """Conversations arriving per second for the offered level."""
    return load.conversations / life_s if life_s > 0 else math.inf
