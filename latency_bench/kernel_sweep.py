"""`python -m latency_bench.kernel_sweep`: the FP8 GEMM's launch choices, timed on the GPU.

For every S2-Pro linear shape and batch M it times the tile choices around the MMA shapes
(swapped 16..64-wide tiles for decode, 64/128-row tiles for larger M; weight tiles of
64..256 rows; 3 or 4 pipeline stages; 4 or 8 warps; every K split that leaves no split
empty), each with the activations quantized in the GEMM's K loop and in a launch before
it, and cuBLAS's block-scaled FP8 GEMM, all on the engine's path: bf16 activations in
(`fp8_linear`; the SwiGLU variant for w2, as the MLP runs it). Then, at each best choice,
the split-K sum in a second launch, the GEMM alone on pre-quantized codes, and the untuned
rule. Every candidate's output is checked against the PyTorch reference before it is
timed (a wrong one is reported and left out). Writes <out>/kernel_sweep.json, prints the
best choices as the `TUNED` table of kernels/fp8_configs.py.

    python -m latency_bench.kernel_sweep --out out/sweep                  # H200: ~3-5 min
    python -m latency_bench.kernel_sweep --shapes wqkv --m 1,16 --jobs 8  # a part
    python -m latency_bench.kernel_sweep --smoke                          # CPU: checks the script
    python -m latency_bench.kernel_sweep --tma --no-warp-specialize --m 1 --compile-sm90
        # any machine: compiles the TMA choices for Hopper (kernels/sm90.py), times nothing

Every distinct kernel variant is compiled first, in `--jobs` processes at once (Triton's
on-disk cache then serves the timing process): a sweep compiles a few hundred variants,
one after another that alone would take longer than a device call may run. Timing is
kernel_bench's: a CUDA graph over enough weight copies to stream each call from HBM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and "--compile-sm90" in sys.argv:  # before Triton: compile, do not interpret
    os.environ["TRITON_INTERPRET"] = "0"

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import (GROUP, SHAPES, SMOKE_SHAPES, Shape, Timer, bench_device, copies_for,
                                        floors, make_weights)

MS = [1, 2, 4, 8, 16, 32, 64, 128]
# (block_n, num_warps, num_stages) of the swapped decode tiles; (block_m, block_n, warps,
# stages) of the plain ones
# (the first sweep's top five at every shape and M came from these; 32-row weight tiles,
# 4 or 6 stages with 4 warps and 64-row plain tiles were never among them: H200, 2026-12-01)
SWAP_TILES = [(64, 4, 3), (128, 4, 3), (128, 8, 3), (128, 8, 4), (256, 8, 3)]
PLAIN_TILES = [(64, 128, 4, 3), (64, 128, 8, 4), (128, 128, 8, 3)]
SPLITS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32]
MAX_PROGRAMS = 132 * 8


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def swiglu_shape(shape: Shape) -> bool:
    """w2 runs behind the SwiGLU in the MLP: its sweep times the SwiGLU variant."""
    return shape.name == "w2"


def split_choices(k: int) -> list[int]:
    groups = cdiv(k, GROUP)
    return [s for s in SPLITS if s <= groups and cdiv(groups, cdiv(groups, s)) == s and groups >= 2 * s or s == 1]


# The TMA kernel's candidates (`--tma`, kernels/fp8_gemm_tma.py): fewer tiles, each with
# every way of running the grid (one program per unit, or persistent with 1 or 2 programs
# per SM), and the plain tiles also warp-specialized. Compiled for sm90 on the CPU
# (`python -m kernels.sm90`, triton 3.9), Hopper's warp specialization partitions the
# loop only at 4 warps (Triton adds the producer warps; at 8 nothing happens) and fails
# on the swapped tiles (128 weight rows on the MMA's side), so only plain tiles take it.
TMA_SWAP_TILES = [(64, 4, 4), (128, 8, 3), (128, 8, 4)]
TMA_PLAIN_TILES = [(64, 64, 4, 4), (64, 128, 8, 4), (128, 128, 8, 3)]
TMA_WS_WARPS = 4
TMA_PROGRAMS_PER_SM = [0, 1, 2]
SMS = 132  # an H200's


def tma_splits(shape: Shape, m: int, tiles: int) -> list[int]:
    """No split, and the fewest splits whose units fill the GPU once and twice over."""
    choices = split_choices(shape.k)
    want = [1] + [next((s for s in choices if tiles * s >= w * SMS), choices[-1]) for w in (1, 2)]
    return sorted(set(want))


def _tiles(mc: int, swap_tiles: list, plain_tiles: list) -> list[tuple]:
    """(block_m, block_n, swap_ab, warps, stages) for the M class `mc`: the swapped decode
    tiles up to 64 rows, the plain ones from 32."""
    tiles = []
    if mc <= 64:
        tiles += [(max(16, mc), bn, True, w, st) for bn, w, st in swap_tiles]
    if mc >= 32:
        tiles += [(bm, bn, False, w, st) for bm, bn, w, st in plain_tiles]
    return tiles


def _cublas(shape: Shape, m: int) -> list:
    """cuBLAS's block-scaled GEMM where it takes the shape (its tile fields unused)."""
    from kernels.fp8_gemm import GemmConfig, cublas_supported

    if cublas_supported(m, shape.n, shape.k, torch.bfloat16):
        return [GemmConfig(16, 64, True, quantize_in_gemm=False, backend="cublas")]
    return []


