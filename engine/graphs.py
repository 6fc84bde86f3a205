"""CUDA-graph capture, the one way this project does it.

`capture(fn, stream, pool)` runs `fn` eagerly `warmups` times on `stream` (Triton
compilation, the caching allocator's blocks, cuBLAS handles and cuDNN plans happen
outside the capture), then records one call into a new graph in `pool`, and replays it
once. Capture mode is thread-local, so another thread's CUDA calls cannot invalidate it.
Returns the graph and what the recorded call returned (its tensors are the graph's
static outputs).

Why the replay: the driver uploads an executable graph on its first launch, so without
one here the first request that needs a graph pays for it (7.8 ms over the 9 decode
graphs of an H200, "The first replay" in latency_bench/RESULTS.md).
Every caller's static inputs point at scratch rows while capturing, so the replay, like
the warm-ups, touches no stream's state.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def capture(fn: Callable[[], Any], stream: torch.cuda.Stream, pool, warmups: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            out = fn()
        graph.replay()
    return graph, out
