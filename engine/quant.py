"""FP8 weights for the slow and fast transformers (`--quant fp8`).

Every linear layer of both transformers' blocks keeps its weight as e4m3 codes with one
fp32 scale per 128 x 128 block, quantized once at load (kernels/fp8_quant.py). A forward
is one launch: the block-scaled GEMM (kernels/fp8_gemm.py) quantizes the activations per
1 x 128 group as it streams them. The MLP stacks w1 and w3 into one GEMM, and w2's GEMM
computes silu(gate) * up from its output in its own K loop:

    x [M, D] -> GEMM w13 [2H, D] -> [M, 2H] -> GEMM w2 [D, H] (silu * up, quantizing) -> [M, D]

Untouched: embeddings, the sampling heads, `fast_project_in` and the norms. A plan
without `fp8` runs the PyTorch references of the same functions (same quantized operands).
Graph safe: shapes and launch choices depend on input shapes only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.kernel_plan import REFERENCE, KernelPlan
from engine.layers import Attention, FeedForward, TransformerBlock
from kernels import fp8_gemm
from kernels.fp8_quant import quantize_weight


class FP8Linear(nn.Module):
    """y = x @ W.T (+ b) with W as block-scaled e4m3. x: [..., K] -> [..., N] in x's dtype."""

    def __init__(self, weight_q: Tensor, weight_scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_q.shape
        self.register_buffer("weight_q", weight_q)  # [N, K] float8_e4m3fn
        self.register_buffer("weight_scale", weight_scale)  # [cdiv(N, 128), cdiv(K, 128)] fp32
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FP8Linear":
        q, s = quantize_weight(linear.weight.detach())
        return cls(q, s, None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor, codes: tuple[Tensor, Tensor] | None = None, plan: KernelPlan = REFERENCE,
                swiglu: bool = False) -> Tensor:
        """`codes`: x's rows already quantized by the kernel that made x (the same codes the
        GEMM would make; x still gives the shape and dtype). `swiglu`: x is a stacked
        gate/up output and silu(gate) * up is multiplied."""
        x2 = x.reshape(-1, x.shape[-1])  # [M, K]
        pdl = {"pdl": plan.pdl} if plan.fp8 else {}
        if codes is not None:
            gemm = fp8_gemm.fp8_gemm if plan.fp8 else fp8_gemm.fp8_gemm_reference
            y = gemm(*codes, self.weight_q, self.weight_scale, x.dtype, **pdl)
        else:
            linear = fp8_gemm.fp8_linear if plan.fp8 else fp8_gemm.fp8_linear_reference
            y = linear(x2, self.weight_q, self.weight_scale, x.dtype, swiglu=swiglu, **pdl)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class FP8FeedForward(nn.Module):
    """SwiGLU w2(silu(w1 x) * w3 x): w1 and w3 stacked into one FP8 GEMM [2H, D], the
    SwiGLU and its quantization inside the w2 GEMM: two launches."""

    def __init__(self, w13: FP8Linear, w2: FP8Linear) -> None:
        super().__init__()
        self.hidden = w13.out_features // 2
        self.w13, self.w2 = w13, w2

    @classmethod
    def from_feed_forward(cls, ff: FeedForward) -> "FP8FeedForward":
        # one weight [2H, D], gate rows then up rows (a block may straddle the seam when
        # H % 128 != 0; it is then one block of the stacked matrix, scaled as such)
        w13 = FP8Linear(*quantize_weight(ff.gate_up_weight().detach()))
        return cls(w13, FP8Linear.from_linear(ff.w2))

    def forward(self, x: Tensor, plan: KernelPlan = REFERENCE, codes: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """`codes`: x already quantized by its producer (as FP8Linear.forward takes them)."""
        return self.w2(self.w13(x, codes, plan), None, plan, swiglu=True)


@torch.no_grad()
def quantize_model_(model: nn.Module) -> nn.Module:
    """Swap every linear layer of the slow and fast transformer blocks for FP8 ones, in
    place, freeing the bf16 weights as it goes (peak extra memory: one weight in fp32).
    Idempotent. Returns the model."""
    for block in [*model.layers, *model.fast_layers]:
        if not isinstance(block.feed_forward, FP8FeedForward):
            _quantize_block_(block)
    return model


def _quantize_block_(block: TransformerBlock) -> None:
    attn: Attention = block.attention
    attn.wqkv = FP8Linear.from_linear(attn.wqkv)
    attn.wo = FP8Linear.from_linear(attn.wo)
    block.feed_forward = FP8FeedForward.from_feed_forward(block.feed_forward)
    # the decode step's norms write their output as codes for wqkv and the MLP: one
    # quantize launch or the K loop's quantization less per GEMM, the same codes
    block.norms_quantize = True


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, FP8Linear) for m in model.modules())
