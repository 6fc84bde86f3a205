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
