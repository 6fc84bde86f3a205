"""The codec's calls and the decode steps take turns on the GPU, with no host waits.

Why: at 64 connections on an H200 the decode step took 13.6-14.8 ms beside the codec's
calls against 8.6 ms alone, while the codec's own work was only ~2 ms a step (64 x 4
frames in 9.6 ms, ~50 frames a step). Run side by side, the codec's convolutions hold
SMs that each of the step's ~800 short, dependent kernels then waits for, so the step's
critical path stretches by far more than the codec's own time; a lower stream priority
for the codec changed that by ~4% (running blocks keep their SMs). Taking turns trades
that overlap for a codec call that waits for the step in flight (up to two steps: the
decode thread launches step t + 1 before it reads step t) and a step that waits for the
codec call before it.

How: two CUDA events. Each decode step's stream waits for the last codec call recorded
before the step's launch, and records `step_done` after it; each codec call's stream waits
for the last recorded step and records `codec_done` after the call. Every wait is on work
enqueued earlier in host time, so the waits can never form a cycle. The prefill stream
takes no part (a prefill is short and someone waits for its first audio).

`EngineConfig.codec_alternate`, off by default: not yet measured on a GPU
(`bash scripts/gpu_check.sh issue5ab`).
"""

from __future__ import annotations

import torch


class GpuAlternation:
    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"the codec and the decode step take turns on a CUDA device, got {device}")
        # recorded once on the current stream (already complete): a wait before the first
        # real record returns at once, and neither event is created lazily from two threads
        self.step_done = torch.cuda.Event()
        self.codec_done = torch.cuda.Event()
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            self.step_done.record(stream)
            self.codec_done.record(stream)

    def before_step(self, stream: torch.cuda.Stream) -> None:
        """The decode step about to be launched on `stream` runs after every codec call
        launched so far."""
        stream.wait_event(self.codec_done)

    def after_step(self, stream: torch.cuda.Stream) -> None:
        stream.record_event(self.step_done)

    def before_codec(self, stream: torch.cuda.Stream) -> None:
        """The codec call about to be launched on `stream` runs after every decode step
        launched so far."""
        stream.wait_event(self.step_done)

    def after_codec(self, stream: torch.cuda.Stream) -> None:
        stream.record_event(self.codec_done)
