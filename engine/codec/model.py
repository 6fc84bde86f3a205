"""The modded-DAC codec: audio [B, T] at 44.1 kHz <-> codes [B, 1 + N, T / 2048].

encode: causal conv encoder (strides 2*4*8*8, a window-limited transformer in its last
block) -> DownsampleQuantizer.encode (x4 more). decode: DownsampleQuantizer.decode ->
causal conv decoder (transposed convs 8*8*4*2) -> tanh. All convolutions are causal, so
decode is streamable (streaming.py). Module names follow upstream's state dict.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.codec.config import ENCODER_HEAD_DIVISOR, CodecConfig
from engine.codec.layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    ResidualUnit,
    Snake1d,
    SpectralHead,
    WindowLimitedTransformer,
)
from engine.codec.quantizer import DownsampleQuantizer


def _residual_units(dim: int) -> list[nn.Module]:
    return [ResidualUnit(dim, dilation) for dilation in (1, 3, 9)]


class EncoderBlock(nn.Module):
    """3 residual units at dim/2 -> Snake -> strided causal conv to dim -> transformer."""

    def __init__(self, dim: int, stride: int, n_layers: int, config: CodecConfig) -> None:
        super().__init__()
        transformer: nn.Module = nn.Identity()
        if n_layers:
            transformer = WindowLimitedTransformer(
                dim, dim, n_layers, dim // ENCODER_HEAD_DIVISOR, config.encoder_transformer_head_dim,
                3 * dim, config.encoder_transformer_window, config.rope_base, config.norm_eps)
        self.block = nn.Sequential(
            *_residual_units(dim // 2),
            Snake1d(dim // 2),
            CausalConv1d(dim // 2, dim, kernel_size=2 * stride, stride=stride),
            transformer,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        dim = config.encoder_dim
        layers: list[nn.Module] = [CausalConv1d(1, dim, kernel_size=7)]
        for stride, n_layers in zip(config.encoder_rates, config.encoder_transformer_layers):
            dim *= 2
            layers.append(EncoderBlock(dim, stride, n_layers, config))
        layers += [Snake1d(dim), CausalConv1d(dim, config.latent_dim, kernel_size=3)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, 1, T] -> [B, latent, T / prod(encoder_rates)]
        return self.block(x)


class SpectralEncoder(nn.Module):
    """The "stft" encoder (CodecConfig.encoder_kind): for each hop of prod(encoder_rates)
    samples, the log-magnitude spectrum of the window of stft_window hops that ends with
    it (zeros before the start: causal, as the conv encoder is), then a k=1 conv to the
    width, `encoder_layers` ConvNeXt blocks, and a k=3 causal conv to the latent. Not in
    upstream's family of checkpoints: an option for the small embedded codec."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        self.hop = math.prod(config.encoder_rates)
        self.n_fft = self.hop * config.stft_window
        width = config.encoder_dim * 2 ** len(config.encoder_rates)
        self.block = nn.Sequential(
            CausalConv1d(self.n_fft // 2 + 1, width, kernel_size=1),
            *[ConvNeXtBlock(width) for _ in range(config.encoder_layers)],
            CausalConv1d(width, config.latent_dim, kernel_size=3),
        )

    def spectrum(self, x: Tensor) -> Tensor:
        """[B, 1, T] (T a multiple of the hop) -> log-magnitudes [B, n_fft / 2 + 1, T / hop], fp32."""
        samples = F.pad(x[:, 0].float(), (self.n_fft - self.hop, 0))
        frames = samples.unfold(-1, self.n_fft, self.hop)  # [B, T / hop, n_fft]
        window = torch.hann_window(self.n_fft, periodic=True, device=x.device)
        return torch.fft.rfft(frames * window).abs().clamp(min=1e-5).log().mT

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, 1, T] -> [B, latent, T / prod(encoder_rates)]
        return self.block(self.spectrum(x).to(x.dtype))


