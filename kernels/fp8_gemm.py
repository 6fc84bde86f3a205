"""Block-scaled FP8 GEMM for decode: y = dequant(a) @ dequant(b).T, out in bf16 (or fp32).

    a        [M, K]    float8_e4m3fn, unit stride along K (kernels/fp8_quant.py: quantize_act)
    a_scale  [M, KB]   float32, row-major contiguous: one scale per 1 x 128 group along K
    b        [N, K]    float8_e4m3fn, unit stride along K (the nn.Linear weight layout)
    b_scale  [NB, KB]  float32, row-major contiguous: one scale per 128 x 128 block
    -> out   [M, N]    out_dtype (bf16 by default)

    KB = cdiv(K, 128), NB = cdiv(N, 128). Any M, N, K >= 1: nothing is padded in memory;
    partial groups/blocks at the K and N edges are masked to zero (see fp8_quant.py).

Two entry points, one kernel:
- `fp8_gemm(a, a_scale, b, b_scale)`: activations already quantized (codes + scales).
- `fp8_linear(x, b, b_scale)`: bf16 activations, quantized inside the GEMM's K loop, so a
  linear layer is one launch (or, where the sweep measured it faster, in a launch of
  their own first: `GemmConfig.quantize_in_gemm`; or, a candidate the sweep times,
  through cuBLAS's block-scaled GEMM: `GemmConfig.backend = "cublas"`). `swiglu=True`
  takes the fused w1/w3 output [M, 2H] and quantizes silu(gate) * up there (the MLP's
  down projection: no separate SwiGLU or quantization launch, no intermediate through
  memory). Each program quantizes the groups it streams, with the same arithmetic as
  quantize_act / swiglu_quant, so the codes and scales are bit for bit the ones those
  kernels would have written. The activation rows
  are re-read by every N tile (from L2: M x K is tiny next to N x K at decode sizes).

The kernel addresses scales as `a_scale + m * KB + g` and `b_scale + (n // 128) * KB + g`,
without stride arguments. The launcher is therefore the one gate on the layout: it checks
the shape AND the strides of both scale tensors and raises on anything else (a transposed
or permuted view included): a scale read with the wrong stride raises nothing, it only
gives wrong logits at full speed.

One K step is one 128-wide group: the tile's fp8 `tl.dot` (fp32 accumulate; on Hopper the
tensor cores' reduced-precision accumulation over 128 products) is promoted into the fp32
accumulator with its two scales, acc += dot * a_scale[m, g] * b_scale[n // 128, g].

Decode (M <= 64) swaps the operands: the tile computes out.T = b @ a.T so the weight rows
fill the MMA's 64-row side and the few activation rows sit on its narrow (>= 16) side.
Split-K (grid axis 2) cuts K into whole groups when the (M, N) tiles alone cannot fill the
GPU. Each split writes its fp32 partial; the last split of a tile to finish (a per-tile
counter) sums the partials in split order (deterministic: the same sum whichever finishes
last), writes the output and resets the counter, all in the one launch. The counters are
a zeroed buffer per CUDA stream (`_counters`): launches on one stream run one after
another (launched with PDL, a GEMM waits for the kernel before it before it touches
them: kernels/pdl.py), and the prefill and decode threads' streams never share one.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.fp8_configs import TUNED
from kernels.fp8_tile import store_tile, tile_start
from kernels.fp8_gemm_tma import launch_tma, tma_ready
from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.fp8_quant import (FP8, GROUP, dequantize_act, dequantize_weight, quantize_act, quantize_act_reference,
                               swiglu_quant, swiglu_quant_reference)
from kernels.pdl import launch_args, pdl_wait

# Streaming multiprocessors when no CUDA device is visible (the interpreter): an H200's.
DEFAULT_SMS = 132
# The untuned rule (shapes outside kernels/fp8_configs.py): split K until the tiles fill
# the GPU about twice, each split streaming >= 4 groups.
PROGRAMS_PER_SM = 2
MIN_GROUPS_PER_SPLIT = 4
MAX_SPLITS = 32
REDUCE_BLOCK = 1024
# Per-tile split counters per CUDA stream (int32, zeroed once, reset by the kernel).
COUNTER_SLOTS = 16384

A_CODES, A_BF16, A_SWIGLU = 0, 1, 2  # the kernel's A_MODE
BACKENDS = ("triton", "cublas")
SPLIT_NONE, SPLIT_SEPARATE_REDUCE, SPLIT_LAST_REDUCES = 0, 1, 2  # its SPLIT_MODE


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
    # split-K partials summed by the last split in the same launch (else a second launch)
    reduce_in_kernel: bool = True
    # fp8_linear: quantize the bf16 activations inside the GEMM's K loop (one launch), else
    # in their own launch first (quantize_act / swiglu_quant; the faster at larger M)
    quantize_in_gemm: bool = True
    # "triton": this module's kernel; "cublas": cuBLAS's block-scaled FP8 GEMM (the same
    # function, torch._scaled_mm with 1 x 128 / 128 x 128 scales; Hopper, cuBLASLt >= 12.9;
    # the tile fields are then unused and the activations are quantized in a launch first)
    backend: str = "triton"
    # the TMA kernel (kernels/fp8_gemm_tma.py; it quantizes bf16 activations in its K loop
    # too, not the SwiGLU), persistent with this many programs per SM (0: one program per
    # unit), its K loop warp-specialized: the sweep's choices (kernels/fp8_configs.py).
    tma: bool = False
    programs_per_sm: int = 0
    warp_specialize: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} must be one of {BACKENDS}")
        if (self.programs_per_sm or self.warp_specialize) and not self.tma:
            raise ValueError("programs_per_sm and warp_specialize are options of the TMA kernel (tma=True)")
        if self.warp_specialize and self.swap_ab:
            # triton 3.9 does not compile it for sm90; with triton 3.6 the GPU tests hung at a
            # persistent split case of it ("GPU test times and compiles" in
            # latency_bench/RESULTS.md): plain tiles only
            raise ValueError("warp_specialize takes plain tiles only (swap_ab=False)")
        if self.tma and self.backend != "triton":
            raise ValueError("the TMA kernel is a Triton kernel: it needs backend 'triton'")
        if not 0 <= self.programs_per_sm <= 8:
            raise ValueError(f"programs_per_sm={self.programs_per_sm} must be in 0..8")
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


def m_class(m: int) -> int:
    """Launch tiles depend on M only through its power-of-two class (1, 2, 4, ..., 128,
    then 128 for anything larger), so the decode buckets' warm-up compiles every variant
    (past 128 the split count also follows M; the kernel takes it at run time)."""
    return min(triton.next_power_of_2(max(m, 1)), 128)


def _whole_splits(groups: int, splits: int) -> int:
    """The split count that cuts `groups` K groups into `splits` or fewer with none empty."""
    return triton.cdiv(groups, triton.cdiv(groups, splits))


def _config_for(a: Tensor, n: int, k: int, config: GemmConfig | None) -> GemmConfig:
    """`config`, or the launch choice for a's rows on a's device."""
    if config is not None:
        return config
    return gemm_config(a.shape[0], n, k, _num_sms(a.device.index if a.is_cuda else None))


def gemm_config(m: int, n: int, k: int, sms: int = DEFAULT_SMS) -> GemmConfig:
    """The measured best for the S2-Pro / Qwen3-4B shapes (kernels/fp8_configs.py, from
    the sweep of kernels/fp8_configs.py; TUNED_ON names the card), else a rule from the MMA shapes."""
    mc = m_class(m)
    tuned = TUNED.get((n, k, mc))
    if tuned is not None:
        cfg = GemmConfig(*tuned)
        if cfg.backend == "cublas" and not cublas_supported(m, n, k):
            # cuBLAS refuses this M (CUBLAS_STATUS_NOT_SUPPORTED): a decode batch is a
            # graph bucket it takes, but a prefill's M is its token count, any number
            return _rule_config(m, n, k, sms)
        if m > mc and cfg.splits > 1:
            # past the largest measured class (prefill: M = tokens), more M tiles fill the
            # GPU by themselves; K splits there would only add fp32 partials (w2's 6 splits
            # at M = 640 would move 39 MB of them). Not measured: a rule from the counts.
            tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
            splits = max(1, min(cfg.splits, round(PROGRAMS_PER_SM * sms / tiles)))
            cfg = replace(cfg, splits=_whole_splits(triton.cdiv(k, GROUP), splits))
        return cfg
    return _rule_config(m, n, k, sms)


def _rule_config(m: int, n: int, k: int, sms: int) -> GemmConfig:
    """gemm_config's untuned rule: tiles from the MMA shapes, K split until the tiles
    fill the GPU about twice."""
    mc = m_class(m)
    if mc <= 64:
        block_m, block_n, swap = max(16, mc), 64, True
    else:
        block_m, block_n, swap = 64, 128, False
    tiles = triton.cdiv(mc, block_m) * triton.cdiv(n, block_n)
    groups = triton.cdiv(k, GROUP)
    want = round(PROGRAMS_PER_SM * sms / tiles)
    splits = max(1, min(want, groups // MIN_GROUPS_PER_SPLIT, MAX_SPLITS))
    splits = _whole_splits(groups, splits)
    # the sweep: quantizing in the K loop pays at M <= 32 only
    return GemmConfig(block_m, block_n, swap, splits, quantize_in_gemm=mc <= 32)


@triton.jit(do_not_specialize=["M", "GROUPS_PER_SPLIT"])
def _fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, p_ptr, cnt_ptr,
    M, N, K, KB, GROUPS_PER_SPLIT, UP_OFFSET,
    stride_am, stride_bn, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr,
    A_MODE: tl.constexpr, SPLIT_MODE: tl.constexpr, SOFT_ROUND: tl.constexpr, SPLITS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    # one (N tile, M tile, K split): its K groups into an fp32 tile, then the common
    # epilogue (kernels/fp8_tile.py store_tile)
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m, offs_n, m_ok, n_ok, as_rows, bs_rows, acc = tile_start(pid_m, pid_n, M, N, KB, as_ptr, bs_ptr, BLOCK_M,
                                                                   BLOCK_N, SWAP_AB)
    offs_k = tl.arange(0, 128)
    g0 = split * GROUPS_PER_SPLIT
    if A_MODE == 1 or A_MODE == 2:
        # bf16 activations are prefetched one group ahead (registers): their loads are
        # not part of Triton's dot pipeline, and waiting on each one from L2 showed as
        # ~0.3 us per group (H200, kernel_sweep)
        x_rows = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
        first = m_ok[:, None] & ((g0 * 128 + offs_k[None, :]) < K)
        x_next = tl.load(x_rows + g0 * 128, mask=first, other=0.0)
        u_next = x_next
        if A_MODE == 2:
            u_next = tl.load(x_rows + UP_OFFSET + g0 * 128, mask=first, other=0.0)
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
        sb = tl.load(bs_rows + g, mask=sb_mask, other=0.0)
        if A_MODE == 0:  # codes and scales from quantize_act
            sa = tl.load(as_rows + g, mask=sa_mask, other=0.0)
            if SWAP_AB:
                at = tl.load(a_ptr + offs_m[None, :] * stride_am + k[:, None], mask=at_mask, other=0.0)
            else:
                a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :], mask=a_mask, other=0.0)
        else:  # quantize the group here, as quantize_act (1) / swiglu_quant (2) would
            x = x_next.to(tl.float32)
            if A_MODE == 2:
                u = u_next.to(tl.float32)
            # the next group of this split (masked off past its last one)
            more = (offs_m * 0 + i + 1) < GROUPS_PER_SPLIT  # [BM]
            ahead = m_ok[:, None] & more[:, None] & ((k[None, :] + 128) < K)
            x_next = tl.load(x_rows + (g + 1) * 128, mask=ahead, other=0.0)
            if A_MODE == 2:
                u_next = tl.load(x_rows + UP_OFFSET + (g + 1) * 128, mask=ahead, other=0.0)
                x = x * tl.sigmoid(x) * u  # silu(gate) * up, fp32 in registers only
            sa, inv = scale_and_inverse(tl.max(tl.abs(x), axis=1))
            a = to_e4m3(x * inv[:, None], SOFT_ROUND)
            if SWAP_AB:
                at = tl.trans(a)
        if SWAP_AB:
            bt = tl.load(b_ptr + offs_n[:, None] * stride_bn + k[None, :], mask=bt_mask, other=0.0)
            acc += tl.dot(bt, at) * (sb[:, None] * sa[None, :])  # [BN, BM]
        else:
            b = tl.load(b_ptr + offs_n[None, :] * stride_bn + k[:, None], mask=b_mask, other=0.0)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])  # [BM, BN]
    store_tile(acc, offs_m, offs_n, m_ok, n_ok, pid_m * tl.num_programs(0) + pid_n, split, M, N, c_ptr, p_ptr,
               cnt_ptr, stride_cm, SWAP_AB, SPLIT_MODE, SPLITS)


@triton.jit
def _splitk_reduce_kernel(p_ptr, c_ptr, numel, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLITS):  # unrolled (all loads in flight); fixed order: the same sum on every run
        acc += tl.load(p_ptr + s * numel + offs, mask=ok, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


# --- split counters ----------------------------------------------------------------------

_counter_lock = threading.Lock()
_counter_buffers: dict[tuple, Tensor] = {}


def _counters(device: torch.device) -> Tensor | None:
    """The zeroed counters of the current CUDA stream (one buffer per stream: the kernel
    leaves them zeroed, and a stream's launches never overlap). None while a graph is being
    captured on a stream that has none yet (a buffer made inside the capture would belong
    to the graph's memory pool): the caller then reduces in a second launch."""
    if device.type != "cuda":
        key = (device.type, None)
    else:
        key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    buf = _counter_buffers.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        with _counter_lock:
            buf = _counter_buffers.setdefault(key, torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device))
    return buf


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


def _check_operand(name: str, x: Tensor, dtypes: tuple[torch.dtype, ...] = (FP8,)) -> None:
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(str(d).removeprefix('torch.') for d in dtypes)}, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {list(x.shape)}")
    if x.stride(1) != 1 and x.shape[1] > 1:
        raise ValueError(f"{name} must have unit stride along K, got strides {x.stride()}")


