"""`python -m latency_bench.profile_codec`: where the codec worker's GPU time goes.

Two parts, for the model's codec (random weights for a preset):
- the codec worker's calls as the service makes them (CUDA graphs, pinned copies), per
  batch bucket and chunk, with the codec's kernels (kernels/snake.py, kernels/conv_state.py:
  the service's default) and with PyTorch only (the baseline, same run): host time of a
  call, to the PCM on the host;
- one eager streaming-decode call under torch.profiler, kernels grouped by name and
  sorted by GPU time (graphs hide their kernels from the profiler).

    python -m latency_bench.profile_codec --model s2-pro --batch 1,16,64 --profile-batch 64
    python -m latency_bench.profile_codec --model s2-pro --flops   # any machine: FLOPs a frame

`--flops` counts the arithmetic of a streaming-decode call per frame of audio (PyTorch's
FLOP counter, on the CPU: the count does not depend on the device), by operation: what a
frame costs at best, whatever the kernels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from engine.bundle import load_bundle
from engine.codec.streaming import StreamingDecoder
from engine.codec_pacing import CHUNKS
from engine.codec_worker import CodecWorker
from latency_bench.engine_bench import median_ms
from latency_bench.jsonfile import write_json
from latency_bench.profile_step import gpu_kernels, print_kernels


VARIANTS = {"pytorch": False, "kernels": True}  # name -> StreamingDecoder's kernels switch


def worker_times(codec, batches: list[int], variant: str, repeats: int = 7) -> list[dict]:
    worker = CodecWorker(codec, max(batches), kernels=VARIANTS[variant])
    worker.warm_up()
    calls = worker.codec_calls
    out = []
    with torch.inference_mode():
        for b in (b for b in calls.buckets if b in batches):
            for n in CHUNKS:
                codes = np.random.default_rng(0).integers(0, 1000, (b, calls.num_codebooks, n))
                ms = median_ms(lambda: calls.decode(list(range(b)), codes), calls.device, repeats)
                out.append({"variant": variant, "batch": b, "frames": n, "ms": ms,
                            "frames_per_s": b * n / ms * 1000})
    return out


def warm_call(codec, batch: int, frames: int):
    """A streaming decoder (the service's kernels) and one call of `batch` streams x
    `frames` frames, run a few times: the callable, ready to profile."""
    dec = StreamingDecoder(codec, batch)
    codes = torch.randint(0, 1000, (batch, codec.num_codebooks, frames), device=dec.device)
    slots = torch.arange(batch, device=dec.device)
    with torch.inference_mode():
        for _ in range(3):
            dec.decode(slots, codes)
    torch.cuda.synchronize()
    return lambda: dec.decode(slots, codes)


def profile_call(codec, batch: int, frames: int, steps: int = 3) -> list[dict]:
    call = warm_call(codec, batch, frames)
    with torch.inference_mode():
        return gpu_kernels(call, steps, "call")


def op_times(codec, batch: int, frames: int, steps: int = 3) -> list[dict]:
    """One eager streaming-decode call under torch.profiler at the operator level: each
    PyTorch op (and Triton launch) by name and input shapes, with the GPU time of the
    kernels it launched (self), slowest first. Says which op a kernel of the list above
    comes from (a copy from a transpose, a cat of the transformer's cache, ...)."""
    from torch.profiler import ProfilerActivity, profile

    call = warm_call(codec, batch, frames)
    with torch.inference_mode():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for _ in range(steps):
                call()
            torch.cuda.synchronize()
    rows = [{"op": e.key, "shapes": str(e.input_shapes)[:120], "us_per_call": e.self_device_time_total / steps,
             "count_per_call": e.count / steps}
            for e in prof.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r["us_per_call"])


def flops_per_frame(codec, batch: int = 2, frames: int = 4) -> dict:
    """FLOPs of one streaming-decode call (after a first call: the conv histories are
    full) divided by the frames it decodes: in total and by ATen op."""
    from torch.utils.flop_counter import FlopCounterMode

    dec = StreamingDecoder(codec, batch, kernels=False)
    codes = torch.randint(0, 1000, (batch, codec.num_codebooks, frames), device=dec.device)
    slots = torch.arange(batch, device=dec.device)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode():
        dec.decode(slots, codes)
        with counter:
            dec.decode(slots, codes)
    per = batch * frames
    ops = {str(op).removeprefix("aten.").removesuffix(".default"): n / per
           for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return {"total": counter.get_total_flops() / per, "by_op": ops}


def module_times(codec, batch: int, frames: int) -> list[dict]:
    """GPU time of every conv module in one eager streaming-decode call, slowest first."""
    dec = StreamingDecoder(codec, batch)
    codes = torch.randint(0, 1000, (batch, codec.num_codebooks, frames), device=dec.device)
    slots = torch.arange(batch, device=dec.device)
    events: dict[str, list] = {}

    def pre(name):
        def hook(module, inputs):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            events.setdefault(name, []).append([start, None, list(inputs[0].shape)])
        return hook

    def post(name):
        def hook(module, inputs, output):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events[name][-1][1] = end
        return hook

    handles = []
    for name, m in codec.named_modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
            handles += [m.register_forward_pre_hook(pre(name)), m.register_forward_hook(post(name))]
    with torch.inference_mode():
        for _ in range(3):
            events.clear()
            dec.decode(slots, codes)
        torch.cuda.synchronize()
    for h in handles:
        h.remove()
    rows = [{"module": f"{name} {type(codec.get_submodule(name)).__name__}", "input": shape,
             "ms": sum(s.elapsed_time(e) for s, e, _ in calls)} for name, calls in events.items()
            for shape in [calls[0][2]]]
    return sorted(rows, key=lambda r: -r["ms"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.profile_codec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="s2-pro")
    p.add_argument("--batch", default="1,16,64", help="worker batch buckets to time")
    p.add_argument("--profile-batch", type=int, default=64)
    p.add_argument("--profile-frames", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="let cuDNN time its kernels per conv shape (torch.backends.cudnn.benchmark)")
    p.add_argument("--ops", type=int, default=0, help="also list the N slowest PyTorch ops of one call, by input shapes")
    p.add_argument("--modules", type=int, default=0, help="also list the N slowest conv modules of one call")
    p.add_argument("--out", default="out/profile_codec")
    p.add_argument("--flops", action="store_true", help="only count the FLOPs a frame (CPU; no timing)")
    a = p.parse_args(argv)
    if a.flops:
        flops = flops_per_frame(load_bundle(a.model, "cpu").codec)
        print(f"{a.model} codec, streaming decode: {flops['total'] / 1e9:.2f} GFLOP a frame")
        for name, n in sorted(flops["by_op"].items(), key=lambda t: -t[1]):
            print(f"  {n / 1e9:7.3f} GFLOP  {name}")
        write_json(Path(a.out) / "codec_flops.json", {"model": a.model, **flops})
        return 0
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    bundle = load_bundle(a.model, "cuda")
    batches = [int(x) for x in a.batch.split(",")]
    res = {"model": bundle.name, "codec_dtype": str(bundle.dtype), "worker": []}
    for variant in VARIANTS:
        res["worker"] += worker_times(bundle.codec, batches, variant)
    print(f"{'batch':>5} {'frames':>6}" + "".join(f" {v + ' ms':>15}" for v in VARIANTS) + "  pytorch / last")
    for rows in zip(*(  # the same (batch, frames) order in every variant
            [r for r in res["worker"] if r["variant"] == v] for v in VARIANTS)):
        print(f"{rows[0]['batch']:>5} {rows[0]['frames']:>6}" + "".join(f" {r['ms']:>15.2f}" for r in rows)
              + f"  {rows[0]['ms'] / rows[-1]['ms']:>5.2f}x")
    rows = profile_call(bundle.codec, a.profile_batch, a.profile_frames)
    res["profile"] = {"batch": a.profile_batch, "frames": a.profile_frames, "kernels": rows}
    print_kernels(rows, "call", a.top, f"eager decode, batch {a.profile_batch} x {a.profile_frames} frames")
    if a.ops:
        ops = op_times(bundle.codec, a.profile_batch, a.profile_frames)[: a.ops]
        res["ops"] = ops
        print(f"\nslowest ops (self GPU time), batch {a.profile_batch} x {a.profile_frames} frames (eager):")
        for r in ops:
            print(f"  {r['us_per_call']:8.1f} us  x{r['count_per_call']:5.1f}  {r['op']}  {r['shapes']}")
    if a.modules:
        slow = module_times(bundle.codec, a.profile_batch, a.profile_frames)[: a.modules]
        res["modules"] = slow
        print(f"\nslowest conv modules, batch {a.profile_batch} x {a.profile_frames} frames (eager, CUDA events):")
        for r in slow:
            print(f"  {r['ms']:7.3f} ms  {r['module']}  in {r['input']}")
    write_json(Path(a.out) / "profile_codec.json", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
