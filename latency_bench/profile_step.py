"""`python -m latency_bench.profile_step`: where one decode step's GPU time goes.

Runs the frame step eagerly (graphs hide their kernels from the profiler) under
torch.profiler and prints the kernels grouped by name, sorted by total GPU time, with
their counts per step; the sum is the step's GPU time (launch gaps aside).

    python -m latency_bench.profile_step --model s2-pro --device cuda --batch 1,64
    python -m latency_bench.profile_step --batch 54 --context 800 --quant fp8   # the c=64 load's step
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine.bundle import QUANT_MODES, load_bundle
from engine.runner import Runner
from latency_bench.engine_bench import prepare_batch
from latency_bench.jsonfile import write_json


def profile_batch(runner: Runner, batch: int, context: int, steps: int) -> list[dict]:
    slots = prepare_batch(runner, batch, context)
    for _ in range(3):
        runner.read(runner.launch(slots, context + 16))
    torch.cuda.synchronize()
    return gpu_kernels(lambda: runner.read(runner.launch(slots, context + 16)), steps, "step")


def gpu_kernels(fn, calls: int, per: str) -> list[dict]:
    """fn() `calls` times under torch.profiler: its CUDA kernels grouped by name, with
    GPU time (`us_per_<per>`) and count per call, slowest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = totals[e.name[:90]]
            t[0] += e.device_time_total
            t[1] += 1
    rows = [{"kernel": k, f"us_per_{per}": v[0] / calls, f"count_per_{per}": v[1] / calls} for k, v in totals.items()]
    return sorted(rows, key=lambda r: -r[f"us_per_{per}"])


def print_kernels(rows: list[dict], per: str, top: int, heading: str) -> tuple[float, float]:
    """Print gpu_kernels' rows (the `top` slowest) under `heading`; returns the total GPU
    time (us) and kernel count per `per`."""
    total = sum(r[f"us_per_{per}"] for r in rows)
    kernels = sum(r[f"count_per_{per}"] for r in rows)
    print(f"\n{heading}: {total / 1000:.2f} ms of GPU time per {per} in {kernels:.0f} kernels")
    for r in rows[:top]:
        print(f"  {r[f'us_per_{per}']:9.1f} us  x{r[f'count_per_{per}']:6.1f}  {r['kernel']}")
    return total, kernels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.profile_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="s2-pro")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", default="1,64")
    p.add_argument("--context", type=int, default=400)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--quant", default="none", choices=QUANT_MODES, help="the transformers' weights (engine/quant.py)")
    p.add_argument("--out", default="out/profile")
    a = p.parse_args(argv)
    bundle = load_bundle(a.model, a.device, quant=a.quant)
    batches = [int(x) for x in a.batch.split(",")]
    runner = Runner(bundle, max(batches), 1536, cuda_graphs=False)
    result = {}
    for b in batches:
        rows = profile_batch(runner, b, a.context, a.steps)
        total, kernels = print_kernels(rows, "step", a.top, f"batch {b}")
        result[b] = {"quant": a.quant, "context": a.context, "gpu_us_per_step": total, "kernels_per_step": kernels, "top": rows[: a.top]}
    write_json(Path(a.out) / "profile.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
