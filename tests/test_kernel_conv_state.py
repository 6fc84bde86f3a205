"""The streaming codec's conv-state kernels (kernels/conv_state.py) against their PyTorch
references, state updates included (Triton interpreter on the CPU, compiled on a GPU),
and the streaming decoder with them against the decoder without them, call after call."""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.layers import Snake1d
from engine.codec.model import Codec
from engine.codec.streaming import StreamingDecoder
from kernels.conv_state import (
    conv_input,
    conv_input_reference,
    self_check,
    transposed_output,
    transposed_output_reference,
)
from kernels.layout import as_layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


def tol(dtype):
    return 1e-6 if dtype == torch.float32 else 8e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("snake", [False, True])
@pytest.mark.parametrize("n, ctx, layout", [(1, 6, "c"), (3, 54, "c"), (40, 18, "c"), (1500, 6, "c"),
                                            (2, 6, "t"), (3, 54, "t"), (1500, 6, "t")])
def test_conv_input_matches_reference(n, ctx, layout, snake, dtype):
    from kernels.layout import time_major as is_time_major

    g = torch.Generator().manual_seed(n * 100 + ctx)
    slots = torch.tensor([3, 0, 2], device=DEVICE)  # out of order; slot 1 is not in the call
    x = (torch.randn(3, 5, n, generator=g) * 3).to(DEVICE, dtype)
    x = as_layout(x, "time-major") if layout == "t" else x
    alpha = (torch.rand(5, generator=g) * 2 + 0.05).to(DEVICE, dtype) if snake else None
    history = torch.randn(4, 5, ctx, generator=g).to(DEVICE, dtype)
    want_history = history.clone()
    want = conv_input_reference(x, want_history, slots, alpha)
    got = conv_input(x, history, slots, alpha)
    assert got.shape == (3, 5, ctx + n) and got.dtype == dtype
    assert is_time_major(got) if layout == "t" else got.is_contiguous()  # the input's layout
    assert rel(got, want) < tol(dtype)
    assert rel(history, want_history) < tol(dtype)
    assert torch.equal(history[slots], got[..., n:])  # the new history is exactly the input's tail
    assert torch.equal(history[1], want_history[1])  # a slot outside the call is untouched


def test_conv_input_strided_x():
    big = torch.randn(2, 4, 300, device=DEVICE)
    x = big[:, :, 100:220]
    history = torch.randn(2, 4, 12, device=DEVICE)
    want_history = history.clone()
    slots = torch.tensor([1, 0], device=DEVICE)
    want = conv_input_reference(x, want_history, slots)
    assert rel(conv_input(x, history, slots), want) < 1e-6
    assert torch.equal(history, want_history)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("emit, overlap, bias, layout", [(8, 8, True, "c"), (2, 6, True, "c"), (2048, 4, False, "c"),
                                                         (1500, 3, True, "c"), (2, 6, True, "t"), (1500, 3, True, "t")])
def test_transposed_output_matches_reference(emit, overlap, bias, layout, dtype):
    g = torch.Generator().manual_seed(emit + overlap)
    slots = torch.tensor([2, 0], device=DEVICE)
    y = torch.randn(2, 6, emit + overlap, generator=g).to(DEVICE, dtype)
    y = as_layout(y, "time-major") if layout == "t" else y
    b = torch.randn(6, generator=g).to(DEVICE, dtype) if bias else None
    tail = torch.randn(3, 6, overlap, generator=g).to(DEVICE, dtype)
    want_tail = tail.clone()
    want = transposed_output_reference(y, want_tail, slots, b, emit)
    got = transposed_output(y, tail, slots, b, emit)
    assert got.shape == (2, 6, emit) and got.dtype == dtype
    assert rel(got, want) < tol(dtype)
    assert rel(tail, want_tail) < tol(dtype)
    assert torch.equal(tail[1], want_tail[1])


def test_bad_inputs_are_refused():
    x = torch.randn(2, 4, 8, device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="state"):
        conv_input(x, torch.zeros(2, 5, 6, device=DEVICE), slots)  # channel count
    with pytest.raises(ValueError, match="contiguous"):
        conv_input(x, torch.zeros(2, 6, 4, device=DEVICE).mT, slots)  # a transposed history
    with pytest.raises(ValueError, match="slots"):
        conv_input(x, torch.zeros(2, 4, 6, device=DEVICE), slots.int())
    with pytest.raises(ValueError, match="alpha"):
        conv_input(x, torch.zeros(2, 4, 6, device=DEVICE), slots, torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match="emit"):
        transposed_output(x, torch.zeros(2, 4, 3, device=DEVICE), slots, None, 4)  # 4 + 3 != 8


