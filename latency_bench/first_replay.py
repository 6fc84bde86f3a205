"""`python -m latency_bench.first_replay`: what the first launch of each CUDA graph costs.

The CUDA driver uploads an executable graph to the device on its first launch unless
`cudaGraphUpload` did it before; PyTorch's capture instantiates a graph without uploading
it. `engine.graphs.capture` therefore replays every graph once right after capturing it.
This benchmark turns that replay off, builds the engine's graphs as the service does
(the runner's decode graph per batch bucket and its prefill graphs, the codec worker's
graph per batch bucket and chunk size), then launches each graph three times, one at a
time, and times each launch to its completion on the host. The sums say how much the
service's first load would wait on first launches without the replay:

    python -m latency_bench.first_replay --model s2-pro --device cuda [--quant fp8] [--pdl-all-batches]

Every graph's static inputs point at scratch rows after capture, so the launches touch
no stream's state (as the replay in engine.graphs does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from engine import graphs
from engine.bundle import QUANT_MODES, load_bundle
from engine.codec_worker import CodecWorker
from engine.runner import Runner
from latency_bench.jsonfile import write_json

LAUNCHES = 3


def launch_times(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> list[float]:
    """Milliseconds from each of LAUNCHES launches to its completion, one after another."""
    times = []
    for _ in range(LAUNCHES):
        stream.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        times.append(1000 * (time.perf_counter() - t0))
    return times


def family(name: str, timed: dict[str, list[float]]) -> dict:
    """One family of graphs: per graph its launch times, and the sums that matter."""
    later_of = {k: statistics.median(t[1:]) for k, t in timed.items()}  # a warm launch of each graph
    first, later = sum(t[0] for t in timed.values()), sum(later_of.values())
    worst = max(timed, key=lambda k: timed[k][0] - later_of[k])
    print(f"{name}: {len(timed)} graphs, first launches {first:.1f} ms in all against {later:.1f} ms for a later"
          f" launch of each ({first - later:+.1f} ms); largest gap {worst}: {timed[worst][0]:.2f} against"
          f" {later_of[worst]:.2f} ms")
    return {"graphs": dict(timed), "first_ms": first, "later_ms": later}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.first_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="s2-pro")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quant", default="none", choices=QUANT_MODES)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--max-len", type=int, default=1536)
    p.add_argument("--pdl-all-batches", action="store_true", help="every decode graph captured with PDL")
    p.add_argument("--out", default="out/first_replay")
    a = p.parse_args(argv)
    if not (a.device.startswith("cuda") and torch.cuda.is_available()):
        p.error("CUDA graphs need a CUDA device")
    bundle = load_bundle(a.model, a.device, quant=a.quant)
    graphs.REPLAY_AFTER_CAPTURE = False
    try:
        # as the service builds them by default (engine/engine.py): shared voice prefix reads on
        runner = Runner(bundle, a.max_running, a.max_len, pdl_all_batches=a.pdl_all_batches, shared_prefix=True)
        worker = CodecWorker(bundle.codec, a.max_running + 1)
        worker.warm_up()
    finally:
        graphs.REPLAY_AFTER_CAPTURE = True
    result = {"model": a.model, "quant": a.quant, "max_running": a.max_running, "gpu": torch.cuda.get_device_name()}
    result["decode"] = family("decode", {f"batch {b}": launch_times(g, runner.decode_stream)
                                         for b, g in runner.graphs.items()})
    prefill = {f"chunk {b}x{t}": launch_times(g.graph, runner.prefill_stream) for (b, t), g in runner.chunk_graphs.items()}
    prefill |= {f"first frame {b}": launch_times(g.graph, runner.prefill_stream) for b, g in runner.first_graphs.items()}
    prefill |= {f"second frame {b}": launch_times(g.graph, runner.prefill_stream) for b, g in runner.second_graphs.items()}
    result["prefill"] = family("prefill", prefill)
    result["codec"] = family("codec", {f"{b} x {n}": launch_times(g.graph, worker.stream)
                                       for (b, n), g in worker._graphs.items()})
    write_json(Path(a.out) / "first_replay.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
