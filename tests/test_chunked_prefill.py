"""Chunked prefill (the path the GPU captures in CUDA graphs: fixed chunk shapes, attention
through the Triton kernel) gives what the eager prefill gives: the same voice-prefix KV,
the same first frames for a batch of segments of different lengths at different
positions, a long segment split over several chunks, and the same frames after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.runner
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
    monkeypatch.setattr(engine.runner, "PREFILL_LENGTHS", (8, 16, 32))
    monkeypatch.setattr(engine.runner, "PREFILL_CHUNK_TOKENS", 64)


def run(runner: Runner, bundle) -> dict:
    prompts = bundle.prompts
    voice = prompts.segment("A voice prompt.")
    assert voice.shape[1] > engine.runner.PREFILL_LENGTHS[-1]  # two chunks
    prefix = runner.prefill_prefix(1, voice)
    texts = ["Hello.", "A longer one", "Hi!"]
    items = [(1, prefix.length, prompts.segment(texts[0]), GREEDY),
             (0, 0, prompts.segment(texts[1]), GREEDY),
             (3, 17, prompts.segment(texts[2]), GREEDY)]
    first = runner.prefill_segments(items)
    long_segment = prompts.segment("Longer than one chunk.")
    assert long_segment.shape[1] > engine.runner.PREFILL_LENGTHS[-1]
    first.append(runner.prefill_segment(2, 5, long_segment, GREEDY))
    steps = [runner.read(runner.launch([1, 0, 3, 2], 120)) for _ in range(4)]
    return {"k": prefix.k.float().cpu(), "first": np.stack(first), "steps": np.stack(steps)}


@pytest.mark.parametrize("attention", ["per-query", "blocked"])
def test_chunked_prefill_gives_the_eager_frames(bundle, attention):
    eager = run(Runner(bundle, 4, 128, cuda_graphs=False, attention_kernel=False), bundle)
    chunked_runner = Runner(bundle, 4, 128, attention_kernel=True, chunked_prefill=True, prefill_attention=attention)
    assert chunked_runner.prefill_blocked == (attention == "blocked")
    assert chunked_runner.chunked_prefill
    assert (chunked_runner.chunk_graphs[(1, 8)].graph is not None) == (DEVICE == "cuda")
    chunked = run(chunked_runner, bundle)
    torch.testing.assert_close(chunked["k"], eager["k"], atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(chunked["first"], eager["first"])
    np.testing.assert_array_equal(chunked["steps"], eager["steps"])


def test_prefill_attention_kind_is_checked(bundle):
    with pytest.raises(ValueError, match="prefill_attention"):
        Runner(bundle, 2, 128, cuda_graphs=False, attention_kernel=True, prefill_attention="flash")


def test_chunked_prefill_needs_the_attention_kernel(bundle):
    with pytest.raises(ValueError, match="attention_kernel"):
        Runner(bundle, 2, 128, cuda_graphs=False, attention_kernel=False, chunked_prefill=True)
