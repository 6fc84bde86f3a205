"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (Hopper on).

Why: a decode step is hundreds of short kernels, one after another on one stream (949 at
batch 1 for the S2-Pro shape, ~7 us each). Between two of them the GPU drains the first
(its last blocks finish one by one, DRAM and SMs half idle) and only then launches and
ramps up the second: at batch 1 the graphed step took 6.71 ms against 6.21 ms of kernel
time (latency_bench/reference/h200-s2pro/profile-step-kernels.txt, engine_bench.json),
and each weight-streaming kernel's own ramp and tail sit inside its kernel time. With PDL
a kernel's blocks are launched as soon as every block of the kernel before it has
started (`gdc_launch_dependents`), so its launch, its address arithmetic and its first
weight loads overlap the previous kernel's tail; it then waits (`gdc_wait`) for that
kernel to complete before it touches anything the step computes.

The contract every kernel launched with `launch_args()` keeps (its `PDL` constexpr):
- `gdc_wait()` comes before it reads anything an earlier kernel may have written
  (activations, KV caches, tokens, counters) and before its first store. Only address
  arithmetic and reads of weights (never written while steps run) may come before it.
- `gdc_wait()` runs in every program, before any early return: a kernel completes only
  after its predecessor did, so waiting on the kernel just before covers all earlier ones.
Kernels launched without PDL (PyTorch's, cuBLAS's, the codec's) wait for their
predecessor to complete as always, so mixing them in is safe.

When a kernel lets the next one launch matters. Letting it launch first thing, before its
own wait (`EARLY`), lets every kernel of the step launch at once, each waiting on the one
before: on an H200 that made chains of GEMVs and the FP8 step slower (w2 15.6 -> 18.1 us,
the FP8 step at batch 16 5.85 -> 6.56 ms; `bash scripts/gpu_check.sh pdl`, first call).
After its wait (`AFTER_WAIT`, the default) at most one kernel runs ahead: the next one's
launch and prologue overlap this one's work.

On/off is process-wide (`enable`): the engine's runner sets it once, after `supported`
says yes, before it captures its CUDA graphs (a graph keeps the launches it captured).
Off on the CPU and under the Triton interpreter (which has no grid-dependency ops).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # the grid-dependency ops (Triton >= 3.3 on NVIDIA); used only when PDL is on
    from triton.language.extra import cuda as _tl_cuda
except ImportError:  # pragma: no cover - a Triton without its CUDA extras
    _tl_cuda = None

OFF, AFTER_WAIT, EARLY = 0, 1, 2  # the kernels' PDL constexpr: when the next kernel may launch
_mode = OFF
# enable(True) with `early` unset takes this (a module setting, so the benchmarks can time
# the early trigger through the engine's own switch)
EARLY_DEFAULT = False


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


def enable(on: bool, early: bool | None = None) -> None:
    """Launch the step's kernels with PDL from now on (True) or not; `early`: each lets
    the next launch before its own wait (a measured baseline, slower). Call before
    capturing graphs; check `supported` first."""
    global _mode
    early = EARLY_DEFAULT if early is None else early
    _mode = (EARLY if early else AFTER_WAIT) if on else OFF


def enabled() -> bool:
    return _mode != OFF


def launch_args() -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr, and Triton's
    launch_pdl option when on."""
    return {"PDL": _mode, "launch_pdl": True} if _mode != OFF else {"PDL": OFF}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the kernel before to complete, and let the next one launch (PDL on; in
    the other order with EARLY); nothing when off. Call before reading what earlier
    kernels wrote."""
    if PDL == 2:
        _tl_cuda.gdc_launch_dependents()
        _tl_cuda.gdc_wait()
    elif PDL == 1:
        _tl_cuda.gdc_wait()
        _tl_cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at `ptrs` (one pointer per line) without waiting for
    them: a weight tile's first bytes come in while the previous kernel finishes."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def self_check(device: torch.device | str, links: int = 24) -> str | None:
    """None if a chain of dependent kernels launched with PDL gives, bit for bit, what the
    same chain gives without it (each link reads both outputs of the one before, so a
    kernel that ran ahead of its predecessor would read stale rows), else why not."""
    from kernels.add_rms_norm import add_rms_norm

    was = _mode
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(64, 2560, generator=g, device=device).bfloat16()
    w = (1 + 0.1 * torch.randn(2560, generator=g, device=device)).bfloat16()
    outputs = []
    try:
        for on in (False, True):
            enable(on, early=was == EARLY)
            s, n = x, x
            for _ in range(links):
                s, n = add_rms_norm(s, n, w, 1e-6)
            outputs.append(torch.cat([s, n]))
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - any failure means "launch without PDL"
        return f"PDL launch failed: {type(e).__name__}: {str(e)[:200]}"
    finally:
        globals()["_mode"] = was
    if not torch.equal(outputs[0], outputs[1]):
        return "a chain of kernels launched with PDL differs from the same chain without it"
    return None
