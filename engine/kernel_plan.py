"""Which Triton kernels the model's forward passes run: decided once at start-up, then
passed explicitly to every forward (prefill and decode run on two threads, so there is
no module global and no flag on the model).

Each kernel is used only once it has compiled and matched its PyTorch reference on this
device at the model's shapes (`build_plan`); `KernelPlan()` is the PyTorch reference
everywhere (a CPU, or `--reference-kernels` on a GPU the kernels were never checked on).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from engine.sampling import MAX_TOP_K
from kernels import add_rms_norm, fast_attention, gemv, pdl, qk_rope_kv, sample, swiglu, text_attention

log = logging.getLogger("engine")

# Decode graphs of these batch buckets launch their kernels with programmatic dependent
# launch; above batch 1 it did not pay (latency_bench/RESULTS.md, "Programmatic dependent launch").
PDL_BATCHES = (1,)
# Single-stream steps only: the GEMV beats cuBLAS at one row and loses at two
# (latency_bench/RESULTS.md, "Single-stream GEMV").
GEMV_MAX_ROWS = 1


@dataclass(frozen=True, slots=True)
class KernelPlan:
    attention: bool = False  # decode / prefill attention through kernels/decode_attention.py
    fused_qkv: bool = False  # q/k norm, rotation and cache write in one launch (kernels/qk_rope_kv.py)
    step: bool = False  # residual add + norm, SwiGLU, fast attention and sampling kernels
    gemv: bool = False  # one-row linear layers and heads through kernels/gemv.py (bf16 weights)
    fp8: bool = False  # FP8 linear layers through the Triton GEMMs (else their references)
    blocked_prefill: bool = False  # prefill attention 16 positions a program (kernels/prefill_attention.py)
    pdl: bool = False  # launch with programmatic dependent launch (Hopper; per decode graph)
    text_attention: bool = False  # the word-timestamp readout through kernels/text_attention.py

    def takes_gemv(self, x: torch.Tensor) -> bool:
        """Whether x (one row of K) goes through the GEMV."""
        return self.gemv and x.numel() == x.shape[-1] > 0

    def for_decode_batch(self, bucket: int) -> "KernelPlan":
        return dataclasses.replace(self, pdl=self.pdl and bucket in PDL_BATCHES)

    def without_pdl(self) -> "KernelPlan":
        return dataclasses.replace(self, pdl=False)


REFERENCE = KernelPlan()


def build_plan(model, device: torch.device, dtype: torch.dtype, kv_quant: str = "none", reference: bool = False,
               gemv_on: bool = True, pdl_on: bool = True) -> KernelPlan:
    """The fastest plan whose kernels all matched their references here. `reference`:
    the PyTorch path everywhere; `gemv_on` / `pdl_on` False: benchmark baselines."""
    if device.type != "cuda" or reference:
        return REFERENCE
    c = model.config
    fp8_weights = any(block.norms_quantize for block in model.layers)  # engine/quant.py
    checks = {
        "fused_qkv": lambda: (qk_rope_kv.self_check(device, dtype, c.n_head, c.n_local_heads, c.head_dim,
                                                    c.attention_qk_norm, c.norm_eps, kv_fp8=kv_quant == "fp8")
                              or qk_rope_kv.self_check(device, dtype, c.fast_n_head, c.fast_n_local_heads,
                                                       c.fast_head_dim, c.fast_attention_qk_norm, c.norm_eps)),
        "step": lambda: (add_rms_norm.self_check(device, dtype, c.dim, c.norm_eps)
                         or add_rms_norm.self_check(device, dtype, c.fast_dim, c.norm_eps)
                         or swiglu.self_check(device, dtype, c.intermediate_size)
                         or swiglu.self_check(device, dtype, c.fast_intermediate_size)
                         or fast_attention.self_check(device, dtype, c.fast_n_head, c.fast_n_local_heads,
                                                      c.fast_head_dim, c.num_codebooks)
                         or sample.self_check(device, c.fast_vocab, c.num_semantic + 1, MAX_TOP_K)),
        "gemv": lambda: gemv.self_check(device, dtype, gemv_shapes(model), max_rows=GEMV_MAX_ROWS,
                                        logits_shapes=head_shapes(model)),
        "pdl": lambda: pdl.supported(device) or pdl.self_check(device),
        # the readout's whole span (engine/alignment.py ALIGN_TOKENS), in the smallest pages
        "text_attention": lambda: text_attention.self_check(device, dtype, c.n_head, c.n_local_heads, c.head_dim,
                                                            page=16, tokens=256),
    }
    wanted = {"fused_qkv": True, "step": True, "gemv": gemv_on and not fp8_weights, "pdl": pdl_on,
              "text_attention": kv_quant != "fp8"}  # an FP8 cache's readout is the reference's
    on = {}
    for name, check in checks.items():
        why = check() if wanted[name] else "not asked for"
        if why is not None and wanted[name]:
            log.warning("%s kernels off (PyTorch path instead): %s", name, why)
        on[name] = why is None
    return KernelPlan(attention=True, fused_qkv=on["fused_qkv"], step=on["step"], gemv=on["gemv"], fp8=fp8_weights,
                      blocked_prefill=kv_quant != "fp8", pdl=on["pdl"], text_attention=on["text_attention"])


def gemv_shapes(model) -> list[tuple[int, int]]:
    """(N, K) of the linear layers a one-row step routes through the GEMV, the down
    projections last (the GEMV runs them with the SwiGLU inside)."""
    blocks = [*model.layers, *model.fast_layers]
    shapes = {tuple(m.weight.shape) for b in blocks for m in (b.attention.wqkv, b.attention.wo)}
    # the stacked gate/up (w13) as served, whether or not the checkpoint's w1 / w3 are stacked yet
    shapes |= {(2 * b.feed_forward.hidden, b.feed_forward.w2.weight.shape[0]) for b in blocks}
    if hasattr(model, "fast_project_in"):
        shapes.add(tuple(model.fast_project_in.weight.shape))
    downs = {tuple(b.feed_forward.w2.weight.shape) for b in blocks}
    return sorted(shapes - downs) + sorted(downs)


def head_shapes(model) -> list[tuple[int, int]]:
    """(N, K) of the sampling heads (the GEMV with an fp32 output)."""
    return sorted({tuple(model.head_weight.shape), tuple(model.fast_output.weight.shape)})
