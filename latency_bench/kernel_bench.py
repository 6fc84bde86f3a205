"""`python -m latency_bench.kernel_bench`: the FP8 decode kernels against cuBLAS, same run.

Per S2-Pro linear shape (the fast transformer's layers have the same widths) and batch
M = 1..128: the block-scaled FP8 GEMM (kernels/fp8_gemm.py) on pre-quantized activations,
the same on bf16 activations as FP8Linear runs it (`fp8_linear`), cuBLAS's GEMM with the
same block scales, cuBLAS FP8 (`torch._scaled_mm`, per-tensor scales, pre-quantized) and
cuBLAS bf16 (`matmul`); then the whole MLP block at M = 1 (`--mlp-m` for more)
(2560 -> 2 x 9728 -> 2560): the engine's FP8 block, cuBLAS FP8 and bf16. Prints a table,
writes <out>/kernel_bench.json.

    python -m latency_bench.kernel_bench --out out/kernel_bench                  # the table (H200)
    python -m latency_bench.kernel_bench --smoke                                  # CPU: checks the script

Timing: every candidate runs inside one CUDA graph over enough distinct weight copies to
exceed 4x the L2 cache, so each call streams its weights from HBM, back to back, as the
36 slow layers do in the engine's captured decode step; time per call = graph time /
calls. The floors assume 4.3 TB/s and 990 TFLOP/s dense fp8 (H200). Absolute numbers
count only from the GPU; `--smoke` times the Triton interpreter and means nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from latency_bench.jsonfile import write_json

HBM_BYTES_PER_S = 4.3e12  # H200 HBM3e copy bandwidth
FP8_FLOPS = 990e12  # H200 dense e4m3 tensor-core peak
L2_BYTES = 50 * 2**20
GROUP = 128


@dataclass(frozen=True)
class Shape:
    name: str
    k: int  # in features
    n: int  # out features
    in_geomean: bool = True


SHAPES = [
    Shape("wqkv", 2560, 6144),
    Shape("wo", 4096, 2560),
    Shape("w1/w3", 2560, 9728),
    Shape("w2", 9728, 2560),
    Shape("w13", 2560, 19456, in_geomean=False),  # w1 and w3 stacked: what the FP8 MLP runs
]
SMOKE_SHAPES = [Shape("wqkv", 256, 384), Shape("w2", 300, 200)]
MS = [1, 2, 4, 8, 16, 32, 64, 128]
MLP = (2560, 9728)  # Qwen3-4B / S2-Pro: dim, hidden
SMOKE_MLP = (256, 384)  # hidden a multiple of 128 (the FP8 block's weight groups)


def floors(m: int, k: int, n: int) -> dict:
    """Bytes and FLOPs of one block-scaled FP8 GEMM and the time each alone would take."""
    kb, nb = -(-k // GROUP), -(-n // GROUP)
    nbytes = n * k + 4 * nb * kb + m * k + 4 * m * kb + 2 * m * n
    flops = 2 * m * n * k
    return {"bytes": nbytes, "flops": flops, "bytes_us": 1e6 * nbytes / HBM_BYTES_PER_S,
            "flops_us": 1e6 * flops / FP8_FLOPS, "floor_us": 1e6 * max(nbytes / HBM_BYTES_PER_S, flops / FP8_FLOPS)}


# --- timing -----------------------------------------------------------------------------

class Timer:
    """Microseconds per call of a list of same-shaped calls (one per weight copy)."""

    def __init__(self, device: torch.device, replays: int = 20) -> None:
        self.device, self.replays = device, replays

    def us_per_call(self, calls: list[Callable[[], object]]) -> float:
        """NaN when the calls fail (a baseline that refuses a shape is reported, not fatal)."""
        try:
            return self._time(calls)
        except (RuntimeError, ValueError) as e:
            print(f"  (skipped: {str(e).splitlines()[0][:120]})", file=sys.stderr)
            return float("nan")

    def _time(self, calls: list[Callable[[], object]]) -> float:
        for c in calls:  # compile and warm the allocator outside any capture
            c()
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            for c in calls:
                c()
            return 1e6 * (time.perf_counter() - t0) / len(calls)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.replays):
            graph.replay()
        end.record()
        end.synchronize()
        del graph
        return 1e3 * start.elapsed_time(end) / (self.replays * len(calls))


def copies_for(weight_bytes: int, smoke: bool) -> int:
    return 2 if smoke else max(2, min(64, math.ceil(4 * L2_BYTES / weight_bytes)))


# --- one linear shape -------------------------------------------------------------------

@dataclass
class Weights:
    wq: torch.Tensor  # [N, K] e4m3 (block-scaled codes; cuBLAS reads the same bytes per-tensor)
    ws: torch.Tensor  # [NB, KB] fp32
    wb: torch.Tensor  # [N, K] bf16


def make_weights(shape: Shape, copies: int, device: torch.device) -> list[Weights]:
    from kernels.fp8_quant import quantize_weight

    out = []
    for i in range(copies):
        g = torch.Generator(device=device).manual_seed(i)
        wb = (0.02 * torch.randn(shape.n, shape.k, generator=g, device=device)).bfloat16()
        out.append(Weights(*quantize_weight(wb), wb))
    return out


def bench_shape(timer: Timer, shape: Shape, ms: list[int], smoke: bool) -> list[dict]:
    from kernels.fp8_gemm import cublas_block_gemm, fp8_gemm, fp8_linear
    from kernels.fp8_quant import quantize_act

    dev = timer.device
    weights = make_weights(shape, copies_for(shape.n * shape.k, smoke), dev)
    one = torch.ones((), device=dev)
    rows = []
    for m in ms:
        x = torch.randn(m, shape.k, device=dev).bfloat16()
        a, a_s = quantize_act(x)
        a_s_m_major = quantize_act(x, m_major_scales=True)[1]
        a_pt = x.to(torch.float8_e4m3fn)  # per-tensor, scale 1 (values do not change the time)
        t = {
            "fp8": timer.us_per_call([lambda w=w: fp8_gemm(a, a_s, w.wq, w.ws) for w in weights]),
            "fp8+quant": timer.us_per_call([lambda w=w: fp8_linear(x, w.wq, w.ws) for w in weights]),
            "scaled_mm": timer.us_per_call([
                lambda w=w: torch._scaled_mm(a_pt, w.wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                for w in weights]),
            # the same block-scaled function through cuBLAS (NaN where torch's cuBLAS lacks it)
            "cublas_block": timer.us_per_call([
                lambda w=w: cublas_block_gemm(a, a_s_m_major, w.wq, w.ws, torch.bfloat16) for w in weights]),
            "bf16": timer.us_per_call([lambda w=w: x @ w.wb.t() for w in weights]),
        }
        rows.append({"shape": shape.name, "k": shape.k, "n": shape.n, "m": m, "in_geomean": shape.in_geomean,
                     "us": t, "vs_scaled_mm": t["scaled_mm"] / t["fp8"], "vs_bf16": t["bf16"] / t["fp8"],
                     "vs_cublas_block": t["cublas_block"] / t["fp8"],
                     **floors(m, shape.k, shape.n)})
    return rows


# --- the MLP block ----------------------------------------------------------------------

def bench_mlp(timer: Timer, dims: tuple[int, int], m: int, smoke: bool) -> dict:
    from engine.kernel_plan import KernelPlan
    from engine.layers import FeedForward
    from engine.quant import FP8FeedForward
    from kernels import pdl

    FP8, FP8_PDL = KernelPlan(fp8=True), KernelPlan(fp8=True, pdl=True)

    dev, (d, h) = timer.device, dims
    copies = copies_for(3 * d * h, smoke)
    bf16, fp8, scaled = [], [], []
    for _ in range(copies):
        with torch.device(dev):
            ff = FeedForward(d, h).to(torch.bfloat16)
        bf16.append(ff)
        fp8.append(FP8FeedForward.from_feed_forward(ff))
        w13 = torch.cat([ff.w1.weight, ff.w3.weight]).to(torch.float8_e4m3fn)
        scaled.append((w13, ff.w2.weight.to(torch.float8_e4m3fn)))
    x = torch.randn(m, d, device=dev).bfloat16()
    one = torch.ones((), device=dev)

    def cublas_fp8(w13, w2):
        # per-tensor static scales (scale 1: no amax pass, the cheapest cuBLAS FP8 MLP)
        gu = torch._scaled_mm(x.to(torch.float8_e4m3fn), w13.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        hq = (F.silu(gu[:, :h]) * gu[:, h:]).to(torch.float8_e4m3fn)
        return torch._scaled_mm(hq, w2.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    with torch.inference_mode():
        t = {
            "fp8": timer.us_per_call([lambda f=f: f(x, FP8) for f in fp8]),
            "scaled_mm": timer.us_per_call([lambda w=w: cublas_fp8(*w) for w in scaled]),
            "bf16": timer.us_per_call([lambda f=f: f(x) for f in bf16]),
        }
        if m == 1 and pdl.supported(dev) is None:  # as the engine's single-stream graph launches it
            t["fp8_pdl"] = timer.us_per_call([lambda f=f: f(x, FP8_PDL) for f in fp8])
    fl = floors(m, d, 2 * h)
    fl2 = floors(m, h, d)
    floor_us = fl["floor_us"] + fl2["floor_us"]
    return {"dim": d, "hidden": h, "m": m, "us": t, "floor_us": floor_us, "target_us": 26.0,
            "vs_scaled_mm": t["scaled_mm"] / t["fp8"], "vs_bf16": t["bf16"] / t["fp8"]}


# --- report -----------------------------------------------------------------------------

def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(rows: list[dict]) -> str:
    head = (f"{'shape':>6} {'K->N':>11} {'M':>4} {'floor':>7} {'fp8':>7} {'fp8+q':>7} {'scaled_mm':>9} "
            f"{'cublas blk':>10} {'bf16':>7} {'x smm':>6} {'x bf16':>6} {'% floor':>7}")
    lines = [head]
    for r in rows:
        t = r["us"]
        lines.append(
            f"{r['shape']:>6} {str(r['k']) + '->' + str(r['n']):>11} {r['m']:>4} {r['floor_us']:>7.2f} {t['fp8']:>7.2f} "
            f"{t['fp8+quant']:>7.2f} {t['scaled_mm']:>9.2f} {t['cublas_block']:>10.2f} {t['bf16']:>7.2f} "
            f"{r['vs_scaled_mm']:>6.2f} "
            f"{r['vs_bf16']:>6.2f} {100 * r['floor_us'] / t['fp8']:>6.0f}%")
    lines.append("(us per call; fp8: on pre-quantized codes; fp8+q: bf16 in, as FP8Linear runs it (the measured "
                 "choice); scaled_mm: cuBLAS FP8, per-tensor scales; cublas blk: cuBLAS with the same block scales; "
                 "x smm / x bf16 = baseline time / fp8 time; % floor = floor / fp8 time)")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latency_bench.kernel_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default=",".join(map(str, MS)), help="batch rows, comma-separated")
    p.add_argument("--shapes", help="comma-separated subset of " + ",".join(s.name for s in SHAPES))
    p.add_argument("--no-mlp", action="store_true")
    p.add_argument("--mlp-m", default="1", help="rows of the MLP block's timings, comma-separated")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="CPU + Triton interpreter, small shapes: checks the script")
    p.add_argument("--out", default="out/kernel_bench")
    return p.parse_args(argv)


def bench_device(smoke: bool, name: str) -> torch.device | None:
    """The GPU (--smoke there: small shapes, a check of the script), else with --smoke the
    CPU under the Triton interpreter (set before anything imports triton); None (after
    saying why) when neither applies. A machine with a GPU never interprets: once triton
    is imported, setting TRITON_INTERPRET changes nothing, and compiled kernels cannot
    read CPU tensors."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not smoke:
        print(f"{name} needs a CUDA device (or --smoke for a CPU check of the script)", file=sys.stderr)
        return None
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device("cpu")