class DecoderBlock(nn.Module):
    """Snake -> causal transposed conv (k = 2 * stride) -> 3 residual units.
    (Upstream also builds a transformer here but never calls it; it has no weights.)"""

    def __init__(self, in_dim: int, out_dim: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(in_dim),
            CausalConvTranspose1d(in_dim, out_dim, kernel_size=2 * stride, stride=stride),
            *_residual_units(out_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        channels = config.decoder_dim
        layers: list[nn.Module] = [CausalConv1d(config.latent_dim, channels, kernel_size=7)]
        for i, stride in enumerate(config.decoder_rates):
            layers.append(DecoderBlock(channels // 2**i, channels // 2 ** (i + 1), stride))
        out_dim = channels // 2 ** len(config.decoder_rates)
        layers += [Snake1d(out_dim), CausalConv1d(out_dim, 1, kernel_size=7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        # z: [B, latent, T] -> [B, 1, T * prod(decoder_rates)]
        return self.model(z)


class SpectralDecoder(nn.Module):
    """The "istft" decoder (CodecConfig.decoder_kind): a causal conv from the latent to
    `decoder_dim`, `decoder_layers` ConvNeXt blocks, all at the latent rate, then a
    SpectralHead with hop prod(decoder_rates). Not in upstream's family of checkpoints:
    an option for the small embedded codec, whose transposed-conv decoder trained on
    spectral losses alone stalled with the spectrum wrong at every scale."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        dim = config.decoder_dim
        self.lookahead = config.istft_lookahead
        # a stream (engine/codec/streaming.py) runs `model` as it is: its audio lags the
        # codes by `lookahead` hops; forward() advances the audio to align it
        self.model = nn.Sequential(
            CausalConv1d(config.latent_dim, dim, kernel_size=7),
            *[ConvNeXtBlock(dim) for _ in range(config.decoder_layers)],
            SpectralHead(dim, math.prod(config.decoder_rates), config.istft_window),
        )

    @property
    def head(self) -> SpectralHead:
        return self.model[-1]

    def hidden(self, z: Tensor) -> Tensor:
        """[B, latent, T] -> the head's input [B, decoder_dim, T]."""
        return self.model[:-1](z)

    def synthesize(self, h: Tensor, spectrum: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """The head's audio from hidden(z), aligned with the codes' audio."""
        return self.head(h, spectrum, advance=self.lookahead)

    def forward(self, z: Tensor) -> Tensor:
        # z: [B, latent, T] -> [B, 1, T * prod(decoder_rates)]
        return self.synthesize(self.hidden(z))


class Codec(nn.Module):
    """`decoder_only=True` leaves out everything only encode reads (encoder, downsample,
    pre_module, VQ input projections): about half of the release's 391M parameters."""

    def __init__(self, config: CodecConfig, decoder_only: bool = False) -> None:
        super().__init__()
        self.config = config
        self.decoder_only = decoder_only
        self.encoder = None if decoder_only else (Encoder if config.encoder_kind == "dac" else SpectralEncoder)(config)
        self.quantizer = DownsampleQuantizer(config, encoder=not decoder_only)
        self.decoder = Decoder(config) if config.decoder_kind == "dac" else SpectralDecoder(config)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def num_codebooks(self) -> int:
        return self.config.num_codebooks

    @torch.no_grad()
    def encode(self, audio: Tensor) -> Tensor:
        """audio: float [B, T] in [-1, 1] at sample_rate -> codes long [B, num_codebooks,
        ceil(T / hop_length)]; the tail is zero-padded to a whole frame (as upstream)."""
        if self.encoder is None:
            raise RuntimeError("this codec was loaded decoder_only; it cannot encode")
        if audio.dim() != 2:
            raise ValueError(f"audio must be [B, T], got {tuple(audio.shape)}")
        if audio.shape[-1] == 0:
            raise ValueError("audio is empty")
        x = audio.to(self.decoder.model[0].conv.weight.dtype)[:, None]  # [B, 1, T]
        x = F.pad(x, (0, -x.shape[-1] % self.hop_length))
        return self.quantizer.encode(self.encoder(x))

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes: [B, num_codebooks, frames] -> audio [B, frames * hop_length] in [-1, 1]."""
        if codes.dim() != 3 or codes.shape[1] != self.num_codebooks:
            raise ValueError(
                f"codes must be [B, {self.num_codebooks}, frames], got {tuple(codes.shape)}")
        return self.decoder(self.quantizer.decode(codes.long()))[:, 0]
