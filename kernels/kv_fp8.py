"""The FP8 KV cache layout: e4m3 codes and their scale packed in one byte tensor.

At high concurrency the decode step reads every live stream's whole KV once per step:
at 64 streams of 400 positions that is 3.8 GB of bf16 for the S2-Pro shape, 1.3 ms of
its 8.1 ms step on an H200 (latency_bench/profile_step.py, _decode_attention_split_kernel).
Stored as e4m3 with one scale per (position, KV head), the same bytes take half the time.

Layout. A packed cache is uint8 [rows, L, K, Dh + 16]: for each (row, position, head),
Dh bytes of e4m3 codes, then the fp32 scale in the next 4 bytes (little-endian, as the
GPU and the CPU store it) and 12 bytes of padding. The padding keeps every head's codes
16-byte aligned, so the kernels load them in 16-byte vectors (with the scale alone,
Dh + 4 bytes a head, the heads sat 4 bytes out of line and the FP8 step was slower than
bf16's). One tensor per cache keeps every consumer of the bf16 layout
(slot copies of the voice prefix cache, the scratch row, index_copy_ writes) unchanged;
only the code that writes new keys and values and the code that reads them know of the
codes. Two views name the parts (`kv_views`): the codes as float8_e4m3fn [.., Dh + 16]
(elements 0..Dh-1) and the scales as float32 [.., (Dh + 16) / 4] (element Dh / 4).
At Dh = 128 a head takes 144 bytes against bf16's 256 (0.56x).

Scales are kernels/fp8_quant.py's: the smallest power of two with amax / scale <= 448 over
the head's Dh values, so dequantizing (code * scale) is exact in fp32 and in bf16, and
the Triton writer (kernels/qk_rope_kv.py) and `pack_kv` give the same bytes. An all-zero
head (and the zero-filled cache at allocation, scale 0) dequantizes to zeros.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.fp8_scale import E4M3_MAX, FP8, pow2_scale

SCALE_BYTES = 4  # the fp32 scale
TAIL_BYTES = 16  # scale + padding after each head's codes (16-byte alignment)


def is_packed(cache: Tensor) -> bool:
    """A packed FP8 cache (else the model-dtype layout [.., Dh])."""
    return cache.dtype == torch.uint8


def packed_dim(head_dim: int) -> int:
    if head_dim % TAIL_BYTES:
        raise ValueError(f"head dim {head_dim} must be a multiple of {TAIL_BYTES} for the packed FP8 KV layout")
    return head_dim + TAIL_BYTES


def head_dim_of(cache: Tensor) -> int:
    """The head dim a cache holds, in either layout."""
    return cache.shape[-1] - TAIL_BYTES if is_packed(cache) else cache.shape[-1]


def kv_views(cache: Tensor) -> tuple[Tensor, Tensor, int]:
    """A packed cache [.., Dh + 16] -> (codes: float8_e4m3fn [.., Dh + 16], scales: float32
    [.., (Dh + 16) / 4], the scale's index Dh / 4 in the last dim of `scales`). The fp32
    view needs every stride a multiple of 4 bytes; checked here, where it is made."""
    if not is_packed(cache) or cache.stride(-1) != 1:
        raise ValueError(f"not a packed FP8 KV cache: {cache.dtype} strides {cache.stride()}")
    if any(st % SCALE_BYTES for st in cache.stride()[:-1]):
        raise ValueError(f"packed FP8 caches need strides that are multiples of 4 bytes (the fp32 scales), "
                         f"got {cache.stride()}")
    dh = head_dim_of(cache)
    return cache.view(FP8), cache.view(torch.float32), dh // SCALE_BYTES


def kernel_args(k_cache: Tensor, v_cache: Tensor) -> tuple[bool, Tensor, Tensor, Tensor, Tensor]:
    """A k/v cache pair as the Triton kernels take it, in either layout: (packed, k, v,
    k_scales, v_scales). Packed: the e4m3 views to read or write codes through and the
    fp32 views for the scales. Else the caches themselves, and again in the scales' place
    (the kernels read no scales then)."""
    if is_packed(k_cache) != is_packed(v_cache):
        raise ValueError(f"k and v caches must share a layout, got {k_cache.dtype} / {v_cache.dtype}")
    if not is_packed(k_cache):
        return False, k_cache, v_cache, k_cache, v_cache
    (k_codes, k_scales, _), (v_codes, v_scales, _) = kv_views(k_cache), kv_views(v_cache)
    return True, k_codes, v_codes, k_scales, v_scales


def pack_kv(x: Tensor) -> Tensor:
    """Keys or values [.., Dh] (any float dtype) -> packed uint8 [.., Dh + 16] (padding zero)."""
    dh = x.shape[-1]
    xf = x.float()
    scale = pow2_scale(xf.abs().amax(dim=-1))  # [..]
    codes = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    out = torch.zeros(*x.shape[:-1], packed_dim(dh), dtype=torch.uint8, device=x.device)
    out[..., :dh] = codes.view(torch.uint8)
    out.view(torch.float32)[..., dh // SCALE_BYTES] = scale
    return out


def unpack_kv(packed: Tensor, dtype: torch.dtype) -> Tensor:
    """Packed uint8 [.., Dh + 16] -> [.., Dh] in `dtype` (exact: codes times a power of two).
    Works on any slice that keeps the last dim whole (gathered rows, a prefix)."""
    if not is_packed(packed):
        raise ValueError(f"not a packed FP8 KV cache: {packed.dtype}")
    dh = head_dim_of(packed)
    if packed.stride(-1) != 1:
        packed = packed.contiguous()
    codes = packed[..., :dh].view(FP8)
    scale = packed.view(torch.float32)[..., dh // SCALE_BYTES]
    return (codes.float() * scale[..., None]).to(dtype)


def store_form(x: Tensor, cache: Tensor) -> Tensor:
    """New keys or values [.., Dh] in the form `cache` stores: packed for an FP8 cache,
    as they are otherwise."""
    return pack_kv(x) if is_packed(cache) else x


def load_form(cached: Tensor, dtype: torch.dtype) -> Tensor:
    """Cached keys or values (any slice of a cache) in `dtype`, either layout."""
    return unpack_kv(cached, dtype) if is_packed(cached) else cached.to(dtype)
