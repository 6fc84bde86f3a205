"""The codec's fused Snake kernel against its PyTorch reference and the codec's own
Snake1d (Triton interpreter on the CPU, compiled on a GPU), and the streaming decoder
with it."""

from __future__ import annotations

import pytest
import torch

from engine.codec.layers import Snake1d
from kernels.snake import self_check, snake, snake_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 3, 5), (2, 16, 1500), (3, 4, 2048)])
def test_matches_reference_and_snake1d(shape, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=g) * 3).to(DEVICE, dtype)
    module = Snake1d(shape[1]).to(DEVICE)
    with torch.no_grad():
        module.alpha.copy_(torch.rand(1, shape[1], 1, generator=g) * 2 + 0.05)
    module = module.to(dtype)
    out = snake(x, module.alpha.view(-1))
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert rel(out, snake_reference(x, module.alpha.view(-1))) < (1e-6 if dtype == torch.float32 else 8e-3)
    # PyTorch's Snake1d rounds after each of its five ops in bf16
    assert rel(out, module(x)) < (1e-5 if dtype == torch.float32 else 3e-2)


def test_strided_input_and_zero_alpha():
    big = torch.randn(2, 4, 200, device=DEVICE)
    x = big[:, :, 50:150]  # rows 200 apart
    alpha = torch.tensor([0.0, 0.5, 1.0, 2.0], device=DEVICE)
    out = snake(x, alpha)
    assert torch.isfinite(out).all()
    assert rel(out, snake_reference(x, alpha)) < 1e-5
    assert torch.allclose(out[:, 0], x[:, 0])  # alpha 0: sin^2(0) / 1e-9 = 0


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        snake(torch.randn(2, 4, 8, device=DEVICE), torch.ones(3, device=DEVICE))


def test_streaming_decode_with_the_kernel_matches_without():
    from engine.codec.config import codec_preset
    from engine.codec.model import Codec
    from engine.codec.streaming import StreamingDecoder

    torch.manual_seed(0)
    codec = Codec(codec_preset("tiny")).to(DEVICE).eval()
    with torch.no_grad():  # alphas away from their init of 1, so that a channel mix-up shows
        for m in codec.modules():
            if isinstance(m, Snake1d):
                m.alpha.uniform_(0.2, 2.0)
    codes = torch.randint(0, codec.config.codebook_size, (2, codec.num_codebooks, 3), device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    # TF32 off: with it cuDNN's conv picks differ by ~1e-3 between the two layouts
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        outs = [StreamingDecoder(codec, 2, kernels=on).decode(slots, codes) for on in (False, True)]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    assert rel(outs[1], outs[0]) < 1e-5


def test_self_check_passes():
    assert self_check(DEVICE, torch.bfloat16) is None


def test_time_major_in_time_major_out():
    from kernels.layout import as_layout, time_major

    x = as_layout(torch.randn(2, 96, 300, device=DEVICE), "time-major")
    alpha = torch.rand(96, device=DEVICE) + 0.1
    out = snake(x, alpha)
    assert time_major(out) and rel(out, snake_reference(x, alpha)) < 1e-6


def test_bias_is_added_first():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 300, generator=g).to(DEVICE)
    alpha = (torch.rand(6, generator=g) * 2 + 0.05).to(DEVICE)
    bias = torch.randn(6, generator=g).to(DEVICE)
    out = snake(x, alpha, bias)
    assert rel(out, snake_reference(x, alpha, bias)) < 1e-6
    assert rel(out, snake_reference(x + bias[:, None], alpha)) < 1e-6
    assert rel(out, snake(x, alpha)) > 1e-2  # the bias did something
