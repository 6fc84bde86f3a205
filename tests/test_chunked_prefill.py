"""Chunked prefill (the path the GPU captures in CUDA graphs: fixed chunk shapes, attention
through the Triton kernel) gives what the eager prefill gives: the same voice-prefix KV,
the same first frames for a batch of segments of different lengths at different
positions, a long segment split over several chunks, and the same frames after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.prefill
from engine.attention import gather_rows
from engine.kernel_plan import REFERENCE, KernelPlan
from engine.runner import Runner
from engine.sampling import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(temperature=0.0, allow_end=False)


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # chunks of at most 32 positions and 64 per batch, so that short prompts take two
    # chunks and a batch of 3 is split into 1 + 2 (and the interpreted kernel stays
    # fast on a CPU)
    monkeypatch.setattr(engine.prefill, "PREFILL_LENGTHS", (8, 16, 32))
    monkeypatch.setattr(engine.prefill, "PREFILL_CHUNK_TOKENS", 64)


def run(runner: Runner, bundle) -> dict:
    prompts = bundle.prompts
    voice = prompts.segment("A voice prompt.")
    assert voice.shape[1] > engine.prefill.PREFILL_LENGTHS[-1]  # two chunks
    runner.prefill_prefix(1, voice)
    texts = ["Hello.", "A longer one", "Hi!"]
    items = [(1, voice.shape[1], prompts.segment(texts[0]), GREEDY),
             (0, 0, prompts.segment(texts[1]), GREEDY),
             (3, 17, prompts.segment(texts[2]), GREEDY)]
    first = runner.prefill_segments(items)
    long_segment = prompts.segment("Longer than one chunk.")
    assert long_segment.shape[1] > engine.prefill.PREFILL_LENGTHS[-1]
    first.append(runner.prefill_segment(2, 5, long_segment, GREEDY))
    steps = [runner.read(runner.launch([1, 0, 3, 2], 120)) for _ in range(4)]
    kv = runner.state.kv
    k = torch.stack([gather_rows(layer, kv.page_table, torch.tensor([1], device=layer.device), voice.shape[1])[0]
                     for layer in kv.k])
    return {"k": k.float().cpu(), "first": np.stack(first), "steps": np.stack(steps)}


@pytest.mark.parametrize("blocked", [False, True], ids=["per-query", "blocked"])
def test_chunked_prefill_gives_the_eager_frames(bundle, blocked):
    eager = run(Runner(bundle, 4, 128, REFERENCE, cuda_graphs=False), bundle)
    chunked_runner = Runner(bundle, 4, 128, KernelPlan(attention=True, blocked_prefill=blocked), chunked_prefill=True)
    assert chunked_runner.prefiller.chunked
    assert (chunked_runner.prefiller.chunk_graphs[(1, 8)].graph is not None) == (DEVICE == "cuda")
    chunked = run(chunked_runner, bundle)
    torch.testing.assert_close(chunked["k"], eager["k"], atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(chunked["first"], eager["first"])
    np.testing.assert_array_equal(chunked["steps"], eager["steps"])


def test_chunked_prefill_needs_the_attention_kernel(bundle):
    with pytest.raises(ValueError, match="plan.attention"):
        Runner(bundle, 2, 128, REFERENCE, cuda_graphs=False, chunked_prefill=True)
