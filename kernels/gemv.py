"""Small-batch linear layers (M = 1..4 rows): y = x @ W.T, streaming W once, without tensor cores.

    x        [M, K]   bf16 / fp16 / fp32, unit stride along K (any row stride)
                      (swiglu=True: [M, 2K], the fused gate/up output; x = silu(gate) * up)
    w        [N, K]   x's dtype, or float8_e4m3fn with w_scale, contiguous
    w_scale  [cdiv(N, 128), cdiv(K, 128)] fp32 row-major (e4m3 weights only: kernels/FP8_NOTES.md)
    bias     [N]      optional, the output's dtype
    -> y     [M, N]   x's dtype
    (or x as e4m3 codes [M, K] with x_scale [M, cdiv(K, 128)] fp32, e4m3 weights only:
     pre-quantized by kernels/fp8_quant.py; y then in out_dtype, bf16 by default)

Why: at decode shapes a linear layer is weight streaming, and at batch 1 cuBLAS's GEMMs
stream the S2-Pro layers at 50-80% of the H200's bandwidth (wo, 4096 -> 2560: 9.7 us
against a 4.9 us floor), some through a split-K reduce launch of their own. A GEMV has no
use for tensor cores at M <= 4: one program per block of BLOCK_N weight rows streams its
[BLOCK_N, K] slab once, in [BLOCK_N, BLOCK_K] tiles, and multiplies each tile into one fp32
accumulator of the tile's shape per row of x, elementwise (the one cross-thread reduction
is at the end), so the loop is loads and FMAs. Each row's accumulator sees the same
operations in the same order whatever M is (the launch choice depends on the weight's
shape only), so a row's output does not depend on its batch. Measured on an H200
(latency_bench/gemv_bench.py; README, "Single-stream decode through a GEMV"): 1.1-1.3x
cuBLAS at M = 1 on the S2-Pro layers, but slower from M = 2 on (each further row is a
whole pass of FMAs and of x's processing per tile, where tensor cores take it for free),
so the engine routes single rows only (engine/linear.py).

e4m3 weights (the FP8 path) are dequantized in registers: a tile never straddles a
128 x 128 scale block (BLOCK_N divides 128, BLOCK_K is a multiple of 128 or divides it),
so the block scale multiplies x's slice instead of the tile. x is quantized first, to e4m3
with one power-of-two scale per 1 x 128 group, the arithmetic of kernels/fp8_quant.py, so
the FP8 path computes the same function here as in its GEMM at larger batches
(`quantize_x=False` skips it: weight-only FP8, measured by latency_bench/gemv_bench.py).

`swiglu=True` computes the MLP's silu(gate) * up while loading x (bf16 weights: the
roundings of kernels/swiglu.py, silu rounded to x's dtype, then the product; e4m3: in
fp32 before quantizing, as fp8_linear does), so the down projection takes the fused
gate/up output directly: one launch, no [M, H] intermediate.

`gemv_reference` is the same function in PyTorch (fp32 math).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.fp8_quant import (dequantize_act, dequantize_weight, quantize_act_reference, quantize_weight,
                               swiglu_quant_reference)
from kernels.gemv_configs import DEFAULT_CONFIG, TUNED, GemvConfig
from kernels.pdl import launch_args, pdl_wait
from kernels.selfcheck import mismatch
from kernels.swiglu import swiglu_reference

MAX_M = 4  # rows one launch takes; above, callers use their GEMM
SCALE_BLOCK = 128


@triton.jit
def _x_slice(x_row, xs_row, s_ptr, ks, pid_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             W_FP8: tl.constexpr, X_FP8: tl.constexpr, QUANT_X: tl.constexpr, SWIGLU: tl.constexpr,
             SOFT_ROUND: tl.constexpr):
    """One row's x[ks] in fp32, as the weight tile multiplies it: the SwiGLU applied,
    quantized (or given as e4m3 codes with their group scales), and times the weight
    blocks' scales."""
    if X_FP8:
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        x = x * tl.load(xs_row + ks // 128, mask=ks < K, other=0.0)
    elif SWIGLU:
        gate = tl.load(x_row + ks, mask=ks < K, other=0.0)
        up = tl.load(x_row + K + ks, mask=ks < K, other=0.0)
        g = gate.to(tl.float32)
        if QUANT_X:  # the FP8 path's activation: fp32 throughout (kernels/fp8_quant.py)
            x = g * tl.sigmoid(g) * up.to(tl.float32)
        else:  # kernels/swiglu.py's roundings: silu, then the product, in x's dtype
            act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
            x = (act * up.to(tl.float32)).to(gate.dtype).to(tl.float32)
    else:
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
    if QUANT_X:
        # e4m3 with one power-of-two scale per 1 x 128 group, as fp8_linear quantizes
        # (BLOCK_K is a multiple of 128): x = codes * scale exactly, kept in fp32
        xg = tl.reshape(x, [BLOCK_K // 128, 128])
        x_scale, x_inv = scale_and_inverse(tl.max(tl.abs(xg), axis=1))
        codes = to_e4m3(xg * x_inv[:, None], SOFT_ROUND).to(tl.float32)
        x = tl.reshape(codes * x_scale[:, None], [BLOCK_K])
    if W_FP8:
        # one row block per tile (BLOCK_N divides 128): scale x's slice by the blocks' scales
        KB: tl.constexpr = (K + 127) // 128
        x = x * tl.load(s_ptr + (pid_n * BLOCK_N // 128) * KB + ks // 128, mask=ks < K, other=0.0)
    return x


@triton.jit
def _row_out(acc, b_ptr, y_row, rn, N: tl.constexpr, HAS_BIAS: tl.constexpr):
    y = tl.sum(acc, axis=1)  # [BLOCK_N]: the one cross-thread reduction
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    tl.store(y_row + rn, y.to(y_row.dtype.element_ty), mask=rn < N)


@triton.jit
def _gemv_kernel(
    x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, stride_xm, stride_xsm, stride_ym,
    ROWS: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, W_FP8: tl.constexpr, X_FP8: tl.constexpr, QUANT_X: tl.constexpr, SWIGLU: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFT_ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # one program per block of BLOCK_N weight rows, for all ROWS (1..4) rows of x: the
    # tile is loaded once and multiplied into one accumulator per row. Each row's
    # accumulator sees the same operations in the same order at every ROWS, so a row's
    # output does not depend on its batch.
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    EVEN_N: tl.constexpr = N % BLOCK_N == 0
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    w_rows = w_ptr + rn[:, None] * K
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + rk
        if EVEN_N and EVEN_K:
            w = tl.load(w_rows + ks[None, :])
        else:
            w = tl.load(w_rows + ks[None, :], mask=(rn[:, None] < N) & (ks[None, :] < K), other=0.0)
        w = w.to(tl.float32)
        x = _x_slice(x_ptr, xs_ptr, s_ptr, ks, pid_n, K, BLOCK_N, BLOCK_K, W_FP8, X_FP8, QUANT_X, SWIGLU,
                         SOFT_ROUND)
        acc0 += w * x[None, :]
        if ROWS > 1:
            x = _x_slice(x_ptr + stride_xm, xs_ptr + stride_xsm, s_ptr, ks, pid_n, K, BLOCK_N, BLOCK_K, W_FP8, X_FP8, QUANT_X, SWIGLU,
                         SOFT_ROUND)
            acc1 += w * x[None, :]
        if ROWS > 2:
            x = _x_slice(x_ptr + 2 * stride_xm, xs_ptr + 2 * stride_xsm, s_ptr, ks, pid_n, K, BLOCK_N, BLOCK_K, W_FP8, X_FP8, QUANT_X, SWIGLU,
                         SOFT_ROUND)
            acc2 += w * x[None, :]
        if ROWS > 3:
            x = _x_slice(x_ptr + 3 * stride_xm, xs_ptr + 3 * stride_xsm, s_ptr, ks, pid_n, K, BLOCK_N, BLOCK_K, W_FP8, X_FP8, QUANT_X, SWIGLU,
                         SOFT_ROUND)
            acc3 += w * x[None, :]
    _row_out(acc0, b_ptr, y_ptr, rn, N, HAS_BIAS)
    if ROWS > 1:
        _row_out(acc1, b_ptr, y_ptr + stride_ym, rn, N, HAS_BIAS)
    if ROWS > 2:
        _row_out(acc2, b_ptr, y_ptr + 2 * stride_ym, rn, N, HAS_BIAS)
    if ROWS > 3:
        _row_out(acc3, b_ptr, y_ptr + 3 * stride_ym, rn, N, HAS_BIAS)


def gemv_config(n: int, k: int, fp8: bool) -> GemvConfig:
    """The measured choice (kernels/gemv_configs.py), else the default. It does not depend
    on M: a row's sums are the same at every batch size."""
    return TUNED.get((n, k, "fp8" if fp8 else "bf16"), DEFAULT_CONFIG)


def _check_codes(x: Tensor, x_scale: Tensor, w: Tensor, swiglu: bool, quantize_x: bool) -> None:
    """Pre-quantized x: e4m3 codes [M, K] with fp32 group scales [M, cdiv(K, 128)]."""
    m, k = x.shape[0], w.shape[1]
    kb = -(-k // SCALE_BLOCK)
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError("e4m3 codes for x go with e4m3 weights")
    if swiglu or quantize_x:
        raise ValueError("x given as e4m3 codes is already quantized (no swiglu, no quantize_x)")
    if x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (m, kb) or (kb > 1 and x_scale.stride(1) != 1):
        raise ValueError(f"x's scales must be fp32 [{m}, {kb}] with unit stride along the groups, got "
                         f"{x_scale.dtype} {list(x_scale.shape)} strides {x_scale.stride()}")


def _check(x: Tensor, w: Tensor, w_scale: Tensor | None, bias: Tensor | None, swiglu: bool, quantize_x: bool,
           config: GemvConfig, x_scale: Tensor | None = None, out_dtype: torch.dtype | None = None) -> tuple[int, int, int]:
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"gemv takes x [M, K] and w [N, K], got {list(x.shape)} and {list(w.shape)}")
    m, n, k = x.shape[0], w.shape[0], w.shape[1]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv takes 1..{MAX_M} rows, got {m}")
    if x.shape[1] != (2 * k if swiglu else k):
        raise ValueError(f"x has {x.shape[1]} columns; w [N, K={k}] wants {2 * k if swiglu else k}"
                         f"{' (gate | up)' if swiglu else ''}")
    if x_scale is not None:
        if x.dtype != torch.float8_e4m3fn:
            raise ValueError(f"x_scale goes with x as e4m3 codes, got x in {x.dtype}")
        _check_codes(x, x_scale, w, swiglu, quantize_x)
    elif x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or fp32 (or e4m3 codes with x_scale), got {x.dtype}")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"the output must be bf16, fp16 or fp32, got {out_dtype}")
    if x.stride(1) != 1:
        raise ValueError("x must have unit stride along K")
    if not w.is_contiguous():
        raise ValueError("w must be contiguous [N, K]")
    if w.dtype == torch.float8_e4m3fn:
        nb, kb = -(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK)
        if w_scale is None or w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (nb, kb):
            got = None if w_scale is None else f"{w_scale.dtype} {list(w_scale.shape)}"
            raise ValueError(f"e4m3 weights need fp32 block scales [{nb}, {kb}], got {got}")
        if (kb > 1 and w_scale.stride(1) != 1) or (nb > 1 and w_scale.stride(0) != kb):
            # the kernel reads the scale of (row block r, group g) at w_scale + r * KB + g
            raise ValueError(f"w_scale must be row-major [{nb}, {kb}], got strides {w_scale.stride()}")
        if SCALE_BLOCK % config.block_n or (config.block_k % SCALE_BLOCK and SCALE_BLOCK % config.block_k):
            raise ValueError(f"a tile must stay within one scale block: {config}")
        if quantize_x and config.block_k % SCALE_BLOCK:
            raise ValueError(f"quantizing x takes whole 128-wide groups per tile: {config}")
    elif w.dtype != x.dtype:
        raise ValueError(f"w must be x's dtype ({x.dtype}) or float8_e4m3fn, got {w.dtype}")
    elif w_scale is not None or quantize_x:
        raise ValueError("w_scale and quantize_x are for e4m3 weights only")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != out_dtype or not bias.is_contiguous()):
        raise ValueError(f"bias must be [{n}] contiguous in {out_dtype}")
    return m, n, k


def gemv(x: Tensor, w: Tensor, w_scale: Tensor | None = None, bias: Tensor | None = None,
         swiglu: bool = False, quantize_x: bool | None = None, config: GemvConfig | None = None,
         x_scale: Tensor | None = None, out_dtype: torch.dtype | None = None, *, pdl: bool = False) -> Tensor:
    """See the module docstring. `quantize_x` (e4m3 weights only, the default there): x
    goes through e4m3 with one power-of-two scale per 1 x 128 group first, exactly as
    fp8_linear quantizes it, so the FP8 path computes the same function at every batch
    size (only the summation order differs); False multiplies x unquantized. `x_scale`:
    x is already e4m3 codes with these group scales (kernels/fp8_quant.py quantize_act or
    swiglu_quant, one launch before this one instead of the same work in every program);
    the output is then `out_dtype` (bf16 unless given). One launch; allocates only the
    output (CUDA-graph safe). `pdl`: kernels/pdl.py."""
    fp8 = w.dtype == torch.float8_e4m3fn
    x_fp8 = x_scale is not None
    quantize_x = (fp8 and not x_fp8) if quantize_x is None else quantize_x
    out_dtype = out_dtype or (torch.bfloat16 if x_fp8 else x.dtype)
    config = config or gemv_config(w.shape[0], w.shape[-1], fp8)
    m, n, k = _check(x, w, w_scale, bias, swiglu, quantize_x, config, x_scale, out_dtype)
    y = torch.empty(m, n, device=x.device, dtype=out_dtype)
    _gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, x_scale if x_fp8 else w, w, w_scale if fp8 else w, bias if bias is not None else w, y,
        x.stride(0), x_scale.stride(0) if x_fp8 else 0, y.stride(0),
        ROWS=m, N=n, K=k, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, W_FP8=fp8, X_FP8=x_fp8, QUANT_X=quantize_x, SWIGLU=swiglu,
        HAS_BIAS=bias is not None,
        SOFT_ROUND=interpreting(), num_warps=config.num_warps, **launch_args(pdl),
    )
    return y


def gemv_reference(x: Tensor, w: Tensor, w_scale: Tensor | None = None, bias: Tensor | None = None,
                   swiglu: bool = False, quantize_x: bool | None = None, x_scale: Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> Tensor:
    """gemv in PyTorch: the same input roundings (and quantization), fp32 products and sums."""
    fp8 = w.dtype == torch.float8_e4m3fn
    quantize_x = (fp8 and x_scale is None) if quantize_x is None else quantize_x
    out_dtype = out_dtype or (torch.bfloat16 if x_scale is not None else x.dtype)
    k = w.shape[1]
    if x_scale is not None:
        xf = dequantize_act(x, x_scale)
    elif quantize_x:
        codes = swiglu_quant_reference(x[:, :k], x[:, k:]) if swiglu else quantize_act_reference(x)
        xf = dequantize_act(*codes)
    elif swiglu:
        xf = swiglu_reference(x).float()  # its roundings: silu in x's dtype, then the product
    else:
        xf = x.float()
    wf = dequantize_weight(w, w_scale) if fp8 else w.float()
    y = xf @ wf.T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def self_check(device: torch.device | str, dtype: torch.dtype, shapes: list[tuple[int, int]], fp8: bool = False,
               max_rows: int = MAX_M, logits_shapes: list[tuple[int, int]] = (), *, pdl: bool = False) -> str | None:
    """None if the kernel compiles here and matches its reference at each (N, K) for
    M = 1..max_rows (and with swiglu at the last shape), and at each of `logits_shapes`
    with an fp32 output (the sampling heads: engine/linear.py head_logits), else why
    not."""
    g = torch.Generator(device=device).manual_seed(0)
    cases = [((n, k), i == len(shapes) - 1, None) for i, (n, k) in enumerate(shapes)]
    cases += [(shape, False, torch.float32) for shape in logits_shapes]
    for (n, k), last, out_dtype in cases:
        for m in range(1, max_rows + 1):
            for swiglu in ([False, True] if last else [False]):
                x = torch.randn(m, 2 * k if swiglu else k, generator=g, device=device).to(dtype)
                w = torch.randn(n, k, generator=g, device=device) / k**0.5
                s = None
                if fp8:
                    w, s = quantize_weight(w)
                else:
                    w = w.to(dtype)
                try:
                    got = gemv(x, w, s, swiglu=swiglu, out_dtype=out_dtype, pdl=pdl)
                except Exception as e:  # noqa: BLE001 - any failure means "use the GEMM"
                    return f"gemv failed at M={m}, N={n}, K={k}: {type(e).__name__}: {str(e)[:200]}"
                if got.dtype != (out_dtype or dtype):
                    return f"gemv M={m} N={n} K={k} gave {got.dtype}, asked for {out_dtype or dtype}"
                why = mismatch(f"gemv M={m} N={n} K={k} swiglu={swiglu} out={out_dtype}", got,
                               gemv_reference(x, w, s, swiglu=swiglu, out_dtype=out_dtype), dtype)
                if why:
                    return why
    return None
