"""One CUDA-graph check the GPU tests share: a step's launchers never wait on the device,
and the step captures into a graph."""

from __future__ import annotations

from typing import Callable

import torch


def capture_without_syncs(step: Callable):
    """Runs `step` once (compiles its kernels outside any capture), once more with the host
    sync check on (a launcher that waits on the device raises), then captures it in a CUDA
    graph. Returns the graph and the outputs the capture wrote, for the caller to replay
    on new inputs against eager calls."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs
