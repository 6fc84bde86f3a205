"""`python -m latency_bench.codec_policy_model`: the codec worker's policies at c=64, modeled.

A model, not a measurement: the real `CodecWorker` policy code (holding, chunks, rounds,
release interval, batch buckets) fed a c=64 arrival pattern, with each GPU call replaced by
a cost model. It says which policies cut the codec's calls and padding before any of them
spends device time, and by roughly how much; the load benchmark on the GPU decides.

The arrival pattern: `--streams` connections, each turn `--turn` frames at one frame per
decode step (`--step-ms`, the c=64 step interval measured on an H200/H100: 14-16 ms),
then `--think` seconds plus ~50 ms before the next turn (the load benchmark's closed loop);
the first turns start spread over 2 s. Frames are s2-pro's (2048 samples at 44.1 kHz).

The cost of a call of B rows x n frames: `--call-ms` + `--row-frame-ms` x B x n, fitted to
the H200's worker calls of the release-size codec (the codec-kernels/nhwc profile: 1 x 1
1.33 ms, 16 x 1 2.05, 64 x 1 3.41, 64 x 4 9.64 ms). The GPU's contention with the decode
step is not modeled: the modeled codec is faster than the real one, so compare policies
within a run, not against the load benchmark's figures.

Checked on an H100 at c=64 (2026-12-06, latency_bench/RESULTS.md, "The codec's policies at
c=64"): release 50 ms + bucket step 8 (+ cut-in) modeled at 0.76x the codec's time a frame,
measured 0.84x, padding 8% modeled and 5% measured; but the frames/s moved 1.01x, since
the codec costs only ~1.27x in frames/s at c=64 (the same load with the codec skipped).
The model ranks the codec's own work, not the service's throughput.

    python -m latency_bench.codec_policy_model                     # the default policy and the variants below
    python -m latency_bench.codec_policy_model --seconds 30 --step-ms 16
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch

from engine.bundle import load_bundle
from engine.codec.config import CodecConfig
from engine.codec_worker import CodecWorker, _End, _Frame

FRAME_S = 1 / CodecConfig().frame_rate  # the release codec's (s2-pro's) frame of audio
# the worker's keyword arguments of each policy compared (the first is the service's default)
POLICIES = {
    "default": {},
    "bucket step 8": {"bucket_step": 8},
    "release 50 ms": {"release_interval_s": 0.05},
    "release 50 ms + bucket step 8": {"release_interval_s": 0.05, "bucket_step": 8},
    "first audio 2 frames": {"first_frames": 2},
    "largest chunk 8": {"max_chunk": 8},
}


@dataclass
class Workload:
    streams: int = 64
    turn: int = 200
    step_s: float = 0.016
    think_s: float = 0.3
    seconds: float = 15.0
    call_s: float = 0.0013
    row_frame_s: float = 0.000032
    seed: int = 0


class _Owner:
    def wanted(self, turn: int) -> bool:
        return True

    def audio(self, turn: int, pcm: np.ndarray) -> None:
        pass

    def segment_end(self, turn: int, reason: str) -> None:
        pass


def model(codec: torch.nn.Module, work: Workload, **policy) -> dict:
    """Run the policy over the workload; calls, frames a call, the padding share of the
    computed frames, and the modeled codec time a frame and share of the wall time."""
    worker = CodecWorker(codec, work.streams + 1, **policy)
    worker.frame_s = FRAME_S
    now = [0.0]
    busy = [0.0]
    worker.clock = lambda: now[0]

    def call(slots: list[int], codes: np.ndarray) -> np.ndarray:
        cost = work.call_s + work.row_frame_s * codes.shape[0] * codes.shape[2]
        now[0] += cost
        busy[0] += cost
        return np.zeros((codes.shape[0], codes.shape[2] * worker.decoder.hop_length), np.float32)

    worker._call = call  # the GPU call, modeled
    worker._drain = lambda slot: None  # a segment end's held-back hops: no audio needed here
    rng = np.random.default_rng(work.seed)
    owners = [_Owner() for _ in range(work.streams)]
    start = rng.uniform(0, 2.0, work.streams)
    left = np.zeros(work.streams, int)
    turn = np.zeros(work.streams, int)
    codes = np.zeros(codec.num_codebooks, np.int64)
    arrived: list = []  # decode steps' items that arrived while the codec was busy
    t = 0.0
    while t < work.seconds:
        items = []
        for s in range(work.streams):
            if left[s] == 0 and t >= start[s]:
                turn[s] += 1
                left[s] = work.turn
            if left[s] > 0:
                items.append(_Frame(owners[s], s, int(turn[s]), codes))
                left[s] -= 1
                if left[s] == 0:
                    items.append(_End(owners[s], s, int(turn[s]), "end"))
                    start[s] = t + work.think_s + 0.05
        arrived.append(items)
        t += work.step_s
        while now[0] < t:  # the codec's thread until the next step's frames arrive
            if arrived:
                now[0] = max(now[0], t - work.step_s)
                batch, arrived = arrived, []
                worker._process(batch)
                continue
            deadline = worker._next_deadline()
            if deadline is None or now[0] + deadline >= t:
                now[0] = t
                break
            now[0] += max(deadline, 0.0005)  # at least the worker's own wake-up granularity
            worker._process([])
    frames, padded = worker.frames_decoded, worker.frames_padded
    return {
        "calls": worker.calls,
        "frames_per_call": frames / max(worker.calls, 1),
        "padding": padded / max(frames + padded, 1),
        "codec_ms_per_frame": 1000 * busy[0] / max(frames, 1),
        "codec_busy": busy[0] / work.seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.codec_policy_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    w = Workload()
    p.add_argument("--streams", type=int, default=w.streams)
    p.add_argument("--turn", type=int, default=w.turn, help="frames a turn")
    p.add_argument("--step-ms", type=float, default=1000 * w.step_s, help="decode step interval")
    p.add_argument("--think", type=float, default=w.think_s, help="seconds between a turn's end and the next")
    p.add_argument("--seconds", type=float, default=w.seconds, help="modeled wall time")
    p.add_argument("--call-ms", type=float, default=1000 * w.call_s, help="a codec call's fixed cost")
    p.add_argument("--row-frame-ms", type=float, default=1000 * w.row_frame_s, help="a call's cost a row-frame")
    a = p.parse_args(argv)
    work = Workload(a.streams, a.turn, a.step_ms / 1000, a.think, a.seconds, a.call_ms / 1000, a.row_frame_ms / 1000)
    codec = load_bundle("tiny", "cpu", torch.float32).codec  # only its shape is used: calls are modeled
    base = None
    print(f"{'policy':32} {'calls':>6} {'frames/call':>11} {'padding':>8} {'ms/frame':>9} {'busy':>5}  vs default")
    for name, policy in POLICIES.items():
        r = model(codec, work, **policy)
        base = base or r
        print(f"{name:32} {r['calls']:6d} {r['frames_per_call']:11.1f} {r['padding']:8.1%} "
              f"{r['codec_ms_per_frame']:9.3f} {r['codec_busy']:5.0%}  {r['codec_ms_per_frame'] / base['codec_ms_per_frame']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
