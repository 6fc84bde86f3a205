"""A CUDA stream whose kernels run on a fixed number of SMs (a CUDA green context).

Why: at 64 connections on an H200 the codec worker's calls (convolutions over up to 64
streams x 4 frames) held SMs that the decode step's kernels then waited for: the step took
13.6 ms beside the codec against 8.6 alone, and putting the codec's bulk calls on a
lower-priority stream changed that by 4% (running blocks keep their SMs whatever the
priority; latency_bench/reference/h200-s2pro/priority). A green context confines the
codec's kernels to `num_sms` SMs, while the decode and prefill kernels (the primary
context) may still use every SM: they always find the rest free of codec blocks. The cost
is a codec with fewer SMs for its own calls (`EngineConfig.codec_sms`, off by default).
Measured at 32 SMs on an H100 (132 SMs), 64 connections, against the default in the same
call (2026-12-06, `latency_bench/reference/h100-s2pro/codec-contention/`): 0.24x the
frames/s. The confined codec took 1.11 ms of GPU a frame against 0.20 and could not keep
up, so turns waited for their audio (TTFA p50 14-16 s). More SMs are unmeasured
(`VARIANTS="default sms96:--codec-sms=96" bash scripts/gpu_check.sh issue5ab`).

How: `torch.cuda.green_contexts.GreenContext` (torch >= 2.10, a CUDA driver with green
contexts). Where it makes streams itself (`GreenContext.Stream()`, torch >= 2.12) that
stream is used; before that, the green context is made current just long enough to create
a stream in it with the driver's cuStreamCreate (a stream created while a green context is
current belongs to it) and torch wraps that as an ExternalStream. The hardware rounds the
SM count up to its partition granularity.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

CU_STREAM_NON_BLOCKING = 1  # no implicit sync with the legacy default stream


@dataclass
class SMStream:
    stream: torch.cuda.Stream
    context: Any  # the GreenContext: kept alive as long as the stream


def sm_stream(num_sms: int, device: torch.device | str) -> SMStream:
    """A stream on `device` whose kernels run on `num_sms` SMs; raises ValueError (CPU,
    a count outside 1..SMs) or RuntimeError (no green contexts here) with the reason."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"confining work to SMs needs a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    if not 1 <= num_sms < total:
        raise ValueError(f"an SM count must be in 1..{total - 1} (this GPU has {total}), got {num_sms}")
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError as e:
        raise RuntimeError(f"torch {torch.__version__} has no CUDA green contexts ({e})") from e
    try:
        context = GreenContext.create(num_sms=num_sms, device_id=index)
    except Exception as e:  # noqa: BLE001 - the driver's or torch's reason, passed on
        raise RuntimeError(f"creating a green context of {num_sms} SMs failed: {type(e).__name__}: {e}") from e
    if hasattr(context, "Stream"):
        stream = context.Stream()
    else:
        stream = torch.cuda.ExternalStream(_driver_stream_in(context), device=device)
    return SMStream(stream, context)


def _driver_stream_in(context) -> int:
    """A new non-blocking stream created while `context` is current (torch < 2.12)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"the CUDA driver library is not loadable ({e})") from e
    handle = ctypes.c_void_p()
    context.set_context()
    try:
        status = libcuda.cuStreamCreate(ctypes.byref(handle), ctypes.c_uint(CU_STREAM_NON_BLOCKING))
    finally:
        context.pop_context()
    if status != 0 or not handle.value:
        raise RuntimeError(f"cuStreamCreate in the green context failed (CUresult {status})")
    return handle.value