def tma_candidates(shape: Shape, m: int, smoke: bool = False, warp_specialize: bool = True) -> list:
    """The TMA kernel's choices for (shape, M), plus the pointer kernel's current table
    entry (the baseline in the same run) and cuBLAS's block-scaled GEMM."""
    from kernels.fp8_gemm import GemmConfig, gemm_config, m_class

    mc = m_class(m)
    tiles = _tiles(mc, TMA_SWAP_TILES, TMA_PLAIN_TILES)[: 1 if smoke else None]
    out = [gemm_config(m, shape.n, shape.k)]
    # bf16 activations quantized in the TMA kernel's K loop where that pays for the pointer
    # kernel (M <= 32; not behind the SwiGLU, which it quantizes in a launch first)
    in_loop = (False, True) if mc <= 32 and not swiglu_shape(shape) else (False,)
    for bm, bn, swap, warps, stages in tiles:
        for s in tma_splits(shape, m, cdiv(shape.n, bn) * cdiv(m, bm))[: 2 if smoke else None]:
            for pps in TMA_PROGRAMS_PER_SM[: 2 if smoke else None]:
                for ws in (False,) if swap or not warp_specialize else (False, True):
                    for quantize in in_loop:
                        out.append(GemmConfig(bm, bn, swap, s, TMA_WS_WARPS if ws else warps, stages,
                                              quantize_in_gemm=quantize, tma=True, programs_per_sm=pps,
                                              warp_specialize=ws))
    return list(dict.fromkeys(out + _cublas(shape, m)))


def candidates(shape: Shape, m: int, smoke: bool = False, tma: bool = False, warp_specialize: bool = True):
    if tma:
        return tma_candidates(shape, m, smoke, warp_specialize)
    from kernels.fp8_gemm import GemmConfig, m_class

    tiles = _tiles(m_class(m), SWAP_TILES, PLAIN_TILES)[: 2 if smoke else None]
    out = []
    for bm, bn, swap, warps, stages in tiles:
        for s in split_choices(shape.k)[: 2 if smoke else None]:
            if cdiv(shape.n, bn) * cdiv(m, bm) * s <= MAX_PROGRAMS or s == 1:
                for fused in (True, False):  # activations quantized in the GEMM, or in a launch before it
                    out.append(GemmConfig(bm, bn, swap, s, warps, stages, quantize_in_gemm=fused))
    return out + _cublas(shape, m)


# --- compiling in parallel ----------------------------------------------------------------

