"""Block-scaled FP8 GEMM for decode: y = dequant(a) @ dequant(b).T, out in bf16 (or fp32).

    a        [M, K]    float8_e4m3fn, unit stride along K (kernels/fp8_quant.py: quantize_act)
    a_scale  [M, KB]   float32, row-major contiguous: one scale per 1 x 128 group along K
    b        [N, K]    float8_e4m3fn, unit stride along K (the nn.Linear weight layout)
    b_scale  [NB, KB]  float32, row-major contiguous: one scale per 128 x 128 block
    -> out   [M, N]    out_dtype (bf16 by default)

    KB = cdiv(K, 128), NB = cdiv(N, 128). Any M, N, K >= 1: nothing is padded in memory;
    partial groups/blocks at the K and N edges are masked to zero (see fp8_quant.py).

The kernel addresses scales as `a_scale + m * KB + g` and `b_scale + (n // 128) * KB + g`,
without stride arguments. The launcher is therefore the one gate on the layout: it checks
the shape AND the strides of both scale tensors and raises on anything else (a transposed
or permuted view included). The seed's MXFP8 path stored scales row-major and read them
with another stride: ~53% logit error, at full speed, with no error raised.

One K step is one 128-wide group: the tile's fp8 `tl.dot` (fp32 accumulate; on Hopper the
tensor cores' reduced-precision accumulation over 128 products) is promoted into the fp32
accumulator with its two scales, acc += dot * a_scale[m, g] * b_scale[n // 128, g].

Decode (M <= 64) swaps the operands: the tile computes out.T = b @ a.T so the weight rows
fill the MMA's 64-row side and the few activation rows sit on its narrow (>= 16) side.
Split-K (grid axis 2) cuts K into whole groups when the (M, N) tiles alone cannot fill the
GPU; the splits write fp32 partials that `_splitk_reduce_kernel` sums in a fixed order
(deterministic) and casts. It is used only where the partials are cheap next to the
weight bytes (see `gemm_config`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.fp8_quant import FP8, GROUP, dequantize_act, dequantize_weight

# Streaming multiprocessors when no CUDA device is visible (the interpreter): an H200's.
DEFAULT_SMS = 132
# Split-K aims at this many programs per SM; a program with a 64 x 128 fp8 weight tile per
# stage keeps ~4 stages in flight, and two resident programs per SM hide each other's
# load latency. Chosen from the tile sizes, not yet measured (kernel_bench.py sweeps it).
PROGRAMS_PER_SM = 2
# A split must stream at least this many K groups (4 x 128) to fill its pipeline.
MIN_GROUPS_PER_SPLIT = 4
# Split-K pays only while its fp32 partials (written + read: 8 bytes x splits x M x N) stay
# small next to the weight bytes (N x K): splits x M <= K / PARTIAL_RATIO keeps them
# under 10%.
PARTIAL_RATIO = 80
MAX_SPLITS = 16
REDUCE_BLOCK = 1024


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """Launch choices; a function of (M, N, K) alone, so a CUDA graph captured for one
    batch bucket always replays the same launches."""

    block_m: int
    block_n: int
    swap_ab: bool  # tile computes out.T = b @ a.T (decode: M on the MMA's narrow side)
    splits: int = 1  # K splits (each takes whole 128-groups)
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two >= 16 (tl.dot's minimum)")
        if not 1 <= self.splits <= MAX_SPLITS:
            raise ValueError(f"splits={self.splits} must be in 1..{MAX_SPLITS}")


@functools.cache
def _num_sms(device_index: int | None) -> int:
    if device_index is None or not torch.cuda.is_available():
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def gemm_config(m: int, n: int, k: int, sms: int = DEFAULT_SMS) -> GemmConfig:
    """Decode-first tile choices by M class (H200 values chosen from the MMA shapes,
    to be swept on the GPU: FP8_NOTES.md, "What to tune first").

    Choices depend on M only through its power-of-two class (1, 2, 4, ..., 64, 128, ...),
    so the decode buckets' warm-up compiles every variant a short prefill can meet."""
    mc = triton.next_power_of_2(m)
    if mc <= 64:
        block_m, block_n, swap = max(16, mc), 64, True
    else:
        block_m, block_n, swap = 64, 128, False
    tiles = triton.cdiv(mc, block_m) * triton.cdiv(n, block_n)
    groups = triton.cdiv(k, GROUP)
    want = round(PROGRAMS_PER_SM * sms / tiles)
    cap = min(groups // MIN_GROUPS_PER_SPLIT, k // (PARTIAL_RATIO * mc), MAX_SPLITS)
    splits = max(1, min(want, cap))
    splits = triton.cdiv(groups, triton.cdiv(groups, splits))  # no empty split
    return GemmConfig(block_m, block_n, swap, splits)


@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, KB,
    stride_am, stride_bn, stride_cs, stride_cm,
    GROUPS_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, 128)
    m_ok = offs_m < M
    n_ok = offs_n < N
    as_rows = as_ptr + offs_m * KB  # [BM] scale rows (layout checked by the launcher)
    bs_rows = bs_ptr + (offs_n // 128) * KB  # [BN] the 128 x 128 block of each weight row
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    g0 = split * GROUPS_PER_SPLIT
    # a constexpr trip count (one per layer shape and M bucket), masked past K: the
    # interpreter cannot loop over runtime bounds
    for i in range(0, GROUPS_PER_SPLIT):
        g = g0 + i
        k = g * 128 + offs_k
        # masks are built per case and from vectors only: Triton 3.9's interpreter rejects
        # a mask that mixes a Python bool or a scalar comparison with a tensor
        if EVEN_K:  # K % 128 == 0 and every split full: row masks only in the hot loop
            sa_mask = m_ok
            sb_mask = n_ok
            bt_mask = n_ok[:, None]
            at_mask = m_ok[None, :]
            a_mask = m_ok[:, None]
            b_mask = n_ok[None, :]
        else:
            g_ok_m = (offs_m * 0 + g) < KB  # [BM]: the scalar test g < KB, as a vector
            g_ok_n = (offs_n * 0 + g) < KB  # [BN]
            k_row = k[None, :] < K  # [1, 128]
            k_col = k[:, None] < K  # [128, 1]
            sa_mask = m_ok & g_ok_m
            sb_mask = n_ok & g_ok_n
            bt_mask = n_ok[:, None] & k_row
            at_mask = m_ok[None, :] & k_col
            a_mask = m_ok[:, None] & k_row
            b_mask = n_ok[None, :] & k_col
        sa = tl.load(as_rows + g, mask=sa_mask, other=0.0)
        sb = tl.load(bs_rows + g, mask=sb_mask, other=0.0)
        if SWAP_AB:
            bt = tl.load(b_ptr + offs_n[:, None] * stride_bn + k[None, :], mask=bt_mask, other=0.0)
            at = tl.load(a_ptr + offs_m[None, :] * stride_am + k[:, None], mask=at_mask, other=0.0)
            acc += tl.dot(bt, at) * (sb[:, None] * sa[None, :])  # [BN, BM]
        else:
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :], mask=a_mask, other=0.0)
            b = tl.load(b_ptr + offs_n[None, :] * stride_bn + k[:, None], mask=b_mask, other=0.0)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])  # [BM, BN]
    c_base = c_ptr + split * stride_cs
    if SWAP_AB:
        tl.store(c_base + offs_m[None, :] * stride_cm + offs_n[:, None], acc.to(c_ptr.dtype.element_ty),
                 mask=m_ok[None, :] & n_ok[:, None])
    else:
        tl.store(c_base + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _splitk_reduce_kernel(p_ptr, c_ptr, numel, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLITS):  # fixed order: the same sum on every run
        acc += tl.load(p_ptr + s * numel + offs, mask=ok, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


# --- launcher --------------------------------------------------------------------------

def check_scales(name: str, scale: Tensor, rows: int, cols: int) -> None:
    """The layout the kernel reads: fp32 [rows, cols], row-major (stride cols, then 1;
    the stride of a size-1 dimension is never used)."""
    if scale.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {scale.dtype}")
    if tuple(scale.shape) != (rows, cols):
        raise ValueError(f"{name} must have shape [{rows}, {cols}], got {list(scale.shape)}")
    for dim, (size, stride, want) in enumerate(zip(scale.shape, scale.stride(), (cols, 1))):
        if size > 1 and stride != want:
            raise ValueError(
                f"{name} must be row-major contiguous (strides ({cols}, 1)), got strides {scale.stride()}: "
                "a transposed or permuted scale tensor would be read with the wrong stride"
            )


def _check_operand(name: str, x: Tensor) -> None:
    if x.dtype != FP8:
        raise TypeError(f"{name} must be float8_e4m3fn, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {list(x.shape)}")
    if x.stride(1) != 1 and x.shape[1] > 1:
        raise ValueError(f"{name} must have unit stride along K, got strides {x.stride()}")


def fp8_gemm(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16, config: GemmConfig | None = None,
) -> Tensor:
    """out [M, N] = dequant(a) @ dequant(b).T; see the module docstring for the layouts.
    `config` overrides the tile choices (benchmarks and tests)."""
    _check_operand("a", a)
    _check_operand("b", b)
    (m, k), (n, kb_) = a.shape, b.shape
    if kb_ != k:
        raise ValueError(f"a [{m}, {k}] and b [{n}, {kb_}] disagree on K")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    if a.device != b.device or a_scale.device != a.device or b_scale.device != a.device:
        raise ValueError("a, b and their scales must be on one device")
    groups = triton.cdiv(k, GROUP)
    check_scales("a_scale", a_scale, m, groups)
    check_scales("b_scale", b_scale, triton.cdiv(n, GROUP), groups)
    if config is None:
        config = gemm_config(m, n, k, _num_sms(a.device.index if a.is_cuda else None))
    return _launch(a, a_scale, b, b_scale, out_dtype, config)


def _launch(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype, cfg: GemmConfig) -> Tensor:
    """Unchecked launch (tests call it to show what a wrong layout would do)."""
    (m, k), n = a.shape, b.shape[0]
    out = torch.empty(m, n, device=a.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return out
    groups = triton.cdiv(k, GROUP)
    per_split = triton.cdiv(groups, cfg.splits)
    splits = triton.cdiv(groups, per_split)
    target = out if splits == 1 else torch.empty(splits, m, n, device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    _fp8_gemm_kernel[grid](
        a, a_scale, b, b_scale, target,
        m, n, k, groups,
        a.stride(0), b.stride(0), target.stride(0) if splits > 1 else 0, n,
        GROUPS_PER_SPLIT=per_split, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SWAP_AB=cfg.swap_ab,
        EVEN_K=k % GROUP == 0 and groups % per_split == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _splitk_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            target, out, m * n, SPLITS=splits, BLOCK=REDUCE_BLOCK,
        )
    return out


def fp8_gemm_reference(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """The same function in plain PyTorch: dequantize both operands, fp32 matmul, cast."""
    return (dequantize_act(a, a_scale) @ dequantize_weight(b, b_scale).t()).to(out_dtype)
