"""Build the upstream modded-DAC at a small random config and record what it computes.

Run with an environment that can import upstream fish-speech and descript-audio-codec:

    PYTHONPATH=/tmp/stubs:/tmp/fs /tmp/upvenv/bin/python scripts/upstream_parity/make_codec_fixture.py

Writes tests/fixtures/upstream/codec/:
  codec.pth           upstream's own state dict, keys exactly as its modules name them
                      (weight norm as `parametrizations.weight.original0/1` on the causal
                      convs and as `weight_g/weight_v` on the dac VQ projections)
  codec_config.json   the same shape in this project's CodecConfig format
  expected.safetensors  audio -> upstream encode codes; codes -> upstream from_indices audio
  fish_keys.json      key -> shape of the upstream model at the release ("fish") shape
This file only drives upstream's public classes; none of their code is in it.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

importlib.import_module("dac.nn.quantize")  # upstream dependency check: fails early without descript-audio-codec
from fish_speech.models.dac.modded_dac import DAC, ModelArgs, WindowLimitedTransformer
from fish_speech.models.dac.rvq import DownsampleResidualVectorQuantize

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from engine.codec.config import CodecConfig  # noqa: E402  (stdlib-only module)

OUT = ROOT / "tests" / "fixtures" / "upstream" / "codec"
SEED = 1234
FIXTURE = CodecConfig(
    encoder_dim=4,
    encoder_transformer_layers=(0, 0, 0, 1),
    encoder_transformer_window=16,
    encoder_transformer_head_dim=16,
    latent_dim=16,
    decoder_dim=32,
    n_codebooks=3,
    codebook_size=64,
    semantic_codebook_size=128,
    quantizer_layers=2,
    quantizer_dim=24,  # != latent_dim: exercises the transformer's in/out projections
    quantizer_heads=3,
    quantizer_head_dim=8,
    quantizer_intermediate=48,
    quantizer_window=6,
)
ENCODE_SAMPLES = 15_000  # 8 frames, the last one partial
DECODE_FRAMES = 14  # > 2 * quantizer_window, so the window mask matters


def build_upstream(c: CodecConfig) -> DAC:
    general = functools.partial(
        ModelArgs, block_size=8192, n_local_heads=-1, head_dim=c.encoder_transformer_head_dim,
        rope_base=c.rope_base, norm_eps=c.norm_eps, dropout_rate=0.1, attn_dropout_rate=0.1,
        channels_first=True)
    # upstream reads the encoder window with getattr(config, "window_size", 512)
    general.window_size = c.encoder_transformer_window

    def transformer() -> WindowLimitedTransformer:
        args = ModelArgs(
            block_size=2048, n_layer=c.quantizer_layers, n_head=c.quantizer_heads,
            dim=c.quantizer_dim, intermediate_size=c.quantizer_intermediate, n_local_heads=-1,
            head_dim=c.quantizer_head_dim, rope_base=c.rope_base, norm_eps=c.norm_eps,
            dropout_rate=0.1, attn_dropout_rate=0.1, channels_first=True)
        return WindowLimitedTransformer(causal=True, window_size=c.quantizer_window,
                                        input_dim=c.latent_dim, config=args)

    quantizer = DownsampleResidualVectorQuantize(
        input_dim=c.latent_dim, n_codebooks=c.n_codebooks, codebook_size=c.codebook_size,
        codebook_dim=c.codebook_dim, quantizer_dropout=0.5,
        downsample_factor=list(c.downsample_factors), semantic_codebook_size=c.semantic_codebook_size,
        pre_module=transformer(), post_module=transformer())
    return DAC(
        encoder_dim=c.encoder_dim, encoder_rates=list(c.encoder_rates), latent_dim=c.latent_dim,
        decoder_dim=c.decoder_dim, decoder_rates=list(c.decoder_rates), quantizer=quantizer,
        sample_rate=c.sample_rate, causal=True,
        encoder_transformer_layers=list(c.encoder_transformer_layers),
        decoder_transformer_layers=[0, 0, 0, 0], transformer_general_config=general)


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Upstream's init leaves biases at 0 and layer scales at 1e-2 / 1e-6, which would hide
    a double-added bias or a wrong transformer. Give every tensor a value that matters,
    scaled so activations stay O(1) and the tanh output is not saturated."""

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("original0", "weight_g"):  # weight-norm magnitude per output row
            value = uniform(p.shape, 0.5, 1.2)
        elif leaf in ("alpha",):  # Snake frequency
            value = uniform(p.shape, 0.5, 1.5)
        elif leaf == "gamma":  # LayerScale / ConvNeXt scale
            value = uniform(p.shape, 0.1, 0.5)
        elif leaf == "bias":
            value = 0.1 * torch.randn(p.shape, generator=gen)
        elif "norm" in name and p.dim() == 1:  # RMSNorm / LayerNorm weight
            value = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif "codebook" in name:
            value = torch.randn(p.shape, generator=gen)
        else:  # plain or direction weights: unit variance per output over fan-in
            fan_in = math.prod(p.shape[1:]) if p.dim() > 1 else 1
            value = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
        with torch.no_grad():
            p.copy_(value)
    # the last conv maps ~unit-variance features to the tanh: keep its output near 0.3 rms
    last = model.decoder.model[-2].conv
    with torch.no_grad():
        last.parametrizations.weight.original0.fill_(0.08)
        last.bias.zero_()


