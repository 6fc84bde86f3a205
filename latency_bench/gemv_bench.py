"""`python -m latency_bench.gemv_bench`: the small-batch GEMV (kernels/gemv.py) against the
GEMMs the engine would otherwise run, same run.

Per S2-Pro linear shape (the fast transformer's layers have the same widths) and M = 1, 2, 4:
- bf16 weights: the GEMV against cuBLAS (`F.linear`); for w2 as the MLP runs it, from the
  fused gate/up output: the GEMV with the SwiGLU inside against kernels/swiglu.py + cuBLAS.
- e4m3 block-scaled weights: the GEMV (activations quantized in every program) against
  the block-scaled FP8 GEMM (kernels/fp8_gemm.py `fp8_linear`, the FP8 path's kernel), the
  GEMV on activations quantized once by a launch of their own (kernels/fp8_quant.py
  quantize_act / swiglu_quant; "prequant", two launches) and on unquantized ones (W8A16).
Then the whole MLP block at M = 1 (w13, then w2 with the SwiGLU inside; issue 7's target
<= 26 us), both FP8 ways. `--sweep` first times every launch choice at M = 1 (`--sweep-m 1,4`: summed over those),
keeps per shape the fastest, and prints the `TUNED` table of kernels/gemv_configs.py
(`--write-configs` writes it there); without it the table's choices run.

    python -m latency_bench.gemv_bench --sweep --out out/gemv     # H200: compile + time, ~3 min
    python -m latency_bench.gemv_bench --out out/gemv             # the tuned choices only
    python -m latency_bench.gemv_bench --smoke                    # CPU: checks the script

Timing is kernel_bench's: one CUDA graph over enough weight copies to stream each call's
weights from HBM, back to back, as the decode step's layers do. Every candidate's output
is checked against gemv_reference before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import (HBM_BYTES_PER_S, SHAPES, SMOKE_SHAPES, Shape, Timer, Weights, bench_device,
                                        copies_for, make_weights)

SWEEP_MS = [1, 2, 4]
WRONG_RESULT_TOL = 2e-2  # bf16 rounding is ~4e-3 relative; a wrong tile or scale is > 0.3


def engine_shapes(smoke: bool) -> list[Shape]:
    """The shapes the engine runs: w1/w3 only stacked (w13)."""
    return SMOKE_SHAPES if smoke else [s for s in SHAPES if s.name != "w1/w3"]


def is_down(shape: Shape) -> bool:
    return shape.name == "w2"


def candidates(smoke: bool):
    """Launch choices to time (one per weight shape serves every M: kernels/gemv.py)."""
    from kernels.gemv import GemvConfig

    if smoke:
        return [GemvConfig(8, 128, 4, 1), GemvConfig(4, 256, 4, 2)]
    out = []
    for bn in (2, 4, 8, 16, 32):
        for bk in (256, 512, 1024):
            for warps in (2, 4, 8):
                regs = bn * bk // (32 * warps)  # fp32 accumulator per thread
                if regs > 128 or regs < 8:
                    continue
                for stages in (1, 2):
                    out.append(GemvConfig(bn, bk, warps, stages))
    return out


def make_x(shape: Shape, m: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(100 + m)
    return torch.randn(m, 2 * shape.k if is_down(shape) else shape.k, generator=g, device=device).bfloat16()


def gemv_calls(weights: list[Weights], x: torch.Tensor, fp8: bool, swiglu: bool, cfg, quantize_x=None) -> list:
    from kernels.gemv import gemv

    if fp8:
        return [lambda w=w: gemv(x, w.wq, w.ws, swiglu=swiglu, quantize_x=quantize_x, config=cfg) for w in weights]
    return [lambda w=w: gemv(x, w.wb, swiglu=swiglu, config=cfg) for w in weights]


def preq_calls(weights: list[Weights], x: torch.Tensor, swiglu: bool) -> list:
    """e4m3 weights, x quantized by its own launch first (kernels/fp8_quant.py), then the
    GEMV on the codes: two launches a call."""
    from kernels.fp8_quant import quantize_act, swiglu_quant
    from kernels.gemv import gemv

    k = x.shape[1] // 2 if swiglu else x.shape[1]

    def call(w: Weights) -> torch.Tensor:
        codes, scales = swiglu_quant(x[:, :k], x[:, k:]) if swiglu else quantize_act(x)
        return gemv(codes, w.wq, w.ws, x_scale=scales, out_dtype=x.dtype)

    return [lambda w=w: call(w) for w in weights]


def reference(x: torch.Tensor, w: Weights, fp8: bool, swiglu: bool, quantize_x=None) -> torch.Tensor:
    from kernels.gemv import gemv_reference

    if fp8:
        return gemv_reference(x, w.wq, w.ws, swiglu=swiglu, quantize_x=quantize_x).float()
    return gemv_reference(x, w.wb, swiglu=swiglu).float()


def checked_time(timer: Timer, fns: list, expected: torch.Tensor) -> float:
    """us per call, NaN (said why) when the candidate fails or is wrong."""
    try:
        out = fns[0]().float()
        err = float((out - expected).norm() / expected.norm().clamp_min(1e-30))
        if not err < WRONG_RESULT_TOL:
            raise ValueError(f"wrong result: relative error {err:.3g}")
        return timer._time(fns)
    except Exception as e:  # noqa: BLE001 - a variant that does not fit (registers) is a NaN row
        print(f"    ({type(e).__name__}: {str(e).splitlines()[0][:100]})", file=sys.stderr, flush=True)
        return float("nan")


def _compile_jobs(args: tuple) -> int:
    """Compile (and run once) each (shape, fp8, cfg) on the GPU; returns the count done."""
    jobs, ms = args
    device = torch.device("cuda")
    done = 0
    for shape, fp8, cfg in jobs:
        w = make_weights(shape, 1, device)
        try:
            for m in ms:
                gemv_calls(w, make_x(shape, m, device), fp8, is_down(shape), cfg)[0]()
            done += 1
        except Exception:  # noqa: BLE001 - reported when timed
            pass
    torch.cuda.synchronize()
    return done


def precompile(jobs: list, ms: list[int], workers: int) -> None:
    """Triton's on-disk cache then serves the timing process (a sweep compiles hundreds of
    variants; one after another they would not fit a device call)."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    chunks = [jobs[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_compile_jobs, [(c, ms) for c in chunks if c]))
    print(f"compiled {done}/{len(jobs)} variants in {time.perf_counter() - t0:.0f} s ({workers} processes)", flush=True)