def _check_common(a: Tensor, b: Tensor, b_scale: Tensor, k: int, out_dtype: torch.dtype) -> None:
    _check_operand("b", b)
    if b.shape[1] != k:
        raise ValueError(f"the activations (K = {k}) and b {list(b.shape)} disagree on K")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    if b.device != a.device or b_scale.device != a.device:
        raise ValueError("the activations, b and its scales must be on one device")
    check_scales("b_scale", b_scale, triton.cdiv(b.shape[0], GROUP), triton.cdiv(k, GROUP))


def fp8_gemm(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16, config: GemmConfig | None = None, *, pdl: bool = False,
) -> Tensor:
    """out [M, N] = dequant(a) @ dequant(b).T; see the module docstring for the layouts.
    `config` overrides the tile choices (benchmarks and tests); `pdl`: kernels/pdl.py."""
    _check_operand("a", a)
    m, k = a.shape
    _check_common(a, b, b_scale, k, out_dtype)
    if a_scale.device != a.device:
        raise ValueError("a and a_scale must be on one device")
    check_scales("a_scale", a_scale, m, triton.cdiv(k, GROUP))
    config = _config_for(a, b.shape[0], k, config)
    if config.backend == "cublas" and m and b.shape[0]:
        return cublas_block_gemm(a, a_scale.t().contiguous().t(), b, b_scale, out_dtype)
    return _launch(a, a_scale, b, b_scale, out_dtype, config, A_CODES, k, pdl=pdl)


ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def fp8_linear(
    x: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype | None = None,
    swiglu: bool = False, config: GemmConfig | None = None, *, pdl: bool = False,
) -> Tensor:
    """out [M, N] = quant(x) @ dequant(b).T in one launch: x [M, K] bf16/fp16/fp32 is
    quantized group by group inside the GEMM exactly as quantize_act would. With
    `swiglu=True`, x is [M, 2K] (gate columns, then up columns: the fused w1/w3 output) and
    the operand is silu(gate) * up, quantized as swiglu_quant would. Output in x's dtype
    unless `out_dtype` says otherwise."""
    _check_operand("x", x, ACT_DTYPES)
    m, width = x.shape
    if swiglu and width % 2:
        raise ValueError(f"swiglu input must be [M, 2H] (gate, then up), got width {width}")
    k = width // 2 if swiglu else width
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_common(x, b, b_scale, k, out_dtype)
    config = _config_for(x, b.shape[0], k, config)
    if config.backend == "cublas" and m and b.shape[0]:  # (empty products: the Triton launcher's early return)
        codes = (swiglu_quant(x[:, :k], x[:, k:], m_major_scales=True, pdl=pdl) if swiglu
                 else quantize_act(x, m_major_scales=True, pdl=pdl))
        return cublas_block_gemm(*codes, b, b_scale, out_dtype)
    if not config.quantize_in_gemm or (swiglu and config.tma):  # (the TMA kernel has no SwiGLU input)
        codes = swiglu_quant(x[:, :k], x[:, k:], pdl=pdl) if swiglu else quantize_act(x, pdl=pdl)
        return _launch(*codes, b, b_scale, out_dtype, config, A_CODES, k, pdl=pdl)
    return _launch(x, None, b, b_scale, out_dtype, config, A_SWIGLU if swiglu else A_BF16, k, pdl=pdl)


