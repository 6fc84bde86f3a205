"""Transformer building blocks shared by the slow and fast transformers.

Shapes: B streams, S new positions, H query heads, K key/value heads, Dh head dim.
Per-step metadata (slots, positions) is passed in explicitly: prefill and decode run on
different threads, so nothing here keeps per-step state on the module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.attention import AttentionMeta, DecodeMeta, FastMeta, attend, decode_cached, fast_cached, write_fast_kv
from engine.kernel_plan import REFERENCE, KernelPlan
from engine.linear import project
from kernels.add_rms_norm import add_rms_norm
from kernels.qk_rope_kv import qk_rope_kv


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (upstream: normalize in fp32, cast back, then scale in
    the model dtype; here the scale is applied in fp32 before the one cast back, which
    differs from upstream by at most one rounding of the model dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # F.rms_norm with the weight is one fused kernel on CUDA that accumulates in fp32
        # (vs 4 for cast, norm, cast back, scale: 3 x 234 launches a frame step at the
        # s2-pro shape, latency_bench/launch_count.py); the step is launch-bound
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def rope_table(max_len: int, head_dim: int, base: float) -> Tensor:
    """[max_len, Dh/2, 2] (cos, sin) rounded to bf16 values: the released models were
    trained with a bf16 table, and an fp32 one was reported to garble their audio. Stored
    as fp32 so that rows view as complex64 rotations."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).bfloat16().float()


