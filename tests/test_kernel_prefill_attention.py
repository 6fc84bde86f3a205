"""The prefill-attention kernel over paged KV caches against its PyTorch reference, against
the same rows read contiguously and against the decode kernel it replaces in the batched
prefill (Triton interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.decode_attention import decode_attention
from kernels.prefill_attention import prefill_attention, prefill_attention_reference
from tests.paged_kv import row_table, spoil_past, to_pages

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def case(h, k, d, s, starts, lengths, dtype, rows=6, cache_len=400, seed=0):
    """q [B, s, h, d] and contiguous k/v rows [rows, cache_len, k, d]; slots, starts, lengths."""
    g = torch.Generator().manual_seed(seed)
    b = len(starts)
    q = torch.randn(b, s, h, d, generator=g).to(DEVICE, dtype)
    kc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    vc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    slots = torch.randperm(rows, generator=g)[:b].to(DEVICE)
    as_tensor = lambda x: torch.tensor(x, device=DEVICE)  # noqa: E731
    return q, kc, vc, slots, as_tensor(starts), as_tensor(lengths)


def paged_case(h, k, d, s, starts, lengths, dtype, page=16, **kw):
    q, kc, vc, slots, st, ln = case(h, k, d, s, starts, lengths, dtype, **kw)
    (kp, table), (vp, _) = to_pages(kc, page), to_pages(vc, page)
    return q, kp, vp, table, slots, st, ln


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("page", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_equals_contiguous_and_the_reference(page, dtype):
    """Segments after a 70-position voice prompt whose full pages rows 1 and 2 share with
    row 0 (their own copies hold garbage), a prompt prefilled from position 0, one query
    deep in, a padded row (no new positions): bit for bit the attention over the
    contiguous rows, and the reference's within the dtype's tolerance."""
    starts, lengths = [70, 70, 0, 130, 5], [40, 33, 40, 1, 0]
    q, kc, vc, _, st, ln = case(8, 2, 16, 40, starts, lengths, dtype, rows=5, cache_len=256)
    slots = torch.tensor([1, 2, 3, 4, 0], device=DEVICE)
    full = 70 // page  # the prompt's full pages
    for c in (kc, vc):
        c[1:3, : full * page] = c[0, : full * page]
    shared = [(0, 1, full), (0, 2, full)]
    (kp, table), (vp, _) = to_pages(kc, page, shared=shared), to_pages(vc, page, shared=shared)
    out = prefill_attention(q, kp, vp, table, slots, st, ln)
    assert not out.isnan().any()
    assert torch.equal(out, prefill_attention(q, kc, vc, row_table(kc), slots, st, ln))
    ref = prefill_attention_reference(q, kp, vp, table, slots, st, ln)
    assert torch.equal(ref, prefill_attention_reference(q, kc, vc, row_table(kc), slots, st, ln))
    assert rel_err(out, ref) < TOL[dtype]
    for i, n in enumerate(lengths):  # padding positions come out as zeros
        assert not out[i, n:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h, k, d, s, starts, lengths", [
    (8, 2, 16, 40, [0, 300, 17], [40, 33, 1]),  # group 4; from position 0, deep in, one query
    (4, 4, 32, 20, [5, 64], [20, 0]),  # group 1; a padding stream (no new positions)
    (16, 2, 16, 17, [100, 0, 63], [17, 16, 2]),  # group 8; a query block split across 17
])
def test_matches_reference(h, k, d, s, starts, lengths, dtype):
    q, kc, vc, table, slots, st, ln = paged_case(h, k, d, s, starts, lengths, dtype, page=32)
    out = prefill_attention(q, kc, vc, table, slots, st, ln)
    assert rel_err(out, prefill_attention_reference(q, kc, vc, table, slots, st, ln)) < TOL[dtype]
    for i, n in enumerate(lengths):
        assert not out[i, n:].any()


def test_matches_one_decode_query_per_position():
    """What the batched prefill computed before: each new position a decode query of its
    row with length position + 1."""
    q, kc, vc, table, slots, st, ln = paged_case(8, 2, 16, 24, [0, 200, 31], [24, 10, 17], torch.float32)
    out = prefill_attention(q, kc, vc, table, slots, st, ln)
    for i in range(3):
        n, a = int(ln[i]), int(st[i])
        each = decode_attention(q[i, :n], kc, vc, table, slots[i].repeat(n), a + torch.arange(1, n + 1, device=DEVICE))
        torch.testing.assert_close(out[i, :n], each, rtol=1e-4, atol=1e-5)


def test_reads_no_key_past_its_position():
    """Garbage past every stream's last new position (the rest of its last page, the pages
    its table row points at beyond it) changes nothing."""
    q, kc, vc, table, slots, st, ln = paged_case(8, 2, 16, 20, [10, 50], [20, 7], torch.float32)
    before = prefill_attention(q, kc, vc, table, slots, st, ln)
    for c in (kc, vc):
        spoil_past(c, table, slots, st + ln)
    assert torch.equal(prefill_attention(q, kc, vc, table, slots, st, ln), before)


def test_a_rows_output_does_not_depend_on_the_batch():
    """A stream prefilled alone gets the bits it gets beside others (batch invariance)."""
    q, kc, vc, table, slots, st, ln = paged_case(8, 2, 16, 40, [0, 120, 7], [40, 21, 3], torch.float32)
    together = prefill_attention(q, kc, vc, table, slots, st, ln)
    for i in range(3):
        n = int(ln[i])
        alone = prefill_attention(q[i : i + 1, :n], kc, vc, table, slots[i : i + 1], st[i : i + 1], ln[i : i + 1])
        assert torch.equal(alone[0], together[i, :n])


def test_max_length_changes_nothing():
    q, kc, vc, table, slots, st, ln = paged_case(8, 2, 16, 16, [3, 100], [16, 9], torch.float32)
    assert torch.equal(prefill_attention(q, kc, vc, table, slots, st, ln, max_length=128),
                       prefill_attention(q, kc, vc, table, slots, st, ln))


def test_launcher_checks_its_inputs():
    q, kc, vc, table, slots, st, ln = paged_case(8, 2, 16, 8, [0, 0], [8, 8], torch.float32)
    with pytest.raises(ValueError, match="int64"):
        prefill_attention(q, kc, vc, table, slots.int(), st, ln)
    with pytest.raises(ValueError, match="do not fit"):
        prefill_attention(q, kc, vc[:, :, :1], table, slots, st, ln)
    with pytest.raises(ValueError, match="share a dtype"):
        prefill_attention(q, kc.double(), vc.double(), table, slots, st, ln)
    with pytest.raises(ValueError, match="FP8"):
        prefill_attention(q, kc.to(torch.uint8), vc.to(torch.uint8), table, slots, st, ln)
    with pytest.raises(ValueError, match="page table"):
        prefill_attention(q, kc, vc, table.long(), slots, st, ln)
    with pytest.raises(ValueError, match="page size 12"):
        prefill_attention(q, kc[:, :12], vc[:, :12], table, slots, st, ln)
    with pytest.raises(ValueError, match="max_length"):
        prefill_attention(q, kc, vc, table, slots, st, ln, max_length=10_000)
