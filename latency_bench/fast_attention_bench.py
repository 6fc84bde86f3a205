"""`python -m latency_bench.fast_attention_bench`: the fast transformer's attention kernel
(kernels/fast_attention.py) alone, against the PyTorch path it replaced (flash attention
through scaled_dot_product_attention), at the decode shape.

A decode step at the S2-Pro shape calls it 39-40 times (4 fast layers x 9-10 codebook
steps); in the step profile at batch 54 it took 8.4 us a call, 0.33 ms of an 8.5 ms FP8
step on an H100 (2026-12-06; RESULTS.md, "The FP8 GEMM table re-tuned with the TMA
kernel"), for a few KiB of keys and values a program: its time is load latency and launch,
not bytes.
This times each (batch, codebook step, warps) inside a CUDA graph of back-to-back calls
(the fast KV cache is written just before in a real step, so it is read from L2 here as
there) and reports us a call and the ratio to PyTorch's.

    python -m latency_bench.fast_attention_bench --batch 1,16,54,64
    python -m latency_bench.fast_attention_bench --module kernels.fast_attention_old   # another version of the kernel
    python -m latency_bench.fast_attention_bench --smoke    # a CPU check of the script (interpreter)
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import Timer, bench_device


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.fast_attention_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,16,54,64")
    p.add_argument("--steps", default="0,9", help="codebook steps (the row attends to positions 0..step)")
    p.add_argument("--warps", default="1,2,4")
    p.add_argument("--calls", type=int, default=40, help="calls per graph (one step's worth)")
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--module", default="kernels.fast_attention", help="the module whose fast_attention is timed")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="out/fast_attention_bench")
    a = p.parse_args(argv)
    device = bench_device(a.smoke, "fast_attention_bench")
    if device is None:
        return 2
    kernel = importlib.import_module(a.module).fast_attention
    from engine.attention import FastMeta, fast_cached  # the PyTorch path the kernel replaced
    from kernels.fast_attention import fast_attention_reference

    takes_warps = "num_warps" in inspect.signature(kernel).parameters
    heads, kv_heads, head_dim, positions = (8, 2, 16, 4) if a.smoke else (32, 8, 128, 10)
    batches = [2] if a.smoke else [int(x) for x in a.batch.split(",")]
    steps = [positions - 1] if a.smoke else [int(x) for x in a.steps.split(",")]
    warps = [4] if a.smoke or not takes_warps else [int(x) for x in a.warps.split(",")]
    calls = 2 if a.smoke else a.calls
    dtype = torch.float32 if a.smoke else torch.bfloat16
    timer = Timer(device, 2 if a.smoke else a.replays)
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    print(f"{a.module}.fast_attention on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'interpreter'})")
    print(" batch  step  warps   kernel us   PyTorch us   ratio")
    for b in batches:
        q = torch.randn(b, heads, head_dim, generator=g).to(device, dtype)
        k, v = (torch.randn(b, positions, kv_heads, head_dim, generator=g).to(device, dtype) for _ in range(2))
        for step in steps:
            want = fast_attention_reference(q, k, v, step).float()
            base = timer.us_per_call([lambda: fast_cached(q[:, None], k, v, FastMeta(step))] * calls)
            for w in warps:
                kw = {"num_warps": w} if takes_warps else {}
                got = kernel(q, k, v, step, **kw).float()
                err = ((got - want).norm() / want.norm()).item()
                if err > 2e-2:
                    print(f"batch {b} step {step} warps {w}: relative error {err:.3g} against the reference",
                          file=sys.stderr)
                    return 1
                us = timer.us_per_call([lambda: kernel(q, k, v, step, **kw)] * calls)
                rows.append({"batch": b, "step": step, "warps": w, "kernel_us": us, "pytorch_us": base,
                             "vs_pytorch": base / us})
                print(f"{b:6d} {step:5d} {w:6d} {us:11.2f} {base:12.2f} {base / us:7.2f}x")
    path = Path(a.out) / "fast_attention_bench.json"
    write_json(path, {"module": a.module, "device": str(device), "rows": rows,
                      "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
