"""The decode-attention kernel over paged KV caches against its PyTorch reference and
against the same rows read contiguously (Triton interpreter on the CPU, compiled on a
GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.kv_fp8 import pack_kv, unpack_kv
from tests.paged_kv import row_table, spoil_past, to_pages

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def case(b, h, k, d, rows, cache_len, lengths, dtype, seed=0):
    """q [b, h, d] and contiguous k/v rows [rows, cache_len, k, d]; slots, lengths."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=g).to(DEVICE, dtype)
    kc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    vc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    slots = torch.randperm(rows, generator=g)[:b].to(DEVICE)
    return q, kc, vc, slots, torch.tensor(lengths, device=DEVICE)


def paged_case(b, h, k, d, rows, cache_len, lengths, dtype, page=16, **pages):
    q, kc, vc, slots, lens = case(b, h, k, d, rows, cache_len, lengths, dtype)
    (kp, table), (vp, _) = to_pages(kc, page, **pages), to_pages(vc, page, **pages)
    return q, kp, vp, table, slots, lens


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("page", [16, 32, 64])
@pytest.mark.parametrize("kind", ["fp32", "bf16", "fp8"])
def test_paged_equals_contiguous_and_the_reference(page, kind):
    """The same rows scattered into shuffled pages: bit for bit the attention over the
    contiguous rows (the same values in the same order), and the reference's within the
    dtype's tolerance. Lengths of 1, on and off page boundaries and across the 256-position
    split; a page table wider than needed; rows 1 and 3 read their first pages from row 0's
    (their own copies hold garbage)."""
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    lengths = [300, 2 * page + 5, 3 * page, 1, 512]
    q, kc, vc, _, lens = case(5, 8, 2, 16, rows=6, cache_len=512, lengths=lengths, dtype=dtype)
    slots = torch.tensor([0, 1, 3, 4, 5], device=DEVICE)  # row 2 is not in the call
    for c in (kc, vc):  # the voice prompt's pages
        c[1, : 2 * page] = c[0, : 2 * page]
        c[3, :page] = c[0, :page]
    if kind == "fp8":  # values of very different sizes along the positions: a misplaced scale shows
        vc = vc * torch.logspace(-3, 3, 512, base=2.0, device=DEVICE, dtype=dtype)[None, :, None, None]
        kc, vc = pack_kv(kc), pack_kv(vc)
    shared = [(0, 1, 2), (0, 3, 1)]
    (kp, table), (vp, _) = to_pages(kc, page, shared=shared), to_pages(vc, page, shared=shared)
    assert torch.equal(table[1, :2], table[0, :2]) and table.shape[1] > 512 // page
    out = decode_attention(q, kp, vp, table, slots, lens, max_length=512)
    assert not out.isnan().any()
    assert torch.equal(out, decode_attention(q, kc, vc, row_table(kc), slots, lens, max_length=512))
    ref = decode_attention_reference(q, kp, vp, table, slots, lens)
    assert torch.equal(ref, decode_attention_reference(q, kc, vc, row_table(kc), slots, lens))
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("page", [16, 32, 64])
def test_every_block_size_reads_every_page_size(page):
    """Blocks within a page, one page a block and blocks across pages give the contiguous
    rows' bits."""
    q, kc, vc, slots, lens = case(3, 8, 2, 16, rows=4, cache_len=256, lengths=[1, 77, 256], dtype=torch.float32)
    (kp, table), (vp, _) = to_pages(kc, page, seed=1), to_pages(vc, page, seed=1)
    for block in (16, 32, 64):
        launch = dict(split=128, block=block, num_warps=2, num_stages=1, max_length=256)
        assert torch.equal(decode_attention(q, kp, vp, table, slots, lens, **launch),
                           decode_attention(q, kc, vc, row_table(kc), slots, lens, **launch)), block


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, k, d, lengths", [
    (3, 8, 2, 16, [1, 300, 517]),  # group 4, lengths across split boundaries
    (2, 4, 4, 32, [33, 256]),  # multi-head (group 1), exactly one split
    (1, 16, 2, 64, [600]),  # group 8
    (5, 2, 1, 16, [7, 1, 257, 64, 31]),
])
def test_matches_reference(b, h, k, d, lengths, dtype):
    q, kc, vc, table, slots, lens = paged_case(b, h, k, d, 7, 600, lengths, dtype, page=32)
    out = decode_attention(q, kc, vc, table, slots, lens)
    assert rel_err(out, decode_attention_reference(q, kc, vc, table, slots, lens)) < TOL[dtype]