def compile_key(shape: Shape, m: int, cfg, a_mode: int) -> tuple:
    """What makes a distinct compiled variant (M and the split length are runtime values;
    N, K and the strides specialize alike for every S2-Pro shape: multiples of 16)."""
    groups = cdiv(shape.k, GROUP)
    per = cdiv(groups, cfg.splits)
    even = shape.k % GROUP == 0 and groups % per == 0
    if cfg.backend == "cublas":
        return ("cublas", a_mode)  # only the quantize kernels compile
    split_mode = 0 if cfg.splits == 1 else (2 if cfg.reduce_in_kernel else 1)
    if cfg.tma:  # no EVEN_K: the copies zero-fill; bf16 in (A_BF16) or codes (the SwiGLU input quantized first)
        unrolled = cfg.splits if split_mode == 2 and not cfg.programs_per_sm else 1
        a_bf16 = cfg.quantize_in_gemm and a_mode == 1
        return ("tma", cfg.block_m, cfg.block_n, cfg.swap_ab, split_mode, unrolled, cfg.num_warps, cfg.num_stages,
                cfg.programs_per_sm > 0, cfg.warp_specialize, a_bf16)
    a_mode = a_mode if cfg.quantize_in_gemm else 0
    unrolled = cdiv(groups, per) if split_mode == 2 else 1  # the in-kernel sum is unrolled over the splits
    return (cfg.block_m, cfg.block_n, cfg.swap_ab, even, a_mode, split_mode, unrolled, cfg.num_warps, cfg.num_stages)


_worker_cache: dict = {}


def calls(weights: list, x: torch.Tensor, cfg, a_mode: int) -> list:
    """One call per weight copy. a_mode 0: the GEMM alone on pre-quantized codes of
    x[:, :K]; 1 / 2: fp8_linear as the engine calls it (2: x is the SwiGLU input)."""
    from kernels.fp8_gemm import fp8_gemm, fp8_linear
    from kernels.fp8_quant import quantize_act

    if a_mode == 0:
        codes = quantize_act(x[:, : weights[0].wq.shape[1]])
        return [lambda w=w: fp8_gemm(*codes, w.wq, w.ws, config=cfg) for w in weights]
    return [lambda w=w: fp8_linear(x, w.wq, w.ws, swiglu=a_mode == 2, config=cfg) for w in weights]


def run_once(shape: Shape, m: int, cfg, a_mode: int, device) -> None:
    key = (shape, device)
    if key not in _worker_cache:
        _worker_cache[key] = make_weights(shape, 1, device)[0]
    x = torch.randn(m, 2 * shape.k if a_mode == 2 else shape.k, device=device).bfloat16()
    calls([_worker_cache[key]], x, cfg, a_mode)[0]()


