"""`python -m latency_bench.mlp_sweep`: the one-launch FP8 MLP (kernels/fp8_mlp.py) over
its two phases' K splits, against the two-launch paths, at decode batches.

The one-launch kernel starts with the launch table's tiles for the two GEMMs it runs
(`mlp_configs`), which were chosen for two separate launches. With one launch the
balance differs: w13's units run on at most as many SMs as there are units (76 groups,
no split, at the S2-Pro shape), and w2's units wait on w13's groups. This times every
(w13 splits, w2 splits) pair on the S2-Pro MLP (2560 -> 2 x 9728 -> 2560) at each M,
after checking that each pair gives the two launches' bits with the same tiles, beside
the engine's two-launch MLP (`fp8`) and the SwiGLU-epilogue one. Prints a table per M
and the best pair, writes <out>/mlp_sweep.json.

    python -m latency_bench.mlp_sweep --m 1,16,54,64 --splits1 1,2,4 --splits2 2,4,8
    python -m latency_bench.mlp_sweep --smoke   # a CPU check of the script (interpreter)

Timing as latency_bench.kernel_bench: inside one CUDA graph over enough weight copies to
stream from HBM.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import MLP, SMOKE_MLP, Timer, bench_device, copies_for


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.mlp_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="1,16,54,64")
    p.add_argument("--splits1", default="1,2,4", help="K splits of the w13 phase")
    p.add_argument("--splits2", default="2,4,8", help="K splits of the w2 phase")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="out/mlp_sweep")
    a = p.parse_args(argv)
    device = bench_device(a.smoke, "mlp_sweep")
    if device is None:
        return 2
    from engine.layers import FeedForward
    from engine.quant import FP8FeedForward
    from kernels.fp8_gemm import _num_sms, fp8_gemm, fp8_swiglu_gemm
    from kernels.fp8_mlp import fp8_mlp, mlp_configs

    d, h = SMOKE_MLP if a.smoke else MLP
    ms = [1] if a.smoke else [int(x) for x in a.m.split(",")]
    pairs = [(1, 1), (1, 2)] if a.smoke else [(int(s1), int(s2)) for s1 in a.splits1.split(",")
                                              for s2 in a.splits2.split(",")]
    timer = Timer(device, a.replays)
    plain, fused = [], []
    for _ in range(copies_for(3 * d * h, a.smoke)):
        with torch.device(device):
            ff = FeedForward(d, h).to(torch.bfloat16)
        plain.append(FP8FeedForward.from_feed_forward(ff))
        fused.append(FP8FeedForward.from_feed_forward(ff, swiglu_epilogue=True))
    sms = _num_sms(device.index if device.type == "cuda" else None)
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
                     "dim": d, "hidden": h, "smoke": a.smoke, "by_m": []}
    t0 = time.perf_counter()
    with torch.inference_mode():
        for m in ms:
            x = torch.randn(m, d, device=device).bfloat16()
            base1, base2 = mlp_configs(m, d, h, sms)
            row = {"m": m, "configs": [dataclasses.asdict(base1), dataclasses.asdict(base2)],
                   "fp8_us": timer.us_per_call([lambda f=f: f(x) for f in plain]),
                   "fp8_swiglu_epilogue_us": timer.us_per_call([lambda f=f: f(x) for f in fused]), "pairs": []}
            for s1, s2 in pairs:
                c1, c2 = dataclasses.replace(base1, splits=s1), dataclasses.replace(base2, splits=s2)
                f0 = fused[0]
                args = (f0.w13.weight_q, f0.w13.weight_scale, f0.w2.weight_q, f0.w2.weight_scale)
                h_codes, h_scales = fp8_swiglu_gemm(x, args[0], args[1], c1)
                same = torch.equal(fp8_mlp(x, *args, configs=(c1, c2)),
                                   fp8_gemm(h_codes, h_scales, args[2], args[3], x.dtype, c2))
                us = timer.us_per_call([lambda f=f, c1=c1, c2=c2: fp8_mlp(
                    x, f.w13.weight_q, f.w13.weight_scale, f.w2.weight_q, f.w2.weight_scale, configs=(c1, c2))
                    for f in fused])
                row["pairs"].append({"splits1": s1, "splits2": s2, "us": us, "same_bits": same})
                print(f"M={m:<3} w13 splits {s1} w2 splits {s2}: {us:8.1f} us{'' if same else '  DIFFERS'}",
                      flush=True)
            ok = [r for r in row["pairs"] if r["same_bits"] and r["us"] == r["us"]]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            row["best"] = best
            results["by_m"].append(row)
            print(f"M={m}: two launches (fp8) {row['fp8_us']:.1f} us, SwiGLU epilogue "
                  f"{row['fp8_swiglu_epilogue_us']:.1f} us; one launch best "
                  + (f"{best['us']:.1f} us at splits {best['splits1']} / {best['splits2']} "
                     f"({row['fp8_us'] / best['us']:.2f}x the engine's fp8 MLP)" if best else "none (all differ)"),
                  flush=True)
    results["seconds"] = time.perf_counter() - t0
    write_json(Path(a.out) / "mlp_sweep.json", results)
    print(f"wrote {Path(a.out) / 'mlp_sweep.json'}")
    return 0 if all(r["same_bits"] for row in results["by_m"] for r in row["pairs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