@pytest.mark.parametrize("fp8", [False, True])
def test_ignores_positions_past_each_length(fp8):
    """Garbage at every position past each stream's length, in its last page and in the
    pages its table row points at beyond it, changes nothing."""
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=300, lengths=[10, 200], dtype=torch.float32)
    if fp8:
        kc, vc = pack_kv(kc), pack_kv(vc)
    (kp, table), (vp, _) = to_pages(kc, 16), to_pages(vc, 16)
    before = decode_attention(q, kp, vp, table, slots, lens)
    for c in (kp, vp):
        spoil_past(c, table, slots, lens)
    assert torch.equal(decode_attention(q, kp, vp, table, slots, lens), before)


def test_max_length_bounds_the_splits_for_graphs():
    q, kc, vc, table, slots, lens = paged_case(2, 4, 2, 16, 3, 1024, [5, 300], torch.float32, spare_columns=0)
    full = decode_attention(q, kc, vc, table, slots, lens)  # 1024 positions: 4 splits
    bounded = decode_attention(q, kc, vc, table, slots, lens, max_length=512)
    torch.testing.assert_close(full, bounded, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="max_length 1040 exceeds"):
        decode_attention(q, kc, vc, table, slots, lens, max_length=1040)


def test_launcher_checks_shapes():
    q, kc, vc, table, slots, lens = paged_case(2, 6, 2, 16, 3, 64, [1, 2], torch.float32)
    with pytest.raises(ValueError, match="powers of two"):
        decode_attention(q, kc, vc, table, slots, lens)  # group 3
    q, kc, vc, table, slots, lens = paged_case(2, 4, 2, 16, 3, 64, [1, 2], torch.float32)
    with pytest.raises(ValueError, match="int64"):
        decode_attention(q, kc, vc, table, slots.int(), lens)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, kc, vc[:, :, :1], table, slots, lens)
    with pytest.raises(ValueError, match="page table"):
        decode_attention(q, kc, vc, table.long(), slots, lens)
    with pytest.raises(ValueError, match="page table"):
        decode_attention(q, kc, vc, table[:, ::2], slots, lens)  # not contiguous
    with pytest.raises(ValueError, match="page table"):
        decode_attention(q, kc, vc, table[0], slots, lens)
    with pytest.raises(ValueError, match="page size 12"):
        decode_attention(q, kc[:, :12], vc[:, :12], table, slots, lens)


# --- the FP8 KV cache (kernels/kv_fp8.py) ----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, k, d, lengths", [
    (3, 8, 2, 16, [1, 300, 517]),
    (2, 32, 8, 128, [5, 260]),  # the S2-Pro heads
])
def test_fp8_cache_matches_the_reference_on_its_own_values(b, h, k, d, lengths, dtype):
    """Read from packed pages, the kernel gives the reference's attention over the
    dequantized values (what the cache holds), within the dtype's tolerance; and the
    unquantized values' within the e4m3 rounding."""
    q, kc, vc, slots, lens = case(b, h, k, d, rows=7, cache_len=600, lengths=lengths, dtype=dtype)
    vc = vc * torch.logspace(-3, 3, vc.shape[1], base=2.0, device=vc.device, dtype=vc.dtype)[None, :, None, None]
    (kp, table), (vp, _) = to_pages(pack_kv(kc), 64), to_pages(pack_kv(vc), 64)
    out = decode_attention(q, kp, vp, table, slots, lens)
    ref = decode_attention_reference(q, unpack_kv(kp, dtype), unpack_kv(vp, dtype), table, slots, lens)
    # the reference reads packed caches too
    assert torch.equal(ref, decode_attention_reference(q, kp, vp, table, slots, lens))
    assert rel_err(out, ref) < TOL[dtype]
    full = decode_attention_reference(q, kc, vc, row_table(kc), slots, lens)  # e4m3 rounding: a few percent
    assert rel_err(out, full) < 0.08