def main(argv=None) -> int:
    a = parse_args(argv)
    device = bench_device(a.smoke, "kernel_bench")
    if device is None:
        return 2
    cuda = device.type == "cuda"
    import triton

    timer = Timer(device, a.replays)
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    if a.shapes:
        shapes = [s for s in shapes if s.name in a.shapes.split(",")]
    ms = [1, 3] if a.smoke else [int(x) for x in a.m.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(device) if cuda else "cpu (interpreter)",
                     "torch": torch.__version__, "triton": triton.__version__, "smoke": a.smoke,
                     "floors": {"hbm_bytes_per_s": HBM_BYTES_PER_S, "fp8_flops": FP8_FLOPS}}
    out = Path(a.out)
    rows = [r for s in shapes for r in bench_shape(timer, s, ms, a.smoke)]
    results["rows"] = rows
    results["geomean_vs_scaled_mm"] = geomean([r["vs_scaled_mm"] for r in rows if r["in_geomean"]])
    results["geomean_vs_bf16"] = geomean([r["vs_bf16"] for r in rows if r["in_geomean"]])
    results["geomean_vs_cublas_block"] = geomean([r["vs_cublas_block"] for r in rows
                                                  if r["in_geomean"] and math.isfinite(r["vs_cublas_block"])])
    print(f"block-scaled FP8 GEMM on {results['device']} (torch {torch.__version__}, triton {triton.__version__})")
    print(table(rows))
    print(f"geomean vs torch._scaled_mm (wqkv, wo, w1/w3, w2; M = {','.join(map(str, ms))}): "
          f"{results['geomean_vs_scaled_mm']:.2f}x (target >= 1.3x); vs bf16: {results['geomean_vs_bf16']:.2f}x; "
          f"vs cuBLAS with the same block scales: {results['geomean_vs_cublas_block']:.2f}x")
    if not a.no_mlp:
        results["mlp_by_m"] = []
        for m in [1] if a.smoke else [int(v) for v in a.mlp_m.split(",")]:
            mlp = bench_mlp(timer, SMOKE_MLP if a.smoke else MLP, m, a.smoke)
            results["mlp_by_m"].append(mlp)
            if m == 1:
                results["mlp"] = mlp
            t = mlp["us"]

            def pdl(key):
                return f", with PDL {t[key]:.1f} us" if key in t else ""
            target = " (target <= 26" if m == 1 else " ("
            print(f"MLP {mlp['dim']} -> 2x{mlp['hidden']} -> {mlp['dim']}, M={m}: fp8 {t['fp8']:.1f} us{pdl('fp8_pdl')}"
                  f"{target}{', ' if m == 1 else ''}floor {mlp['floor_us']:.1f}); "
                  f"cuBLAS FP8 {t['scaled_mm']:.1f} us, bf16 {t['bf16']:.1f} us")
    write_json(out / "kernel_bench.json", results)
    print(f"wrote {out / 'kernel_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