def sweep(timer: Timer, shapes: list[Shape], ms: list[int], kinds: list[bool], smoke: bool, jobs: int) -> list[dict]:
    """Every launch choice at each M of `ms`; the best is the one with the least time summed
    over them (one choice per weight shape serves every M, so that a row's sums do not
    depend on its batch)."""
    device = timer.device
    plan = [(s, fp8, c) for s in shapes for fp8 in kinds for c in candidates(smoke)
            if not (fp8 and (128 % c.block_n or c.block_k % 128))]
    if device.type == "cuda" and jobs > 1:
        precompile(plan, ms, jobs)
    rows = []
    for shape in shapes:
        weights = make_weights(shape, copies_for(2 * shape.n * shape.k, smoke), device)
        xs = {m: make_x(shape, m, device) for m in ms}
        for fp8 in kinds:
            expected = {m: reference(x, weights[0], fp8, is_down(shape)) for m, x in xs.items()}
            times = []
            for s, f, cfg in plan:
                if s == shape and f == fp8:
                    per_m = {m: checked_time(timer, gemv_calls(weights, x, fp8, is_down(shape), cfg), expected[m])
                             for m, x in xs.items()}
                    times.append((sum(per_m.values()), per_m, cfg))
            ok = [t for t in times if t[0] == t[0]]
            best_sum, best_per_m, best = min(ok, key=lambda t: t[0]) if ok else (float("nan"), {}, None)
            rows.append({"shape": shape.name, "n": shape.n, "k": shape.k, "ms": ms, "kind": "fp8" if fp8 else "bf16",
                         "best_us": best_per_m, "best": dataclasses.asdict(best) if best else None,
                         "top5": [(per_m, dataclasses.asdict(c)) for _, per_m, c in sorted(ok, key=lambda t: t[0])[:5]]})
            said = ", ".join(f"M={m} {t:.2f}" for m, t in best_per_m.items())
            print(f"  {shape.name:5} {rows[-1]['kind']:4}: best {said} us {best}", flush=True)
        del weights
    return rows


