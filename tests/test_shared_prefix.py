"""Shared voice-prompt pages (engine/pages.py, engine/scheduler.py): streams of one voice
whose page-table rows point at that voice's KV pages, each with its own copy of the partly
filled last page, decode exactly the frames of streams that each hold a private copy of
the prompt's KV, also when a row comes back with another voice; with the PyTorch
attention and the Triton kernels (interpreted on a CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernel_plan import REFERENCE, KernelPlan
from engine.runner import RowPages, Runner
from engine.sampling import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(temperature=0.0, allow_end=False, seed=0)
ATTENTION = KernelPlan(attention=True)  # the Triton decode attention reads the pages
P, MAX_LEN, PAGES = 16, 160, 64
VOICES = {"a": "The first voice prompt.", "b": "Another voice, a longer prompt than that."}  # 43 and 61 positions
# (row, voice, text): rows 0 and 2 speak voice a, rows 1 and 3 voice b; then row 0 comes back with voice b
TURNS = [(0, "a", "Hello."), (1, "b", "A longer one."), (2, "a", "Hi there!"), (3, "b", "Fine.")]
AGAIN = (0, "b", "Back again.")
PLANS = [
    pytest.param(REFERENCE, False, id="reference"),
    pytest.param(ATTENTION, False, id="triton"),
    pytest.param(None, True, id="graphs", marks=pytest.mark.gpu),  # the default plan, graphs, chunked prefill
]


class Speaker:
    """Gives rows their voice and turn as the engine does: with `shared`, a voice's prompt is
    prefilled once and rows point at its pages (copying the partly filled last page before a
    segment writes into it); without, every row prefills its own copy of the prompt."""

    def __init__(self, runner: Runner, bundle, shared: bool) -> None:
        self.runner, self.prompts, self.shared = runner, bundle.prompts, shared
        self.free = iter(range(1, PAGES))  # page 0 is the scratch page
        self.voices: dict[str, list[int]] = {}

    def take(self, n: int) -> list[int]:
        return [next(self.free) for _ in range(n)]

    def voice_pages(self, row: int, voice: str) -> list[int]:
        if voice not in self.voices or not self.shared:
            tokens = self.prompts.segment(VOICES[voice])
            self.voices[voice] = self.take(-(-tokens.shape[1] // P))
            self.runner.prefill_prefix(row, tokens, self.voices[voice])
        return self.voices[voice]

    def turn(self, row: int, voice: str, text: str) -> np.ndarray:
        start = self.prompts.segment(VOICES[voice]).shape[1]
        pages = self.voice_pages(row, voice)
        if self.shared:  # the full pages shared, the last one copied
            full = start // P
            own = self.take(MAX_LEN // P - full)
            rows = RowPages(row, pages[:full] + own, [(pages[full], own[0])] if start % P else [])
        else:
            rows = RowPages(row, pages + self.take(MAX_LEN // P - len(pages)))
        return self.runner.prefill_segments([(row, start, self.prompts.segment(text), GREEDY)], [rows])[0]


def steps(runner: Runner, n: int) -> np.ndarray:
    return np.stack([runner.read(runner.launch([0, 1, 2, 3], 150)) for _ in range(n)])


def run(runner: Runner, bundle, shared: bool, spoil: str | None = None) -> dict:
    """Four turns, four decode steps; row 0 comes back with voice b, four more steps.
    `spoil`: garbage in the full pages of that voice's prompt before decoding."""
    speaker = Speaker(runner, bundle, shared)
    out = {"first": np.stack([speaker.turn(*t) for t in TURNS])}
    if spoil is not None:
        pages = speaker.voices[spoil][:-1]
        for cache in (runner.state.kv.k, runner.state.kv.v):
            cache[:, pages] = 10 * torch.randn_like(cache[:, pages])
        if runner.state.cuda:
            torch.cuda.synchronize()
    out["before"] = steps(runner, 4)
    out["again"] = speaker.turn(*AGAIN)
    out["after"] = steps(runner, 4)
    return out


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle


def runner_for(bundle, plan, graphs: bool) -> Runner:
    return Runner(bundle, 4, MAX_LEN, plan, pages=PAGES, page_size=P, cuda_graphs=graphs)


@pytest.mark.parametrize("plan, graphs", PLANS)
def test_streams_reading_one_voices_pages_decode_their_own_frames(bundle, plan, graphs):
    own = run(runner_for(bundle, plan, graphs), bundle, shared=False)
    shared_runner = runner_for(bundle, plan, graphs)
    shared = run(shared_runner, bundle, shared=True)
    for key in ("first", "before", "again", "after"):
        np.testing.assert_array_equal(shared[key], own[key], err_msg=key)
    table = shared_runner.state.kv.page_table
    assert table[0, :3].tolist() == table[1, :3].tolist() == table[3, :3].tolist()  # b's full pages (row 0 came back)
    assert table[2, :2].tolist() != table[0, :2].tolist()  # a's
    assert len({int(table[r, 3]) for r in (0, 1, 3)}) == 3  # each its own copy of b's partly filled page


def test_the_streams_of_a_voice_read_its_pages_and_only_they(bundle):
    """Garbage in voice a's full pages after the segments' prefill: rows 0 and 2 (voice a)
    decode other frames, rows 1 and 3 (voice b) the same (so the comparison above can fail)."""
    clean = run(runner_for(bundle, REFERENCE, False), bundle, shared=True)
    spoiled = run(runner_for(bundle, REFERENCE, False), bundle, shared=True, spoil="a")
    np.testing.assert_array_equal(spoiled["before"][:, [1, 3]], clean["before"][:, [1, 3]])
    for row in (0, 2):
        assert not np.array_equal(spoiled["before"][:, row], clean["before"][:, row])
