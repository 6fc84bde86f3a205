"""Sampling: greedy, top-k / top-p / temperature, repetition penalty, repetition-aware
resampling, determinism per stream, and the window contract."""

from __future__ import annotations

import pytest
import torch

from engine.frame import new_window, push_window
from engine.sampling import (
    MAX_TOP_K,
    SamplingParams,
    SamplingTensors,
    sample_codebook,
    sample_semantic,
)

V = 50


def params(n=1, **kw):
    return SamplingTensors.from_params([SamplingParams(**kw)] * n, "cpu")


def empty_window(b, w=10):
    return torch.full((b, w), -1, dtype=torch.int32)


def draws(logits, n, **kw):
    """n samples of one row: same seed, frames 0..n-1."""
    p = params(n, **kw)
    step = torch.arange(n)
    return sample_codebook(logits.expand(n, -1), p, empty_window(n), step, codebook=1)


def test_greedy_is_argmax():
    logits = torch.randn(8, V)
    out = sample_codebook(logits, params(8, temperature=0.0), empty_window(8), torch.zeros(8, dtype=torch.long), 1)
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = torch.randn(1, V)
    assert set(draws(logits, 200, top_k=1, top_p=1.0, temperature=1.5).tolist()) == {int(logits.argmax())}
    assert set(draws(logits, 200, top_k=0, top_p=1e-6, temperature=1.5).tolist()) == {int(logits.argmax())}


def test_frequencies_follow_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0] + [-30.0] * (V - 4)])
    n, temperature = 20000, 0.8
    counts = torch.bincount(draws(logits, n, top_k=0, top_p=1.0, temperature=temperature), minlength=V).float()
    expect = torch.softmax(logits[0] / temperature, -1) * n
    assert counts[4:].sum() == 0
    # within 4 standard deviations of a binomial count
    assert torch.all((counts[:4] - expect[:4]).abs() < 4 * expect[:4].sqrt() + 1)


def test_top_k_limits_the_support():
    logits = torch.randn(1, V)
    allowed = set(torch.topk(logits[0], 5).indices.tolist())
    assert set(draws(logits, 2000, top_k=5, top_p=1.0, temperature=2.0).tolist()) <= allowed


def test_top_p_drops_the_tail_upstream_style():
    # probs 0.5, 0.3, 0.2: with top_p 0.85 the token whose cumulative mass (1.0) crosses
    # the threshold is dropped, so only the first two remain.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [1e-12] * (V - 3)]))
    got = set(draws(logits, 3000, top_k=0, top_p=0.85, temperature=1.0).tolist())
    assert got == {0, 1}


def test_same_seed_and_frame_reproduce_regardless_of_batch_neighbours():
    logits = torch.randn(3, V)
    p = SamplingTensors.from_params(
        [SamplingParams(seed=5, temperature=1.0, top_p=1.0), SamplingParams(seed=9, temperature=1.0, top_p=1.0),
         SamplingParams(seed=5, temperature=1.0, top_p=1.0)], "cpu")
    steps = torch.tensor([3, 3, 3])
    batch = sample_codebook(logits, p, empty_window(3), steps, 2)
    alone = sample_codebook(logits[2:], params(1, seed=5, temperature=1.0, top_p=1.0), empty_window(1), steps[2:], 2)
    assert batch[2] == alone[0]
    # different seeds give different draw sequences over many frames
    seq = lambda seed: draws(torch.zeros(1, V), 64, seed=seed, top_k=0, top_p=1.0, temperature=1.0)
    assert not torch.equal(seq(1), seq(2))
    assert torch.equal(seq(1), seq(1))


