"""CUDA-graph capture, the one way this project does it.

`capture(fn, stream, pool)` runs `fn` eagerly `warmups` times on `stream` (Triton
compilation, the caching allocator's blocks, cuBLAS handles and cuDNN plans happen
outside the capture), then records one call into a new graph in `pool`. Capture mode is
thread-local, so another thread's CUDA calls cannot invalidate it. Returns the graph and
what the recorded call returned (its tensors are the graph's static outputs).
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
    return graph, out