def fish_keys() -> dict[str, list[int]]:
    """Key -> shape of upstream's model at the release shape, built on the meta device."""
    import hydra
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(next(Path(p) for p in sys.path if (Path(p) / "fish_speech").is_dir())
                         / "fish_speech" / "configs" / "modded_dac_vq.yaml")
    with torch.device("meta"):
        model = hydra.utils.instantiate(cfg)
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def main() -> None:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = build_upstream(FIXTURE)
    randomize(model, gen)
    model.eval()
    hop = FIXTURE.hop_length
    assert model.frame_length == hop, (model.frame_length, hop)

    t = torch.arange(ENCODE_SAMPLES) / FIXTURE.sample_rate
    audio = torch.stack([
        0.5 * torch.sin(2 * math.pi * 220 * t) + 0.1 * torch.randn(ENCODE_SAMPLES, generator=gen),
        0.3 * torch.randn(ENCODE_SAMPLES, generator=gen).clamp(-3, 3),
    ])
    K = FIXTURE.num_codebooks
    codes = torch.cat([
        torch.randint(0, FIXTURE.semantic_codebook_size, (2, 1, DECODE_FRAMES), generator=gen),
        torch.randint(0, FIXTURE.codebook_size, (2, K - 1, DECODE_FRAMES), generator=gen),
    ], dim=1)
    codes[0, 0, 3] = FIXTURE.semantic_codebook_size + 5  # out of range: upstream clamps
    codes[1, 2, 7] = FIXTURE.codebook_size + 100

    with torch.no_grad():
        encoded, _ = model.encode(audio)
        decoded = model.from_indices(codes.clone())[:, 0]  # from_indices clamps in place
    print(f"encode codes {tuple(encoded.shape)}, decode audio {tuple(decoded.shape)} "
          f"std {decoded.std():.3f} max|x| {decoded.abs().max():.3f}")

    OUT.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), OUT / "codec.pth")
    (OUT / "codec_config.json").write_text(FIXTURE.to_json() + "\n")
    save_file({
        "audio": audio.contiguous(),
        "codes": encoded.long().contiguous(),
        "decode_codes": codes.contiguous(),
        "decoded": decoded.contiguous(),
    }, OUT / "expected.safetensors")
    (OUT / "fish_keys.json").write_text(json.dumps(fish_keys(), indent=0) + "\n")
    for path in sorted(OUT.iterdir()):
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