def test_repetition_penalty_lowers_recent_tokens():
    logits = torch.zeros(1, V)
    logits[0, 7] = 1.0
    window = torch.full((1, 16), -1, dtype=torch.int32)
    window[0, -1] = 7
    n = 4000
    p = params(n, repetition_penalty=2.0, temperature=1.0, top_p=1.0, top_k=0)
    with_pen = sample_codebook(logits.expand(n, -1), p, window.expand(n, -1), torch.arange(n), 1)
    without = draws(logits, n, temperature=1.0, top_p=1.0, top_k=0)
    assert (with_pen == 7).sum() < 0.75 * (without == 7).sum()


def test_repetition_aware_resampling_redraws_a_repeated_semantic_token():
    num_semantic = V - 1
    logits = torch.full((1, V), -30.0)
    logits[0, 3], logits[0, 4], logits[0, 5] = 1.0, 0.5, 0.4
    window = torch.full((1, 10), -1, dtype=torch.int32)
    window[0, -1] = 3  # token 3 was just produced
    n = 2000
    kw = dict(temperature=0.05, top_p=1.0, top_k=0)
    steps = torch.arange(n)
    off = sample_semantic(logits.expand(n, -1), params(n, ras=False, **kw), window.expand(n, -1), steps, num_semantic)
    on = sample_semantic(logits.expand(n, -1), params(n, ras=True, **kw), window.expand(n, -1), steps, num_semantic)
    assert (off == 3).all()  # temperature 0.05: always the top token
    # redrawn at temperature 1.0 / top-p 0.9, which keeps tokens 3 and 4 (p = 0.62 / 0.38)
    share = (on == 3).float().mean()
    assert 0.55 < share < 0.7 and set(on.tolist()) == {3, 4}
    # without 3 in the window nothing is redrawn
    fresh = sample_semantic(logits.expand(n, -1), params(n, ras=True, **kw), empty_window(n), steps, num_semantic)
    assert (fresh == 3).all()
    # end-of-speech (row num_semantic) is never resampled
    eos = torch.full((1, V), -5.0)
    eos[0, num_semantic] = 5.0
    w = torch.full((1, 10), num_semantic, dtype=torch.int32)
    assert (sample_semantic(eos, params(1, ras=True, **kw), w, steps[:1], num_semantic) == num_semantic).all()


def test_params_are_validated():
    for bad in (dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=MAX_TOP_K + 1), dict(repetition_penalty=5.0), dict(seed=-1)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_window_contract_is_strict():
    window = new_window(2, 4, 3, "cpu")
    push_window(window, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert window[:, -1].tolist() == [[1, 2, 3], [4, 5, 6]] and (window[:, :-1] == -1).all()
    with pytest.raises(TypeError, match="int32"):
        push_window(window.long(), torch.tensor([[1, 2, 3], [4, 5, 6]]))
    with pytest.raises(TypeError, match=r"\[batch, codebooks\]"):
        push_window(window, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=r"\[batch, codebooks\]"):
        push_window(window, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        push_window(window, torch.zeros(2, 3))


def test_end_of_speech_can_be_blocked_for_fixed_length_runs():
    num_semantic = V - 1
    logits = torch.full((4, V), -5.0)
    logits[:, num_semantic] = 10.0  # end-of-speech is by far the likeliest
    w = empty_window(4)
    steps = torch.arange(4)
    assert (sample_semantic(logits, params(4, temperature=1.0), w, steps, num_semantic) == num_semantic).all()
    blocked = sample_semantic(logits, params(4, temperature=1.0, allow_end=False), w, steps, num_semantic)
    assert (blocked < num_semantic).all()
    greedy = sample_semantic(logits, params(4, temperature=0.0, allow_end=False), w, steps, num_semantic)
    assert (greedy < num_semantic).all()


def test_window_codes_outside_the_head_are_ignored():
    """A window may hold codes of a wider codebook than this head samples (S1 samples the
    residual codes from the first 1024 rows): they must not index out of range."""
    from engine.sampling import window_presence

    window = torch.tensor([[3, 5000, -1, 49]], dtype=torch.int32)
    present = window_presence(window, V)
    assert present[0].nonzero().flatten().tolist() == [3, 49]
