"""What the FP8 GEMM kernels (kernels/fp8_gemm.py, kernels/fp8_gemm_tma.py) share around
their K loops: a tile's rows, columns, scale rows and accumulator, and the epilogue that
writes the finished fp32 tile to the output, or to its split's partial with the last
split of the tile summing them (the split modes and the counters are described in
fp8_gemm.py)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_start(pid_m, pid_n, M, N, KB, as_ptr, bs_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               SWAP_AB: tl.constexpr):
    """The tile's rows and columns, which of them are real, each row's activation-scale
    row and each column's weight-scale row (addressed without strides: the launcher checks
    both layouts), and a zero accumulator ([BN, BM] when SWAP_AB, else [BM, BN])."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    as_rows = as_ptr + offs_m * KB  # [BM] scale rows
    bs_rows = bs_ptr + (offs_n // 128) * KB  # [BN] the 128 x 128 block of each weight row
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    return offs_m, offs_n, m_ok, n_ok, as_rows, bs_rows, acc


@triton.jit
def store_tile(
    acc, offs_m, offs_n, m_ok, n_ok, tile, split, M, N, c_ptr, p_ptr, cnt_ptr, stride_cm,
    SWAP_AB: tl.constexpr, SPLIT_MODE: tl.constexpr, SPLITS: tl.constexpr,
):
    """acc: [BLOCK_N, BLOCK_M] when SWAP_AB, else [BLOCK_M, BLOCK_N]. `tile`: the tile's
    counter index (unique per (M, N) tile of the launch). SPLIT_MODE 0: write the output;
    1: write this split's fp32 partial (a second launch sums them); 2: write it, and the
    split that completes the tile's count sums all partials in split order
    (deterministic), writes the output (in c's dtype) and resets the counter."""
    if SWAP_AB:
        out_mask = m_ok[None, :] & n_ok[:, None]
        c_offs = offs_m[None, :] * stride_cm + offs_n[:, None]
        p_offs = offs_m[None, :] * N + offs_n[:, None]
    else:
        out_mask = m_ok[:, None] & n_ok[None, :]
        c_offs = offs_m[:, None] * stride_cm + offs_n[None, :]
        p_offs = offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_MODE == 0:
        tl.store(c_ptr + c_offs, acc.to(c_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(p_ptr + split * M * N + p_offs, acc, mask=out_mask)
        if SPLIT_MODE == 2:
            # every thread's partial is written before the count goes up (release); the
            # split that makes the count complete reads all partials (acquire, past L1)
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if done == SPLITS - 1:
                # unrolled: every split's loads are in flight at once, one L2 round trip at the
                # end of the launch instead of SPLITS dependent ones; summed in split order
                # (deterministic)
                total = tl.zeros_like(acc)
                for s in tl.static_range(SPLITS):
                    total += tl.load(p_ptr + s * M * N + p_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
                tl.store(c_ptr + c_offs, total.to(c_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
