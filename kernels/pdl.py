"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (Hopper on).

Why: a decode step is hundreds of short kernels, one after another on one stream (949 at
batch 1 for the S2-Pro shape, ~7 us each). Between two of them the GPU drains the first
and only then launches and ramps up the second: at batch 1 the graphed step took 6.71 ms
against 6.21 ms of kernel time (latency_bench/reference/h200-s2pro/profile-step-kernels.txt,
engine_bench.json). With PDL a kernel is launched while the one before it still runs: its
launch and address arithmetic overlap that kernel's work, and it waits (`gdc_wait`) for
that kernel to complete before it touches anything the step computes.

The contract every kernel launched with `launch_args()` keeps (its `PDL` constexpr):
- `gdc_wait()` comes before it reads anything an earlier kernel may have written
  (activations, KV caches, tokens, counters) and before its first store.
- `gdc_wait()` runs in every program, before any early return: a kernel completes only
  after its predecessor did, so waiting on the kernel just before covers all earlier ones.
- It lets the next kernel launch (`gdc_launch_dependents`) only after its own wait, so at
  most one kernel runs ahead.
Kernels launched without PDL (PyTorch's, cuBLAS's, the codec's) wait for their
predecessor to complete as always, so mixing them in is safe.

Measured on an H200 (`bash scripts/gpu_check.sh pdl`, two calls; files in
latency_bench/reference/h200-s2pro/pdl/), the engine's step, CUDA graphs, with against
without, same run:
- FP8 weights (the block-scaled GEMM's chain): batch 1 4.94 -> 4.55 ms (1.09x), but
  batch 16 5.86 -> 6.11 ms (0.96x) and batch 64 0.99x.
- bf16 (the GEMV at batch 1, cuBLAS above): batch 1 1.6% faster (5.63 -> 5.54 ms), 1.00x
  at 16 and 64.
So the runner captures its batch-1 graph with PDL and the others without (PDL_BATCHES in
engine/runner.py). Two variants were slower and are gone: each kernel letting the next
launch before its own wait (every kernel of the step launched at once; FP8 batch 1 5.30
ms, w2's GEMV 15.7 -> 18.1 us), and the GEMV asking its first weight tile into L2 before
its wait (bf16 batch 1 5.77 against 5.54 ms without).

On/off is process-wide (`enable`, `launching`): the runner turns it on around its
self-checks and the captures that take it, and off again (a graph keeps the launches it
captured). Off on the CPU and under the
Triton interpreter (which has no grid-dependency ops).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

try:  # the grid-dependency ops (Triton >= 3.3 on NVIDIA); used only when PDL is on
    from triton.language.extra import cuda as _tl_cuda
except ImportError:  # pragma: no cover - a Triton without its CUDA extras
    _tl_cuda = None

_enabled = False


def supported(device: torch.device | str) -> str | None:
    """None if kernels on `device` can be launched with PDL, else why not."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "not a CUDA device"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "the Triton interpreter has no grid-dependency control"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"compute capability {major}.x (PDL needs 9.0, Hopper, or later)"
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError as e:
        return f"this Triton has no NVIDIA backend options: {e}"
    if "launch_pdl" not in getattr(CUDAOptions, "__dataclass_fields__", {}):
        return f"Triton {triton.__version__} has no launch_pdl option"
    if not hasattr(_tl_cuda, "gdc_wait"):
        return f"Triton {triton.__version__} has no gdc_wait"
    return None


def enable(on: bool) -> None:
    """Launch the step's kernels with PDL from now on (True) or not. Check `supported`
    first."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


@contextmanager
def launching(on: bool):
    """`enable(on)` for the launches (or graph captures) in the block, then back to what
    it was."""
    was = _enabled
    enable(on)
    try:
        yield
    finally:
        enable(was)


def launch_args() -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr, and Triton's
    launch_pdl option when on."""
    return {"PDL": True, "launch_pdl": True} if _enabled else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the kernel before to complete, then let the next one launch (PDL on);
    nothing when off. Call before reading what earlier kernels wrote."""
    if PDL:
        _tl_cuda.gdc_wait()
        _tl_cuda.gdc_launch_dependents()


def self_check(device: torch.device | str, links: int = 24) -> str | None:
    """None if a chain of dependent kernels launched with PDL gives, bit for bit, what the
    same chain gives without it (each link reads both outputs of the one before, so a
    kernel that ran ahead of its predecessor would read stale rows), else why not."""
    from kernels.add_rms_norm import add_rms_norm

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(64, 2560, generator=g, device=device).bfloat16()
    w = (1 + 0.1 * torch.randn(2560, generator=g, device=device)).bfloat16()
    outputs = []
    try:
        for on in (False, True):
            with launching(on):
                s, n = x, x
                for _ in range(links):
                    s, n = add_rms_norm(s, n, w, 1e-6)
            outputs.append(torch.cat([s, n]))
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - any failure means "launch without PDL"
        return f"PDL launch failed: {type(e).__name__}: {str(e)[:200]}"
    if not torch.equal(outputs[0], outputs[1]):
        return "a chain of kernels launched with PDL differs from the same chain without it"
    return None
