"""The codec's quantizer: L2-normalised nearest-neighbour VQ, residual VQ, and the wrapper
that downsamples the latent x4 in time, runs a transformer on each side of the codebooks
and upsamples back.

Codes are [B, 1 + n_codebooks, frames]: row 0 the semantic codebook, rows 1.. the residual
ones. Encoding follows upstream's arithmetic step by step (including the straight-through
`z_e + (z_q - z_e)`), because each residual codebook picks its code from what the previous
ones left over and a rounding difference could flip a near-tie.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.codec.config import CodecConfig
from engine.codec.layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    WindowLimitedTransformer,
)


class VectorQuantizer(nn.Module):
    """1x1 projections around a codebook; the search is cosine (both sides L2-normalised),
    the decoded vector is the raw codebook row."""

    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int, encoder: bool = True):
        super().__init__()
        self.codebook_size = codebook_size
        self.in_proj = nn.Conv1d(input_dim, codebook_dim, 1) if encoder else None
        self.out_proj = nn.Conv1d(codebook_dim, input_dim, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        # z: [B, D, T] -> codes [B, T], quantized z [B, D, T]
        z_e = self.in_proj(z)  # [B, d, T]
        B, d, T = z_e.shape
        enc = F.normalize(z_e.mT.reshape(B * T, d))
        book = F.normalize(self.codebook.weight)
        dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ book.t() + book.pow(2).sum(1)[None]
        codes = (-dist).max(1).indices.view(B, T)
        z_q = self.codebook(codes).mT
        return codes, self.out_proj(z_e + (z_q - z_e))

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, T] -> [B, D, T]
        return self.out_proj(self.codebook(codes).mT)


class ResidualVQ(nn.Module):
    """Each codebook quantizes what the previous ones left; the sum is the quantized z."""

    def __init__(self, input_dim: int, n_codebooks: int, codebook_size: int, codebook_dim: int,
                 encoder: bool = True) -> None:
        super().__init__()
        self.codebook_size = codebook_size
        self.quantizers = nn.ModuleList(
            VectorQuantizer(input_dim, codebook_size, codebook_dim, encoder)
            for _ in range(n_codebooks))

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        # z: [B, D, T] -> codes [B, N, T], quantized z [B, D, T]
        residual, z_q, codes = z, 0.0, []
        for vq in self.quantizers:
            c, q = vq.encode(residual)
            residual = residual - q
            z_q = z_q + q
            codes.append(c)
        return torch.stack(codes, dim=1), z_q

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, N, T] -> [B, D, T]
        z = 0.0
        for i, vq in enumerate(self.quantizers):
            z = z + vq.decode(codes[:, i])
        return z


class DownsampleQuantizer(nn.Module):
    """encode: downsample (causal conv stride f + ConvNeXt, per factor) -> pre_module ->
    semantic VQ -> residual VQ of the rest. decode: both VQs' vectors summed ->
    post_module -> upsample (transposed conv k = stride = f + ConvNeXt, per factor)."""

    def __init__(self, config: CodecConfig, encoder: bool = True) -> None:
        super().__init__()
        c = config
        dim = c.latent_dim
        self.semantic_quantizer = ResidualVQ(dim, 1, c.semantic_codebook_size, c.codebook_dim, encoder)
        self.quantizer = ResidualVQ(dim, c.n_codebooks, c.codebook_size, c.codebook_dim, encoder)

        def transformer() -> WindowLimitedTransformer:
            return WindowLimitedTransformer(
                dim, c.quantizer_dim, c.quantizer_layers, c.quantizer_heads, c.quantizer_head_dim,
                c.quantizer_intermediate, c.quantizer_window, c.rope_base, c.norm_eps)

        factors = c.downsample_factors
        self.downsample = nn.Sequential(*(
            nn.Sequential(CausalConv1d(dim, dim, f, stride=f), ConvNeXtBlock(dim))
            for f in factors)) if encoder else None
        # upstream indexes upsample stages from the deepest factor back to the first
        self.upsample = nn.Sequential(*(
            nn.Sequential(CausalConvTranspose1d(dim, dim, f, stride=f), ConvNeXtBlock(dim))
            for f in reversed(factors)))
        self.pre_module = transformer() if encoder else None
        self.post_module = transformer()

    def encode(self, z: Tensor) -> Tensor:
        # z: [B, D, T_latent] -> codes [B, 1 + N, T_latent / prod(factors)]
        z = self.pre_module(self.downsample(z))
        semantic_codes, semantic_z = self.semantic_quantizer.encode(z)
        residual_codes, _ = self.quantizer.encode(z - semantic_z)
        return torch.cat([semantic_codes, residual_codes], dim=1)

    def embed(self, codes: Tensor) -> Tensor:
        """codes: [B, 1 + N, T] -> summed codebook vectors [B, D, T] (before post_module).
        Out-of-range codes are clamped into each codebook, as upstream does."""
        semantic = codes[:, :1].clamp(0, self.semantic_quantizer.codebook_size - 1)
        residual = codes[:, 1:].clamp(0, self.quantizer.codebook_size - 1)
        return self.semantic_quantizer.decode(semantic) + self.quantizer.decode(residual)

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, 1 + N, T] -> [B, D, T * prod(factors)]
        return self.upsample(self.post_module(self.embed(codes)))
