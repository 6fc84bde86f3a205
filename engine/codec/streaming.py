"""Stateful, causal, batched streaming decode: code frames in, audio samples out, for many
streams at once, each new frame costing one frame of work.

Every layer on the decode path is causal, so decoding frames [t, t + n) only needs a
bounded summary of frames < t. That summary is kept per stream, in tensors whose first
dim is the slot (0 <= slot < max_streams), so one call decodes a batch of streams at
different points: rows are gathered with `buf[slots]` and written back with
`buf[slots] = ...` (slots in one call must be distinct).

State layout (S = max_streams, W = post_module window, in frames of the tensor's layer):
  pos                      long [S]         frames decoded so far (the RoPE position and
                                            the window mask of the next frame)
  post_module KV, per layer  k, v [S, W, H, Dh]  ring buffer: frame p lives at row p % W,
                                            keys stored after RoPE; rows with p < 0 are
                                            masked, so a fresh slot needs no history
  causal conv (stride 1)   [S, C_in, receptive - 1]   the last inputs it saw; zeros are
                                            exactly the zero padding of a whole decode
  causal transposed conv   [S, C_out, kernel - stride]  the overlap of the last frame's
                                            output with the next frame's, bias NOT yet
                                            added (the bias is added once, on emission)
  spectral head ("istft")  [S, R - 1, hop]  the windows of the last frames, overlapping
                                            the next R - 1 hops

A stream of the "istft" decoder with a lookahead of L hops (CodecConfig.istft_lookahead)
lags its codes by L hops: after a frame, the last L hops of audio its window describes are
still in the head's tail, waiting for the next frames' windows to complete them. At a
segment's end no next frame comes, so `drain` hands those L hops out and clears the tail:
a segment's stream audio is then the whole-sequence decode's, whole, L hops later, and
the next segment starts from a silent tail, as a fresh stream does.

The whole-sequence `Codec.decode` is the reference: feeding the same frames in chunks of
any sizes gives the same samples up to float rounding. Nothing is re-decoded: a call with
n frames runs every layer on n frames plus its fixed context, whatever the history.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.codec.layers import (
    Attend,
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    ResidualUnit,
    Snake1d,
    SpectralHead,
    WindowLimitedTransformer,
    overlap_add,
    window_mask,
)
from engine.codec.model import Codec, DecoderBlock
from kernels import conv_state, residual
from kernels import ring_attention as ring_attention_kernel
from kernels import snake as snake_kernel
from kernels.conv_state import conv_input, transposed_output
from kernels.layout import as_time_major
from kernels.residual import add_residual
from kernels.ring_attention import ring_attention
from kernels.snake import snake

# (x: [B, C, n], slots: [B]) -> [B, C', n * upsampling]
Step = Callable[[Tensor, Tensor], Tensor]


KERNELS = {"snake": snake_kernel, "conv_state": conv_state, "ring_attention": ring_attention_kernel,
           "residual": residual}


def _kernel_ok(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether kernels/<name>.py compiles and matches its reference here (logged if not)."""
    why = KERNELS[name].self_check(device, dtype)
    if why is not None:
        logging.getLogger(__name__).warning("kernels.%s off (PyTorch path instead): %s", name, why)
    return why is None


