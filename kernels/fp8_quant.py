"""FP8 (e4m3) quantization in the block-scaled layout that kernels/fp8_gemm.py consumes.

Activations: one scale per 1 x 128 group along K, one launch for codes and scales.
The MLP's SwiGLU: `silu(gate) * up` computed in fp32 registers and quantized in the same
launch, so the product never goes through memory in bf16. Weights: one scale per
128 x 128 block, quantized once at load time (plain PyTorch: it runs once per weight).

Layouts (the GEMM launcher checks shape and strides of every scale tensor it reads):

    x        [M, K]       bf16 / fp16 / fp32, unit stride along K
    x_q      [M, K]       float8_e4m3fn, contiguous
    x_scale  [M, KB]      float32, contiguous (row-major), KB = cdiv(K, 128)
    w        [N, K]       the nn.Linear weight (out x in)
    w_q      [N, K]       float8_e4m3fn, contiguous
    w_scale  [NB, KB]     float32, contiguous (row-major), NB = cdiv(N, 128)

    x ~= x_q * x_scale[m, k // 128]        w ~= w_q * w_scale[n // 128, k // 128]

Padding rule: nothing is padded in memory. Tensors keep their logical sizes; the group
and block grids are cdiv(size, 128), and a partial group or block at the K or N edge
takes its scale from its valid elements alone. Kernels mask loads past K and N to zero,
so the missing elements contribute nothing to any sum.

Scales are powers of two: the smallest 2^e with amax / 2^e <= 448 (e4m3's largest
finite value), so codes fill (224, 448] at the top of each group. Dividing by a power of
two is exact, so the kernels and the references round the very same fp32 values to e4m3
(round to nearest even) and agree bit for bit; e4m3 keeps 3 mantissa bits at any scale,
so a power-of-two scale costs at most one binade of headroom at the bottom of the range.
An all-zero group gets the scale 2^-72 (from the amax floor 2^-64) and codes 0.

The kernels' device arithmetic (the scale by exponent bits, the e4m3 rounding, and the
interpreter's workaround) is kernels/e4m3.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from kernels.e4m3 import interpreting, scale_and_inverse, to_e4m3
from kernels.fp8_scale import E4M3_MAX, FP8, pow2_scale  # the rule in PyTorch (Triton-free module)
from kernels.pdl import launch_args, pdl_wait

GROUP = 128  # elements per activation scale group (along K) and per weight block side

# Groups per program of the activation kernels: 4 x 128 elements (1 KiB of bf16 in, 512 B
# of codes out). The launch is latency-bound at decode sizes (M <= 128, K <= 9728): chosen
# so a K = 9728 row takes 19 programs, not yet tuned on the H200 (kernel_bench.py).
GROUPS_PER_PROGRAM = 4


# --- activations -----------------------------------------------------------------------

@triton.jit
def _quantize_groups(x, q_row, s_row, stride_sg, offs_g, offs_k, k_ok, NUM_GROUPS, SOFT_ROUND: tl.constexpr):
    """x [G, 128] fp32 (zeros past the edge) -> codes and scales of one row's groups."""
    scale, inv = scale_and_inverse(tl.max(tl.abs(x), axis=1))
    q = to_e4m3(x * inv[:, None], SOFT_ROUND)
    tl.store(q_row + offs_k, q, mask=k_ok)
    tl.store(s_row + offs_g * stride_sg, scale, mask=offs_g < NUM_GROUPS)


@triton.jit
def _quant_act_kernel(
    x_ptr, q_ptr, s_ptr,
    K, NUM_GROUPS, stride_xm, stride_qm, stride_sm, stride_sg,
    GROUPS: tl.constexpr, SOFT_ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    m = tl.program_id(0)
    offs_g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    offs_k = offs_g[:, None] * 128 + tl.arange(0, 128)[None, :]  # [G, 128]
    k_ok = offs_k < K
    x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    _quantize_groups(x, q_ptr + m * stride_qm, s_ptr + m * stride_sm, stride_sg, offs_g, offs_k, k_ok, NUM_GROUPS,
                     SOFT_ROUND)


@triton.jit
def _swiglu_quant_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr,
    H, NUM_GROUPS, stride_gm, stride_um, stride_qm, stride_sm, stride_sg,
    GROUPS: tl.constexpr, SOFT_ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # PDL: the step's earlier kernels are done (kernels/pdl.py)
    m = tl.program_id(0)
    offs_g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    offs_k = offs_g[:, None] * 128 + tl.arange(0, 128)[None, :]
    k_ok = offs_k < H
    g = tl.load(g_ptr + m * stride_gm + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + m * stride_um + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u  # silu(gate) * up, fp32 in registers only
    _quantize_groups(h, q_ptr + m * stride_qm, s_ptr + m * stride_sm, stride_sg, offs_g, offs_k, k_ok, NUM_GROUPS,
                     SOFT_ROUND)


def _check_activation(name: str, x: Tensor) -> None:
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{name} must be bf16, fp16 or fp32, got {x.dtype}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name} must have unit stride along K, got strides {x.stride()}")


def _outputs(m: int, k: int, device: torch.device, m_major_scales: bool) -> tuple[Tensor, Tensor]:
    q = torch.empty(m, k, device=device, dtype=FP8)
    if m_major_scales:  # [M, KB] with strides (1, M): the layout cuBLAS's 1 x 128 scaling reads
        return q, torch.empty(triton.cdiv(k, GROUP), m, device=device, dtype=torch.float32).t()
    return q, torch.empty(m, triton.cdiv(k, GROUP), device=device, dtype=torch.float32)


def quantize_act(x: Tensor, m_major_scales: bool = False, *, pdl: bool = False) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (codes [M, K] e4m3, scales [M, cdiv(K, 128)] fp32), one launch. The
    scales are row-major (what kernels/fp8_gemm.py reads) unless `m_major_scales`: the
    same values with strides (1, M), what cuBLAS's 1 x 128 block scaling reads."""
    _check_activation("x", x)
    m, k = x.shape
    q, s = _outputs(m, k, x.device, m_major_scales)
    groups = s.shape[1]
    if m and k:
        _quant_act_kernel[(m, triton.cdiv(groups, GROUPS_PER_PROGRAM))](
            x, q, s, k, groups, x.stride(0), q.stride(0), s.stride(0), s.stride(1),
            GROUPS=GROUPS_PER_PROGRAM, SOFT_ROUND=interpreting(), **launch_args(pdl),
        )
    return q, s


def swiglu_quant(gate: Tensor, up: Tensor, m_major_scales: bool = False, *, pdl: bool = False) -> tuple[Tensor, Tensor]:
    """silu(gate) * up, quantized: gate, up [M, H] (e.g. the two halves of a fused
    w1/w3 GEMM output, row stride 2H) -> (codes [M, H] e4m3, scales [M, cdiv(H, 128)];
    `m_major_scales` as in quantize_act)."""
    _check_activation("gate", gate)
    _check_activation("up", up)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ")
    m, h = gate.shape
    q, s = _outputs(m, h, gate.device, m_major_scales)
    groups = s.shape[1]
    if m and h:
        _swiglu_quant_kernel[(m, triton.cdiv(groups, GROUPS_PER_PROGRAM))](
            gate, up, q, s, h, groups, gate.stride(0), up.stride(0), q.stride(0), s.stride(0), s.stride(1),
            GROUPS=GROUPS_PER_PROGRAM, SOFT_ROUND=interpreting(), **launch_args(pdl),
        )
    return q, s


# --- references (plain PyTorch, the same functions) ------------------------------------

def _group_rows(x: Tensor) -> Tensor:
    """[M, K] -> [M, KB, 128] fp32, zero-padded past K (padding never reaches memory)."""
    m, k = x.shape
    return F.pad(x.float(), (0, (-k) % GROUP)).view(m, -1, GROUP)


def quantize_act_reference(x: Tensor) -> tuple[Tensor, Tensor]:
    m, k = x.shape
    xg = _group_rows(x)
    scale = pow2_scale(xg.abs().amax(dim=-1))  # [M, KB]
    q = (xg / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.view(m, -1)[:, :k].contiguous(), scale


def swiglu_quant_reference(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return quantize_act_reference(F.silu(gate.float()) * up.float())


def dequantize_act(q: Tensor, scale: Tensor) -> Tensor:
    """codes [M, K] + scales [M, KB] -> fp32 [M, K]."""
    return q.float() * scale.repeat_interleave(GROUP, dim=1)[:, : q.shape[1]]


# --- weights (load time) ---------------------------------------------------------------

def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """An nn.Linear weight [N, K] -> (codes [N, K] e4m3, scales [NB, KB] fp32 row-major).
    Runs once at load time; one fp32 copy of the weight is the peak extra memory."""
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    wp = F.pad(w.float(), (0, (-k) % GROUP, 0, (-n) % GROUP))  # zeros: amax over valid elements only
    nb, kb = wp.shape[0] // GROUP, wp.shape[1] // GROUP
    blocks = wp.view(nb, GROUP, kb, GROUP)
    scale = pow2_scale(blocks.abs().amax(dim=(1, 3)))  # [NB, KB]
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.view(nb * GROUP, kb * GROUP)[:n, :k].contiguous(), scale.contiguous()


def dequantize_weight(q: Tensor, scale: Tensor) -> Tensor:
    """codes [N, K] + scales [NB, KB] -> fp32 [N, K]."""
    n, k = q.shape
    full = scale.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)
    return q.float() * full[:n, :k]