def _compile_jobs(jobs: list) -> list[str]:
    """Compile (and run once) each job; a variant that does not fit (shared memory,
    registers) is reported and later timed as NaN."""
    device = torch.device("cuda")
    failed = []
    for shape, m, cfg, a_mode in jobs:
        try:
            run_once(shape, m, cfg, a_mode, device)
        except Exception as e:  # noqa: BLE001 - Triton's OutOfResources and compile errors alike
            failed.append(f"{shape.name} M={m} {cfg} mode {a_mode}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    torch.cuda.synchronize()
    return failed


def precompile(jobs: list, workers: int, cuda: bool) -> float:
    """Compile one job per distinct variant, spread over `workers` processes."""
    t0 = time.perf_counter()
    seen, unique = set(), []
    for job in jobs:
        key = compile_key(*job)
        if key not in seen:
            seen.add(key)
            unique.append(job)
    if cuda and workers > 1 and len(unique) > 1:
        import multiprocessing as mp

        chunks = [unique[i::workers] for i in range(workers)]
        with mp.get_context("spawn").Pool(workers) as pool:
            failed = [f for part in pool.map(_compile_jobs, [c for c in chunks if c]) for f in part]
        for f in failed:
            print(f"  does not compile: {f}", flush=True)
    dt = time.perf_counter() - t0
    print(f"compiled {len(unique)} variants in {dt:.0f} s ({workers} processes)", flush=True)
    return dt


# --- timing ---------------------------------------------------------------------------------

# A candidate whose output is this far from the PyTorch reference is not timed: a fast
# wrong choice must never reach the table (a layout error is > 0.3; bf16 rounding ~2e-3).
WRONG_RESULT_TOL = 1e-2


def reference(x: torch.Tensor, w, a_mode: int) -> torch.Tensor:
    """What every candidate of (x, weight, a_mode) must compute (time_config's a_mode)."""
    from kernels.fp8_gemm import fp8_linear_reference

    k = w.wq.shape[1]
    return fp8_linear_reference(x if a_mode else x[:, :k], w.wq, w.ws, swiglu=a_mode == 2).float()


def _check_result(out: torch.Tensor, expected: torch.Tensor) -> None:
    err = float((out.float() - expected).norm() / expected.norm().clamp_min(1e-30))
    if not err < WRONG_RESULT_TOL:
        raise ValueError(f"wrong result: relative error {err:.3g} against the PyTorch reference")


def time_config(timer: Timer, weights: list, x: torch.Tensor, cfg, a_mode: int, expected: torch.Tensor) -> float:
    """`calls`' time per call; `expected` (reference(x, weights[0], a_mode)) is checked
    before timing."""
    try:
        return _time_config(timer, weights, x, cfg, a_mode, expected)
    except Exception as e:  # noqa: BLE001 - a variant that does not fit is a NaN row, not the end of the sweep
        print(f"  ({cfg}: {type(e).__name__}: {str(e).splitlines()[0][:100]})", flush=True)
        return float("nan")


def _time_config(timer: Timer, weights: list, x: torch.Tensor, cfg, a_mode: int, expected: torch.Tensor) -> float:
    fns = calls(weights, x, cfg, a_mode)
    _check_result(fns[0](), expected)
    return timer.us_per_call(fns)


def sweep(timer: Timer, shapes: list[Shape], ms: list[int], smoke: bool, jobs: int, tma: bool = False,
          warp_specialize: bool = True) -> list[dict]:
    from kernels.fp8_gemm import GemmConfig, gemm_config

    cuda = timer.device.type == "cuda"
    plan = [(s, m, c, 2 if swiglu_shape(s) else 1) for s in shapes for m in ms for c in candidates(s, m, smoke, tma, warp_specialize)]
    print(f"{len(plan)} timings planned", flush=True)
    precompile(plan, jobs, cuda)
    rows = []
    for shape in shapes:
        weights = make_weights(shape, copies_for(shape.n * shape.k, smoke), timer.device)
        a_mode = 2 if swiglu_shape(shape) else 1
        for m in ms:
            x = torch.randn(m, 2 * shape.k if a_mode == 2 else shape.k, device=timer.device).bfloat16()
            expected = reference(x, weights[0], a_mode)
            table = gemm_config(m, shape.n, shape.k)
            timed = [(time_config(timer, weights, x, c, a_mode, expected), c) for c in candidates(shape, m, smoke, tma, warp_specialize)]
            table_us = next((us for us, c in timed if c == table), None)
            timed = [t for t in timed if t[0] == t[0]]  # NaN: a variant that failed
            timed.sort(key=lambda t: t[0])
            best_us, best = timed[0]
            fused = [us for us, c in timed if c.quantize_in_gemm and c.backend == "triton"]
            separate = [us for us, c in timed if not c.quantize_in_gemm and c.backend == "triton" and not c.tma]
            cublas = [us for us, c in timed if c.backend == "cublas"]
            with_tma = [us for us, c in timed if c.tma]
            rows.append({"shape": shape.name, "n": shape.n, "k": shape.k, "m": m, "a_mode": a_mode,
                         "best": dataclasses.asdict(best), "best_us": best_us,
                         "best_fused_us": fused[0] if fused else None, "best_separate_us": separate[0] if separate else None,
                         "cublas_us": cublas[0] if cublas else None,
                         "tma_us": with_tma[0] if with_tma else None, "table_us": table_us,
                         "top": [{"us": us, "config": dataclasses.asdict(c)} for us, c in timed[:8]],
                         "all": [{"us": us, "config": dataclasses.asdict(c)} for us, c in timed],
                         "floor_us": floors(m, shape.k, shape.n)["floor_us"]})
            print(f"{shape.name:>6} M={m:<4} best {best_us:7.2f} us  {best}", flush=True)
    # the other paths at each best choice: compile them in parallel, then time
    extra = []
    for r in rows:
        shape = next(s for s in shapes if s.name == r["shape"])
        best = GemmConfig(**r["best"])
        extra.append((shape, r["m"], best, 0))
        if best.splits > 1:
            extra.append((shape, r["m"], dataclasses.replace(best, reduce_in_kernel=False), r["a_mode"]))
        extra.append((shape, r["m"], gemm_config(r["m"], shape.n, shape.k), 0))
    precompile(extra, jobs, cuda)
    for shape in shapes:
        weights = make_weights(shape, copies_for(shape.n * shape.k, smoke), timer.device)
        for r in (r for r in rows if r["shape"] == shape.name):
            m, a_mode, best = r["m"], r["a_mode"], GemmConfig(**r["best"])
            x = torch.randn(m, 2 * shape.k if a_mode == 2 else shape.k, device=timer.device).bfloat16()
            codes_expected = reference(x, weights[0], 0)
            r["codes_us"] = time_config(timer, weights, x, best, 0, codes_expected)
            r["second_reduce_launch_us"] = (
                time_config(timer, weights, x, dataclasses.replace(best, reduce_in_kernel=False), a_mode,
                            reference(x, weights[0], a_mode)) if best.splits > 1 else None)
            rule = gemm_config(m, shape.n, shape.k)
            r["rule"], r["rule_codes_us"] = dataclasses.asdict(rule), time_config(timer, weights, x, rule, 0, codes_expected)
    return rows


def compile_tma_plan_sm90(shapes: list[Shape], ms: list[int], warp_specialize: bool) -> int:
    """Each distinct TMA kernel variant that `--tma` would time, compiled for sm90 with
    the Triton installed here (kernels/sm90.py; no GPU): one line each with its shared
    memory, registers and spills. Returns how many failed to compile. What a device call
    would otherwise find out first (2026-12-05: a stalled compile or run cost one)."""
    from kernels.fp8_gemm import SPLIT_LAST_REDUCES, split_mode_for
    from kernels.sm90 import tma_gemm

    variants = {}
    for shape in shapes:
        for m in ms:
            for c in tma_candidates(shape, m, warp_specialize=warp_specialize):
                if not c.tma:
                    continue
                mode = split_mode_for(c, c.splits, cdiv(shape.n, c.block_n) * cdiv(m, c.block_m))  # as launched
                kw = dict(block_m=c.block_m, block_n=c.block_n, swap=c.swap_ab, split_mode=mode,
                          splits=c.splits if mode == SPLIT_LAST_REDUCES else 1, persistent=c.programs_per_sm > 0,
                          ws=c.warp_specialize, warps=c.num_warps, stages=c.num_stages, a_bf16=c.quantize_in_gemm)
                variants.setdefault(tuple(kw.items()), kw)
    import triton

    print(f"{len(variants)} TMA variants, compiled for sm90 with triton {triton.__version__}", flush=True)
    failed = 0
    for kw in variants.values():
        t0 = time.perf_counter()
        try:
            k = tma_gemm(**kw)
            what = (f"ok {time.perf_counter() - t0:4.1f} s, shared {k.shared_bytes} B, TMA copies {k.tma_copies}, "
                    f"registers {k.registers}, spill {k.local_bytes} B"
                    + (", warp-specialized" if k.warp_specialized else ""))
        except Exception as e:  # noqa: BLE001 - the line says which variant fails and why
            failed += 1
            what = f"FAILS: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(f"  {kw}: {what}", flush=True)
    print(f"{failed} of {len(variants)} do not compile")
    return failed


def _f(x) -> float:
    return float("nan") if x is None else x


def report(rows: list[dict]) -> str:
    head = (f"{'shape':>6} {'M':>4} {'floor':>6} {'best':>7} {'fused':>7} {'separate':>8} {'cublas':>7} {'tma':>7} "
            f"{'table':>7} {'codes':>7} {'2 launch':>8} {'rule':>7} {'%floor':>6}  best (block_m, block_n, swap, splits, "
            "warps, stages, quantize in gemm, backend[, tma: programs per SM, warp-specialized])")
    lines = [head]
    for r in rows:
        b = r["best"]
        tma = f", tma {b['programs_per_sm']} {b['warp_specialize']}" if b.get("tma") else ""
        lines.append(
            f"{r['shape']:>6} {r['m']:>4} {r['floor_us']:>6.2f} {r['best_us']:>7.2f} {_f(r['best_fused_us']):>7.2f} "
            f"{_f(r['best_separate_us']):>8.2f} {_f(r.get('cublas_us')):>7.2f} {_f(r.get('tma_us')):>7.2f} "
            f"{_f(r.get('table_us')):>7.2f} {_f(r.get('codes_us')):>7.2f} "
            f"{_f(r.get('second_reduce_launch_us')):>8.2f} {_f(r.get('rule_codes_us')):>7.2f} "
            f"{100 * r['floor_us'] / r['best_us']:>5.0f}%  "
            f"({b['block_m']}, {b['block_n']}, {b['swap_ab']}, {b['splits']}, {b['num_warps']}, {b['num_stages']}, "
            f"{b['quantize_in_gemm']}, {b['backend']}{tma})")
    lines.append("(us per call, bf16 activations in (w2: the SwiGLU input). best: the fastest choice; fused / separate: "
                 "the fastest Triton choice with the activations quantized in the GEMM / in a launch before it; cublas: "
                 "cuBLAS's block-scaled GEMM behind the same quantize launch; tma: the fastest TMA kernel choice (--tma); "
                 "table: kernels/fp8_configs.py's choice (gemm_config) in the same run; codes: the best "
                 "tiles on pre-quantized codes, the GEMM alone; 2 launch: the best with split-K summed in a second "
                 "launch; rule: gemm_config's untuned rule on codes)")
    return "\n".join(lines)


# Decode batches up to this many rows get the same K split per shape: a row's sums (and so
# a greedy stream's tokens) then do not depend on how many streams share its step. Tiles,
# warps and stages do not change a row's sum order; splits do (the partials are summed).
BATCH_INVARIANT_UP_TO = 16


def batch_invariant(rows: list[dict], up_to: int = BATCH_INVARIANT_UP_TO) -> list[dict]:
    """Per shape, the one K split that costs least summed over the M classes <= `up_to`,
    and each of those classes' fastest choice with it (from every timed choice where the
    rows have them, else their top eight); rows of other shapes and larger M unchanged."""
    out = [dict(r) for r in rows]
    for shape in {r["shape"] for r in out}:
        small = [r for r in out if r["shape"] == shape and r["m"] <= up_to]
        timed = [r.get("all") or r["top"] for r in small]
        common = set.intersection(*({t["config"]["splits"] for t in ts} for ts in timed)) if timed else set()
        if not common:
            continue
        cost = {s: sum(min(t["us"] for t in ts if t["config"]["splits"] == s) for ts in timed) for s in common}
        split = min(cost, key=cost.get)
        for r, ts in zip(small, timed):
            best = min((t for t in ts if t["config"]["splits"] == split), key=lambda t: t["us"])
            r["best"], r["best_us"] = best["config"], best["us"]
    return out


def tuned_table(rows: list[dict], keep: dict | None = None) -> str:
    """The TUNED dict of kernels/fp8_configs.py (w1/w3 is no engine shape: the MLP runs w13).
    `keep`: a table whose entries for shapes the rows do not cover stay as they are (a sweep
    of some shapes rewrites only those)."""
    lines = ["TUNED = {"]
    swept = {(r["n"], r["k"]) for r in rows}
    for (n, k, m), entry in (keep or {}).items():
        if (n, k) not in swept:
            lines.append(f"    ({n}, {k}, {m}): {tuple(entry)!r},  # kept from the previous table")
    for r in rows:
        b = r["best"]
        lines.append(f"    ({r['n']}, {r['k']}, {r['m']}): ({b['block_m']}, {b['block_n']}, {b['swap_ab']}, "
                     f"{b['splits']}, {b['num_warps']}, {b['num_stages']}, {b['reduce_in_kernel']}, "
                     f"{b['quantize_in_gemm']}, {b['backend']!r}, {b.get('tma', False)}, {b.get('programs_per_sm', 0)}, "
                     f"{b.get('warp_specialize', False)}),  # {r['shape']}, {r['best_us']:.2f} us")
    lines.append("}")
    return "\n".join(lines)


def write_configs(path: Path, table: str, tuned_on: str) -> None:
    """Replace everything from `TUNED_ON = ` on in a configs module (its docstring stays)
    with this table; the module must still import and give GemmConfig-sized tuples."""
    text = path.read_text()
    head, sep, _ = text.partition("TUNED_ON = ")
    if not sep:
        raise ValueError(f"{path} has no TUNED_ON line")
    body = table.replace("TUNED = {", "TUNED: dict[tuple[int, int, int], tuple] = {  # GemmConfig's fields in order", 1)
    path.write_text(f"{head}TUNED_ON = {tuned_on!r}\n{body}\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.kernel_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default=",".join(map(str, MS)))
    p.add_argument("--shapes", help="comma-separated subset of " + ",".join(s.name for s in SHAPES))
    p.add_argument("--jobs", type=int, default=14, help="compile processes")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--tma", action="store_true",
                   help="time the TMA kernel's choices (kernels/fp8_gemm_tma.py) against the current table's")
    p.add_argument("--no-warp-specialize", action="store_true",
                   help="--tma without the warp-specialized choices (on an H100, triton 3.6, 2026-12-05, the GPU "
                        "tests stalled at the first warp-specialized persistent split case)")
    p.add_argument("--compile-sm90", action="store_true",
                   help="with --tma: only compile its choices for Hopper on this machine (no GPU), time nothing")
    p.add_argument("--out", default="out/kernel_sweep")
    p.add_argument("--write-configs", metavar="PATH",
                   help="rewrite TUNED_ON and TUNED in this copy of kernels/fp8_configs.py with the sweep's "
                        "batch-invariant table (so one GPU call can sweep, adopt and measure)")
    a = p.parse_args(argv)
    if a.compile_sm90:
        if not a.tma:
            p.error("--compile-sm90 compiles the TMA kernel's choices: give --tma")
        shapes = [s for s in SHAPES if not a.shapes or s.name in a.shapes.split(",")]
        return 1 if compile_tma_plan_sm90(shapes, [int(x) for x in a.m.split(",")], not a.no_warp_specialize) else 0
    device = bench_device(a.smoke, "kernel_sweep")
    if device is None:
        return 2
    import triton

    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    if a.shapes:
        shapes = [s for s in shapes if s.name in a.shapes.split(",")]
    ms = [1, 3] if a.smoke else [int(x) for x in a.m.split(",")]
    if a.write_configs and sorted(ms) != MS:
        # a partial table would send the M classes left out to the untuned rule, and the
        # batch-invariant split must be chosen over every class up to 16 at once
        p.error(f"--write-configs needs every M class ({','.join(map(str, MS))})")
    t0 = time.perf_counter()
    rows = sweep(Timer(device, a.replays), shapes, ms, a.smoke, a.jobs, a.tma, not a.no_warp_specialize)
    print(report(rows))
    print(f"TUNED with one K split per shape up to M = {BATCH_INVARIANT_UP_TO} (batch-invariant decode):")
    from kernels.fp8_configs import TUNED

    table = tuned_table(batch_invariant(rows), keep=TUNED)
    print(table)
    if a.write_configs and not a.smoke:
        tuned_on = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}"
        write_configs(Path(a.write_configs), table, f"{tuned_on}, {time.strftime('%Y-%m-%d')} (latency_bench.kernel_sweep)")
        print(f"wrote the table into {a.write_configs}")
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
               "torch": torch.__version__, "triton": triton.__version__, "smoke": a.smoke,
               "seconds": time.perf_counter() - t0, "rows": rows}
    write_json(Path(a.out) / "kernel_sweep.json", results)
    print(f"wrote {Path(a.out) / 'kernel_sweep.json'} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
