"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (Hopper on).

A decode step is hundreds of short kernels on one stream; without PDL the GPU drains each
before it launches the next. With it a kernel is launched while the one before still runs:
its launch and address arithmetic overlap that kernel's work, and it waits (`gdc_wait`)
for that kernel to complete before it touches anything the step computes. It pays at
batch 1 only (latency_bench/RESULTS.md, 'Programmatic dependent launch').

Every launcher whose kernel keeps the contract takes `pdl: bool = False` and launches with
`launch_args(pdl)`; the caller decides per launch (or per captured graph) and checks
`supported` and `self_check` first. The contract (the kernel's `PDL` constexpr):
- `pdl_wait` comes before it reads anything an earlier kernel may have written and before
  its first store, in every program, before any early return: a kernel completes only
  after its predecessor did, so waiting on the kernel just before covers all earlier ones;
- it lets the next kernel launch only after its own wait, so at most one runs ahead.
Kernels launched without PDL (PyTorch's, cuBLAS's) wait for their predecessor as always,
so mixing them in is safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

try:  # the grid-dependency ops (Triton >= 3.3 on NVIDIA); used only with PDL on
    from triton.language.extra import cuda as _tl_cuda
except ImportError:  # pragma: no cover - a Triton without its CUDA extras
    _tl_cuda = None


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


def launch_args(pdl: bool) -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr, and Triton's
    launch_pdl option when on."""
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the kernel before to complete, then let the next one launch (PDL on);
    nothing when off. Call before reading what earlier kernels wrote."""
    if PDL:
        _tl_cuda.gdc_wait()
        _tl_cuda.gdc_launch_dependents()


@triton.jit
def _link_kernel(x_ptr, y_ptr, s_ptr, n_ptr, dim, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    # one link of self_check's chain: s = x + y, n = s / rms(s), one row per program
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    s = tl.load(x_ptr + row * dim + offs, mask=mask, other=0.0) + tl.load(y_ptr + row * dim + offs, mask=mask,
                                                                            other=0.0)
    n = s / tl.sqrt(tl.sum(s * s, axis=0) / dim + 1e-6)
    tl.store(s_ptr + row * dim + offs, s, mask=mask)
    tl.store(n_ptr + row * dim + offs, n, mask=mask)


def _chain(x: Tensor, links: int, pdl: bool) -> Tensor:
    """`links` launches, each reading both outputs of the one before: a link that ran
    ahead of its predecessor would read stale rows."""
    rows, dim = x.shape
    s, n = x, x
    for _ in range(links):
        s2, n2 = torch.empty_like(x), torch.empty_like(x)
        _link_kernel[(rows,)](s, n, s2, n2, dim, BLOCK=triton.next_power_of_2(dim), **launch_args(pdl))
        s, n = s2, n2
    return torch.cat([s, n])


def self_check(device: torch.device | str, links: int = 24) -> str | None:
    """None if a chain of dependent kernels launched with pdl=True gives, bit for bit, what
    the same chain gives with pdl=False, else why not (the caller launches without PDL)."""
    if why := supported(device):
        return why
    x = torch.randn(64, 2560, generator=torch.Generator(device=device).manual_seed(0), device=device)
    try:
        without, with_pdl = (_chain(x, links, pdl) for pdl in (False, True))
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - any failure means "launch without PDL"
        return f"PDL launch failed: {type(e).__name__}: {str(e)[:200]}"
    if not torch.equal(without, with_pdl):
        return "a chain of kernels launched with PDL differs from the same chain without it"
    return None
