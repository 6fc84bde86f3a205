"""The DualAR transformer: a slow transformer over text + semantic tokens and a fast
transformer that expands each semantic token into the frame's residual codes.

Parameter names follow the public checkpoints (after key remapping), so a state dict
loads with `load_state_dict(..., assign=True)` onto a model built on the meta device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from engine.attention import BatchPrefillMeta, DecodeMeta, FastMeta, PrefillMeta, flat_positions
from engine.config import ModelConfig
from engine.kernel_plan import REFERENCE, KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.layers import RMSNorm, TransformerBlock, rope_table, run_blocks
from engine.linear import head_logits, project


class DualARModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.codebook_embeddings = nn.Embedding(c.codebook_size * c.num_codebooks, c.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(
                c.dim, c.n_head, c.n_local_heads, c.head_dim, c.intermediate_size, c.norm_eps,
                c.attention_qkv_bias, c.attention_o_bias, c.attention_qk_norm,
            )
            for _ in range(c.n_layer)
        )
        self.norm = RMSNorm(c.dim, c.norm_eps)
        if not c.tie_word_embeddings:
            self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.fast_dim != c.dim:
            self.fast_project_in = nn.Linear(c.dim, c.fast_dim)
        self.fast_embeddings = nn.Embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(
            TransformerBlock(
                c.fast_dim, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim,
                c.fast_intermediate_size, c.norm_eps, c.fast_attention_qkv_bias,
                c.fast_attention_o_bias, c.fast_attention_qk_norm,
            )
            for _ in range(c.n_fast_layer)
        )
        self.fast_norm = RMSNorm(c.fast_dim, c.norm_eps)
        self.fast_output = nn.Linear(c.fast_dim, c.codebook_size, bias=False)
        self._init_derived(self.embeddings.weight.device)

    # --- derived, non-persistent state -------------------------------------------------

    def _init_derived(self, device: torch.device) -> None:
        c = self.config
        if device.type == "meta":
            self.register_buffer("rope", None, persistent=False)
            self.register_buffer("fast_rope", None, persistent=False)
            self.register_buffer("head_weight", None, persistent=False)
            return
        self.register_buffer("rope", rope_table(c.max_seq_len, c.head_dim, c.rope_base).to(device), persistent=False)
        self.register_buffer(
            "fast_rope", rope_table(c.num_codebooks, c.fast_head_dim, c.rope_base).to(device), persistent=False
        )
        self.register_buffer("head_weight", None, persistent=False)
        self.refresh_head()

    def finish_loading(self) -> "DualARModel":
        """Build the derived buffers after real weights were assigned to a meta model."""
        self._init_derived(self.embeddings.weight.device)
        return self

    def refresh_head(self) -> None:
        """Rebuild the sampling head from the output weights (call after they change).

        The slow head only ever samples semantic tokens or end-of-speech, so it keeps
        those rows alone: [num_semantic + 1, dim] instead of the whole text vocabulary."""
        c = self.config
        w = self.embeddings.weight if c.tie_word_embeddings else self.output.weight
        rows = torch.cat([w[c.semantic_begin_id : c.semantic_end_id + 1], w[c.im_end_id : c.im_end_id + 1]])
        self.head_weight = rows.detach().clone()

    # --- slow transformer --------------------------------------------------------------

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens: [B, 1 + C, S] (row 0 token ids, rows 1.. codes) -> [B, S, D]."""
        c = self.config
        ids, codes = tokens[:, 0], tokens[:, 1:]
        is_semantic = (ids >= c.semantic_begin_id) & (ids <= c.semantic_end_id)
        offsets = torch.arange(c.num_codebooks, device=tokens.device)[None, :, None] * c.codebook_size
        code_emb = self.codebook_embeddings(codes + offsets).sum(dim=1)  # [B, S, D]
        x = self.embeddings(ids) + torch.where(is_semantic[..., None], code_emb, 0.0)
        if c.scale_codebook_embeddings:
            x = torch.where(is_semantic[..., None], x / math.sqrt(c.num_codebooks + 1), x)
        return x

    def _slow(self, x: Tensor, positions: Tensor, kv: KVCache, meta) -> tuple[Tensor, Tensor]:
        """-> the last hidden states [B, S, D] and them normed (self.norm)."""
        cos_sin = self.rope[positions]  # [B, S, Dh/2, 2]
        return run_blocks(self.layers, x, cos_sin, kv.k, kv.v, meta, self.norm)

    def _head(self, h: Tensor, normed: Tensor, plan: KernelPlan) -> tuple[Tensor, Tensor]:
        """h: [B, D] last slow hidden, normed: it normed -> (head logits
        [B, num_semantic + 1] in fp32 (engine/linear.py LOGITS_DTYPE), fast input)."""
        logits = head_logits(normed, self.head_weight, plan)
        fast_in = normed if self.config.norm_fastlayer_input else h
        if hasattr(self, "fast_project_in"):
            fast_in = project(self.fast_project_in, fast_in, plan)
        return logits, fast_in

    def prefill(self, tokens: Tensor, slot: int, start: int, kv: KVCache,
                plan: KernelPlan = REFERENCE) -> tuple[Tensor, Tensor]:
        """Append S positions to one stream. tokens: [1 + C, S].
        Returns (head logits [1, num_semantic + 1] fp32, fast input [1, fast_dim]) at the last position."""
        s = tokens.shape[-1]
        positions = torch.arange(start, start + s, device=tokens.device)[None]
        h, normed = self._slow(self.embed(tokens[None]), positions, kv, PrefillMeta(slot, start, kv.page_table, plan))
        return self._head(h[:, -1], normed[:, -1], plan)

    def prefill_batch(
        self, tokens: Tensor, slots: Tensor, starts: Tensor, lengths: Tensor, kv_len: int, kv: KVCache,
        plan: KernelPlan = REFERENCE,
    ) -> tuple[Tensor, Tensor]:
        """Append a segment to each of B streams at once. tokens: [B, 1 + C, S], right-padded;
        slots, starts, lengths: [B] int64 (device; a row of length 0 writes only to the
        scratch page). Returns the head logits and fast input at each stream's last real
        position: [B, num_semantic + 1], [B, fast_dim]. With the plan's attention kernels
        nothing depends on host lengths: CUDA-graph safe."""
        b, s = tokens.shape[0], tokens.shape[-1]
        positions = (starts[:, None] + torch.arange(s, device=tokens.device)[None, :]).clamp(max=self.config.max_seq_len - 1)
        meta = BatchPrefillMeta(slots, starts, lengths, kv_len, kv.page_table, plan)
        h, normed = self._slow(self.embed(tokens), positions, kv, meta)
        last = (torch.arange(b, device=h.device), (lengths - 1).clamp(min=0))
        return self._head(h[last], normed[last], plan)

    def decode_slow(
        self, tokens: Tensor, slots: Tensor, positions: Tensor, kv_len: int, kv: KVCache,
        plan: KernelPlan = REFERENCE, align=None,
    ) -> tuple[Tensor, Tensor]:
        """One position for each of B streams. tokens: [B, 1 + C]; slots (page-table
        rows), positions: [B]; `align`: the word-timestamp readout (DecodeMeta.align)."""
        flat = flat_positions(kv.page_table, kv.page_size, slots, positions)
        meta = DecodeMeta(slots, positions, kv_len, kv.page_table, flat, plan, positions + 1 if plan.attention else None,
                          align)
        h, normed = self._slow(self.embed(tokens[:, :, None]), positions[:, None], kv, meta)
        return self._head(h[:, 0], normed[:, 0], plan)

    def full_logits(self, tokens: Tensor) -> Tensor:
        """Whole-vocabulary logits for a fresh sequence, [1 + C, S] -> [S, vocab]
        (parity tests and training; serving uses the sampling head)."""
        kv = KVCache.allocate(self.config, 1, tokens.shape[-1], tokens.device, self.embeddings.weight.dtype)
        positions = torch.arange(tokens.shape[-1], device=tokens.device)[None]
        _, x = self._slow(self.embed(tokens[None]), positions, kv, PrefillMeta(0, 0, kv.page_table))
        w = self.embeddings.weight if self.config.tie_word_embeddings else self.output.weight
        return (x @ w.t())[0]

    # --- fast transformer --------------------------------------------------------------

    def fast_step(self, x: Tensor, step: int, fast: FastCache, plan: KernelPlan = REFERENCE) -> Tensor | None:
        """One fast position for B rows. x: [B, fast_dim] (the slow output at step 0,
        the embedding of code step-1 after). Returns fp32 logits [B, codebook_size] for
        code `step`, or None at step 0 (code 0 is the slow model's semantic token, so
        step 0 only fills the fast KV, its last block no more than its keys and values,
        and its logits are never read)."""
        cos_sin = self.fast_rope[step : step + 1][None].expand(x.shape[0], -1, -1, -1)
        out = run_blocks(self.fast_layers, x[:, None], cos_sin, fast.k, fast.v, FastMeta(step, plan), self.fast_norm,
                         last_fills_kv=step == 0)
        return None if out is None else head_logits(out[1][:, 0], self.fast_output.weight, plan)
