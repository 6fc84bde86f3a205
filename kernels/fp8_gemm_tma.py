"""The block-scaled FP8 GEMM with its operand tiles loaded by TMA (Hopper's tensor memory
accelerator), optionally persistent and warp-specialized: a candidate for the decode
shapes where the pointer kernel (kernels/fp8_gemm.py) streams weights far below the
card's bandwidth (H200: 23-57% of the bytes floor at M = 64; kernels/FP8_NOTES.md).

The same function and layouts as `fp8_gemm`: per 128-wide K group, one fp8 dot promoted
into the fp32 accumulator with its two scales, the same group order and the same split-K
partials and sums, so a row's output does not depend on which kernel made it. It takes
codes, or bf16 activations (A_BF16) that it loads by TMA and quantizes group by group in
its K loop with quantize_act's arithmetic (the same codes bit for bit); the SwiGLU input
of the MLP's down projection is quantized in a launch first.

Why each option might pay (the sweep of kernels/fp8_configs.py timed them against the
pointer kernel; the table takes the TMA kernel where it won: kernels/fp8_configs.py):
- TMA: one instruction per tile instead of per-thread address arithmetic and 16-byte
  loads; the copy engine zero-fills rows and columns past M, N and K, so the hot loop
  has no masks.
- persistent (`programs_per_sm` > 0): a grid of that many programs per SM walks the
  (tile, split) units, so the last wave is not a fraction of the GPU and a program's next
  unit can start loading while its last one finishes.
- warp-specialized (Triton's automatic partitioning, Hopper since Triton 3.4, on
  descriptor loops): producer warps keep the TMA loads running ahead while the consumer
  warps wait on each group's wgmma before scaling it into the accumulator, which the
  software pipeline alone must serialize.

TMA needs 16-byte aligned bases and row strides (K % 16 == 0 for e4m3 rows, K % 8 for
bf16): `tma_ready` says whether the operands allow it; the launcher takes the pointer
kernel otherwise.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.fp8_tile import store_tile, tile_start
from kernels.pdl import launch_args, pdl_wait

try:  # host-side tensor descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - an older Triton: every config falls back to the pointer kernel
    TensorDescriptor = None

TMA_ALIGN = 16  # bytes: base address and row stride of a TMA operand


def tma_ready(*operands: Tensor) -> bool:
    """Whether TMA can load these [rows, K] operands as they are (unit stride along K,
    16-byte aligned base and row stride)."""
    if TensorDescriptor is None:
        return False
    if operands and operands[0].is_cuda and not _has_tma(operands[0].device.index):
        return False  # before Hopper (e.g. an sm89 card, which has e4m3 but no TMA): the pointer kernel
    for x in operands:
        if x.ndim != 2 or x.stride(1) != 1:
            return False
        if (x.stride(0) * x.element_size()) % TMA_ALIGN or x.data_ptr() % TMA_ALIGN:
            return False
    return True


@functools.cache
def _has_tma(device_index: int | None) -> bool:
    """TMA copies exist from compute capability 9.0 (Hopper) on. The tuned table
    (kernels/fp8_configs.py) names the TMA kernel for some shapes; on an older card those
    calls take the pointer kernel with the same tiles instead."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def descriptor(x: Tensor, rows: int) -> "TensorDescriptor":
    """A descriptor over x [R, K] whose loads are [rows, 128] boxes (one K group)."""
    return TensorDescriptor.from_tensor(x, [rows, 128])