def apply_rope(x: Tensor, cos_sin: Tensor) -> Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) as complex numbers x[2i] + i x[2i+1]
    (one complex multiply instead of ~8 elementwise kernels).

    x: [B, S, H, Dh]; cos_sin: [B, S, Dh/2, 2] (rows of rope_table at each position).
    """
    cs = cos_sin.float()
    if cs.stride(-1) != 1 or any(st % 2 for st in cs.stride()[:-1]):
        cs = cs.contiguous()  # an expanded table (stride 0, the fast transformer's) views as is
    rot = torch.view_as_complex(cs).unsqueeze(2)  # [B, S, 1, Dh/2]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2))  # explicit: an empty x too
    return torch.view_as_real(xc * rot).flatten(-2).type_as(x)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x).

    The checkpoint keeps w1 and w3 apart; `fuse_gate_up_()` (the serving runner calls it)
    stacks them into one [2H, D] projection, `w13`, so that a decode step makes one GEMM
    instead of two per block (76 fewer launches a step at the s2-pro shape, and one larger
    weight stream instead of two). The state dict then holds `w13` instead of w1 / w3."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.fused = False

    @torch.no_grad()
    def fuse_gate_up_(self) -> "FeedForward":
        if not self.fused:
            w1, w3 = self.w1.weight, self.w3.weight
            w13 = nn.Linear(w1.shape[1], 2 * self.hidden, bias=False, device="meta")
            w13.weight = nn.Parameter(torch.cat([w1, w3]), requires_grad=w1.requires_grad)
            del self.w1, self.w3  # their memory goes back as the stacked copy takes its place
            self.w13, self.fused = w13, True
        return self

    def gate_up_weight(self) -> Tensor:
        """[2H, D]: the gate (w1) rows, then the up (w3) rows, fused or not."""
        return self.w13.weight if self.fused else torch.cat([self.w1.weight, self.w3.weight])

    def forward(self, x: Tensor, plan: KernelPlan = REFERENCE, codes=None) -> Tensor:
        """With the plan's step kernels (fused gate/up only) silu(gate) * up is one Triton
        launch (kernels/swiglu.py), or inside the one-row GEMV. `codes`: FP8 layers only."""
        if self.fused:
            gate_up = project(self.w13, x, plan)
            if plan.step:
                return project(self.w2, gate_up, plan, swiglu=True)
            gate, up = gate_up.split(self.hidden, dim=-1)
            return project(self.w2, F.silu(gate) * up, plan)
        return project(self.w2, F.silu(project(self.w1, x, plan)) * project(self.w3, x, plan), plan)


class Attention(nn.Module):
    """Grouped-query attention with a fused qkv projection and optional QK-norm
    (RMSNorm over the head dim, applied before RoPE)."""

    def __init__(
        self,
        dim: int,
        n_head: int,
        n_kv_head: int,
        head_dim: int,
        eps: float,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def qkv(self, x: Tensor, cos_sin: Tensor, codes=None, plan: KernelPlan = REFERENCE) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, S, D] -> q [B, S, H, Dh], k and v [B, S, K, Dh], QK-normed and rotated.

        q and k are normed and rotated together, as one [B, S, H + K, Dh] view of the
        fused projection: one norm, one scale and one rotation instead of two of each
        (the decode step is launch-bound; latency_bench/launch_count.py). The norm is the
        upstream order: normalize in fp32, cast back, then scale by q_norm / k_norm."""
        b, s, _ = x.shape
        h, kv, dh = self.n_head, self.n_kv_head, self.head_dim
        qkv = project(self.wqkv, x, plan, codes)
        qk = qkv[..., : (h + kv) * dh].view(b, s, h + kv, dh)
        v = qkv[..., (h + kv) * dh :].view(b, s, kv, dh)
        if self.qk_norm:
            scale = torch.cat([self.q_norm.weight.expand(h, dh), self.k_norm.weight.expand(kv, dh)])  # [H + K, Dh]
            qk = F.rms_norm(qk, (dh,), eps=self.q_norm.eps) * scale.to(qk.dtype)
        qk = apply_rope(qk, cos_sin)
        q, k = qk.split([h, kv], dim=2)
        return q, k, v

    def forward(
        self, x: Tensor, cos_sin: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta, codes=None,
    ) -> Tensor:
        # x: [B, S, D] -> [B, S, D]; codes: x's rows already quantized by the norm that made
        # x (FP8 layers only: kernels/add_rms_norm.py), which the FP8 GEMM takes as they are
        b, s, _ = x.shape
        plan = meta.plan
        if isinstance(meta, DecodeMeta) and plan.fused_qkv:
            # the pool viewed as [pages * P, 1, K, Dh]: row `flat`, position 0
            q = self._qkv_into_cache(x, cos_sin, k_cache.view(-1, 1, *k_cache.shape[2:]),
                                     v_cache.view(-1, 1, *v_cache.shape[2:]), meta.flat, 0, plan, codes)
            y = decode_cached(q, k_cache, v_cache, meta)
            if meta.align is not None:
                meta.align.read(self, q, k_cache)
        elif isinstance(meta, FastMeta) and plan.fused_qkv:
            q = self._qkv_into_cache(x, cos_sin, k_cache, v_cache, None, meta.step, plan, codes)
            y = fast_cached(q, k_cache, v_cache, meta)
        else:
            q, k, v = self.qkv(x, cos_sin, codes, plan)
            y = attend(q, k, v, k_cache, v_cache, meta)  # [B, S, H, Dh]
            if isinstance(meta, DecodeMeta) and meta.align is not None:
                meta.align.read(self, q, k_cache)
        return project(self.wo, y.reshape(b, s, self.n_head * self.head_dim), plan)

    def write_kv(self, x: Tensor, cos_sin: Tensor, k_cache: Tensor, v_cache: Tensor, meta: FastMeta,
                 codes=None) -> None:
        """The keys and values of x's one new position into the fast cache, no attention."""
        if meta.plan.fused_qkv:
            self._qkv_into_cache(x, cos_sin, k_cache, v_cache, None, meta.step, meta.plan, codes)
        else:
            _, k, v = self.qkv(x, cos_sin, codes, meta.plan)
            write_fast_kv(k, v, k_cache, v_cache, meta.step)

    def _qkv_into_cache(
        self, x: Tensor, cos_sin: Tensor, k_cache: Tensor, v_cache: Tensor, rows: Tensor | None,
        positions: Tensor | int, plan: KernelPlan, codes=None,
    ) -> Tensor:
        """What qkv() + the cache write of one new position per row do, in one Triton
        launch (kernels/qk_rope_kv.py). x: [B, 1, D] -> q [B, 1, H, Dh]; k and v land in
        the caches at (rows[b], positions[b]), or with rows None at (b, positions)."""
        norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else (None, None, 0.0)
        q = qk_rope_kv(project(self.wqkv, x[:, 0], plan, codes), norm[0], norm[1], cos_sin[:, 0], norm[2],
                       k_cache, v_cache, rows, positions, self.n_head, pdl=plan.pdl)
        return q[:, None]


class TransformerBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        n_head: int,
        n_kv_head: int,
        head_dim: int,
        hidden: int,
        eps: float,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv_head, head_dim, eps, qkv_bias, o_bias, qk_norm)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        # FP8 linear layers (engine/quant.py sets it): forward_kernels' norms also write their
        # output as e4m3 codes, which wqkv's and the MLP's GEMMs take as they are
        self.norms_quantize = False

    def forward(
        self, x: Tensor, cos_sin: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta
    ) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos_sin, k_cache, v_cache, meta)
        return h + self.feed_forward(self.ffn_norm(h), meta.plan)

    def forward_kernels(
        self, x: Tensor, delta: Tensor | None, cos_sin: Tensor, k_cache: Tensor, v_cache: Tensor,
        meta: AttentionMeta,
    ) -> tuple[Tensor, Tensor]:
        """forward() through the Triton kernels, with the residual add deferred: takes the
        residual stream as (x, delta), x + delta, and returns it the same way, so that
        each add runs in one launch with the norm after it (kernels/add_rms_norm.py),
        the last block's with the final norm (run_blocks). The MLP's activation is
        kernels/swiglu.py."""
        x, normed, codes = self.add_norm(x, delta, self.attention_norm, meta.plan)
        attended = self.attention(normed, cos_sin, k_cache, v_cache, meta, codes)
        x, normed, codes = self.add_norm(x, attended, self.ffn_norm, meta.plan)
        return x, self.feed_forward(normed, meta.plan, codes)

    def add_norm(self, x: Tensor, delta: Tensor | None, norm: RMSNorm,
                 plan: KernelPlan) -> tuple[Tensor, Tensor, tuple | None]:
        """x + delta and `norm` of it in one launch (kernels/add_rms_norm.py): (sum, normed,
        codes). With FP8 linear layers (norms_quantize) the norm also writes its output as
        e4m3 codes for the GEMM after it (no quantize launch before the GEMM, no quantization
        in its K loop; the same codes either way); else codes is None."""
        if self.norms_quantize:
            return add_rms_norm(x, delta, norm.weight, norm.eps, quantize=True, pdl=plan.pdl)
        return (*add_rms_norm(x, delta, norm.weight, norm.eps, pdl=plan.pdl), None)


def run_blocks(
    blocks: nn.ModuleList, x: Tensor, cos_sin: Tensor, k: Tensor, v: Tensor, meta: AttentionMeta,
    final_norm: RMSNorm, last_fills_kv: bool = False,
) -> tuple[Tensor, Tensor] | None:
    """Every block in turn, then the final norm: returns the last hidden states and them
    normed. k, v: [n_blocks, ...] caches. With the plan's step kernels: forward_kernels.

    `last_fills_kv` (the fast transformer's step 0, whose output is never read): the last
    block only writes its keys and values, and nothing is returned; its attention and
    MLP would be one block pass of 76 in an s2-pro frame step, computed for nothing."""
    n = len(blocks) - 1 if last_fills_kv else len(blocks)
    last = blocks[n] if last_fills_kv else None
    plan = meta.plan
    if not plan.step:
        for i in range(n):
            x = blocks[i](x, cos_sin, k[i], v[i], meta)
        if last is not None:
            return last.attention.write_kv(last.attention_norm(x), cos_sin, k[n], v[n], meta)
        return x, final_norm(x)
    delta = None
    for i in range(n):
        x, delta = blocks[i].forward_kernels(x, delta, cos_sin, k[i], v[i], meta)
    if last is not None:
        _, normed, codes = last.add_norm(x, delta, last.attention_norm, plan)
        return last.attention.write_kv(normed, cos_sin, k[n], v[n], meta, codes)
    return add_rms_norm(x, delta, final_norm.weight, final_norm.eps, pdl=plan.pdl)