class StreamingDecoder:
    """Decodes up to `max_streams` streams, each in its own slot. Build it after the codec
    is on its final device and dtype: the state is allocated to match, once."""

    def __init__(self, codec: Codec, max_streams: int, kernels: bool | None = None) -> None:
        """`kernels`: the Triton path: Snake in one pass (kernels/snake.py), each conv's
        per-slot state read and written in the pass that builds its input or finishes its
        output, a Snake before a causal conv folded in (kernels/conv_state.py), attention
        over the rings (kernels/ring_attention.py), the residual units' conv biases added in
        the passes after their convs (kernels/residual.py), and the activations time-major,
        each conv run on their NHWC view with a channels-last copy of its weight
        (kernels/layout.py; the decoder's conv weights once more, 111 MiB for the
        release-size codec in bf16). None: on a GPU, once every one of these kernels has
        matched its reference there; False: the PyTorch path."""
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        weight = codec.decoder.model[0].conv.weight
        self.codec = codec
        self.max_streams = max_streams
        self.device, self.dtype = weight.device, weight.dtype
        if kernels is None:
            kernels = self.device.type == "cuda" and all(
                _kernel_ok(name, self.device, self.dtype) for name in ("snake", "conv_state", "ring_attention", "residual"))
        self.kernels = kernels
        self._state: list[Tensor] = []  # every per-slot tensor, for reset and accounting
        self.pos = self._new(dtype=torch.long)
        self._post = codec.quantizer.post_module
        self._kv = [
            (self._new(self._post.window, layer.attention.n_heads, layer.attention.head_dim),
             self._new(self._post.window, layer.attention.n_heads, layer.attention.head_dim))
            for layer in self._post.layers
        ]
        # the spectral head's overlap-add tail and the hops of it a segment end drains
        # (set by _spectral_step; None for the transposed-conv decoder)
        self._head_tail: Tensor | None = None
        self._lookahead = getattr(codec.decoder, "lookahead", 0)
        self._upsample = self._compile(codec.quantizer.upsample)
        self._decoder = self._compile(codec.decoder.model)

    @property
    def hop_length(self) -> int:
        return self.codec.hop_length

    def state_bytes(self) -> int:
        """Memory held for all slots; fixed at construction, whatever the streams' lengths."""
        return sum(t.numel() * t.element_size() for t in self._state)

    def reset(self, slot: int) -> None:
        """Start a fresh stream in `slot`."""
        if not 0 <= slot < self.max_streams:
            raise IndexError(f"slot {slot} outside 0..{self.max_streams - 1}")
        for t in self._state:
            t[slot].zero_()

    @property
    def drain_samples(self) -> int:
        """Samples `drain` returns at a segment end (0: the decoder holds no audio back)."""
        return self._lookahead * self.codec.decoder.head.hop if self._drains else 0

    @property
    def _drains(self) -> bool:
        return self._head_tail is not None and self._lookahead > 0

    @torch.no_grad()
    def drain(self, slot: int) -> Tensor | None:
        """A segment of `slot` ended: its audio still held back (the spectral head's first
        `lookahead` tail hops, [lookahead * hop] float32 on the device, rounded to the
        decoder's dtype as `decode`'s audio is) and the tail
        cleared, so the next frames start from silence; None when nothing is held back
        (no lookahead). In place, like `reset`: the CUDA graphs keep their buffers."""
        if not 0 <= slot < self.max_streams:
            raise IndexError(f"slot {slot} outside 0..{self.max_streams - 1}")
        if not self._drains:
            return None
        # rounded to the decoder's dtype as `decode`'s audio is
        audio = self._head_tail[slot, : self._lookahead].flatten().to(self.dtype).float().clone()
        self._head_tail[slot].zero_()
        return audio

    @torch.no_grad()
    def decode(self, slots: Tensor, codes: Tensor) -> Tensor:
        """slots: long [B] (distinct); codes: [B, num_codebooks, n] the next n frames of each
        stream -> audio [B, n * hop_length]."""
        B, K, n = codes.shape
        if K != self.codec.num_codebooks or n < 1 or slots.shape != (B,):
            raise ValueError(f"codes must be [B, {self.codec.num_codebooks}, n >= 1] and slots "
                             f"[B]; got codes {tuple(codes.shape)}, slots {tuple(slots.shape)}")
        slots = slots.to(self.device, torch.long)
        z = self.codec.quantizer.embed(codes.to(self.device, torch.long))  # [B, D, n]
        z = self._transformer(z, slots)
        audio = self._decoder(self._upsample(z, slots), slots)  # [B, 1, n * hop]
        self.pos[slots] += n
        return audio[:, 0]

    # -- state ------------------------------------------------------------------------

    def _new(self, *shape: int, dtype: torch.dtype | None = None) -> Tensor:
        t = torch.zeros(self.max_streams, *shape, device=self.device, dtype=dtype or self.dtype)
        self._state.append(t)
        return t

    # -- the window-limited transformer ------------------------------------------------

    def _transformer(self, x: Tensor, slots: Tensor) -> Tensor:
        # x: [B, C, n] -> [B, C, n]
        n, W = x.shape[-1], self._post.window
        if self.kernels:  # one launch a layer: attention over the ring, and its update

            start = self.pos[slots]
            positions = start[:, None] + torch.arange(n, device=self.device)

            def attend_over_ring(i: int) -> Attend:
                k_cache, v_cache = self._kv[i]
                return lambda q, k, v: ring_attention(q, k, v, k_cache, v_cache, slots, start)

            return self._post.run(x.mT, positions, attend_over_ring).mT
        start = self.pos[slots][:, None]  # [B, 1]
        positions = start + torch.arange(n, device=self.device)  # [B, n]
        # ring row r holds frame start - W + ((r - start) mod W); < 0 means "none yet"
        ring_pos = start - W + (torch.arange(W, device=self.device) - start) % W  # [B, W]
        key_pos = torch.cat([ring_pos, positions], dim=1)  # [B, W + n]
        mask = window_mask(positions[:, :, None], key_pos[:, None, :], W) & (key_pos >= 0)[:, None]
        mask = mask[:, None]  # [B, 1, n, W + n], shared by all heads and layers
        kept = positions[:, -min(n, W):]  # the frames the ring keeps after this call
        rows = (slots[:, None], kept % W)

        def attend_for_layer(i: int) -> Attend:
            k_cache, v_cache = self._kv[i]

            def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                # q, k, v: [B, n, H, Dh] -> [B, n, H, Dh]
                keys = torch.cat([k_cache[slots], k], dim=1).transpose(1, 2)
                values = torch.cat([v_cache[slots], v], dim=1).transpose(1, 2)
                y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
                k_cache[rows] = k[:, -kept.shape[1]:]
                v_cache[rows] = v[:, -kept.shape[1]:]
                return y.transpose(1, 2)

            return attend

        return self._post.run(x.mT, positions, attend_for_layer).mT

    # -- convolutions: one step function per module, built once ---------------------------

    def _compile(self, module: nn.Module) -> Step:
        if isinstance(module, nn.Sequential):
            steps, layers = [], list(module)
            while layers:
                layer = layers.pop(0)
                if (self.kernels and isinstance(layer, Snake1d) and layers
                        and isinstance(layers[0], CausalConv1d) and layers[0].receptive > 1):
                    steps.append(self._conv_step(layers.pop(0), snake=layer))  # one pass for both
                else:
                    steps.append(self._compile(layer))

            def sequence(x: Tensor, slots: Tensor) -> Tensor:
                for step in steps:
                    x = step(x, slots)
                return x

            return sequence
        if isinstance(module, ResidualUnit):
            if self.kernels:
                return self._residual_step(module)
            inner = self._compile(module.block)
            return lambda x, slots: x + inner(x, slots)
        if isinstance(module, DecoderBlock):
            return self._compile(module.block)
        if isinstance(module, ConvNeXtBlock):
            conv = self._conv_step(module.dwconv)
            return lambda x, slots: x + module.pointwise(conv(x, slots))
        if isinstance(module, CausalConv1d):
            return self._conv_step(module)
        if isinstance(module, CausalConvTranspose1d):
            return self._transposed_step(module)
        if isinstance(module, SpectralHead):
            return self._spectral_step(module)
        if isinstance(module, Snake1d) and self.kernels:  # pointwise: no state

            alpha = module.alpha.view(-1)
            return lambda x, slots: snake(x, alpha)
        if isinstance(module, (Snake1d, nn.Tanh, nn.Identity)):
            return lambda x, slots: module(x)
        if isinstance(module, WindowLimitedTransformer):
            raise TypeError("only the post_module transformer is streamed")
        raise TypeError(f"no streaming rule for {type(module).__name__}")

    def _residual_step(self, unit: ResidualUnit) -> Step:
        """Snake -> k7 conv -> Snake -> k1 conv, added to the input, in five launches: the
        first Snake and the k7 conv's history in one pass (conv_input), both convs without
        their bias, the k7 bias added in the second Snake's pass, the k1 bias in the
        residual add's."""

        snake_in, conv7, snake_mid, conv1 = unit.block
        if not (isinstance(snake_in, Snake1d) and isinstance(conv7, CausalConv1d) and isinstance(snake_mid, Snake1d)
                and isinstance(conv1, CausalConv1d) and conv1.receptive == 1 and conv7.conv.bias is not None
                and conv1.conv.bias is not None):
            raise TypeError("a residual unit is Snake, causal conv, Snake, k1 conv (both with bias)")
        first = self._conv_step(conv7, snake=snake_in, bias=False)
        alpha, bias7 = snake_mid.alpha.view(-1), conv7.conv.bias
        pointwise, bias1 = self._nhwc(conv1.conv, bias=False), conv1.conv.bias

        def step(x: Tensor, slots: Tensor) -> Tensor:
            h = snake(first(x, slots), alpha, bias7)
            return add_residual(x, pointwise(h), bias1)

        return step

    def _conv_step(self, layer: CausalConv1d, snake: Snake1d | None = None, bias: bool = True) -> Step:
        """The conv's step; `snake`: the Snake1d before it, applied on the way in; `bias`
        False: the conv's bias is left for the next pass to add (both only with the kernels)."""
        if layer.stride != 1:
            raise TypeError("strided convs are not on the decode path")
        conv, ctx = layer.conv, layer.receptive - 1
        if ctx == 0:
            if self.kernels:
                nhwc = self._nhwc(conv, bias)
                return lambda x, slots: nhwc(x)
            return lambda x, slots: conv(x)
        history = self._new(conv.in_channels, ctx)  # [S, C_in, ctx], after the Snake if any
        if self.kernels:

            alpha = None if snake is None else snake.alpha.view(-1)
            nhwc = self._nhwc(conv, bias)
            return lambda x, slots: nhwc(conv_input(x, history, slots, alpha))

        def step(x: Tensor, slots: Tensor) -> Tensor:
            # x: [B, C_in, n] -> [B, C_out, n]
            full = torch.cat([history[slots], x], dim=-1)  # [B, C_in, ctx + n]
            history[slots] = full[..., -ctx:]
            return conv(full)  # no padding: ctx + n inputs give n outputs

        return step

    def _nhwc(self, conv: nn.Conv1d | nn.ConvTranspose1d, bias: bool = True) -> Callable[[Tensor], Tensor]:
        """The conv (no padding) on a time-major activation [B, C, T] (kernels/layout.py),
        as a 2-D conv on its [B, C, 1, T] view, which is NHWC: cuDNN takes and gives NHWC
        as it is, with a channels-last copy of the weight made here once. (PyTorch's 1-D
        convs make a 3-D input contiguous first, and cuDNN then transposed every input to
        NHWC and every output back: 0.87 of a 3.6 ms call, H200, s2-pro codec, 64 x 1.)
        `bias` False: the bias is left for the next pass to add."""

        weight = conv.weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
        b = conv.bias if bias else None
        if isinstance(conv, nn.ConvTranspose1d):
            if conv.padding[0] or conv.output_padding[0] or conv.dilation[0] != 1 or conv.groups != 1:
                raise TypeError("streamed transposed convs have no padding, dilation or groups")
            stride = (1, conv.stride[0])
            return lambda x: as_time_major(F.conv_transpose2d(x.unsqueeze(2), weight, b, stride=stride).squeeze(2))
        if conv.padding[0] or conv.stride[0] != 1:
            raise TypeError("streamed convs have no padding and stride 1")
        dilation, groups = (1, conv.dilation[0]), conv.groups
        return lambda x: as_time_major(F.conv2d(x.unsqueeze(2), weight, b, dilation=dilation, groups=groups).squeeze(2))

    def _spectral_step(self, head: SpectralHead) -> Step:
        tail = self._new(head.window_hops - 1, head.hop, dtype=torch.float32)  # [S, R - 1, hop]: earlier tails
        self._head_tail = tail

        def step(x: Tensor, slots: Tensor) -> Tensor:
            # x: [B, dim, n] -> [B, 1, n * hop]
            audio, rest = overlap_add(head.frames(x), tail[slots])  # fp32, as the tail
            tail[slots] = rest
            return audio[:, None].to(x.dtype)

        return step

    def _transposed_step(self, layer: CausalConvTranspose1d) -> Step:
        conv, stride, overlap = layer.conv, layer.stride, layer.overlap
        if overlap == 0:
            if self.kernels:
                nhwc = self._nhwc(conv)
                return lambda x, slots: nhwc(x)
            return lambda x, slots: conv(x)
        tail = self._new(conv.out_channels, overlap)  # [S, C_out, overlap], bias-free
        if self.kernels:

            nhwc = self._nhwc(conv, bias=False)

            def fused(x: Tensor, slots: Tensor) -> Tensor:
                y = nhwc(x)  # [B, C_out, emit + overlap]
                return transposed_output(y, tail, slots, conv.bias, x.shape[-1] * stride)

            return fused

        def step(x: Tensor, slots: Tensor) -> Tensor:
            # x: [B, C_in, n] -> [B, C_out, n * stride]
            emit = x.shape[-1] * stride
            y = F.conv_transpose1d(x, conv.weight, None, stride=stride)  # [B, C_out, emit + overlap]
            y[..., :overlap] += tail[slots]
            tail[slots] = y[..., emit:]
            return y[..., :emit] + conv.bias[:, None]

        return step