@triton.jit(do_not_specialize=["M", "GROUPS_PER_SPLIT", "UNITS"])
def _fp8_gemm_tma_kernel(
    a_desc, as_ptr, b_desc, bs_ptr, c_ptr, p_ptr, cnt_ptr,
    M, N, KB, GROUPS_PER_SPLIT, UNITS, TILES_N, TILES_M, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_MODE: tl.constexpr,
    SPLITS: tl.constexpr = 1, PERSISTENT: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False,
    PDL: tl.constexpr = False, SOFT_ROUND: tl.constexpr = False, A_BF16: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    if PERSISTENT:
        # units in order n, then m, then split: a tile's splits are TILES_N * TILES_M units
        # apart, so they run on different programs at about the same time
        for unit in tl.range(tl.program_id(0), UNITS, tl.num_programs(0), flatten=True,
                             warp_specialize=WARP_SPECIALIZE):
            _unit(unit, a_desc, as_ptr, b_desc, bs_ptr, c_ptr, p_ptr, cnt_ptr, M, N, KB, GROUPS_PER_SPLIT,
                  TILES_N, TILES_M, stride_cm, BLOCK_M, BLOCK_N, SWAP_AB, SPLIT_MODE, SPLITS, False,
                  SOFT_ROUND, A_BF16)
    else:
        _unit(tl.program_id(0), a_desc, as_ptr, b_desc, bs_ptr, c_ptr, p_ptr, cnt_ptr, M, N, KB, GROUPS_PER_SPLIT,
              TILES_N, TILES_M, stride_cm, BLOCK_M, BLOCK_N, SWAP_AB, SPLIT_MODE, SPLITS, WARP_SPECIALIZE,
              SOFT_ROUND, A_BF16)


@triton.jit
def _unit(
    unit, a_desc, as_ptr, b_desc, bs_ptr, c_ptr, p_ptr, cnt_ptr, M, N, KB, GROUPS_PER_SPLIT, TILES_N, TILES_M,
    stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_MODE: tl.constexpr,
    SPLITS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, SOFT_ROUND: tl.constexpr, A_BF16: tl.constexpr,
):
    """One (tile, split) unit: its K groups into an fp32 tile, then the common epilogue."""
    pid_n = unit % TILES_N
    pid_m = (unit // TILES_N) % TILES_M
    split = unit // (TILES_N * TILES_M)
    offs_m, offs_n, m_ok, n_ok, as_rows, bs_rows, acc = tile_start(pid_m, pid_n, M, N, KB, as_ptr, bs_ptr, BLOCK_M,
                                                                   BLOCK_N, SWAP_AB)
    g0 = split * GROUPS_PER_SPLIT
    # the group itself is the induction variable: Hopper's warp specialization (triton 3.9,
    # compiled for sm90 on the CPU) crashed on a `g0 + i` that both partitions use
    for g in tl.range(g0, g0 + GROUPS_PER_SPLIT, warp_specialize=WARP_SPECIALIZE):
        # a split's last groups may lie past K (splits x groups per split >= KB): the TMA
        # loads give zeros there and the masked scales zero, so they add nothing
        sb = tl.load(bs_rows + g, mask=n_ok & ((offs_n * 0 + g) < KB), other=0.0)
        if A_BF16:  # quantized here as quantize_act would (zeros past M and K: no effect on the amax)
            x = a_desc.load([pid_m * BLOCK_M, g * 128]).to(tl.float32)  # [BM, 128]
            sa, inv = scale_and_inverse(tl.max(tl.abs(x), axis=1))
            a = to_e4m3(x * inv[:, None], SOFT_ROUND)
        else:
            sa = tl.load(as_rows + g, mask=m_ok & ((offs_m * 0 + g) < KB), other=0.0)
            a = a_desc.load([pid_m * BLOCK_M, g * 128])  # [BM, 128] e4m3
        b = b_desc.load([pid_n * BLOCK_N, g * 128])  # [BN, 128] e4m3, K-major as wgmma wants
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(a)) * (sb[:, None] * sa[None, :])  # [BN, BM]
        else:
            acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])  # [BM, BN]
    store_tile(acc, offs_m, offs_n, m_ok, n_ok, pid_m * TILES_N + pid_n, split, M, N, c_ptr, p_ptr, cnt_ptr,
               stride_cm, SWAP_AB, SPLIT_MODE, SPLITS)


def launch_tma(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out: Tensor, partials: Tensor,
               counters: Tensor | None, k: int, per_split: int, splits: int, split_mode: int, cfg, a_bf16: bool,
               sms: int, pdl: bool) -> None:
    """The TMA kernel over out [M, N] (fp8_gemm's `_launch` checked everything and made
    the buffers). A persistent config runs min(units, programs_per_sm x SMs) programs."""
    m, n = a.shape[0], b.shape[0]
    tiles_n, tiles_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    units = tiles_n * tiles_m * splits
    programs = min(units, cfg.programs_per_sm * sms) if cfg.programs_per_sm else units
    _fp8_gemm_tma_kernel[(programs,)](
        descriptor(a, cfg.block_m), a_scale, descriptor(b, cfg.block_n), b_scale, out, partials,
        partials if counters is None else counters,
        m, n, triton.cdiv(k, 128), per_split, units, tiles_n, tiles_m, out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SWAP_AB=cfg.swap_ab, SPLIT_MODE=split_mode,
        SPLITS=splits if split_mode == 2 else 1, PERSISTENT=cfg.programs_per_sm > 0,
        WARP_SPECIALIZE=cfg.warp_specialize, SOFT_ROUND=interpreting(), A_BF16=a_bf16, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch_args(pdl),
    )
