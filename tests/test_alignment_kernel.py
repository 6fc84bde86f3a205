"""The word-timestamp readout kernel (kernels/text_attention.py) against its PyTorch
reference over shuffled KV pages (Triton interpreter on the CPU, compiled on a GPU):
each row's selected heads' softmax over its own text span, zeros past it and for rows
without one."""

from __future__ import annotations

import os

import pytest
import torch

from kernels.kv_fp8 import pack_kv
from kernels.text_attention import text_attention, text_attention_reference
from tests.paged_kv import to_pages

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="Triton kernels run on a GPU or under TRITON_INTERPRET=1")


def case(dtype, page=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows, length, kv, d, h = 5, 300, 2, 32, 6
    q = torch.randn(4, h, d, generator=g).to(DEVICE, dtype)
    keys = (3 * torch.randn(rows, length, kv, d, generator=g)).to(DEVICE, dtype)
    cache, table = to_pages(keys, page)
    slots = torch.tensor([3, 0, 4, 1], device=DEVICE)
    # (text start, length): a span across pages, one longer than T (cut at T), one empty,
    # one of a single token
    spans = torch.tensor([[7, 40], [5, 0], [20, 20], [236, 100], [33, 1]], device=DEVICE)
    heads = torch.tensor([5, 0, 2], device=DEVICE)
    return q, keys, cache, table, slots, spans, heads


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_and_the_definition(dtype):
    q, keys, cache, table, slots, spans, heads = case(dtype)
    T = 64
    out = text_attention(q, cache, table, slots, spans, heads, T)
    ref = text_attention_reference(q, cache, table, slots, spans, heads, T)
    assert out.shape == ref.shape == (4, 3, T) and not out.isnan().any()
    assert torch.allclose(out, ref, atol=1e-5 if dtype == torch.float32 else 2e-3), (out - ref).abs().max()
    # the definition, row by row, from the contiguous keys
    for b, slot in enumerate(slots.tolist()):
        start, n = spans[slot].tolist()
        n = min(n, T)
        for s, h in enumerate(heads.tolist()):
            if n == 0:
                assert not out[b, s].any()
                continue
            k = keys[slot, start : start + n, h // 3].float()
            p = (k @ q[b, h].float() * q.shape[-1] ** -0.5).softmax(-1)
            assert torch.allclose(out[b, s, :n], p, atol=1e-5 if dtype == torch.float32 else 2e-3)
            assert not out[b, s, n:].any()


def test_reference_reads_packed_fp8_caches():
    q, keys, _, _, slots, spans, heads = case(torch.bfloat16)
    packed, table = to_pages(pack_kv(keys), 16)
    plain, table2 = to_pages(keys, 16)
    a = text_attention_reference(q, packed, table, slots, spans, heads, 64)
    b = text_attention_reference(q, plain, table2, slots, spans, heads, 64)
    assert (a - b).abs().max() < 0.1 and torch.allclose(a.sum(-1), b.sum(-1), atol=1e-4)
