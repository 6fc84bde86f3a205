"""FP8 weights for the slow and fast transformers (`--quant fp8`).

Every linear layer of both transformers' blocks (attention wqkv and wo, the MLP's w1, w3
and w2) keeps its weight as e4m3 codes with one fp32 scale per 128 x 128 block, quantized
once at load time (kernels/fp8_quant.py). A forward is one launch: the block-scaled GEMM
(kernels/fp8_gemm.py: fp8_linear) quantizes the bf16 activations to e4m3 with one scale
per 1 x 128 group as it streams them, output in the activations' dtype. The MLP fuses w1
and w3 into one GEMM; the down projection's GEMM computes silu(gate) * up from that output
and quantizes it in its own K loop, so the product never goes through memory:

    x [M, D] -> GEMM w13 [2H, D] (quantizing x) -> [M, 2H] -> GEMM w2 [D, H] (silu * up, quantizing) -> [M, D]

Untouched: embeddings, the sampling heads (slow `head_weight` / `output`, `fast_output`),
`fast_project_in` and the norms (a few MB, read once per step, and where the logits are
made).

Graph safety: forwards allocate outputs whose shapes depend on input shapes only, branch
on shapes and module attributes only, never read device data on the host. Launch choices
are a function of (M, N, K), so a graph captured for a batch bucket replays as captured.

`kernel=False` runs the PyTorch references of the same functions (same quantized
operands, fp32 matmul): the switch tests flip (Triton is still imported: the references
live beside their kernels).

Engine hook (not wired here): after the model is loaded and before the Runner warms up
and captures its graphs, call `quantize_model_(bundle.model)`; see kernels/FP8_NOTES.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.layers import Attention, FeedForward, TransformerBlock


def _linear(kernel: bool):
    """fp8_linear (the Triton kernel) or its PyTorch reference; imported on use, so that
    importing this module never needs Triton."""
    from kernels import fp8_gemm

    return fp8_gemm.fp8_linear if kernel else fp8_gemm.fp8_linear_reference


def _quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    from kernels.fp8_quant import quantize_weight

    return quantize_weight(w.detach())


class FP8Linear(nn.Module):
    """y = x @ W.T (+ b) with W as block-scaled e4m3. x: [..., K] -> [..., N] in x's dtype."""

    def __init__(self, weight_q: Tensor, weight_scale: Tensor, bias: Tensor | None = None, kernel: bool = True) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_q.shape
        self.register_buffer("weight_q", weight_q)  # [N, K] float8_e4m3fn
        self.register_buffer("weight_scale", weight_scale)  # [cdiv(N, 128), cdiv(K, 128)] fp32
        self.register_buffer("bias", bias)
        self.kernel = kernel

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: bool = True) -> "FP8Linear":
        q, s = _quantize_weight(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, s, bias, kernel)

    def forward(self, x: Tensor, codes: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """`codes`: x's rows already quantized by the kernel that made x (quantize_act's
        codes [M, K] and scales; kernels/add_rms_norm.py quantize=True): the GEMM takes them
        as they are, the same codes it would have made (x still gives the shape and dtype)."""
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if codes is not None:
            from kernels import fp8_gemm as g

            gemm = g.fp8_gemm if self.kernel else g.fp8_gemm_reference
            y = gemm(*codes, self.weight_q, self.weight_scale, x.dtype)
        else:
            y = _linear(self.kernel)(x2, self.weight_q, self.weight_scale, x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


class FP8FeedForward(nn.Module):
    """SwiGLU w2(silu(w1 x) * w3 x) with w1 and w3 stacked into one FP8 GEMM [2H, D] and the
    SwiGLU and its quantization fused into the w2 GEMM: two launches.

    `swiglu_epilogue` (quant mode "fp8-swiglu-epilogue"; H % 128 == 0): the gate and up
    rows are stored interleaved per 128 (kernels/fp8_quant.py interleave_gate_up) and the
    SwiGLU and its quantization run in the w13 GEMM's epilogue (kernels/fp8_gemm.py
    fp8_swiglu_gemm), so w2's GEMM takes codes: no [M, 2H] intermediate in memory and no
    quantize launch before w2. The same codes bit for bit as the unfused path with the
    same splits. Measured on an H100 (2026-12-05) it is slower than the unfused path: the
    MLP block at M = 1 0.98x, the decode step 0.95-1.00x, prefill 0.45-0.60x (cuBLAS runs
    the unfused w13 there); latency_bench/reference/h100-s2pro/swiglu-epilogue/.

    `one_launch` (quant mode "fp8-mlp-one-launch"; that layout): at decode batches (M <=
    ONE_LAUNCH_MAX_ROWS) both GEMMs run in one persistent launch (kernels/fp8_mlp.py
    fp8_mlp), the same bits as the two launches; larger M (prefill) keeps the two. Measured
    on an H100 (2026-12-06): the block 0.86-1.05x the unfused MLP, the decode step
    0.74-0.85x, prefill as the epilogue's; latency_bench/reference/h100-s2pro/mlp-one-launch/."""

    ONE_LAUNCH_MAX_ROWS = 128

    def __init__(self, w13: FP8Linear, w2: FP8Linear, kernel: bool = True, swiglu_epilogue: bool = False,
                 one_launch: bool = False) -> None:
        super().__init__()
        self.hidden = w13.out_features // 2
        self.w13, self.w2 = w13, w2
        self.kernel = kernel
        self.swiglu_epilogue = swiglu_epilogue  # w13's rows interleaved: see the class docstring
        # both GEMMs in one persistent launch (kernels/fp8_mlp.py; needs the interleaved rows)
        self.one_launch = one_launch and swiglu_epilogue

    @property
    def kernel(self) -> bool:
        return self.w13.kernel

    @kernel.setter
    def kernel(self, on: bool) -> None:
        # one switch for the whole block: w13 and w2 run as FP8Linear modules on the unfused
        # path, so a flag of this module's own would leave w13 on the kernel while the rest
        # ran the reference (a GPU-only mismatch: on the CPU both are the reference)
        self.w13.kernel = self.w2.kernel = on

    @classmethod
    def from_feed_forward(cls, ff: FeedForward, kernel: bool = True, swiglu_epilogue: bool = False,
                          one_launch: bool = False) -> "FP8FeedForward":
        # one weight [2H, D]: gate rows then up rows (a block may straddle the seam when
        # H % 128 != 0; it is then one block of the stacked matrix, scaled as such), or
        # the two interleaved per 128 rows for the SwiGLU epilogue
        stacked = ff.gate_up_weight().detach()
        swiglu_epilogue = (swiglu_epilogue or one_launch) and (stacked.shape[0] // 2) % 128 == 0
        if swiglu_epilogue:
            from kernels.fp8_quant import interleave_gate_up

            stacked = interleave_gate_up(stacked)
        w13 = FP8Linear(*_quantize_weight(stacked), kernel=kernel)
        return cls(w13, FP8Linear.from_linear(ff.w2, kernel), kernel, swiglu_epilogue, one_launch)

    def forward(self, x: Tensor, kernel: bool = False, codes: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """`kernel` is FeedForward's switch for its bf16 SwiGLU kernel (the decode step's
        kernel path passes it); here the activation is always fused into a GEMM. `codes`: x
        already quantized by its producer (as FP8Linear.forward takes them)."""
        x2 = x.reshape(-1, x.shape[-1])  # [M, D]
        if self.one_launch and self.kernel and x2.shape[0] <= self.ONE_LAUNCH_MAX_ROWS:
            from kernels.fp8_mlp import fp8_mlp

            y = fp8_mlp(x2, self.w13.weight_q, self.w13.weight_scale, self.w2.weight_q, self.w2.weight_scale,
                        codes=codes)
        elif self.swiglu_epilogue:  # (one_launch's reference path too: the same function)
            from kernels import fp8_gemm as g

            swiglu = g.fp8_swiglu_gemm if self.kernel else g.fp8_swiglu_gemm_reference
            gemm = g.fp8_gemm if self.kernel else g.fp8_gemm_reference
            h_codes, h_scales = swiglu(x2, self.w13.weight_q, self.w13.weight_scale, codes=codes)
            y = gemm(h_codes, h_scales, self.w2.weight_q, self.w2.weight_scale, x.dtype)
        else:
            linear = _linear(self.kernel)
            gu = self.w13(x2, codes)  # [M, 2H]: gate | up
            y = linear(gu, self.w2.weight_q, self.w2.weight_scale, x.dtype, swiglu=True)
        return y.view(*x.shape[:-1], y.shape[-1])


def _quantize_block_(block: TransformerBlock, kernel: bool, swiglu_epilogue: bool, one_launch: bool) -> None:
    attn: Attention = block.attention
    attn.wqkv = FP8Linear.from_linear(attn.wqkv, kernel)
    attn.wo = FP8Linear.from_linear(attn.wo, kernel)
    block.feed_forward = FP8FeedForward.from_feed_forward(block.feed_forward, kernel, swiglu_epilogue, one_launch)
    # the decode step's norms (TransformerBlock.forward_kernels) write their output as codes
    # for wqkv and the MLP: one quantize launch (M >= 32) or the K loop's quantization
    # (M <= 16) less per GEMM, the same codes
    block.norms_quantize = True


@torch.no_grad()
def quantize_model_(model: nn.Module, kernel: bool = True, swiglu_epilogue: bool = False,
                    one_launch: bool = False) -> nn.Module:
    """Swap every linear layer of the slow (`model.layers`) and fast (`model.fast_layers`)
    transformer blocks for FP8 ones, in place; frees the bf16 weights as it goes (peak
    extra memory: one weight in fp32). `swiglu_epilogue`, `one_launch`: FP8FeedForward's
    options. Idempotent. Returns the model."""
    for block in [*model.layers, *model.fast_layers]:
        if not isinstance(block.feed_forward, FP8FeedForward):
            _quantize_block_(block, kernel, swiglu_epilogue, one_launch)
    return model


def set_kernel_(model: nn.Module, kernel: bool) -> nn.Module:
    """Flip every FP8 module between the Triton kernels and the PyTorch references."""
    for mod in model.modules():
        if isinstance(mod, FP8Linear):  # FP8FeedForward's switch is its two FP8Linear modules'
            mod.kernel = kernel
    return model


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, FP8Linear) for m in model.modules())
