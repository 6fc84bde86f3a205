"""The streaming codec's per-slot conv state, read and written in the pass that builds a
conv's input or finishes its output (engine/codec/streaming.py).

A causal conv with a receptive field of ctx + 1 samples keeps, per stream slot, the last
ctx inputs it saw; a call on n new samples runs on [history, x] (ctx + n columns) and
leaves the last ctx of them as the new history. In PyTorch that is a gather
(history[slots]), a concatenation, a strided copy and a scatter (history[slots] = ...),
each its own pass over memory and its own launch, and in the decoder the Snake before
the conv is one more pass. Measured on an H200 (latency_bench.profile_codec, s2-pro codec,
batch 64 x 1 frame): Snake, cat, gather and scatter were ~3 of a call's 6.8 ms.

`conv_input`: one launch builds the conv's input and updates the history:

    x        [B, C, n]          the new inputs (any strides)
    history  [S, C, ctx]        contiguous; row slots[b] is stream b's
    slots    long [B]           distinct
    alpha    [C] or None        Snake1d's alpha: x goes through the Snake on the way in
    -> full  [B, C, ctx + n]    in x's layout (kernels/layout.py): history[slots] then
                                snake(x); afterwards
                                history[slots] == full[..., n:] (the last ctx columns)

`transposed_output`: a causal transposed conv's output overlaps the next call's by
`overlap` samples; the overlap is kept per slot (bias-free) and added in:

    y        [B, C, emit + overlap]   conv_transpose1d(x, weight, no bias), any strides
    tail     [S, C, overlap]          contiguous
    bias     [C] or None
    -> out   [B, C, emit]       in y's layout: y[..., :emit] + bias, plus tail[slots] on its first
                                `overlap` columns; afterwards tail[slots] == y[..., emit:]
                                (plus the old tail where it reaches past emit)

Snake math is the one of kernels/snake.py (fp32, rounded once), so the results are those
of the Snake kernel followed by the PyTorch state updates. Each stream's state row is
read and rewritten by one program (conv_input: a program of its own after the body's;
transposed_output: the one at column block 0); the barrier orders its reads of the old
state before its writes. `*_reference` are the same functions in
plain PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.selfcheck import mismatch
from kernels.layout import TILE, as_layout, empty_as, tile
from kernels.snake import snake_reference

@triton.jit
def _snake(x, alpha):
    s = tl.sin(alpha * x)
    return x + s * s / (alpha + 1e-9)


@triton.jit
def _conv_input_kernel(
    x_ptr, h_ptr, slots_ptr, a_ptr, out_ptr, sx_b, sx_c, sx_t, so_b, so_c, so_t, rows, channels, n, body_blocks,
    CTX: tl.constexpr, CTX_BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, SNAKE: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # rows b * C + c
    col = tl.program_id(1)
    real = r < rows
    b = r // channels
    c = r % channels
    x_row = (b * sx_b + c * sx_c)[:, None]  # [ROWS, 1]
    out_row = (b * so_b + c * so_c)[:, None]
    alpha = tl.zeros((ROWS, 1), tl.float32)
    if SNAKE:
        alpha = tl.load(a_ptr + c, mask=real, other=1.0).to(tl.float32)[:, None]
    if col < body_blocks:  # the body: out[ctx + t] = snake(x[t])
        t = (col * BLOCK + tl.arange(0, BLOCK))[None, :]
        keep = real[:, None] & (t < n)
        v = tl.load(x_ptr + x_row + t * sx_t, mask=keep, other=0.0).to(tl.float32)
        if SNAKE:
            v = _snake(v, alpha)
        tl.store(out_ptr + out_row + (CTX + t) * so_t, v.to(out_ptr.dtype.element_ty), mask=keep)
    else:  # the state, by one program per row tile: the old history goes in front, the
        # last ctx columns of the whole input become the new history
        slot = tl.load(slots_ptr + b, mask=real, other=0)
        h_row = ((slot * channels + c) * CTX)[:, None]
        j = tl.arange(0, CTX_BLOCK)[None, :]
        mine = real[:, None] & (j < CTX)
        old = tl.load(h_ptr + h_row + j, mask=mine, other=0.0)
        src = n + j  # column of the whole input that becomes history column j
        from_old = src < CTX
        kept_old = tl.load(h_ptr + h_row + src, mask=mine & from_old, other=0.0).to(tl.float32)
        kept_new = tl.load(x_ptr + x_row + (src - CTX) * sx_t, mask=mine & (src >= CTX), other=0.0).to(tl.float32)
        if SNAKE:
            kept_new = _snake(kept_new, alpha)
        # rounded to the output dtype as the body is, so history == full[..., n:] exactly
        new = tl.where(from_old, kept_old, kept_new.to(out_ptr.dtype.element_ty).to(tl.float32))
        tl.debug_barrier()  # every read of the old history before any write of the new
        tl.store(out_ptr + out_row + j * so_t, old.to(out_ptr.dtype.element_ty), mask=mine)
        tl.store(h_ptr + h_row + j, new.to(h_ptr.dtype.element_ty), mask=mine)


@triton.jit
def _transposed_output_kernel(
    y_ptr, tail_ptr, slots_ptr, bias_ptr, out_ptr, sy_b, sy_c, sy_t, so_b, so_c, so_t, rows, channels, emit,
    OVERLAP: tl.constexpr, OVERLAP_BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, BIAS: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.program_id(1)
    real = r < rows
    b = r // channels
    c = r % channels
    y_row = (b * sy_b + c * sy_c)[:, None]
    slot = tl.load(slots_ptr + b, mask=real, other=0)
    t_row = ((slot * channels + c) * OVERLAP)[:, None]
    bias = tl.zeros((ROWS, 1), tl.float32)
    if BIAS:
        bias = tl.load(bias_ptr + c, mask=real, other=0.0).to(tl.float32)[:, None]
    t = (col * BLOCK + tl.arange(0, BLOCK))[None, :]
    keep = real[:, None] & (t < emit)
    v = tl.load(y_ptr + y_row + t * sy_t, mask=keep, other=0.0).to(tl.float32)
    # the old tail adds onto the first `overlap` columns: only the first column block
    # reaches them (the launcher makes BLOCK >= overlap)
    v += tl.load(tail_ptr + t_row + t, mask=keep & (t < OVERLAP), other=0.0).to(tl.float32)
    # the new tail: y[emit + j], plus the old tail where it reaches past emit
    j = tl.arange(0, OVERLAP_BLOCK)[None, :]
    mine = real[:, None] & (j < OVERLAP) & (j * 0 + col == 0)
    new = tl.load(y_ptr + y_row + (emit + j) * sy_t, mask=mine, other=0.0).to(tl.float32)
    new += tl.load(tail_ptr + t_row + emit + j, mask=mine & (emit + j < OVERLAP), other=0.0).to(tl.float32)
    tl.debug_barrier()  # every read of the old tail before any write of the new
    tl.store(out_ptr + (b * so_b + c * so_c)[:, None] + t * so_t, (v + bias).to(out_ptr.dtype.element_ty), mask=keep)
    tl.store(tail_ptr + t_row + j, new.to(tail_ptr.dtype.element_ty), mask=mine)


def _check_state(x: Tensor, state: Tensor, slots: Tensor, what: str) -> None:
    if x.ndim != 3 or state.ndim != 3 or state.shape[1] != x.shape[1]:
        raise ValueError(f"{what}: x must be [B, C, n] and the state [S, C, k], got {list(x.shape)} and {list(state.shape)}")
    if not state.is_contiguous() or state.dtype != x.dtype or state.device != x.device:
        raise ValueError(f"{what}: the state must be contiguous, of x's dtype and device; got {state.dtype} on {state.device}")
    if slots.shape != (x.shape[0],) or slots.dtype != torch.long or slots.device != x.device:
        raise ValueError(f"{what}: slots must be long [B] on x's device, got {slots.dtype} {list(slots.shape)}")


def _check_channel_vector(v: Tensor | None, x: Tensor, what: str) -> None:
    if v is not None and (v.shape != (x.shape[1],) or v.device != x.device):
        raise ValueError(f"{what} must be [C] = [{x.shape[1]}] on x's device, got {list(v.shape)} on {v.device}")


def conv_input(x: Tensor, history: Tensor, slots: Tensor, alpha: Tensor | None = None) -> Tensor:
    """See the module docstring."""
    _check_state(x, history, slots, "conv_input")
    _check_channel_vector(alpha, x, "alpha")
    b, c, n = x.shape
    ctx = history.shape[2]
    if not 1 <= ctx <= 1024:
        raise ValueError(f"conv_input needs a history of 1..1024 samples, got {ctx}")
    out = empty_as(x, (b, c, ctx + n))
    if b * c and n:
        # one more column of programs after the body's: each row tile's history, so the
        # body's programs carry none of its work (when every program also did the history
        # part under a mask, the time-major tiles, as wide in history as in body, took
        # 0.62 ms a 64 x 1 call on an H200 against 0.27 channel-major)
        rows, block = tile(x, n)
        rows = min(rows, max(1, 2 * TILE // triton.next_power_of_2(ctx)))  # history tile <= 2 tiles
        body_blocks = triton.cdiv(n, block)
        _conv_input_kernel[(triton.cdiv(b * c, rows), body_blocks + 1)](
            x, history, slots, alpha if alpha is not None else x, out, *x.stride(), *out.stride(), b * c, c, n,
            body_blocks,
            CTX=ctx, CTX_BLOCK=triton.next_power_of_2(ctx), ROWS=rows, BLOCK=block, SNAKE=alpha is not None,
            num_warps=4,
        )
    return out


def transposed_output(y: Tensor, tail: Tensor, slots: Tensor, bias: Tensor | None, emit: int) -> Tensor:
    """See the module docstring."""
    _check_state(y, tail, slots, "transposed_output")
    _check_channel_vector(bias, y, "bias")
    overlap = tail.shape[2]
    if not 1 <= overlap <= 1024 or y.shape[2] != emit + overlap or emit < 1:
        raise ValueError(f"transposed_output: y must be [B, C, emit + overlap] with 1 <= overlap <= 1024, "
                         f"got {list(y.shape)}, emit {emit}, overlap {overlap}")
    b, c, _ = y.shape
    out = empty_as(y, (b, c, emit))
    if b * c:
        # column blocks at least `overlap` wide: the old tail is added by the first one
        rows, block = tile(y, emit, at_least=overlap)
        _transposed_output_kernel[(triton.cdiv(b * c, rows), triton.cdiv(emit, block))](
            y, tail, slots, bias if bias is not None else y, out, *y.stride(), *out.stride(), b * c, c, emit,
            OVERLAP=overlap, OVERLAP_BLOCK=triton.next_power_of_2(overlap), ROWS=rows, BLOCK=block,
            BIAS=bias is not None, num_warps=4,
        )
    return out


def conv_input_reference(x: Tensor, history: Tensor, slots: Tensor, alpha: Tensor | None = None) -> Tensor:
    """`conv_input` in plain PyTorch (updates `history` the same way)."""
    _check_state(x, history, slots, "conv_input")
    if alpha is not None:
        x = snake_reference(x, alpha)
    full = torch.cat([history[slots], x], dim=-1)
    history[slots] = full[..., x.shape[-1]:]
    return full


def transposed_output_reference(y: Tensor, tail: Tensor, slots: Tensor, bias: Tensor | None, emit: int) -> Tensor:
    """`transposed_output` in plain PyTorch (updates `tail` the same way)."""
    _check_state(y, tail, slots, "transposed_output")
    overlap = tail.shape[2]
    y = y.float().clone()
    y[..., :overlap] += tail[slots].float()
    tail[slots] = y[..., emit:].to(tail.dtype)
    out = y[..., :emit]
    if bias is not None:
        out = out + bias.float()[:, None]
    return out.to(tail.dtype)


def self_check(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Compile and run both kernels against their references (state updates included),
    in both layouts the decoder uses (kernels/layout.py): None if they agree, else why
    not (the caller keeps the PyTorch path)."""
    try:
        g = torch.Generator().manual_seed(0)
        slots = torch.tensor([2, 0], device=device)
        for n, layout in ((3, "channel-major"), (40, "channel-major"), (3, "time-major"), (40, "time-major")):
            # (n: shorter and longer than the history)
            x = (torch.randn(2, 24, n, generator=g) * 3).to(device, dtype)
            alpha = (torch.rand(24, generator=g) * 2).to(device, dtype)
            history = torch.randn(3, 24, 18, generator=g).to(device, dtype)
            want_h = history.clone()
            x = as_layout(x, layout)
            want = conv_input_reference(x, want_h, slots, alpha)
            why = mismatch(f"conv_input ({layout})", conv_input(x, history, slots, alpha), want, dtype) or mismatch(
                f"conv_input's history ({layout})", history, want_h, dtype)
            if why:
                return why
            y = as_layout(torch.randn(2, 24, 4 * n + 4, generator=g).to(device, dtype), layout)
            bias, tail = torch.randn(24, generator=g).to(device, dtype), torch.randn(3, 24, 4, generator=g).to(device, dtype)
            want_t = tail.clone()
            want = transposed_output_reference(y, want_t, slots, bias, 4 * n)
            why = mismatch(f"transposed_output ({layout})", transposed_output(y, tail, slots, bias, 4 * n), want,
                           dtype) or mismatch(f"transposed_output's tail ({layout})", tail, want_t, dtype)
            if why:
                return why
        return None
    except Exception as e:  # a compile failure included
        return f"conv_state: {type(e).__name__}: {e}"
