"""Layouts and launch tiles of the codec decoder's elementwise kernels (kernels/snake.py,
kernels/residual.py, kernels/conv_state.py).

An activation [B, C, T] is either channel-major (contiguous: each channel's samples
adjacent) or time-major (a transposed view of a contiguous [B, T, C]: each sample's
channels adjacent, which is cuDNN's NHWC). The streaming decoder runs time-major on the
GPU: its convolutions then take and give NHWC as they are, where channel-major tensors
cost two layout transposes per conv (measured on an H200, s2-pro codec, batch 64 x 1
frame: 0.87 of a call's 3.6 ms). The kernels take any strides and give their output in
the layout of their input; the tile follows the layout, so that a warp's loads are
adjacent in memory either way.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

TILE = 2048  # elements per program: ROWS rows (b * C + c) x BLOCK samples


def time_major(x: Tensor) -> bool:
    """[B, C, T] stored as a contiguous [B, T, C] (and not also channel-major: C or T of 1)."""
    return x.ndim == 3 and not x.is_contiguous() and x.transpose(1, 2).is_contiguous()


def as_time_major(x: Tensor) -> Tensor:
    """x itself if it is time-major (or C or T is 1), else a time-major copy. cuDNN gives
    NHWC for NHWC in; this keeps a conv whose layout choice differs from breaking the chain."""
    if x.shape[1] == 1 or x.shape[2] == 1 or time_major(x):
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def as_layout(x: Tensor, layout: str) -> Tensor:
    """x's values in "channel-major" or "time-major" storage (the kernels' self-checks)."""
    if layout == "channel-major":
        return x.contiguous()
    if layout == "time-major":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    raise ValueError(f"unknown layout {layout!r}")


def empty_as(x: Tensor, shape: tuple[int, int, int]) -> Tensor:
    """An uninitialized [B, C, T] of x's dtype and device, in x's layout."""
    b, c, t = shape
    if time_major(x):
        return torch.empty(b, t, c, device=x.device, dtype=x.dtype).transpose(1, 2)
    return torch.empty(b, c, t, device=x.device, dtype=x.dtype)


def tile(x: Tensor, n: int, at_least: int = 1) -> tuple[int, int]:
    """(ROWS, BLOCK) for x's layout and rows of n samples, BLOCK >= at_least (<= 1,024).

    Channel-major: up to 1,024 samples of a row and as many rows as fill the tile (the
    decoder's rows run from 4 samples, its input at one frame, to thousands; one row per
    program left most of it masked off at the short ones: measured on an H200, s2-pro
    codec, 64 x 1 frame, 16 Snakes took 0.72 ms, at 0.66 TB/s). Time-major: up to 256
    adjacent channels and as many samples as fill the tile, at most twice the tile when
    BLOCK must reach at_least."""
    need = triton.next_power_of_2(max(at_least, 1))
    if not time_major(x):
        block = min(1024, max(4, need, triton.next_power_of_2(max(n, 1))))
        return TILE // block, block
    rows = min(256, triton.next_power_of_2(x.shape[1]))
    block = max(need, min(triton.next_power_of_2(max(n, 1)), TILE // rows))
    return max(1, min(rows, 2 * TILE // block)), block