def tuned_table(rows: list[dict]) -> str:
    lines = ["TUNED: dict[tuple[int, int, str], GemvConfig] = {"]
    for r in rows:
        if r["best"]:
            b = r["best"]
            lines.append(f"    ({r['n']}, {r['k']}, {r['kind']!r}): GemvConfig({b['block_n']}, {b['block_k']}, "
                         f"{b['num_warps']}, {b['num_stages']}),  # {r['shape']}, "
                         + ", ".join(f"M={m} {t:.2f}" for m, t in r["best_us"].items()) + " us")
    lines.append("}")
    return "\n".join(lines)


def compare(timer: Timer, shapes: list[Shape], ms: list[int], smoke: bool) -> list[dict]:
    """The tuned GEMV against the engine's GEMM at each shape, M and weight kind."""
    from kernels.fp8_gemm import fp8_linear
    from kernels.swiglu import swiglu as swiglu_kernel

    device = timer.device
    rows = []
    for shape in shapes:
        weights = make_weights(shape, copies_for(2 * shape.n * shape.k, smoke), device)
        down = is_down(shape)
        for m in ms:
            x = make_x(shape, m, device)
            if down:
                cublas = [lambda w=w: F.linear(swiglu_kernel(x), w.wb) for w in weights]
            else:
                cublas = [lambda w=w: F.linear(x, w.wb) for w in weights]
            fp8_gemm = [lambda w=w: fp8_linear(x, w.wq, w.ws, x.dtype, swiglu=down) for w in weights]
            us = {
                "gemv_bf16": checked_time(timer, gemv_calls(weights, x, False, down, None), reference(x, weights[0], False, down)),
                "cublas_bf16": timer.us_per_call(cublas),
                "gemv_fp8": checked_time(timer, gemv_calls(weights, x, True, down, None), reference(x, weights[0], True, down)),
                "gemv_fp8_w8a16": checked_time(timer, gemv_calls(weights, x, True, down, None, quantize_x=False),
                                               reference(x, weights[0], True, down, quantize_x=False)),
                "gemv_fp8_prequant": checked_time(timer, preq_calls(weights, x, down), reference(x, weights[0], True, down)),
                "fp8_gemm": timer.us_per_call(fp8_gemm),
            }
            bf16_bytes, fp8_bytes = 2 * shape.n * shape.k, shape.n * shape.k + 4 * -(-shape.n // 128) * -(-shape.k // 128)
            rows.append({"shape": shape.name + (" (swiglu in)" if down else ""), "n": shape.n, "k": shape.k, "m": m, "us": us,
                         "bf16_floor_us": 1e6 * bf16_bytes / HBM_BYTES_PER_S, "fp8_floor_us": 1e6 * fp8_bytes / HBM_BYTES_PER_S,
                         "bf16_speedup": us["cublas_bf16"] / us["gemv_bf16"], "fp8_speedup": us["fp8_gemm"] / us["gemv_fp8"]})
        del weights
    return rows


def compare_table(rows: list[dict]) -> str:
    head = (f"{'shape':18} {'M':>2} | {'cuBLAS bf16':>11} {'gemv bf16':>9} {'x':>5} {'floor':>6} | "
            f"{'fp8 GEMM':>8} {'gemv fp8':>8} {'x':>5} {'prequant':>8} {'W8A16':>6} {'floor':>6}   (us)")
    lines = [head]
    for r in rows:
        u = r["us"]
        lines.append(f"{r['shape']:18} {r['m']:>2} | {u['cublas_bf16']:>11.2f} {u['gemv_bf16']:>9.2f} {r['bf16_speedup']:>5.2f} "
                     f"{r['bf16_floor_us']:>6.2f} | {u['fp8_gemm']:>8.2f} {u['gemv_fp8']:>8.2f} {r['fp8_speedup']:>5.2f} "
                     f"{u['gemv_fp8_prequant']:>8.2f} {u['gemv_fp8_w8a16']:>6.2f} {r['fp8_floor_us']:>6.2f}")
    return "\n".join(lines)


def bench_mlp(timer: Timer, dim: int, hidden: int, smoke: bool) -> dict:
    """The MLP block at M = 1: w13 (2H x D), then w2 (D x H) from its output, SwiGLU inside."""
    from kernels.fp8_quant import quantize_act, swiglu_quant
    from kernels.gemv import gemv
    from kernels.swiglu import swiglu as swiglu_kernel

    device = timer.device
    w13s = make_weights(Shape("w13", dim, 2 * hidden), copies_for(4 * hidden * dim, smoke), device)
    w2s = make_weights(Shape("w2", hidden, dim), len(w13s), device)
    x = torch.randn(1, dim, device=device).bfloat16()

    def fp8_block(a, b):
        return gemv(gemv(x, a.wq, a.ws), b.wq, b.ws, swiglu=True)

    def fp8_prequant_block(a, b):  # four launches: quantize, w13, SwiGLU + quantize, w2
        codes, scales = quantize_act(x)
        gate_up = gemv(codes, a.wq, a.ws, x_scale=scales)
        codes, scales = swiglu_quant(gate_up[:, :hidden], gate_up[:, hidden:])
        return gemv(codes, b.wq, b.ws, x_scale=scales)

    def bf16_block(a, b):
        return gemv(gemv(x, a.wb), b.wb, swiglu=True)

    def cublas_block(a, b):
        return F.linear(swiglu_kernel(F.linear(x, a.wb)), b.wb)

    pairs = list(zip(w13s, w2s))
    us = {name: timer.us_per_call([lambda a=a, b=b: f(a, b) for a, b in pairs])
          for name, f in (("gemv_fp8", fp8_block), ("gemv_fp8_prequant", fp8_prequant_block), ("gemv_bf16", bf16_block),
                          ("cublas_bf16", cublas_block))}
    fp8_bytes = 3 * hidden * dim + 4 * 3 * -(-hidden // 128) * -(-dim // 128)
    return {"dim": dim, "hidden": hidden, "m": 1, "us": us, "fp8_floor_us": 1e6 * fp8_bytes / HBM_BYTES_PER_S,
            "bf16_floor_us": 1e6 * 6 * hidden * dim / HBM_BYTES_PER_S, "target_us": 26.0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.gemv_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="store_true", help="time every launch choice first; print the TUNED table")
    p.add_argument("--m", default=",".join(map(str, SWEEP_MS)), help="batch sizes of the comparison")
    p.add_argument("--sweep-m", default="1", help="batch sizes the sweep sums its times over (the engine "
                   "routes single rows: engine/linear.py)")
    p.add_argument("--kinds", default="bf16,fp8")
    p.add_argument("--jobs", type=int, default=14, help="compile processes for --sweep")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--write-configs", action="store_true", help="--sweep: write the table into kernels/gemv_configs.py")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="out/gemv_bench")
    a = p.parse_args(argv)
    device = bench_device(a.smoke, "gemv_bench")
    if device is None:
        return 2
    timer = Timer(device, a.replays)
    shapes = engine_shapes(a.smoke)
    ms = [1, 3] if a.smoke else [int(v) for v in a.m.split(",")]
    kinds = [k == "fp8" for k in a.kinds.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
                     "torch": torch.__version__, "smoke": a.smoke}
    if a.sweep:
        rows = sweep(timer, shapes, [int(v) for v in a.sweep_m.split(",")], kinds, a.smoke, a.jobs)
        results["sweep"] = rows
        table = tuned_table(rows)
        print(table)
        if a.write_configs:
            from kernels import gemv_configs

            path = Path(gemv_configs.__file__)
            head = path.read_text().partition("TUNED_ON = ")[0]
            path.write_text(f"{head}TUNED_ON = {results['device'] + ', torch ' + torch.__version__!r}\n{table}\n")
            print(f"wrote {path}")
            import importlib

            import kernels.gemv as tuned_module

            importlib.reload(gemv_configs)
            tuned_module.TUNED = gemv_configs.TUNED
    rows = compare(timer, shapes, ms, a.smoke)
    results["rows"] = rows
    print(compare_table(rows))
    mlp = results["mlp"] = bench_mlp(timer, *((256, 384) if a.smoke else (2560, 9728)), a.smoke)
    u = mlp["us"]
    print(f"MLP {mlp['dim']} -> 2x{mlp['hidden']} -> {mlp['dim']}, M=1: gemv fp8 {u['gemv_fp8']:.1f} us, pre-quantized "
          f"{u['gemv_fp8_prequant']:.1f} us (target <= 26, floor {mlp['fp8_floor_us']:.1f}), gemv bf16 {u['gemv_bf16']:.1f} us, cuBLAS bf16 {u['cublas_bf16']:.1f} us "
          f"(bf16 floor {mlp['bf16_floor_us']:.1f})")
    write_json(Path(a.out) / "gemv_bench.json", results)
    print(f"wrote {Path(a.out) / 'gemv_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
