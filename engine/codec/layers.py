"""Building blocks of the modded-DAC codec: causal convolutions, Snake, ConvNeXt, residual
units and the window-limited causal transformer.

Every module keeps upstream's parameter names (`conv.weight`, `alpha`, `layers.N.attention.wqkv`,
...) so a released state dict maps onto it after weight norm is folded (see loader.py).
Shapes: B batch, C channels, T time steps; the transformer works on [B, T, D] tokens.
The whole-sequence forward here is the reference; streaming.py runs the same weights one
chunk at a time with explicit state.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the codec's transformer blocks share the model's norm, rotary embedding and SwiGLU
from engine.layers import FeedForward, RMSNorm, apply_rope  # noqa: F401 (re-exported)

# q, k, v: [B, T, H, Dh] -> [B, T, H, Dh]
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


class CausalConv1d(nn.Module):
    """Conv1d that only looks back: pads (receptive - stride) zeros on the left and, for
    strided convs, right-pads the input to a whole number of strides (as upstream does)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 stride: int = 1, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride,
                              dilation=dilation, groups=groups)
        self.stride = stride
        self.receptive = (kernel_size - 1) * dilation + 1
        self.left_pad = self.receptive - stride

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, ceil(T / stride)]
        right_pad = -x.shape[-1] % self.stride
        return self.conv(F.pad(x, (self.left_pad, right_pad)))


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d whose last (kernel - stride) outputs are dropped, so T frames give
    exactly T * stride samples and no output depends on a later frame."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, T * stride]
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.overlap]


class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha per channel; the 1e-9 keeps alpha = 0 finite (upstream)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    """Snake -> dilated causal conv k7 -> Snake -> conv k1, added to the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv1d(dim, dim, kernel_size=7, dilation=dilation),
            Snake1d(dim),
            CausalConv1d(dim, dim, kernel_size=1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7, then LayerNorm -> MLP (x4, GELU) -> per-channel scale,
    added to the input. `pointwise` is split out so streaming can feed its own conv."""

    def __init__(self, dim: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, mlp_ratio * dim)
        self.pwconv2 = nn.Linear(mlp_ratio * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def pointwise(self, h: Tensor) -> Tensor:
        # h: [B, C, T] (the dwconv output) -> [B, C, T]
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.mT))))
        return (self.gamma * h).mT

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pointwise(self.dwconv(x))


LOG_MAGNITUDE_MAX = 6.0  # exp(6) ~ 400: a fresh head cannot blow the output up


