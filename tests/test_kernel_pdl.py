"""Programmatic dependent launch is a per-call argument (kernels/pdl.py): every launcher the
decode step uses takes `pdl` (off by default), and on a Hopper GPU a chain of the real
launchers gives, bit for bit, the same with it as without."""

from __future__ import annotations

import inspect

import pytest
import torch

from kernels import (add_rms_norm, decode_attention, fast_attention, fp8_gemm, fp8_quant, gemv, kv_fp8_store, pdl,
                     prefill_attention, qk_rope_kv, sample, swiglu)

LAUNCHERS = [
    add_rms_norm.add_rms_norm, swiglu.swiglu, fast_attention.fast_attention, decode_attention.decode_attention,
    prefill_attention.prefill_attention, qk_rope_kv.qk_rope_kv, kv_fp8_store.store_kv_fp8, sample.sample_tokens,
    gemv.gemv, fp8_gemm.fp8_gemm, fp8_gemm.fp8_linear, fp8_quant.quantize_act, fp8_quant.swiglu_quant,
]
SELF_CHECKS = [add_rms_norm.self_check, swiglu.self_check, fast_attention.self_check, qk_rope_kv.self_check,
               sample.self_check, gemv.self_check]


def test_launch_args_name_the_kernel_flag_and_the_launch_option():
    assert pdl.launch_args(False) == {"PDL": False}
    assert pdl.launch_args(True) == {"PDL": True, "launch_pdl": True}


@pytest.mark.parametrize("fn", LAUNCHERS + SELF_CHECKS, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_every_launcher_takes_pdl_by_keyword_off_by_default(fn):
    p = inspect.signature(fn).parameters["pdl"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is False


def test_off_on_the_cpu_with_the_reason():
    assert pdl.supported("cpu") == "not a CUDA device"
    assert pdl.self_check("cpu") == "not a CUDA device"


hopper = pytest.mark.skipif(not torch.cuda.is_available() or pdl.supported("cuda") is not None,
                            reason="needs a GPU with PDL (Hopper on)")


@hopper
def test_gpu_the_self_checks_chain_agrees():
    assert pdl.self_check("cuda", links=64) is None


@hopper
def test_gpu_a_chain_of_step_launchers_is_the_same_with_pdl():
    """norm -> FP8 GEMM -> SwiGLU -> GEMV -> norm, each reading what the one before wrote:
    a kernel that ran ahead of its predecessor would read stale rows."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 2560, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(2560, generator=g, device="cuda")).bfloat16()
    w13, w13_s = fp8_quant.quantize_weight(torch.randn(2 * 1024, 2560, generator=g, device="cuda") / 50)
    w2 = (torch.randn(2560, 1024, generator=g, device="cuda") / 32).bfloat16()

    def chain(on: bool) -> torch.Tensor:
        s, n = x, x
        for _ in range(8):
            s, n, codes = add_rms_norm.add_rms_norm(s, n, w, 1e-6, quantize=True, pdl=on)
            h = swiglu.swiglu(fp8_gemm.fp8_gemm(*codes, w13, w13_s, pdl=on), pdl=on)
            n = gemv.gemv(h[:1], w2, pdl=on).expand_as(n).contiguous()
        return torch.cat([s, n])

    assert torch.equal(chain(False), chain(True))
