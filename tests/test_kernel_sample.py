"""The one-launch sampling kernel against engine/sampling.py, draw for draw (Triton
interpreter on the CPU, compiled on a GPU): codebook draws and the semantic draw with
its end-of-speech block and repetition-aware resampling."""

from __future__ import annotations

import pytest
import torch

from engine.sampling import (
    MAX_TOP_K, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P, SamplingParams, SamplingTensors, frame_gumbel,
    sample_codebook, sample_semantic,
)
from kernels.sample import DrawParams, sample_tokens, sample_tokens_reference, self_check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = [  # temperature, top_p, top_k (0 = off), seed, allow_end, ras
    (0.7, 0.7, 30, 1, True, True), (1.0, 1.0, 0, 2, True, True), (0.0, 0.7, 30, 3, True, True),
    (1.3, 0.95, 5, 4, False, True), (0.5, 0.3, 128, 5, True, False), (0.9, 1.0, 1, 6, False, True),
    (2.0, 0.99, 64, 7, True, True),
]


def params_for(settings) -> SamplingTensors:
    return SamplingTensors.from_params(
        [SamplingParams(temperature=t, top_p=p, top_k=k, seed=s, allow_end=e, ras=r) for t, p, k, s, e, r in settings],
        DEVICE,
    )


@pytest.mark.parametrize("vocab", [300, 50])  # 50: fewer tokens than MAX_TOP_K candidates
def test_codebook_draws_match_the_reference(vocab):
    params, b = params_for(SETTINGS), len(SETTINGS)
    g = torch.Generator().manual_seed(vocab)
    for trial in range(6):
        logits = (torch.randn(b, vocab, generator=g) * (0.3 + trial / 1.5)).to(DEVICE)
        step = torch.randint(0, 10_000, (b,), generator=g).to(DEVICE)
        draw = 1 + trial % 3
        noise = frame_gumbel(params, step, 4)[:, draw]
        want = sample_codebook(logits, params, torch.full((b, 4), -1, device=DEVICE), step, draw, noise, penalize=False)
        assert torch.equal(sample_tokens(logits, params, step, draw, MAX_TOP_K), want), trial


def test_semantic_draws_match_the_reference_with_end_block_and_ras():
    params, b, vocab = params_for(SETTINGS), len(SETTINGS), 257  # the last column: end-of-speech
    g = torch.Generator().manual_seed(0)
    resampled = 0
    for trial in range(8):
        logits = (torch.randn(b, vocab, generator=g) * (0.5 + trial / 2)).to(DEVICE)
        logits[:, -1] += 2.0  # end-of-speech often on top: the block must matter
        step = torch.randint(0, 10_000, (b,), generator=g).to(DEVICE)
        window = torch.randint(-1, vocab - 1, (b, 10), generator=g, dtype=torch.int32).to(DEVICE)
        window[:, 3] = logits[:, :-1].argmax(-1).int()  # the likeliest semantic token was just used
        noise = frame_gumbel(params, step, 3)
        want = sample_semantic(logits, params, window, step, vocab - 1, noise[:, 0], noise[:, 3], penalize=False)
        got = sample_tokens(logits, params, step, 0, MAX_TOP_K, (window, vocab - 1, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P))
        assert torch.equal(got, want), trial
        assert not (got[~params.allow_end] == vocab - 1).any()
        resampled += int((got != sample_tokens(logits, params_without_ras(params), step, 0, MAX_TOP_K,
                                               (window, vocab - 1, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P))).sum())
    assert resampled > 0  # RAS changed some draws: the redraw path was exercised


def params_without_ras(params: SamplingTensors) -> SamplingTensors:
    return SamplingTensors(params.temperature, params.top_p, params.top_k, params.repetition_penalty,
                           torch.zeros_like(params.ras), params.seed, params.allow_end)


def test_greedy_rows_take_the_argmax_and_bf16_logits_work():
    params = params_for([(0.0, 0.7, 30, s, True, True) for s in range(5)])
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    logits[torch.arange(5), torch.arange(5) * 100] = 30.0  # one clear winner per row
    got = sample_tokens(logits, params, torch.zeros(5, dtype=torch.long, device=DEVICE), 2, MAX_TOP_K)
    assert torch.equal(got, torch.arange(5, device=DEVICE) * 100)


def test_rows_without_a_candidate_give_an_in_range_token():
    """NaN or -inf logits (a broken model) must not yield a token past the vocabulary,
    which would index an embedding out of bounds on the next step."""
    params = params_for(SETTINGS[:3])  # sampled, sampled, greedy
    logits = torch.full((3, 64), float("nan"), device=DEVICE)
    logits[1] = float("-inf")
    step = torch.zeros(3, dtype=torch.long, device=DEVICE)
    assert torch.equal(sample_tokens(logits, params, step, 1, MAX_TOP_K), torch.zeros(3, dtype=torch.long, device=DEVICE))
    window = torch.full((3, 10), -1, dtype=torch.int32, device=DEVICE)
    got = sample_tokens(logits, params, step, 0, MAX_TOP_K, (window, 63, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P))
    assert ((got >= 0) & (got < 64)).all()


