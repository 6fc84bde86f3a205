"""The decode-attention kernel against its PyTorch reference (Triton interpreter on the
CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.kv_fp8 import pack_kv, unpack_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def case(b, h, k, d, rows, cache_len, lengths, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=g).to(DEVICE, dtype)
    kc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    vc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    slots = torch.randperm(rows, generator=g)[:b].to(DEVICE)
    return q, kc, vc, slots, torch.tensor(lengths, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, k, d, lengths", [
    (3, 8, 2, 16, [1, 300, 517]),  # group 4, lengths across split boundaries
    (2, 4, 4, 32, [33, 256]),  # multi-head (group 1), exactly one split
    (1, 16, 2, 64, [600]),  # group 8
    (5, 2, 1, 16, [7, 1, 257, 64, 31]),
])
def test_matches_reference(b, h, k, d, lengths, dtype):
    q, kc, vc, slots, lens = case(b, h, k, d, rows=7, cache_len=600, lengths=lengths, dtype=dtype)
    out = decode_attention(q, kc, vc, slots, lens)
    ref = decode_attention_reference(q, kc, vc, slots, lens)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < TOL[dtype], err


def test_ignores_positions_past_each_length():
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=300, lengths=[10, 200], dtype=torch.float32)
    before = decode_attention(q, kc, vc, slots, lens)
    kc[:, 200:] = 1e4  # garbage beyond every length (e.g. a longer previous stream in the row)
    vc[:, 200:] = float("nan")
    assert torch.equal(decode_attention(q, kc, vc, slots, lens), before)


def test_max_length_bounds_the_splits_for_graphs():
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=1024, lengths=[5, 300], dtype=torch.float32)
    full = decode_attention(q, kc, vc, slots, lens)
    bounded = decode_attention(q, kc, vc, slots, lens, max_length=512)
    torch.testing.assert_close(full, bounded, rtol=1e-5, atol=1e-6)


def test_launcher_checks_shapes():
    q, kc, vc, slots, lens = case(2, 6, 2, 16, rows=3, cache_len=64, lengths=[1, 2], dtype=torch.float32)
    with pytest.raises(ValueError, match="powers of two"):
        decode_attention(q, kc, vc, slots, lens)  # group 3
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=64, lengths=[1, 2], dtype=torch.float32)
    with pytest.raises(ValueError, match="int64"):
        decode_attention(q, kc, vc, slots.int(), lens)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, kc, vc[:, :, :1], slots, lens)


# --- the FP8 KV cache (kernels/kv_fp8.py) ----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, k, d, lengths", [
    (3, 8, 2, 16, [1, 300, 517]),
    (1, 16, 2, 64, [600]),
    (2, 32, 8, 128, [5, 260]),  # the S2-Pro heads
])
def test_fp8_cache_matches_the_reference_on_its_own_values(b, h, k, d, lengths, dtype):
    """Read from packed caches, the kernel gives the reference's attention over the
    dequantized values (what the cache holds), within the dtype's tolerance. Values of very
    different sizes from one position to the next, so their scales differ along the
    positions (a scale applied to the wrong position shows)."""
    q, kc, vc, slots, lens = case(b, h, k, d, rows=7, cache_len=600, lengths=lengths, dtype=dtype)
    vc = vc * torch.logspace(-3, 3, vc.shape[1], base=2.0, device=vc.device, dtype=vc.dtype)[None, :, None, None]
    kp, vp = pack_kv(kc), pack_kv(vc)
    out = decode_attention(q, kp, vp, slots, lens)
    ref = decode_attention_reference(q, unpack_kv(kp, dtype), unpack_kv(vp, dtype), slots, lens)
    assert torch.equal(ref, decode_attention_reference(q, kp, vp, slots, lens))  # the reference reads packed caches too
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < TOL[dtype], err
    # and against the unquantized cache: the e4m3 rounding of keys and values, a few percent
    full = decode_attention_reference(q, kc, vc, slots, lens)
    err = ((out.float() - full.float()).norm() / full.float().norm()).item()
    assert err < 0.08, err


def test_fp8_cache_ignores_positions_past_each_length():
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=300, lengths=[10, 200], dtype=torch.float32)
    kp, vp = pack_kv(kc), pack_kv(vc)
    before = decode_attention(q, kp, vp, slots, lens)
    kp[:, 200:] = 255  # garbage beyond every length: NaN codes and a NaN scale
    vp[:, 200:] = 255
    assert torch.equal(decode_attention(q, kp, vp, slots, lens), before)


def test_fp8_launcher_checks_layouts():
    q, kc, vc, slots, lens = case(2, 4, 2, 16, rows=3, cache_len=64, lengths=[1, 2], dtype=torch.float32)
    with pytest.raises(ValueError, match="share a layout"):
        decode_attention(q, pack_kv(kc), vc, slots, lens)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, pack_kv(torch.cat([kc, kc], -1)), pack_kv(torch.cat([vc, vc], -1)), slots, lens)
    with pytest.raises(ValueError, match="share a dtype"):
        decode_attention(q, kc.bfloat16(), vc.bfloat16(), slots, lens)


def test_launch_choices_give_the_same_attention():
    """block / num_warps / num_stages (latency_bench.attention_bench's sweep) change how the
    kernel runs, not what it computes."""
    q, kc, vc, slots, lens = case(3, 8, 2, 16, rows=5, cache_len=300, lengths=[1, 130, 300], dtype=torch.float32)
    base = decode_attention(q, kc, vc, slots, lens)
    for split, block in ((256, 16), (256, 128), (64, 32), (512, 64)):
        torch.testing.assert_close(decode_attention(q, kc, vc, slots, lens, block=block, num_warps=2, num_stages=1,
                                                    split=split), base, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="block"):
        decode_attention(q, kc, vc, slots, lens, block=48)


def test_attention_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.attention_bench import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_bench.json").read_text())["rows"]
    assert [r["fp8"] for r in rows] == [False, True] and all(r["us"] > 0 for r in rows)


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
    out = decode_attention(q, kc, vc, slots, lens, max_length=530)
    ref = decode_attention_reference(q, kc, vc, slots, lens)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < TOL[dtype], err


# --- shared voice prefixes (prefix_rows / prefix_lens) ---------------------------------

def shared_prefix_case(fp8: bool, prefix: int, lengths: list[int], dtype=torch.float32):
    """Rows 0-3 hold the same first `prefix` positions (one voice prompt copied into
    each stream's row), rows 4-5 another; positions past the prefix differ per row."""
    b = len(lengths)
    q, kc, vc, _, lens = case(b, 8, 2, 16, rows=7, cache_len=600, lengths=lengths, dtype=dtype)
    for cache in (kc, vc):
        cache[1:4, :prefix] = cache[0, :prefix]
        cache[5, :prefix] = cache[4, :prefix]
    if fp8:
        kc, vc = pack_kv(kc), pack_kv(vc)
    slots = torch.tensor([0, 1, 2, 3, 4, 5][:b], device=DEVICE)
    leaders = torch.tensor([0, 0, 0, 0, 4, 4][:b], device=DEVICE)
    return q, kc, vc, slots, lens, leaders, torch.full((b,), prefix, device=DEVICE)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("prefix, lengths, split", [
    (340, [1, 300, 341, 599, 340, 517], None),  # a stream shorter than the prefix, one at its edge
    (100, [600, 64, 101, 257, 5, 600], 64),  # the prefix ends inside a split and inside a block
    (0, [10, 20, 30, 40, 50, 60], None),  # no prefix: every position from the stream's own row
])
def test_shared_prefix_gives_the_same_bits(fp8, prefix, lengths, split):
    """Read through one row per voice, the attention is bit for bit the attention over each
    stream's own copy: the same values in the same order."""
    q, kc, vc, slots, lens, leaders, plens = shared_prefix_case(fp8, prefix, lengths)
    own = decode_attention(q, kc, vc, slots, lens, split=split)
    shared = decode_attention(q, kc, vc, slots, lens, split=split, prefix_rows=leaders, prefix_lens=plens)
    assert torch.equal(own, shared)


@pytest.mark.parametrize("fp8", [False, True])
def test_shared_prefix_reads_the_prefix_row_and_the_rest_from_its_own(fp8):
    """Garbage in the followers' copies of the prefix changes nothing: each stream reads
    its prefix from the leader's row and everything after it from its own. Without the
    prefix rows the same garbage does change the output (so the check can fail)."""
    prefix, lengths = 200, [400, 450, 201, 150, 300, 500]
    q, kc, vc, slots, lens, leaders, plens = shared_prefix_case(fp8, prefix, lengths)
    clean = decode_attention(q, kc, vc, slots, lens)
    followers = torch.tensor([1, 2, 3, 5], device=DEVICE)
    for cache in (kc, vc):  # fp8: NaN codes and scales; else large values
        cache[followers, :prefix] = 255 if fp8 else 1e3
    assert torch.equal(decode_attention(q, kc, vc, slots, lens, prefix_rows=leaders, prefix_lens=plens), clean)
    spoiled = decode_attention(q, kc, vc, slots, lens)
    assert not torch.equal(spoiled[followers], clean[followers])
    assert torch.equal(spoiled[[0, 4]], clean[[0, 4]])  # the leaders read their own rows either way
    ref = decode_attention_reference(q, kc, vc, slots, lens, prefix_rows=leaders, prefix_lens=plens)
    err = ((clean.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < TOL[torch.float32], err


def test_shared_prefix_arguments_are_checked():
    q, kc, vc, slots, lens, leaders, plens = shared_prefix_case(False, 10, [20, 20])
    with pytest.raises(ValueError, match="prefix_rows and prefix_lens"):
        decode_attention(q, kc, vc, slots, lens, prefix_rows=leaders)
    with pytest.raises(ValueError, match="prefix_rows and prefix_lens"):
        decode_attention(q, kc, vc, slots, lens, prefix_rows=leaders.int(), prefix_lens=plens)


def test_shared_prefix_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.attention_bench import main

    assert main(["--smoke", "--shared-prefix", "20", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_shared_prefix.json").read_text())["rows"]
    assert [r["fp8"] for r in rows] == [False, True] and all(r["own_us"] > 0 and r["shared_us"] > 0 for r in rows)
