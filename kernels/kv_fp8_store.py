"""Keys or values into a packed FP8 KV cache in one launch (the prefill write).

    x       [N, K, Dh]            new keys or values (bf16 / fp16 / fp32), unit stride along Dh
    cache   [rows, L, K, Dh + 16] uint8, packed (kernels/kv_fp8.py), contiguous
    index   [N] int64             flat position row * L + position of each of x's rows

A prefill (a voice prompt, a batch of text segments) writes many positions per layer.
In PyTorch `pack_kv` + `index_copy_` is ~10 launches per tensor: ~700 a prefill chunk
at the S2-Pro shape, which made a 16-segment prefill 64 ms against 36 with the bf16 cache
on an H200. Here: one program per (row of x, KV head), the same scale rule and e4m3
rounding as `pack_kv` (bytes identical; the decode step's writes go through
kernels/qk_rope_kv.py instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.kv_fp8 import TAIL_BYTES, head_dim_of, is_packed, kv_views, pack_kv
from kernels.pdl import launch_args, pdl_wait


@triton.jit
def _store_kv_fp8_kernel(
    x_ptr, index_ptr, codes_ptr, scales_ptr,
    stride_xn, stride_xk, stride_pos, stride_head,
    HEAD_DIM: tl.constexpr, SOFT_ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    n = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    x = tl.load(x_ptr + n * stride_xn + head * stride_xk + d).to(tl.float32)
    scale, inv = scale_and_inverse(tl.max(tl.abs(x), axis=0))
    at = tl.load(index_ptr + n) * stride_pos + head * stride_head  # byte offset of the head's slab
    tl.store(codes_ptr + at + d, to_e4m3(x * inv, SOFT_ROUND))
    tl.store(scales_ptr + (at + HEAD_DIM) // 4, scale)


def _check(x: Tensor, cache: Tensor, index: Tensor) -> None:
    if not is_packed(cache) or cache.ndim != 4 or not cache.is_contiguous():
        raise ValueError(f"cache must be a contiguous packed FP8 KV cache [rows, L, K, Dh + {TAIL_BYTES}], "
                         f"got {cache.dtype} {tuple(cache.shape)}")
    rows, length, heads, _ = cache.shape
    dh = head_dim_of(cache)
    if x.ndim != 3 or x.shape[1:] != (heads, dh) or x.stride(-1) != 1 or not x.is_floating_point():
        raise ValueError(f"x must be float [N, {heads}, {dh}] with unit stride along Dh, got {x.dtype} {tuple(x.shape)}")
    if index.shape != (x.shape[0],) or index.dtype != torch.int64:
        raise ValueError(f"index must be int64 [{x.shape[0]}], got {index.dtype} {tuple(index.shape)}")
    if dh & (dh - 1):
        raise ValueError(f"head dim {dh} must be a power of two")


def store_kv_fp8(x: Tensor, cache: Tensor, index: Tensor, *, pdl: bool = False) -> None:
    """See the module docstring. Indices must lie in [0, rows * L) (not checked on the
    device: the callers build them from their own slots and positions)."""
    _check(x, cache, index)
    if not x.shape[0]:
        return
    codes, scales, _ = kv_views(cache)
    _store_kv_fp8_kernel[(x.shape[0], cache.shape[2])](
        x, index, codes, scales,
        x.stride(0), x.stride(1), cache.stride(1), cache.stride(2),
        HEAD_DIM=head_dim_of(cache), SOFT_ROUND=interpreting(), **launch_args(pdl),
    )


def store_kv_fp8_reference(x: Tensor, cache: Tensor, index: Tensor) -> None:
    _check(x, cache, index)
    cache.view(-1, *cache.shape[2:]).index_copy_(0, index, pack_kv(x))
