"""Sizes of the modded-DAC codec (the Fish Speech S1/S2 codec family).

One `CodecConfig` describes the whole network: the causal conv encoder (with a small
transformer in its deepest block), the x4 downsampling residual-VQ wrapper with its
window-limited transformers, and the causal conv decoder. `codec_preset("fish")` is the
shape of the released `codec.pth`; `codec_preset("tiny")` is a small codec of the same
family for tests and laptops. A checkpoint folder with another shape carries a
`codec_config.json` (`to_json` / `from_json`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace

MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 192_000

DECODER_KINDS = ("dac", "istft")
ENCODER_KINDS = ("dac", "stft")

# Upstream sizes the encoder transformer's heads as `dim // 64` whatever its head_dim is.
ENCODER_HEAD_DIVISOR = 64


@dataclass(slots=True)
class CodecConfig:
    sample_rate: int = 44_100
    # encoder: conv stem of `encoder_dim` channels, one block per rate doubling the width
    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)  # per encoder block
    encoder_transformer_window: int = 512  # frames at the encoder rate (hop 512)
    encoder_transformer_head_dim: int = 64
    # "dac": the strided conv encoder above (the release's). "stft": an experiment for small
    # codecs: each hop's log-magnitude spectrum (a causal window of stft_window hops) ->
    # `encoder_layers` ConvNeXt blocks at the encoder rate, as wide as the conv encoder's
    # last block (encoder_dim * 2 ** len(encoder_rates)): the encoder starts from the
    # spectrum the loss compares instead of learning it from samples
    encoder_kind: str = "dac"
    encoder_layers: int = 2
    stft_window: int = 4
    # width of the encoder output, the quantizer input and the decoder input (upstream
    # requires the three to agree, so it is one field)
    latent_dim: int = 1024
    # decoder: `decoder_dim` channels halved by each transposed-conv block
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    # "dac": the transposed-conv decoder above (the release's). "istft": an experiment for
    # small codecs: `decoder_layers` ConvNeXt blocks of `decoder_dim` at the latent rate and a
    # head that predicts each latent frame's spectrum (magnitude and phase), turned into
    # audio by an inverse FFT with overlap-add (Vocos's idea): the loss's spectra are one
    # step from the output. Its hop is prod(decoder_rates), its window istft_window hops.
    decoder_kind: str = "dac"
    decoder_layers: int = 6
    istft_window: int = 4
    # "istft" only: hops by which a head frame's window starts before its own hop. A frame
    # sees the latent up to its own hop, so with 0 the window's later hops (up to
    # istft_window - 1 of them, most of its weight) are audio the codes for it have not
    # described yet: ~1.5 hops in every code frame of 4 are guessed. istft_window - 1 removes the guess; the offline decode is then
    # advanced to stay aligned, and a stream (engine/codec/streaming.py) lags its codes by
    # this many hops.
    istft_lookahead: int = 0
    # quantizer: 1 semantic codebook + `n_codebooks` residual ones
    n_codebooks: int = 9
    codebook_size: int = 1024
    semantic_codebook_size: int = 4096
    codebook_dim: int = 8
    downsample_factors: tuple[int, ...] = (2, 2)
    # quantizer pre/post transformers (window in code frames)
    quantizer_layers: int = 8
    quantizer_dim: int = 1024
    quantizer_heads: int = 16
    quantizer_head_dim: int = 64
    quantizer_intermediate: int = 3072
    quantizer_window: int = 128
    rope_base: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("encoder_rates", "encoder_transformer_layers", "decoder_rates",
                     "downsample_factors"):
            setattr(self, name, tuple(int(v) for v in getattr(self, name)))
        _check(MIN_SAMPLE_RATE <= self.sample_rate <= MAX_SAMPLE_RATE,
               f"sample_rate {self.sample_rate} outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE}")
        for name in ("encoder_dim", "latent_dim", "decoder_dim", "n_codebooks", "codebook_size",
                     "semantic_codebook_size", "codebook_dim", "quantizer_layers",
                     "quantizer_dim", "quantizer_heads", "quantizer_head_dim",
                     "quantizer_intermediate", "quantizer_window", "encoder_transformer_window",
                     "encoder_transformer_head_dim"):
            _check(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        for name in ("encoder_rates", "decoder_rates", "downsample_factors"):
            rates = getattr(self, name)
            _check(len(rates) > 0 and all(r > 0 for r in rates), f"{name} must be positive: {rates}")
        _check(len(self.encoder_transformer_layers) == len(self.encoder_rates),
               "encoder_transformer_layers needs one entry per encoder rate")
        _check(all(n >= 0 for n in self.encoder_transformer_layers),
               "encoder_transformer_layers must be >= 0")
        for i, n in enumerate(self.encoder_transformer_layers):
            width = self.encoder_dim * 2 ** (i + 1)
            _check(n == 0 or width >= ENCODER_HEAD_DIVISOR,
                   f"encoder block {i} is {width} wide; a transformer there needs >= 64")
        # decode must give exactly hop_length samples per code frame
        _check(math.prod(self.decoder_rates) == math.prod(self.encoder_rates),
               f"decoder_rates {self.decoder_rates} must upsample by the encoder's "
               f"{math.prod(self.encoder_rates)}")
        _check(self.decoder_kind in DECODER_KINDS, f"decoder_kind must be one of {DECODER_KINDS}")
        _check(self.encoder_kind in ENCODER_KINDS, f"encoder_kind must be one of {ENCODER_KINDS}")
        _check(self.encoder_layers > 0 and 1 <= self.stft_window <= 16,
               "encoder_layers must be > 0 and stft_window in 1..16 hops")
        _check(self.decoder_kind != "dac" or self.decoder_dim % 2 ** len(self.decoder_rates) == 0,
               f"decoder_dim {self.decoder_dim} must halve {len(self.decoder_rates)} times")
        _check(self.decoder_layers > 0 and 1 <= self.istft_window <= 16,
               "decoder_layers must be > 0 and istft_window in 1..16 hops")
        _check(0 <= self.istft_lookahead < self.istft_window,
               f"istft_lookahead must be in 0..istft_window - 1 ({self.istft_window - 1})")
        _check(self.norm_eps > 0 and self.rope_base > 0, "norm_eps and rope_base must be > 0")
        _check(self.quantizer_head_dim % 2 == 0 and self.encoder_transformer_head_dim % 2 == 0,
               "RoPE needs an even head_dim")

    @property
    def hop_length(self) -> int:
        """Audio samples per code frame (2048 for the release codec)."""
        return math.prod(self.encoder_rates) * math.prod(self.downsample_factors)

    @property
    def num_codebooks(self) -> int:
        return 1 + self.n_codebooks

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop_length

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> CodecConfig:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("codec config JSON must be an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown codec config fields: {unknown}")
        return cls(**data)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"CodecConfig: {message}")


_PRESETS: dict[str, CodecConfig] = {
    # the released S1-mini / S2-Pro codec.pth (fish_speech/configs/modded_dac_vq.yaml)
    "fish": CodecConfig(),
    # same family, ~1% of the width: 4 codebooks of 256, hop 2048 at 44.1 kHz
    "tiny": CodecConfig(
        encoder_dim=8,
        encoder_transformer_layers=(0, 0, 0, 1),
        latent_dim=64,
        decoder_dim=64,
        n_codebooks=3,
        codebook_size=256,
        semantic_codebook_size=256,
        quantizer_layers=2,
        quantizer_dim=64,
        quantizer_heads=2,
        quantizer_head_dim=32,
        quantizer_intermediate=192,
    ),
}


def codec_preset(name: str, **overrides) -> CodecConfig:
    """A named codec shape; keyword overrides replace single fields (validated)."""
    try:
        base = _PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown codec preset {name!r}; known: {sorted(_PRESETS)}") from None
    return replace(base, **overrides)
