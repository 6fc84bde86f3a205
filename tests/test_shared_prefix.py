"""Shared voice prefixes in the runner (engine/device_state.py, engine/decode.py): streams of one voice read its
prompt's KV from one row of the step, with exactly the frames of reading their own
copies, also as streams leave and a slot comes back with another voice (Triton decode
attention, interpreted on a CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernel_plan import REFERENCE, KernelPlan
from engine.runner import Runner
from engine.sampling import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(temperature=0.0, allow_end=False)
ATTENTION = KernelPlan(attention=True)  # the Triton decode attention, where the shared reads happen


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle


def steps(runner: Runner, slots: list[int], n: int) -> list[np.ndarray]:
    return [runner.read(runner.launch(slots, 150)) for _ in range(n)]


def run(runner: Runner, bundle, spoil_followers: bool = False, leave: bool = False) -> dict:
    """Voices A (slots 0, 2) and B (1, 3); four steps; slot 0 comes back with voice B and
    the same slot list decodes on (its staged prefix rows must follow the new voice).
    `leave`: between the two, slot 0 leaves for two steps (slot 2 then leads voice A)."""
    prompts = bundle.prompts
    a = runner.prefill_prefix(0, prompts.segment("The first voice prompt."))
    b = runner.prefill_prefix(1, prompts.segment("Another voice, a longer prompt than that."))
    runner.load_prefix(2, a)
    runner.load_prefix(3, b)
    texts = {0: "Hello.", 1: "A longer one.", 2: "Hi there!", 3: "Fine."}
    prefix = {0: a, 1: b, 2: a, 3: b}
    first = [runner.prefill_segment(s, prefix[s].length, prompts.segment(t), GREEDY) for s, t in texts.items()]
    if spoil_followers:  # what slots 2 and 3 hold of their prompts must not be read by the decode steps
        for cache in (runner.state.kv.k, runner.state.kv.v):
            cache[:, 2, : a.length] = 1e3
            cache[:, 3, : b.length] = -1e3
    out = {"first": np.stack(first), "before": np.stack(steps(runner, [0, 1, 2, 3], 4))}
    out["staged"] = runner.decoder.batch_prefix[:, :4].cpu().numpy().copy()
    if leave:
        out["left"] = np.stack(steps(runner, [1, 2, 3], 2))
    runner.load_prefix(0, b)
    out["again"] = runner.prefill_segment(0, b.length, prompts.segment("Back again."), GREEDY)
    out["after"] = np.stack(steps(runner, [0, 1, 2, 3], 4))
    out["staged_after"] = runner.decoder.batch_prefix[:, :4].cpu().numpy().copy()
    return out


@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.gpu)])
def test_shared_prefix_reads_give_each_streams_own_frames(bundle, graphs):
    if graphs and DEVICE != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    own = run(Runner(bundle, 4, 160, ATTENTION, cuda_graphs=graphs, shared_prefix=False), bundle)
    shared_runner = Runner(bundle, 4, 160, ATTENTION, cuda_graphs=graphs)
    assert shared_runner.decoder.shared_prefix
    shared = run(shared_runner, bundle)
    for key in ("first", "before", "again", "after"):
        np.testing.assert_array_equal(shared[key], own[key], err_msg=key)
    a_len, b_len = shared["staged"][1, 0], shared["staged"][1, 1]
    assert a_len != b_len
    np.testing.assert_array_equal(shared["staged"], [[0, 1, 0, 1], [a_len, b_len, a_len, b_len]])
    # slot 0 now speaks voice B: it leads B's streams, and slot 2 (voice A) reads its own row
    np.testing.assert_array_equal(shared["staged_after"], [[0, 0, 2, 0], [b_len, b_len, a_len, b_len]])


def test_followers_read_the_prompt_from_the_first_stream_of_their_voice(bundle):
    """Garbage in the followers' copies of their prompts after their segments' prefill:
    with shared reads the decode steps' frames are still the clean run's, and without
    them they are not (so this can fail)."""
    clean = run(Runner(bundle, 4, 160, ATTENTION, cuda_graphs=False, shared_prefix=False), bundle)
    shared = run(Runner(bundle, 4, 160, ATTENTION, cuda_graphs=False), bundle,
                 spoil_followers=True)
    np.testing.assert_array_equal(shared["before"], clean["before"])
    spoiled = run(Runner(bundle, 4, 160, ATTENTION, cuda_graphs=False, shared_prefix=False), bundle, spoil_followers=True)
    assert not np.array_equal(spoiled["before"], clean["before"])


def test_a_segment_over_the_prompt_ends_the_sharing(bundle):
    runner = Runner(bundle, 4, 160, ATTENTION, cuda_graphs=False)
    a = runner.prefill_prefix(0, bundle.prompts.segment("A voice prompt."))
    runner.load_prefix(1, a)
    assert runner.state.slot_prefix[0] == runner.state.slot_prefix[1] == (a.ident, a.length)
    runner.prefill_segment(1, 0, bundle.prompts.segment("No voice at all."), GREEDY)  # from position 0
    assert runner.state.slot_prefix[1] is None and runner.state.slot_prefix[0] == (a.ident, a.length)
    runner.read(runner.launch([0, 1], 150))
    np.testing.assert_array_equal(runner.decoder.batch_prefix[:, :2].cpu().numpy(), [[0, 1], [a.length, 0]])


def test_off_without_the_attention_kernel(bundle):
    assert not Runner(bundle, 2, 64, REFERENCE, cuda_graphs=False, shared_prefix=True).decoder.shared_prefix
