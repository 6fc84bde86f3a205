"""CUDA-graph capture, the one way this project does it.

`capture(fn, stream, pool)` runs `fn` eagerly `warmups` times on `stream` (Triton
compilation, the caching allocator's blocks, cuBLAS handles and cuDNN plans happen
outside the capture), then records one call into a new graph in `pool`, and replays it
once. Capture mode is thread-local, so another thread's CUDA calls cannot invalidate it.
Returns the graph and what the recorded call returned (its tensors are the graph's
static outputs).

Why the replay: PyTorch instantiates a captured graph but does not upload it; the CUDA
driver uploads an executable graph to the device on its first launch (`cudaGraphUpload`
does it ahead of time), so without a replay here the first request that needs a given
graph pays that on its step. Measured on an H200 (2026-12-06, `python -m
latency_bench.first_replay`, which turns the replay off): +7.8 ms over the 9 decode
graphs' first launches, +22.2 ms over the 34 prefill graphs, +8.1 ms over the 24 codec
graphs, at most 1.3 ms for one graph. Small, but paid in the first requests' steps; it
was not what made the server's first c=64 run slow (engine/codec_worker.py, `_process`).
Every caller's static inputs point at scratch rows while capturing, so the replay, like
the warm-ups, touches no stream's state.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# off only for latency_bench.first_replay, which times the first launch itself
REPLAY_AFTER_CAPTURE = True


def capture(fn: Callable[[], Any], stream: torch.cuda.Stream, pool, warmups: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            out = fn()
        if REPLAY_AFTER_CAPTURE:
            graph.replay()
    return graph, out