def test_bad_inputs_are_refused():
    params = params_for(SETTINGS[:2])
    step = torch.zeros(2, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="logits"):
        sample_tokens(torch.randn(2, 10, device=DEVICE).t(), params, step, 1, MAX_TOP_K)
    with pytest.raises(ValueError, match="step"):
        sample_tokens(torch.randn(2, 10, device=DEVICE), params, step.int(), 1, MAX_TOP_K)
    with pytest.raises(ValueError, match="last column"):
        sample_tokens(torch.randn(2, 10, device=DEVICE), params, step, 0, MAX_TOP_K,
                      (torch.zeros(2, 10, dtype=torch.int32, device=DEVICE), 5, RAS_DRAW, 1.0, 0.9))


def test_the_kernels_noise_stride_is_the_engines():
    from engine.sampling import DRAWS_PER_FRAME
    from kernels import sample

    assert sample.DRAWS_PER_FRAME == DRAWS_PER_FRAME


def _gathered_rows(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Which rows the kernel draws from gathered candidates (the rule in kernels/sample.py,
    over logits: a tie of logits ties the keys' order too): at most GATHER_CAP logits at
    or above the top_k-th largest of the GATHER_GROUPS group maxima."""
    from kernels import sample

    b, v = logits.shape
    block = 1 << (v - 1).bit_length()
    padded = torch.full((b, block), float("-inf"), device=logits.device)
    padded[:, :v] = logits.float()
    groups = min(sample.GATHER_GROUPS, block)
    maxima = padded.view(b, groups, -1).amax(-1).sort(-1, descending=True).values
    k = top_k.clamp(max=MAX_TOP_K)
    floor = torch.where(k <= groups, maxima.gather(1, (k.clamp(max=groups) - 1)[:, None])[:, 0], float("-inf"))
    return ((padded >= floor[:, None]) & (padded > float("-inf"))).sum(-1) <= min(sample.GATHER_CAP, block)


@pytest.mark.parametrize("vocab, semantic", [(4096, False), (4097, True), (1000, False)])
def test_gathered_draws_are_the_walks(vocab, semantic):
    """The draw from gathered candidates (sorted, the stops as masks) gives token for token
    what the walk over all keys gives, on flat and peaked logits, ties, every setting; the
    inputs take both paths (a top_k of 128 over flat logits gathers too many)."""
    settings = SETTINGS + [(0.8, 0.9, 30, 8, True, True), (1.0, 1.0, 128, 9, True, True)]
    params, b = params_for(settings), len(settings)
    g = torch.Generator().manual_seed(vocab)
    paths = set()
    for trial in range(3):
        logits = torch.randn(b, vocab, generator=g) * (0.5 + 2 * trial)
        if trial == 2:
            logits = (logits * 2).round() / 2  # many tied logits
        logits = logits.to(DEVICE)
        paths |= set(_gathered_rows(logits, params.top_k).tolist())
        step = torch.randint(0, 10_000, (b,), generator=g).to(DEVICE)
        extra = ()
        if semantic:
            window = torch.randint(-1, vocab - 1, (b, 10), generator=g, dtype=torch.int32).to(DEVICE)
            window[:, 3] = logits[:, :-1].argmax(-1).int()
            extra = ((window, vocab - 1, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P),)
        draw = 0 if semantic else 1 + trial
        walked = sample_tokens(logits, params, step, draw, MAX_TOP_K, *extra, gather=False)
        assert torch.equal(sample_tokens(logits, params, step, draw, MAX_TOP_K, *extra), walked), trial
    assert paths == {True, False}


def test_the_kernels_own_reference_draws_what_the_engine_draws():
    """kernels/sample.py's PyTorch reference (what the self-check compares against, with
    no engine import) is engine/sampling.py's draw, token for token."""
    params, b = params_for(SETTINGS), len(SETTINGS)
    g = torch.Generator().manual_seed(2)
    for trial in range(4):
        logits = (torch.randn(b, 257, generator=g) * (0.5 + trial)).to(DEVICE)
        step = torch.randint(0, 10_000, (b,), generator=g).to(DEVICE)
        window = torch.randint(-1, 256, (b, 10), generator=g, dtype=torch.int32).to(DEVICE)
        window[:, 3] = logits[:, :-1].argmax(-1).int()
        noise = frame_gumbel(params, step, 3)
        want = sample_codebook(logits, params, window, step, 2, noise[:, 2], penalize=False)
        assert torch.equal(sample_tokens_reference(logits, params, step, 2, MAX_TOP_K), want), trial
        want = sample_semantic(logits, params, window, step, 256, noise[:, 0], noise[:, 3], penalize=False)
        got = sample_tokens_reference(logits, params, step, 0, MAX_TOP_K,
                                      (window, 256, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P))
        assert torch.equal(got, want), trial


def test_the_self_check_passes_and_takes_its_own_params():
    assert self_check(DEVICE, 300, 257, MAX_TOP_K) is None
    p = params_for(SETTINGS[:2])
    own = DrawParams(p.temperature, p.top_p, p.top_k, p.seed, p.allow_end, p.ras)
    logits, step = torch.randn(2, 300, device=DEVICE), torch.zeros(2, dtype=torch.long, device=DEVICE)
    assert torch.equal(sample_tokens(logits, own, step, 1, MAX_TOP_K), sample_tokens(logits, p, step, 1, MAX_TOP_K))
