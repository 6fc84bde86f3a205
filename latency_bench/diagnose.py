"""`python -m latency_bench.diagnose`: where a turn's time goes, without the network.

Times, on the given model and device: the codec's streaming decode per call (batch x
frames, with cuDNN on and off), a segment prefill to its first frame, and the engine
end to end (say -> first audio -> every later chunk) at a few concurrencies. Used to
explain load-test numbers; prints a short table and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from engine.bundle import load_bundle
from engine.codec.streaming import StreamingDecoder
from engine.engine import Engine, EngineConfig, StreamParams
from engine.sampling import SamplingParams
from engine.voice import VoiceInput
from latency_bench.engine_bench import median_ms
from latency_bench.jsonfile import write_json


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def codec_times(bundle, batches, frames, repeats=5) -> list[dict]:
    out = []
    dev = bundle.device
    for cudnn in (True, False):
        torch.backends.cudnn.enabled = cudnn
        dec = StreamingDecoder(bundle.codec, max(batches))
        for b in batches:
            for n in frames:
                codes = torch.randint(0, 1000, (b, bundle.codec.num_codebooks, n), device=dev)
                slots = torch.arange(b, device=dev)
                times = []
                for i in range(repeats + 2):
                    _sync(dev)
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        dec.decode(slots, codes).float().cpu()
                    times.append(time.perf_counter() - t0)
                out.append({"cudnn": cudnn, "batch": b, "frames": n, "first_ms": 1000 * times[0],
                            "ms": 1000 * statistics.median(times[2:])})
    torch.backends.cudnn.enabled = True
    return out


def codec_graph_times(bundle, max_streams: int, repeats: int = 5) -> list[dict]:
    """The codec worker's calls as the service makes them (CUDA graphs on a GPU, pinned
    copies in and out), per batch bucket and chunk: host time of a call, to the PCM on
    the host."""
    from engine.codec_worker import CHUNKS, CodecWorker

    worker = CodecWorker(bundle.codec, max_streams)
    worker.warm_up()
    out = []
    with torch.inference_mode():
        for b in worker.buckets:
            for n in CHUNKS:
                codes = np.random.default_rng(0).integers(0, 1000, (b, worker.num_codebooks, n))
                ms = median_ms(lambda: worker._call(list(range(b)), codes), bundle.device, repeats)
                out.append({"graphs": bool(worker._graphs), "batch": b, "frames": n, "ms": ms})
    return out


class _Sink:
    def __init__(self):
        self.t_say = 0.0
        self.chunks = []
        self.ready = threading.Event()
        self.done = threading.Event()

    def on_ready(self, cached, ms):
        self.ready.set()

    def on_audio(self, turn, pcm):
        self.chunks.append((time.perf_counter(), len(pcm)))

    def on_segment_end(self, turn, reason):
        self.done.set()

    def on_error(self, code, message):
        print("error", code, message)
        self.done.set()


def engine_times(bundle, concurrency, frames, turns=3) -> dict:
    engine = Engine(bundle, EngineConfig(max_running=max(concurrency), max_queued=0, max_len=1536)).start()
    results = {}
    try:
        for c in concurrency:
            ttfa, gaps = [], []
            for turn in range(turns):
                sinks = [_Sink() for _ in range(c)]
                params = StreamParams(SamplingParams(seed=turn, allow_end=False), frame_budget=frames)
                handles = [engine.open(VoiceInput(), params, s) for s in sinks]
                for s in sinks:
                    s.ready.wait(60)
                for h, s in zip(handles, sinks):
                    s.t_say = time.perf_counter()
                    engine.say(h, 1, "Thanks for calling, how can I help you today?")
                for s in sinks:
                    s.done.wait(120)
                for h, s in zip(handles, sinks):
                    engine.close(h)
                    if s.chunks:
                        ttfa.append(s.chunks[0][0] - s.t_say)
                        gaps += [b[0] - a[0] for a, b in zip(s.chunks, s.chunks[1:])]
            results[c] = {
                "ttfa_ms": {q: 1000 * float(np.percentile(ttfa, q)) for q in (50, 90, 99)},
                "gap_ms": {q: 1000 * float(np.percentile(gaps, q)) for q in (50, 90, 99)} if gaps else {},
            }
            print(f"engine c={c}: TTFA ms {results[c]['ttfa_ms']}, chunk gap ms {results[c]['gap_ms']}", flush=True)
    finally:
        engine.stop()
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.diagnose", description=__doc__)
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="auto")
    p.add_argument("--codec-batch", default="1,16,64")
    p.add_argument("--codec-frames", default="1,2,4")
    p.add_argument("--concurrency", default="1,16", help="engine levels; empty: codec times only")
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--out", default="out/diagnose")
    a = p.parse_args(argv)
    bundle = load_bundle(a.model, a.device)
    res = {"codec": codec_times(bundle, [int(x) for x in a.codec_batch.split(",")],
                                [int(x) for x in a.codec_frames.split(",")])}
    for r in res["codec"]:
        print(f"codec cudnn={r['cudnn']!s:5} batch {r['batch']:>3} x {r['frames']} frames: "
              f"{r['ms']:7.2f} ms (first call {r['first_ms']:.0f} ms)", flush=True)
    res["codec_worker"] = codec_graph_times(bundle, max(int(x) for x in a.codec_batch.split(",")))
    for r in res["codec_worker"]:
        print(f"codec worker call (graphs={r['graphs']}) batch {r['batch']:>3} x {r['frames']} frames: {r['ms']:7.2f} ms",
              flush=True)
    if a.concurrency:
        res["engine"] = engine_times(bundle, [int(x) for x in a.concurrency.split(",")], a.frames)
    write_json(Path(a.out) / "diagnose.json", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
