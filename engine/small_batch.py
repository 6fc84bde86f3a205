"""Decode-sized linear layers through the GEMV kernel (kernels/gemv.py).

A decode step of one stream multiplies one row by every weight of both transformers:
the S2-Pro frame step streams ~7.7 GB of bf16 weights through 76 layer passes plus the
heads, and that streaming is most of its time. `use_gemv_(model, rows)`
routes every such layer through the GEMV when its input has at most `rows` rows, and
through its GEMM (cuBLAS, or the FP8 GEMM) above:

- each block's wqkv, wo and w13 (the stacked gate/up), and w2 with the SwiGLU inside
  (it takes the fused gate/up output: FeedForward.forward), become `GemvLinear` (the same
  parameters, no copy); so do the fast transformer's `fast_output` and `fast_project_in`;
- both sampling heads (the slow model's `head_weight`, the semantic rows, and the fast
  transformer's `fast_output`) read the GEMV too, through `head_logits`.

FP8 layers (engine/quant.py) stay on the block-scaled FP8 GEMM at every batch. The GEMV
takes e4m3 weights (kernels/gemv.py), but measured at M = 1 on an H200 it only wins on
wqkv and wo (latency_bench/gemv_bench.py), and a stream alone would then sum its rows
differently from the same stream batched, where the FP8 GEMM keeps one K split up to 16
rows so that it does not (kernels/fp8_configs.py).

The switch is per module attribute and branches on shapes only, so a CUDA graph
captured per batch bucket replays the path it captured. `use_gemv_(model, 0)` turns it
off (the A/B baseline; the engine's `gemv=False`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.layers import FeedForward

# The engine routes single rows only. The kernel takes up to kernels/gemv.py MAX_M = 4,
# but measured on an H200 (latency_bench.engine_bench --gemv-baseline, s2-pro, bf16) the
# step is 1.20x faster at batch 1 and slower at 2 (0.94x) and 4 (0.69x) than on cuBLAS:
# a row more costs the GEMV a whole pass of FMAs and x's processing per weight tile,
# cuBLAS's tensor cores next to nothing. (This module imports no Triton.)
GEMV_MAX_ROWS = 1


def gemv_rows(x: Tensor, max_rows: int) -> int:
    """x's row count if the GEMV takes it (1..max_rows), else 0."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return rows if 0 < rows <= max_rows else 0


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, max_rows: int = 0, swiglu: bool = False) -> Tensor:
    """x @ weight.T (+ bias): through the GEMV when x has 1..max_rows rows, else F.linear.
    `swiglu`: x is the fused gate/up output [..., 2K]; silu(gate) * up is multiplied
    (kernels/swiglu.py's roundings, inside the GEMV or by that kernel first)."""
    if gemv_rows(x, max_rows):
        from kernels.gemv import gemv

        x2 = x.reshape(-1, x.shape[-1])
        y = gemv(x2 if x2.stride(-1) == 1 else x2.contiguous(), weight, bias=bias, swiglu=swiglu)
        return y.view(*x.shape[:-1], weight.shape[0])
    if swiglu:
        from kernels.swiglu import swiglu as swiglu_kernel

        x = swiglu_kernel(x)
    return F.linear(x, weight, bias)


# The sampling heads' logits stay in fp32, their accumulator's precision. Rounded to bf16
# (~1/16 at the codebook head's |logits| of 8-16) two candidates often tie exactly, and
# the draw then takes the lower id whatever the model meant: on the default voice, the
# FP8 gate's first differing draw (frame 1's first residual code) was such a tie in bf16
# (latency_bench/fp8_agreement.py --margins). The heads are a few MB: an fp32 output
# costs nothing measurable, an fp32 copy of their weights would double their reads, so
# the inputs stay in the model's dtype and only the sums and the output are fp32.
LOGITS_DTYPE = torch.float32


def head_logits(x: Tensor, weight: Tensor, max_rows: int = 0) -> Tensor:
    """A sampling head's logits, x [..., K] @ weight.T [N, K], summed and returned in fp32
    (LOGITS_DTYPE): through the GEMV at 1..max_rows rows, cuBLAS with an fp32 output on a
    GPU, fp32 upcasts on a CPU (no bf16 x bf16 -> fp32 matmul there)."""
    if gemv_rows(x, max_rows):
        from kernels.gemv import gemv

        x2 = x.reshape(-1, x.shape[-1])
        y = gemv(x2 if x2.stride(-1) == 1 else x2.contiguous(), weight, out_dtype=LOGITS_DTYPE)
        return y.view(*x.shape[:-1], weight.shape[0])
    if x.dtype == LOGITS_DTYPE and weight.dtype == LOGITS_DTYPE:
        return F.linear(x, weight)
    if x.is_cuda:
        x2 = x.reshape(-1, x.shape[-1])
        return torch.mm(x2, weight.t(), out_dtype=LOGITS_DTYPE).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x.to(LOGITS_DTYPE), weight.to(LOGITS_DTYPE))


class GemvLinear(nn.Linear):
    """nn.Linear sharing `linear`'s parameters; at most `max_rows` rows go through the GEMV."""

    def __init__(self, linear: nn.Linear, max_rows: int) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.max_rows = max_rows

    def forward(self, x: Tensor, swiglu: bool = False) -> Tensor:
        """`swiglu`: x is the fused gate/up output [..., 2 * in_features] (see `linear`)."""
        return linear(x, self.weight, self.bias, self.max_rows, swiglu)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gemv up to {self.max_rows} rows"


def _swap(owner: nn.Module, name: str, max_rows: int) -> None:
    mod = getattr(owner, name, None)
    if isinstance(mod, GemvLinear):
        mod.max_rows = max_rows
    elif type(mod) is nn.Linear and max_rows:
        setattr(owner, name, GemvLinear(mod, max_rows))


def use_gemv_(model: nn.Module, max_rows: int) -> nn.Module:
    """Route the model's decode-sized linear layers through the GEMV up to `max_rows`
    rows (0: never). In place; shares every weight; call before capturing graphs."""
    for block in [*model.layers, *model.fast_layers]:
        _swap(block.attention, "wqkv", max_rows)  # FP8Linear is no nn.Linear: left on its GEMM
        _swap(block.attention, "wo", max_rows)
        ff = block.feed_forward
        if isinstance(ff, FeedForward) and ff.fused:  # the SwiGLU-inside form needs the stacked gate/up
            _swap(ff, "w13", max_rows)
            _swap(ff, "w2", max_rows)
    _swap(model, "fast_project_in", max_rows)
    model.gemv_rows = max_rows  # both sampling heads (DualARModel._head and fast_step: head_logits)
    return model


def gemv_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(N, K) of the layers use_gemv_ has routed, a down projection's last (the GEMV runs
    it with the SwiGLU inside: kernels/gemv.py self_check tests that form at the last
    shape). The heads are head_shapes (an fp32 output)."""
    downs = {tuple(m.w2.weight.shape) for m in model.modules()
             if isinstance(m, FeedForward) and isinstance(getattr(m, "w2", None), GemvLinear)}
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, GemvLinear)}
    return sorted(shapes - downs) + sorted(downs)


def head_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(N, K) of the sampling heads (head_logits: the GEMV with an fp32 output)."""
    heads = [getattr(model, "head_weight", None), model.fast_output.weight]
    return sorted({tuple(w.shape) for w in heads if w is not None})
