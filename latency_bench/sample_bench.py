"""`python -m latency_bench.sample_bench`: the sampling kernel's two ways to draw, same run.

kernels/sample.py draws a row's token either by walking the candidates from the top (one
max-reduction over the whole vocabulary per candidate, up to top_k of them: `gather=False`)
or from the candidates gathered at or above a threshold, all at once (the default; more
candidates than fit fall back to the walk). At the S2-Pro shape a frame makes one semantic
draw (4,097 logits: end-of-speech last, RAS) and one per residual codebook (4,096).

Per head, batch and sampling setting: microseconds per call inside a CUDA graph of calls
back to back (kernel_bench's Timer), the walk, the gathered draw and their ratio, after
checking both give the same tokens. Settings: the service's defaults (temperature 0.7,
top_p 0.7, top_k 30), greedy, and top_k 128 (the most a request may ask: over flat logits
the gathered set overflows and the walk runs, so this row shows the fallback's cost).
Logits are random normal (a random-weight model's are flat like these; a trained model's
peak, and then both ways stop sooner).

    python -m latency_bench.sample_bench --out out/sample      # H200, ~30 s
    python -m latency_bench.sample_bench --smoke               # CPU: checks the script
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import Timer, bench_device

SETTINGS = {"default": (0.7, 0.7, 30), "greedy": (0.0, 0.7, 30), "top_k 128": (1.0, 1.0, 128)}
CALLS = 32  # calls per graph (each its own logits)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.sample_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="s2-pro")
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--smoke", action="store_true", help="small batch and few calls (a check of the script)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    device = bench_device(args.smoke, "sample_bench")
    if device is None:
        return 2
    from engine.config import preset
    from engine.sampling import MAX_TOP_K, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P, SamplingParams, SamplingTensors
    from kernels.sample import sample_tokens

    config = preset(args.model)
    heads = {"semantic": config.num_semantic + 1, "codebook": config.fast_vocab}
    batches = [1] if args.smoke else [int(b) for b in args.batch.split(",")]
    calls = 2 if args.smoke else CALLS
    timer = Timer(device, replays=1 if args.smoke else 20)
    rows = []
    print(f"{'head':>9} {'batch':>5} {'setting':>10} {'walk us':>8} {'gathered us':>11} {'ratio':>6}")
    for head, vocab in heads.items():
        for b in batches:
            for name, (t, top_p, top_k) in SETTINGS.items():
                params = SamplingTensors.from_params(
                    [SamplingParams(temperature=t, top_p=top_p, top_k=top_k, seed=s) for s in range(b)], device)
                g = torch.Generator().manual_seed(b)
                logits = [torch.randn(b, vocab, generator=g).to(device) for _ in range(calls)]
                step = torch.arange(b, device=device)
                extra = ()
                if head == "semantic":
                    window = torch.full((b, config.sampling_window), -1, dtype=torch.int32, device=device)
                    extra = ((window, vocab - 1, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P),)
                draw = 0 if head == "semantic" else 1

                def run(x, gather):
                    return sample_tokens(x, params, step, draw, MAX_TOP_K, *extra, gather=gather)

                for x in logits[:2]:
                    if not torch.equal(run(x, True), run(x, False)):
                        raise SystemExit(f"{head} batch {b} {name}: the gathered draw differs from the walk")
                us = {mode: timer.us_per_call([lambda x=x, m=m: run(x, m) for x in logits])
                      for mode, m in (("walk", False), ("gathered", True))}
                row = {"head": head, "vocab": vocab, "batch": b, "setting": name, "walk_us": us["walk"],
                       "gathered_us": us["gathered"], "ratio": us["walk"] / us["gathered"]}
                rows.append(row)
                print(f"{head:>9} {b:>5} {name:>10} {us['walk']:>8.2f} {us['gathered']:>11.2f} {row['ratio']:>5.2f}x",
                      flush=True)
    if args.out:
        write_json(args.out / "sample_bench.json", {"device": str(torch.cuda.get_device_name(device))
                                                    if device.type == "cuda" else "cpu (interpreter)",
                                                    "model": args.model, "smoke": args.smoke, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
