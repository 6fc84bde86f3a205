"""The MLP block's two FP8 GEMMs in one persistent launch: w13 with its SwiGLU epilogue,
then w2, the second starting on each group of the first's output as soon as it is done.

Why: at decode shapes every GEMM of the step is latency-bound, not bandwidth-bound
(Nsight Compute on an H100, batch 54: one 4-warp program per SM, ~80% of issue cycles
idle, the SMs active ~60% of a GEMM's time: the launch, the first loads, the split-K
tail; kernels/FP8_NOTES.md "Counters, and four candidates measured"). Two launches
drain the GPU between w13 and w2; here the programs of one launch walk a queue of work
units, all of w13's (tile, K split) units first, then w2's, and a w2 unit waits only for
the 128-channel groups of the SwiGLU output its K range reads. So w2's weights stream
while w13's last tiles finish, and there is one launch, one ramp and one tail a block.

    y = fp8_mlp(x, w13, w13_scale, w2, w2_scale)   # x [M, D] -> y [M, D], x's dtype

w13 [2H, D] e4m3 with its rows interleaved per 128 (kernels/fp8_quant.py
interleave_gate_up, the SwiGLU epilogue's layout), w2 [D, H]; block scales as
quantize_weight makes them. The same arithmetic as `fp8_swiglu_gemm` then `fp8_gemm`
with the same tiles and splits (kernels/fp8_gemm.py `gemm_unit` does each unit; the
splits of a tile are summed in split order by its last split), so the output is the
two-launch path's bit for bit.

How units find each other (all in the per-stream counter buffer `_counters`, which every
kernel leaves zeroed):
- a work counter: each program takes the next unit until none is left;
- per w13 output group, a count of its finished M tiles (`store_tile`'s `done_ptr`,
  raised with release semantics after the tile's codes and scales are written); a w2
  unit spins on the counts of its groups (acquire) before its K loop, which then reads
  them past L1 (`gemm_unit`'s A_MODE 3: a line of scales spans several groups, and an
  SM's L1 may hold one it read before the later groups were written);
- an exit counter: the last program out resets the work counter and the group counts.
Progress: a w2 unit only waits for w13 units taken before it (the queue hands out all of
w13 first), each of which is running on some program and never waits, so no residency
assumption is needed. Under the Triton interpreter the programs run one after another:
the first takes every unit in order and nothing ever waits.

Measured on an H100 (2026-12-06, `bash scripts/gpu_check.sh mlpfused`;
latency_bench/reference/h100-s2pro/mlp-one-launch/): the block alone 1.01-1.05x the
default two-launch MLP at M <= 16 and 0.86-0.91x at M = 54-64 (the time of its layout's
two launches, within 0.5 us), and the engine step 0.74-0.85x (~20 us more a block than
alone; not diagnosed). Not the default: the engine uses it only in the opt-in quant mode
`fp8-mlp-one-launch` (engine/quant.py FP8FeedForward one_launch). Its K-split sweep
(latency_bench/mlp_sweep.py, commit 662476d) was removed unrun: no split can recover the
engine's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.fp8_gemm import (
    A_BF16, A_CODES, A_CODES_FRESH, ACT_DTYPES, COUNTER_SLOTS, GROUP, SPLIT_LAST_REDUCES, SPLIT_NONE, GemmConfig,
    _check_common, _check_operand, _counters, _interpreting, _num_sms, _rule_config, check_scales, fp8_gemm,
    fp8_gemm_reference, fp8_swiglu_gemm, fp8_swiglu_gemm_reference, gemm_config, gemm_unit, swiglu_gemm_config,
)
from kernels.fp8_quant import FP8, quantize_act, round_code
from kernels.pdl import launch_args, pdl_wait

# Persistent programs a SM. Both phases' pipelines are allocated side by side: at the
# S2-Pro shape the kernel takes 100-124 KB of shared memory at 3 stages (compiled for sm90
# on the CPU, triton 3.6), so one program a SM fits.
PROGRAMS_PER_SM = 1
STAGES = 3  # 4 stages: 133-165 KB


@triton.jit
def _fp8_mlp_kernel(
    x_ptr, xs_ptr, w13_ptr, w13s_ptr, h_ptr, hs_ptr, w2_ptr, w2s_ptr, y_ptr,
    p1_ptr, p2_ptr, cnt_ptr,
    M, D, H, N, DB, HB, GPS1, TILES1_N, TILES1_M, UNITS1, GPS2, TILES2_N, TILES2_M, UNITS2,
    stride_xm, stride_ym, OFF_CNT2, OFF_READY, OFF_WORK,
    BLOCK_M1: tl.constexpr, SWAP1: tl.constexpr, SPLITS1: tl.constexpr, MODE1: tl.constexpr,
    A_MODE1: tl.constexpr, EVEN1: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, SWAP2: tl.constexpr, SPLITS2: tl.constexpr,
    MODE2: tl.constexpr, A_MODE2: tl.constexpr, EVEN2: tl.constexpr,
    HB_P2: tl.constexpr, ROUND: tl.constexpr, SOFT_ROUND: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    work_ptr = cnt_ptr + OFF_WORK  # [0]: the next unit, [1]: programs done
    ready_ptr = cnt_ptr + OFF_READY  # per w13 output group: its M tiles written
    u = tl.atomic_add(work_ptr, 1, sem="relaxed", scope="gpu")
    while u < UNITS1 + UNITS2:
        if u < UNITS1:  # w13 (interleaved gate/up, 256 rows a tile) -> SwiGLU codes h [M, H]
            gemm_unit(u % TILES1_N, (u // TILES1_N) % TILES1_M, u // (TILES1_N * TILES1_M), TILES1_N,
                      x_ptr, xs_ptr, w13_ptr, w13s_ptr, h_ptr, p1_ptr, cnt_ptr,
                      M, 2 * H, D, DB, GPS1, 0, stride_xm, D, H,
                      BLOCK_M1, 256, SWAP1, EVEN1, A_MODE1, MODE1, SOFT_ROUND, SPLITS1,
                      hs_ptr, True, ROUND, ready_ptr)
        else:  # w2 on h's codes, once the groups of its K range are written
            v = u - UNITS1
            split = v // (TILES2_N * TILES2_M)
            for g in range(split * GPS2, tl.minimum(split * GPS2 + GPS2, HB)):
                seen = tl.atomic_add(ready_ptr + g, 0, sem="acquire", scope="gpu")
                while seen < TILES1_M:
                    seen = tl.atomic_add(ready_ptr + g, 0, sem="acquire", scope="gpu")
            gemm_unit(v % TILES2_N, (v // TILES2_N) % TILES2_M, split, TILES2_N,
                      h_ptr, hs_ptr, w2_ptr, w2s_ptr, y_ptr, p2_ptr, cnt_ptr + OFF_CNT2,
                      M, N, H, HB, GPS2, 0, H, H, stride_ym,
                      BLOCK_M2, BLOCK_N2, SWAP2, EVEN2, A_MODE2, MODE2, SOFT_ROUND, SPLITS2,
                      None, False, 0)
        u = tl.atomic_add(work_ptr, 1, sem="relaxed", scope="gpu")
    # the last program out leaves the counters zeroed for the next launch on this stream
    out = tl.atomic_add(work_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if out == tl.num_programs(0) - 1:
        offs = tl.arange(0, HB_P2)
        tl.store(ready_ptr + offs, tl.zeros([HB_P2], tl.int32), mask=offs < HB)
        tl.atomic_xchg(work_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(work_ptr + 1, 0, sem="relaxed", scope="gpu")


def mlp_configs(m: int, d: int, h: int, sms: int) -> tuple[GemmConfig, GemmConfig]:
    """The two phases' tiles: the launch table's choices for the SwiGLU GEMM and for w2 at
    this M (their pointer-kernel tiles where the table names TMA or cuBLAS)."""
    c1 = swiglu_gemm_config(m, 2 * h, d, sms)
    c2 = gemm_config(m, d, h, sms)
    if c2.backend != "triton":
        c2 = _rule_config(m, d, h, sms)
    return c1, c2


@dataclass(frozen=True)
class Plan:
    """Everything a launch derives from (M, D, H, the configs, how x comes in): the grid,
    the kernel's integer arguments after its pointers and strides, its constexprs, warps.
    One place, so that `kernels.sm90 --mlp` compiles what `fp8_mlp` launches."""

    programs: int
    splits: tuple[int, int]  # K splits of the two phases (1: no partials)
    ints: tuple[int, ...]  # M, D, H, N, DB, HB, GPS1, TILES1_N, TILES1_M, UNITS1, GPS2, TILES2_N, TILES2_M, UNITS2
    offsets: tuple[int, int, int]  # OFF_CNT2, OFF_READY, OFF_WORK in the counter buffer
    constexprs: dict
    num_warps: int

    @property
    def counters_needed(self) -> int:
        return self.offsets[2] + 2


def plan(m: int, d: int, h: int, c1: GemmConfig, c2: GemmConfig, a_mode: int, dtype: torch.dtype,
         sms: int) -> Plan:
    """The launch of `fp8_mlp` for x [m, d] (`a_mode`: A_BF16 or A_CODES), H = h."""
    phases = []
    for k, cfg in ((d, c1), (h, c2)):  # groups per split, splits, M tiles, split mode, even K
        groups = triton.cdiv(k, GROUP)
        per_split = triton.cdiv(groups, cfg.splits)
        splits = triton.cdiv(groups, per_split)
        phases.append((per_split, splits, triton.cdiv(m, cfg.block_m), SPLIT_LAST_REDUCES if splits > 1 else SPLIT_NONE,
                       k % GROUP == 0 and groups % per_split == 0))
    (gps1, splits1, tiles1_m, mode1, even1), (gps2, splits2, tiles2_m, mode2, even2) = phases
    hb = tiles1_n = h // GROUP  # a w13 tile (256 interleaved rows) is one group of H
    tiles2_n = triton.cdiv(d, c2.block_n)
    units1, units2 = tiles1_n * tiles1_m * splits1, tiles2_n * tiles2_m * splits2
    off_cnt2 = tiles1_n * tiles1_m  # the w13 phase's split counters first, then w2's, the group counts, the queue
    off_ready = off_cnt2 + tiles2_n * tiles2_m
    constexprs = dict(
        BLOCK_M1=c1.block_m, SWAP1=c1.swap_ab, SPLITS1=splits1, MODE1=mode1, A_MODE1=a_mode, EVEN1=even1,
        BLOCK_M2=c2.block_m, BLOCK_N2=c2.block_n, SWAP2=c2.swap_ab, SPLITS2=splits2, MODE2=mode2,
        A_MODE2=A_CODES_FRESH, EVEN2=even2, HB_P2=triton.next_power_of_2(hb), ROUND=round_code(dtype),
    )
    # 8 warps where the first phase's tile is [64, 256] (M >= 32: 4 warps spilled its fp32
    # tile to local memory, compiled for sm90), else the configs' own
    warps = 8 if c1.block_m >= 64 else max(c1.num_warps, c2.num_warps)
    return Plan(min(units1 + units2, PROGRAMS_PER_SM * sms), (splits1, splits2),
                (m, d, h, d, triton.cdiv(d, GROUP), hb, gps1, tiles1_n, tiles1_m, units1, gps2, tiles2_n, tiles2_m,
                 units2), (off_cnt2, off_ready, off_ready + hb), constexprs, warps)


def fp8_mlp(x: Tensor, w13: Tensor, w13_scale: Tensor, w2: Tensor, w2_scale: Tensor,
            codes: tuple[Tensor, Tensor] | None = None,
            configs: tuple[GemmConfig, GemmConfig] | None = None) -> Tensor:
    """y [M, D] = w2 @ swiglu(w13 @ x) in FP8, one launch (see the module docstring). x
    [M, D] bf16/fp16/fp32 (`codes`: x already quantized by its producer, used as they
    are); w13 [2H, D] interleaved per 128 rows, w2 [D, H], e4m3 with their block scales.
    Falls back to the two launches (fp8_swiglu_gemm, fp8_gemm) where the stream has no
    counter buffer yet (a graph capture on a new stream)."""
    _check_operand("x", x, ACT_DTYPES)
    m, d = x.shape
    h2 = w13.shape[0]
    if h2 % (2 * GROUP) or tuple(w2.shape) != (d, h2 // 2):
        raise ValueError(f"w13 must be [2H, {d}] with H % {GROUP} == 0 and w2 [{d}, H], got {tuple(w13.shape)} "
                         f"and {tuple(w2.shape)}")
    hdim = h2 // 2
    _check_common(x, w13, w13_scale, d, x.dtype)
    _check_operand("w2", w2)
    check_scales("w2_scale", w2_scale, triton.cdiv(d, GROUP), hdim // GROUP)
    for name, w, k in (("w13", w13, d), ("w2", w2, hdim)):
        if w.stride(0) != k:  # the kernel steps through the weights' rows by their width
            raise ValueError(f"{name} must have contiguous rows (row stride {k}), got strides {w.stride()}")
    if not w2.device == w2_scale.device == x.device:
        raise ValueError("x, w2 and its scales must be on one device")
    sms = _num_sms(x.device.index if x.is_cuda else None)
    c1, c2 = configs or mlp_configs(m, d, hdim, sms)
    if c1.block_n != 2 * GROUP:
        raise ValueError(f"the first phase needs 256-row weight tiles (one group's gate and up rows), got {c1}")
    y = torch.empty(m, d, device=x.device, dtype=x.dtype)
    if m == 0:
        return y
    if codes is not None:
        _check_operand("codes", codes[0])
        check_scales("codes' scales", codes[1], m, triton.cdiv(d, GROUP))
    a_mode = A_CODES if codes is not None or not c1.quantize_in_gemm else A_BF16
    launch = plan(m, d, hdim, c1, c2, a_mode, x.dtype, sms)
    counters = _counters(x.device)
    if counters is None or launch.counters_needed > COUNTER_SLOTS:
        h_codes, h_scales = fp8_swiglu_gemm(x, w13, w13_scale, c1, codes=codes)
        return fp8_gemm(h_codes, h_scales, w2, w2_scale, x.dtype, c2)
    if codes is not None:
        a, a_scale = codes
    elif a_mode == A_BF16:
        a, a_scale = x, x
    else:
        a, a_scale = quantize_act(x)
    h_codes = torch.empty(m, hdim, device=x.device, dtype=FP8)
    h_scales = torch.empty(m, hdim // GROUP, device=x.device, dtype=torch.float32)
    # split-K partials, where a phase splits K (an unsplit phase never touches its pointer)
    splits1, splits2 = launch.splits
    p1 = torch.empty(splits1, m, h2, device=x.device, dtype=torch.float32) if splits1 > 1 else h_scales
    p2 = torch.empty(splits2, m, d, device=x.device, dtype=torch.float32) if splits2 > 1 else h_scales
    _fp8_mlp_kernel[(launch.programs,)](
        a, a_scale, w13, w13_scale, h_codes, h_scales, w2, w2_scale, y, p1, p2, counters,
        *launch.ints, a.stride(0), y.stride(0), *launch.offsets,
        **launch.constexprs, SOFT_ROUND=_interpreting(), num_warps=launch.num_warps, num_stages=STAGES,
        **launch_args(),
    )
    return y


def fp8_mlp_reference(x: Tensor, w13: Tensor, w13_scale: Tensor, w2: Tensor, w2_scale: Tensor) -> Tensor:
    """The same function in plain PyTorch: the SwiGLU GEMM's reference, then w2's."""
    h_codes, h_scales = fp8_swiglu_gemm_reference(x, w13, w13_scale)
    return fp8_gemm_reference(h_codes, h_scales, w2, w2_scale, x.dtype)
