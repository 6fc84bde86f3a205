"""`python -m latency_bench.ncu_kernels`: the decode step's heaviest kernels, each launched
once inside a profiler window, for Nsight Compute's hardware counters.

Timings (kernel_bench, attention_bench, profile_step) say how long a kernel takes; they
do not say why it is ~2x its bytes floor (the FP8 GEMMs at M = 54-64, the FP8 KV read).
This script sets up the S2-Pro decode shapes and launches, between
`cudaProfilerStart` / `cudaProfilerStop`, one call of each:

- the FP8 linear layers as the engine runs them (`fp8_linear`: bf16 in, the launch
  table's choice) for wqkv, wo, w13 (w1 and w3 stacked) and w2, at M = --m values;
- decode attention over a bf16 and an FP8 KV cache at --batch / --context, at the default
  launch (`launch_choice`) and, for the FP8 cache, at each --fp8-launch given.

Everything is compiled and warmed before the window opens, so only these launches are
profiled. Run it under ncu (scripts/gpu_check.sh part `ncu` does, with
`--profile-from-start off --clock-control none`); alone it just runs the calls.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python3 -m latency_bench.ncu_kernels --m 1,54 --batch 54 --context 800
"""

from __future__ import annotations

import argparse
import sys

import torch


def parse_launch(text: str) -> dict:
    """'split,block,warps,stages' -> decode_attention keyword arguments."""
    split, block, warps, stages = (int(x) for x in text.split(","))
    return {"split": split, "block": block, "num_warps": warps, "num_stages": stages}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.ncu_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="1,54", help="rows of the FP8 linear layers")
    p.add_argument("--batch", type=int, default=54)
    p.add_argument("--context", type=int, default=800)
    p.add_argument("--fp8-launch", action="append", default=[],
                   help="an extra FP8-cache launch 'split,block,warps,stages' (repeatable)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_kernels: needs a CUDA device", file=sys.stderr)
        return 2
    from kernels.decode_attention import decode_attention
    from kernels.fp8_gemm import fp8_linear
    from latency_bench.attention_bench import make_cache
    from latency_bench.kernel_bench import SHAPES, make_weights

    dev = torch.device("cuda")
    calls: list[tuple[str, object]] = []
    for shape in SHAPES:
        if shape.name == "w1/w3":  # the engine's MLP runs w13
            continue
        w = make_weights(shape, 1, dev)[0]
        for m in (int(x) for x in a.m.split(",")):
            x = torch.randn(m, shape.k, device=dev).bfloat16()
            calls.append((f"{shape.name} M={m}", lambda x=x, w=w: fp8_linear(x, w.wq, w.ws)))
    heads, kv_heads, head_dim, b, ctx = 32, 8, 128, a.batch, a.context
    q = torch.randn(b, heads, head_dim, device=dev).bfloat16()
    slots = torch.arange(b, device=dev)
    lengths = torch.full((b,), ctx, device=dev)
    for fp8 in (False, True):
        kc, vc = make_cache(b, ctx, kv_heads, head_dim, fp8, dev)
        launches = [("default", {})] + ([(s, parse_launch(s)) for s in a.fp8_launch] if fp8 else [])
        for name, kw in launches:
            calls.append((f"attention {'fp8' if fp8 else 'bf16'} {name}", lambda kc=kc, vc=vc, kw=kw: decode_attention(
                q, kc, vc, slots, lengths, max_length=1536, **kw)))
    with torch.inference_mode():
        for _, call in calls:  # compile, warm
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for name, call in calls:
            torch.cuda.nvtx.range_push(name)
            call()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print("profiled, in order:", "; ".join(n for n, _ in calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
