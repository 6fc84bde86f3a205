"""The codec trainer's fused Snake (training/snake_train.py): its output and both gradients
against autograd through the PyTorch reference (Triton interpreter on the CPU, compiled on
a GPU), and a codec trainer using it computing the same step as with Snake1d's own ops."""

from __future__ import annotations

import pytest
import torch

from kernels.snake import snake_reference
from training.snake_train import snake_train

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


def value_and_grads(fn, x, alpha, weight):
    x = x.detach().clone().requires_grad_(True)
    alpha = alpha.detach().clone().requires_grad_(True)
    y = fn(x, alpha)
    dx, da = torch.autograd.grad((y.float() * weight).sum(), (x, alpha))
    return y, dx, da


@pytest.mark.parametrize("shape", [(1, 3, 5), (2, 16, 1500), (2, 4, 2048)])
def test_value_and_both_gradients_match_autograd(shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=g) * 3).to(DEVICE)
    alpha = (torch.rand(shape[1], generator=g) * 2 + 0.05).to(DEVICE)
    alpha[0] = 0.0  # upstream's eps keeps alpha = 0 finite, in the gradient too
    weight = torch.randn(*shape, generator=g).to(DEVICE)
    got = value_and_grads(snake_train, x, alpha, weight)
    want = value_and_grads(snake_reference, x, alpha, weight)
    for name, a, b in zip(("value", "grad x", "grad alpha"), got, want):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel(a, b) < 1e-5, (name, rel(a, b))


def test_strided_input_and_bf16():
    big = torch.randn(2, 8, 300, device=DEVICE)
    x = big[:, :, 50:250]  # not contiguous: rows 300 apart
    alpha = torch.rand(8, device=DEVICE) + 0.1
    weight = torch.randn(2, 8, 200, device=DEVICE)
    got, want = value_and_grads(snake_train, x, alpha, weight), value_and_grads(snake_reference, x, alpha, weight)
    assert all(rel(a, b) < 1e-5 for a, b in zip(got, want))
    xb, ab = x.bfloat16(), alpha.float()  # the trainer's alpha stays fp32 under bf16 activations
    got = value_and_grads(snake_train, xb, ab, weight)
    want = value_and_grads(snake_reference, xb, ab, weight)
    assert got[0].dtype == got[1].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    assert all(rel(a, b) < 2e-2 for a, b in zip(got, want))


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="alpha"):
        snake_train(torch.randn(2, 4, 8, device=DEVICE), torch.ones(3, device=DEVICE))


def test_a_codec_trainer_with_it_takes_the_same_step():
    """codec_forward.use_fused_snake_ (CodecTrainConfig.fused_snake): the same weights give
    the same reconstruction loss and the same gradients as with Snake1d's own ops."""
    import copy

    from engine.codec.model import Codec
    from training.codec_forward import CodecTrainer, add_weight_norm_, init_codec_, use_fused_snake_
    from training.codec_losses import ReconstructionLoss
    from tests.test_train import CODEC

    plain = CodecTrainer(add_weight_norm_(init_codec_(Codec(CODEC), 3)), quantizer_dropout=0.0).to(DEVICE)
    fused = copy.deepcopy(plain)
    use_fused_snake_(fused.codec)
    loss = ReconstructionLoss(CODEC.sample_rate, mel_windows=(32, 64, 128), mel_bands=(5, 10, 20), stft_windows=(64,)).to(DEVICE)
    x = (torch.randn(2, 64 * CODEC.hop_length, generator=torch.Generator().manual_seed(4)) * 0.1).to(DEVICE)
    results = []
    for trainer in (plain, fused):
        y, _ = trainer(x)
        value = loss.mel(y, x)
        value.backward()
        grads = {n: p.grad.clone() for n, p in trainer.named_parameters() if p.grad is not None}
        results.append((float(value.detach()), grads))
    assert abs(results[0][0] - results[1][0]) < 1e-5 * abs(results[0][0])
    assert results[0][1].keys() == results[1][1].keys()
    snake_alphas = [n for n in results[0][1] if n.endswith("alpha")]
    assert snake_alphas  # the Snakes' own parameters get their gradient through the kernel
    for name, g in results[0][1].items():
        assert rel(results[1][1][name], g) < 1e-3, name