@pytest.fixture
def no_tf32():
    """cuDNN picks other conv algorithms for the kernels' NHWC layout than for PyTorch's
    NCHW; with TF32 allowed (PyTorch's default for cuDNN) they differ by ~1e-3 in fp32."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = tf32


@pytest.mark.parametrize("decoder, window", [("dac", 128), ("istft", 128), ("dac", 4)])
def test_streaming_decode_with_the_kernels_matches_without(decoder, window, no_tf32):
    """Chunks of different sizes, streams joining late, one stream reset midway: with the
    state kernels (Snake folded into the convs, attention over the rings, time-major
    activations) every call's audio is the PyTorch path's; with a window of 4 frames the
    rings wrap around."""
    torch.manual_seed(0)
    codec = Codec(codec_preset("tiny", decoder_kind=decoder, quantizer_window=window)).to(DEVICE).eval()
    with torch.no_grad():  # alphas away from their init of 1, so that a channel mix-up shows
        for m in codec.modules():
            if isinstance(m, Snake1d):
                m.alpha.uniform_(0.2, 2.0)
    plain = StreamingDecoder(codec, 3, kernels=False)
    fused = StreamingDecoder(codec, 3, kernels=True)
    g = torch.Generator().manual_seed(1)
    calls = [([0, 1], 1), ([1, 0], 3), ([2], 2), ([0, 2, 1], 1), ("reset", 1), ([1, 2], 4)]
    for call in calls:
        if call[0] == "reset":
            plain.reset(call[1])
            fused.reset(call[1])
            continue
        slots, n = torch.tensor(call[0], device=DEVICE), call[1]
        codes = torch.randint(0, codec.config.codebook_size, (len(call[0]), codec.num_codebooks, n), generator=g).to(DEVICE)
        want, got = plain.decode(slots, codes), fused.decode(slots, codes)
        assert got.shape == want.shape == (len(call[0]), n * codec.hop_length)
        assert rel(got, want) < 1e-5, call


def test_self_check_passes():
    assert self_check(DEVICE, torch.bfloat16) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, window, starts", [
    (1, 8, [0, 5, 40]),     # a fresh slot, a ring not yet full, a ring wrapped many times
    (3, 8, [6, 0, 13]),     # new frames overwrite rows earlier queries of the call still see
    (12, 8, [2, 9, 0]),     # more new frames than the window
    (4, 128, [0, 200, 127]),
])
def test_ring_attention_matches_reference(n, window, starts, dtype):
    from kernels.ring_attention import ring_attention, ring_attention_reference

    g = torch.Generator().manual_seed(n * 1000 + window)
    slots = torch.tensor([3, 0, 1], device=DEVICE)
    start = torch.tensor(starts, device=DEVICE)
    qkv = torch.randn(3, n, 3, 4, 32, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.unbind(2)  # strided views, as the decoder's wqkv output gives them
    k_cache, v_cache = (torch.randn(4, window, 4, 32, generator=g).to(DEVICE, dtype) for _ in range(2))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want = ring_attention_reference(q, k, v, want_k, want_v, slots, start)
    got = ring_attention(q, k, v, k_cache, v_cache, slots, start)
    assert got.shape == (3, n, 4, 32) and got.dtype == dtype
    assert rel(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # rows moved, not computed
    assert torch.equal(k_cache[2], want_k[2])  # a slot outside the call is untouched


def test_ring_attention_refuses_bad_inputs():
    from kernels.ring_attention import ring_attention

    q = torch.randn(2, 1, 4, 32, device=DEVICE)
    cache = torch.zeros(3, 8, 4, 32, device=DEVICE)
    slots, start = torch.tensor([0, 1], device=DEVICE), torch.tensor([0, 0], device=DEVICE)
    with pytest.raises(ValueError, match="caches"):
        ring_attention(q, q, q, torch.zeros(3, 8, 2, 32, device=DEVICE), cache, slots, start)
    with pytest.raises(ValueError, match="start"):
        ring_attention(q, q, q, cache, cache.clone(), slots, start.int())
    with pytest.raises(ValueError, match="head size"):
        ring_attention(*(torch.randn(2, 1, 4, 24, device=DEVICE),) * 3, torch.zeros(3, 8, 4, 24, device=DEVICE),
                       torch.zeros(3, 8, 4, 24, device=DEVICE), slots, start)
