"""One audio frame for a batch of streams: the slow step, every fast codebook step and
sampling, with no host sync (the whole function can be captured in a CUDA graph).

A frame is a column [1 + C]: row 0 the slow token (a semantic id, or <|im_end|> at the
end of speech), rows 1..C the codes (code 0 is the semantic code).

The previous-tokens window keeps one strict contract: int32 [B, W, C] (the last W
frames' codes, -1 where empty), updated from int32/int64 [B, C] frames.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernel_plan import REFERENCE, KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.model import DualARModel
from engine.sampling import (
    MAX_TOP_K, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P, SamplingTensors, frame_gumbel, sample_codebook, sample_semantic,
)
from kernels.sample import sample_tokens


def check_window(window: Tensor, frame_codes: Tensor) -> None:
    if window.dtype != torch.int32 or window.ndim != 3:
        raise TypeError(f"window must be int32 [batch, window, codebooks], got {window.dtype} {list(window.shape)}")
    if frame_codes.ndim != 2 or frame_codes.shape[0] != window.shape[0] or frame_codes.shape[1] != window.shape[2]:
        raise TypeError(
            f"frame codes must be [batch, codebooks] = [{window.shape[0]}, {window.shape[2]}], "
            f"got {list(frame_codes.shape)}"
        )
    if frame_codes.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"frame codes must be an integer tensor, got {frame_codes.dtype}")


def push_window(window: Tensor, frame_codes: Tensor) -> None:
    """Shift the window by one frame and append `frame_codes`, in place."""
    check_window(window, frame_codes)
    window.copy_(torch.cat([window[:, 1:], frame_codes[:, None].to(torch.int32)], dim=1))


def new_window(batch: int, size: int, num_codebooks: int, device: torch.device | str) -> Tensor:
    return torch.full((batch, size, num_codebooks), -1, dtype=torch.int32, device=device)


def sample_frame(
    model: DualARModel,
    fast: FastCache,
    head_logits: Tensor,
    fast_in: Tensor,
    params: SamplingTensors,
    window: Tensor,
    frame_index: Tensor,
    plan: KernelPlan = REFERENCE,
) -> Tensor:
    """Sample a frame from the slow head's output. head_logits: [B, num_semantic + 1];
    fast_in: [B, fast_dim]; window: int32 [B, W, C]; frame_index: [B] int64 (noise
    counter per stream). Returns the frame [B, 1 + C] int64."""
    c = model.config
    penalize = c.uses_repetition_penalty
    if plan.step and not penalize:  # each draw one Triton launch (kernels/sample.py)
        def semantic_draw() -> Tensor:
            ras = (window[:, :, 0], c.num_semantic, RAS_DRAW, RAS_TEMPERATURE, RAS_TOP_P)
            return sample_tokens(head_logits, params, frame_index, 0, MAX_TOP_K, ras, pdl=plan.pdl)

        def codebook_draw(logits: Tensor, i: int) -> Tensor:
            return sample_tokens(logits, params, frame_index, i, MAX_TOP_K, pdl=plan.pdl)
    else:
        gumbel = frame_gumbel(params, frame_index, c.num_codebooks)  # [B, C + 1, K]: every draw's noise

        def semantic_draw() -> Tensor:
            return sample_semantic(head_logits, params, window[:, :, 0], frame_index, c.num_semantic,
                                   gumbel[:, 0], gumbel[:, c.num_codebooks], penalize)

        def codebook_draw(logits: Tensor, i: int) -> Tensor:
            return sample_codebook(logits, params, window[:, :, i], frame_index, i, gumbel[:, i], penalize)

    row = semantic_draw()
    is_end = row == c.num_semantic
    token = torch.where(is_end, c.im_end_id, c.semantic_begin_id + row)
    code = torch.where(is_end, 0, row)  # the end frame's codes are never decoded
    codes = [code]
    model.fast_step(fast_in, 0, fast, plan)
    for i in range(1, c.num_codebooks):
        logits = model.fast_step(model.fast_embeddings(code), i, fast, plan)[:, : c.fast_vocab]
        code = codebook_draw(logits, i)
        codes.append(code)
    return torch.stack([token, *codes], dim=1)


def decode_frame(
    model: DualARModel,
    kv: KVCache,
    fast: FastCache,
    tokens: Tensor,
    slots: Tensor,
    positions: Tensor,
    kv_len: int,
    params: SamplingTensors,
    window: Tensor,
    frame_index: Tensor,
    plan: KernelPlan = REFERENCE,
    align=None,
) -> Tensor:
    """Feed each stream's previous frame (tokens [B, 1 + C]) at its position and sample
    the next frame [B, 1 + C] (`align`: the word-timestamp readout, DecodeMeta.align)."""
    head_logits, fast_in = model.decode_slow(tokens, slots, positions, kv_len, kv, plan, align)
    return sample_frame(model, fast, head_logits, fast_in, params, window, frame_index, plan)