def test_fp8_launcher_checks_layouts():
    q, kc, vc, table, slots, lens = paged_case(2, 4, 2, 16, 3, 64, [1, 2], torch.float32)
    with pytest.raises(ValueError, match="share a layout"):
        decode_attention(q, pack_kv(kc), vc, table, slots, lens)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, pack_kv(torch.cat([kc, kc], -1)), pack_kv(torch.cat([vc, vc], -1)), table, slots, lens)
    with pytest.raises(ValueError, match="share a dtype"):
        decode_attention(q, kc.bfloat16(), vc.bfloat16(), table, slots, lens)


# --- launch choices -----------------------------------------------------------------------

def test_launch_choices_give_the_same_attention():
    """block / num_warps / num_stages (latency_bench.attention_bench's sweep) change how the
    kernel runs, not what it computes."""
    q, kc, vc, table, slots, lens = paged_case(3, 8, 2, 16, 5, 300, [1, 130, 300], torch.float32, page=32)
    base = decode_attention(q, kc, vc, table, slots, lens)
    for split, block in ((256, 16), (256, 128), (64, 32), (512, 64)):
        torch.testing.assert_close(decode_attention(q, kc, vc, table, slots, lens, block=block, num_warps=2,
                                                    num_stages=1, split=split), base, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="block"):
        decode_attention(q, kc, vc, table, slots, lens, block=48)


def test_default_launch_follows_the_batch_and_the_cache_kind():
    from kernels.decode_attention import LARGE_BF16, LARGE_FP8, SMALL, launch_choice

    assert launch_choice(1, 8, fp8=False) == SMALL  # batch 1: short splits fill the SMs
    assert launch_choice(64, 8, fp8=False) == LARGE_BF16
    assert launch_choice(64, 8, fp8=True) == LARGE_FP8
    for c in (SMALL, LARGE_BF16, LARGE_FP8):
        assert c.split % c.block == 0


@pytest.mark.parametrize("fp8, dtype", [(False, torch.float32), (True, torch.bfloat16)])
def test_large_batch_launch_matches_the_reference(fp8, dtype):
    """32 rows x 8 KV heads take the large-batch launch (512-position splits, 2 warps);
    lengths across the 256 and 512 boundaries."""
    from kernels.decode_attention import LARGE_BF16, launch_choice

    lengths = [1 + (97 * i) % 529 for i in range(32)]
    q, kc, vc, slots, lens = case(32, 16, 8, 16, rows=33, cache_len=530, lengths=lengths, dtype=dtype)
    assert launch_choice(32, 8, fp8) != launch_choice(1, 8, fp8) and LARGE_BF16.split == 512
    if fp8:
        kc, vc = pack_kv(kc), pack_kv(vc)
    (kp, table), (vp, _) = to_pages(kc, 16), to_pages(vc, 16)
    out = decode_attention(q, kp, vp, table, slots, lens, max_length=530)
    assert rel_err(out, decode_attention_reference(q, kp, vp, table, slots, lens)) < TOL[dtype]


# --- the benchmark script -----------------------------------------------------------------

def test_attention_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.attention_bench import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_bench.json").read_text())["rows"]
    assert [r["fp8"] for r in rows] == [False, True] and all(r["us"] > 0 for r in rows)


def test_shared_pages_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.attention_bench import main

    assert main(["--smoke", "--shared-prefix", "20", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_shared_prefix.json").read_text())["rows"]
    assert [r["fp8"] for r in rows] == [False, True] and all(r["own_us"] > 0 and r["shared_us"] > 0 for r in rows)