class SpectralHead(nn.Module):
    """Latent frames [B, dim, T] -> audio [B, 1, T * hop] (the "istft" decoder's output):
    each frame's spectrum, log-magnitude and phase of n_fft // 2 + 1 bins (n_fft =
    window_hops * hop), from a LayerNorm and one linear layer; an inverse real FFT, a
    periodic Hann window, and overlap-add. Frame t's window covers samples [t * hop,
    t * hop + n_fft), so samples [t * hop, (t + 1) * hop) are complete once frame t is in:
    no look-ahead, and a stream only keeps the last frames' tails (`overlap_add`)."""

    def __init__(self, dim: int, hop: int, window_hops: int) -> None:
        super().__init__()
        self.hop, self.window_hops, self.n_fft = hop, window_hops, hop * window_hops
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.proj = nn.Linear(dim, self.n_fft + 2)

    def spectrum(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """[B, dim, T] -> each frame's (log-magnitude, phase) [B, T, n_fft // 2 + 1], fp32,
        the log-magnitude clamped as synthesis uses it."""
        h = self.proj(self.norm(x.mT)).float()
        bins = self.n_fft // 2 + 1
        return h[..., :bins].clamp(max=LOG_MAGNITUDE_MAX), h[..., bins:]

    def frames(self, x: Tensor, spectrum: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """[B, dim, T] -> each frame's windowed waveform [B, T, window_hops, hop], fp32
        (from `spectrum`, this head's output for x, when the caller has it already)."""
        B, _, T = x.shape
        log_magnitude, phase = self.spectrum(x) if spectrum is None else spectrum
        wave = torch.fft.irfft(torch.polar(torch.exp(log_magnitude), phase), n=self.n_fft)
        # made per call, not a buffer: checkpoints load onto the meta device, which a
        # non-persistent buffer would never leave. Hann windows overlap-added at this hop
        # sum to window_hops / 2: scaled so that they sum to 1
        window = torch.hann_window(self.n_fft, periodic=True, device=x.device) * (2.0 / self.window_hops)
        return (wave * window).view(B, T, self.window_hops, self.hop)

    def forward(self, x: Tensor, spectrum: tuple[Tensor, Tensor] | None = None, advance: int = 0) -> Tensor:
        """`advance`: drop the first `advance` hops and end with the overlap-add tail of the
        last frames instead (SpectralDecoder's lookahead): the same length, T * hop."""
        audio, tail = overlap_add(self.frames(x, spectrum), None)
        if advance:
            T = x.shape[-1]
            audio = torch.cat([audio, tail.flatten(1)], dim=1)[:, advance * self.hop:(advance + T) * self.hop]
        return audio[:, None].to(x.dtype)

    def analysis_window(self, device: torch.device | str | None = None) -> Tensor:
        """The analysis window a under which this head's synthesis reconstructs a signal
        exactly: if each frame's spectrum is rfft(a * frame) with the true phase, overlap-
        add gives the frame's samples back (sum over shifts of a * s = 1, s the synthesis
        window hann * 2 / window_hops). hann^2 summed over window_hops >= 3 shifts is
        3 / 8 x window_hops, so a = hann / 0.75; at 2 hops Hann alone sums to 1, so a = 1
        (1 hop has no such window: a = 1 there too). Training's head-spectrum loss takes
        its targets under it (training/codec_losses.frame_log_magnitude)."""
        if self.window_hops >= 3:
            return torch.hann_window(self.n_fft, periodic=True, device=device) / 0.75
        return torch.ones(self.n_fft, device=device)


def overlap_add(frames: Tensor, tail: Tensor | None) -> tuple[Tensor, Tensor]:
    """frames [B, n, R, hop] (frame i's window, in R hops) and the tail of earlier frames
    [B, R - 1, hop] (what they add to the next R - 1 hops; None: nothing before) -> the n
    completed hops [B, n * hop] and the new tail [B, R - 1, hop]."""
    B, n, R, hop = frames.shape
    buf = frames.new_zeros(B, n + R - 1, hop)
    if tail is not None:
        buf[:, : R - 1] += tail.to(buf.dtype)
    for k in range(R):
        buf[:, k : k + n] += frames[:, :, k]
    return buf[:, :n].reshape(B, n * hop), buf[:, n:]


# ---------------------------------------------------------------------------------------
# window-limited causal transformer


def rope_cos_sin(positions: Tensor, head_dim: int, base: float) -> Tensor:
    """[..., Dh/2, 2] (cos, sin) rows for integer `positions`, rounded to bf16.

    The release was trained with a bf16 table, so the rounding is part of the model; it is
    computed per call (cheap) so that any absolute position works, as a stream never ends.
    """
    exponent = torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (base ** exponent)
    angles = positions.float().unsqueeze(-1) * inv_freq  # [..., Dh/2]
    rotation = torch.polar(torch.ones_like(angles), angles)  # upstream builds it this way
    return torch.view_as_real(rotation).to(torch.bfloat16)


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int) -> Tensor:
    """True where a query may see a key: causal and at most `window - 1` frames back.
    q_pos: [..., Tq, 1]; k_pos: [..., 1, Tk] -> bool [..., Tq, Tk]."""
    return (k_pos <= q_pos) & (k_pos > q_pos - window)


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Causal attention limited to the last `window` positions, over a whole sequence.

    q, k, v: [B, T, H, Dh] -> [B, T, H, Dh]. Long inputs run in query blocks of `window`
    whose keys start `window - 1` frames earlier, so memory is O(T * window), not O(T^2)
    (a 60 s reference is 5168 encoder frames).
    """
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, Dh]
    T = q.shape[2]
    pos = torch.arange(T, device=q.device)
    block = T if T <= 2 * window else window
    outs = []
    for start in range(0, T, block):
        end = min(T, start + block)
        k_start = max(0, start - window + 1)
        mask = window_mask(pos[start:end, None], pos[None, k_start:end], window)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, k_start:end], v[:, :, k_start:end], attn_mask=mask))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return y.transpose(1, 2)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-2))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.wqkv = nn.Linear(dim, 3 * n_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: Tensor, cos_sin: Tensor, attend: Attend) -> Tensor:
        # x: [B, T, D] -> [B, T, D]
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        y = attend(apply_rope(q, cos_sin), apply_rope(k, cos_sin), v)
        return self.wo(y.reshape(B, T, self.n_heads * self.head_dim))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, head_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, n_heads, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = LayerScale(dim)
        self.ffn_layer_scale = LayerScale(dim)

    def forward(self, x: Tensor, cos_sin: Tensor, attend: Attend) -> Tensor:
        # x: [B, T, D]; `attend` decides where keys come from (whole sequence or a cache)
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x), cos_sin, attend))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class WindowLimitedTransformer(nn.Module):
    """Causal pre-norm transformer whose attention sees only the last `window` frames,
    channels-first in and out ([B, C, T]). Linear projections wrap it when its width
    differs from the channels (never in the release codec)."""

    def __init__(self, channels: int, dim: int, n_layers: int, n_heads: int, head_dim: int,
                 hidden: int, window: int, rope_base: float, eps: float) -> None:
        super().__init__()
        self.window, self.head_dim, self.rope_base = window, head_dim, rope_base
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_heads, head_dim, hidden, eps) for _ in range(n_layers))
        self.norm = RMSNorm(dim, eps)
        self.input_proj = nn.Linear(channels, dim) if channels != dim else nn.Identity()
        self.output_proj = nn.Linear(dim, channels) if channels != dim else nn.Identity()

    def run(self, h: Tensor, positions: Tensor, attend_for_layer: Callable[[int], Attend]) -> Tensor:
        # h: [B, T, C] tokens; positions: [B or 1, T] absolute frame indices -> [B, T, C]
        cos_sin = rope_cos_sin(positions, self.head_dim, self.rope_base)
        h = self.input_proj(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos_sin, attend_for_layer(i))
        return self.output_proj(self.norm(h))

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C, T] -> [B, C, T]
        positions = torch.arange(x.shape[-1], device=x.device)[None]

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return windowed_attention(q, k, v, self.window)

        return self.run(x.mT, positions, lambda _: attend).mT