def _launch(a: Tensor, a_scale: Tensor | None, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype,
            cfg: GemmConfig, a_mode: int = A_CODES, k: int | None = None, *, pdl: bool = False) -> Tensor:
    """Unchecked Triton launch (tests call it to show what a wrong layout would do):
    out [M, N] in out_dtype."""
    m, n = a.shape[0], b.shape[0]
    k = a.shape[1] if k is None else k
    out = torch.empty(m, n, device=a.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return out
    groups = triton.cdiv(k, GROUP)
    per_split = triton.cdiv(groups, cfg.splits)
    splits = triton.cdiv(groups, per_split)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    split_mode = split_mode_for(cfg, splits, grid[0] * grid[1])
    partials = out if split_mode == SPLIT_NONE else torch.empty(splits, m, n, device=a.device, dtype=torch.float32)
    counters = _counters(a.device) if split_mode == SPLIT_LAST_REDUCES else None
    if split_mode == SPLIT_LAST_REDUCES and counters is None:  # capturing with no buffer yet
        split_mode = SPLIT_SEPARATE_REDUCE
    if cfg.tma and a_mode in (A_CODES, A_BF16) and tma_ready(a, b):
        launch_tma(a, a if a_scale is None else a_scale, b, b_scale, out, partials, counters, k, per_split, splits,
                   split_mode, cfg, a_mode == A_BF16, _num_sms(a.device.index if a.is_cuda else None), pdl)
    else:
        _fp8_gemm_kernel[grid](
            a, a if a_scale is None else a_scale, b, b_scale, out, partials, partials if counters is None else counters,
            m, n, k, groups, per_split, k,
            a.stride(0), b.stride(0), out.stride(0),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SWAP_AB=cfg.swap_ab,
            EVEN_K=k % GROUP == 0 and groups % per_split == 0,
            A_MODE=a_mode, SPLIT_MODE=split_mode, SOFT_ROUND=interpreting(),
            SPLITS=splits if split_mode == SPLIT_LAST_REDUCES else 1,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_args(pdl),
        )
    if split_mode == SPLIT_SEPARATE_REDUCE:
        _splitk_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            partials, out, m * n, SPLITS=splits, BLOCK=REDUCE_BLOCK, **launch_args(pdl),
        )
    return out


def cublas_supported(m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16) -> bool:
    """Shapes cuBLAS's block-scaled GEMM takes with this module's layouts as they are:
    whole 128 x 128 weight blocks, weight-scale columns (K / 128) a multiple of 4 and
    activation rows (M: the leading dimension of the M-major activation scales) a multiple
    of 4 (cuBLAS reads scales in fours; measured on an H100, 2026-12-06: M = 1 and 54 were
    refused with CUBLAS_STATUS_NOT_SUPPORTED, 16, 56, 64 and 300 taken). All S2-Pro N and K."""
    return m % 4 == 0 and n % GROUP == 0 and k % (4 * GROUP) == 0 and out_dtype in (torch.bfloat16, torch.float16)


def cublas_block_gemm(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """The same product through cuBLAS (torch._scaled_mm recognizes 1 x 128 and 128 x 128
    block scaling from the scale shapes): a [M, K] e4m3 with `a_scale` [M, KB] in M-major
    strides (1, M) (quantize_act(..., m_major_scales=True)); b [N, K] and b_scale [NB, KB]
    row-major as stored, read as b.T [K, N] (column-major) and b_scale.T [KB, NB]. cuBLAS
    checks the shapes; this checks the strides, which it would read without a word."""
    m, k = a.shape
    n = b.shape[0]
    if not cublas_supported(m, n, k, out_dtype):
        raise ValueError(f"cuBLAS block-scaled GEMM needs M % 4 == 0, N % 128 == 0, K % 512 == 0 and a bf16/fp16 "
                         f"output; got M={m}, N={n}, K={k}, {out_dtype}")
    kb = k // GROUP
    if tuple(a_scale.shape) != (m, kb) or (m > 1 and a_scale.stride(0) != 1) or (kb > 1 and a_scale.stride(1) != m):
        raise ValueError(f"a_scale must be [{m}, {kb}] with strides (1, {m}) (M-major) for cuBLAS, "
                         f"got {list(a_scale.shape)} with strides {a_scale.stride()}")
    check_scales("b_scale", b_scale, n // GROUP, kb)
    return torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=b_scale.t(), out_dtype=out_dtype)


# --- references (plain PyTorch, the same functions) ------------------------------------

def split_mode_for(cfg: GemmConfig, splits: int, tiles: int) -> int:
    """How a launch of `cfg` with `splits` K splits over `tiles` output tiles sums them:
    not at all (one split), the last split of each tile in the same launch (a counter per
    tile), or a second launch. A persistent TMA grid always takes the second launch: with
    the in-launch sum (a counter and a branch after each unit) Triton did not pipeline the
    persistent unit loop (compiled for sm90 on the CPU, triton 3.9: one stage of shared
    memory against three; kernels/FP8_NOTES.md)."""
    if splits == 1:
        return SPLIT_NONE
    persistent = cfg.tma and cfg.programs_per_sm > 0
    if cfg.reduce_in_kernel and not persistent and tiles <= COUNTER_SLOTS:
        return SPLIT_LAST_REDUCES
    return SPLIT_SEPARATE_REDUCE


def fp8_gemm_reference(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """Dequantize both operands, fp32 matmul, cast."""
    return (dequantize_act(a, a_scale) @ dequantize_weight(b, b_scale).t()).to(out_dtype)


def fp8_linear_reference(x: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype | None = None,
                         swiglu: bool = False) -> Tensor:
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if swiglu:
        h = x.shape[1] // 2
        codes = swiglu_quant_reference(x[:, :h], x[:, h:])
    else:
        codes = quantize_act_reference(x)
    return fp8_gemm_reference(*codes, b, b_scale, out_dtype)
