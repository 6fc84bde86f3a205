"""Cascade decode attention (kernels/cascade_attention.py) against the reference of
decode attention with shared prefix rows (Triton interpreter on the CPU, compiled on a
GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.cascade_attention import PrefixLaunch, cascade_attention
from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.kv_fp8 import pack_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# small blocks so that a few streams span several query blocks and prefix splits
SMALL = PrefixLaunch(streams=2, split=64, block=32)


def voices_case(prefixes: dict[int, int], voice_of: list[int | None], lengths: list[int], fp8=False,
                dtype=torch.float32, h=8, k=2, d=16, cache_len=300, seed=0):
    """Stream i decodes in row i + 1 (row 0 is a spare, the last row the padding's
    scratch row). voice_of[i]: the voice whose prompt (prefixes[voice] positions, the same
    bits in every row that holds it) stream i's row starts with, or None. The prefix row
    of a voice is the row of its first stream, as engine/runner.py stages it; padding
    entries (voice "pad") point at the scratch row with length 1 and no prefix.
    -> q, k, v, slots, lengths, prefix_rows, prefix_lens."""
    b, rows = len(lengths), len(lengths) + 2
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=g).to(DEVICE, dtype)
    kc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    vc = torch.randn(rows, cache_len, k, d, generator=g).to(DEVICE, dtype)
    prompts = {v: (torch.randn(n, k, d, generator=g).to(DEVICE, dtype), torch.randn(n, k, d, generator=g).to(DEVICE, dtype))
               for v, n in prefixes.items()}
    scratch = rows - 1
    slots, prefix_rows, prefix_lens, first = [], [], [], {}
    for i, voice in enumerate(voice_of):
        slot = scratch if voice == "pad" else i + 1
        slots.append(slot)
        if voice is None or voice == "pad":
            prefix_rows.append(slot)
            prefix_lens.append(0)
            continue
        kc[slot, : prefixes[voice]], vc[slot, : prefixes[voice]] = prompts[voice]
        prefix_rows.append(first.setdefault(voice, slot))
        prefix_lens.append(prefixes[voice])
    if fp8:
        kc, vc = pack_kv(kc), pack_kv(vc)
    lens = [1 if v == "pad" else n for v, n in zip(voice_of, lengths)]
    as_t = lambda x: torch.tensor(x, device=DEVICE)  # noqa: E731
    return q, kc, vc, as_t(slots), as_t(lens), as_t(prefix_rows), as_t(prefix_lens)


def assert_matches_reference(out, q, kc, vc, slots, lens, rows, plens, dtype):
    ref = decode_attention_reference(q, kc, vc, slots, lens, prefix_rows=rows, prefix_lens=plens)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < TOL[dtype], err


# two voices (A: 100 positions, inside a block and a split of SMALL; B: 128, at a split
# boundary of SMALL), streams without a prompt, padding, a voice of one stream (C), a
# stream shorter than its prompt and one exactly as long (no own positions)
MIXED = dict(
    prefixes={"A": 100, "B": 128, "C": 70},
    voice_of=["A", None, "B", "A", "B", "C", "A", None, "B", "pad", "pad"],
    lengths=[290, 40, 200, 100, 128, 71, 60, 300, 129, 0, 0],
)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("launch", [None, SMALL], ids=["default", "small"])
def test_matches_the_reference(fp8, dtype, launch):
    q, kc, vc, slots, lens, rows, plens = voices_case(**MIXED, fp8=fp8, dtype=dtype)
    out = cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=launch)
    assert_matches_reference(out, q, kc, vc, slots, lens, rows, plens, dtype)


@pytest.mark.parametrize("prefix, lengths", [
    (64, [64, 65, 200, 64]),  # at a split boundary, lengths at it
    (33, [33, 34, 1, 250]),  # inside a block; a stream of length 1 (shorter than its prompt)
    (250, [250, 260, 251, 299]),  # several prefix splits
])
def test_one_voice(prefix, lengths):
    q, kc, vc, slots, lens, rows, plens = voices_case({"A": prefix}, ["A"] * len(lengths), lengths)
    for launch in (SMALL, PrefixLaunch(streams=1, split=32, block=16), None):
        out = cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=launch)
        assert_matches_reference(out, q, kc, vc, slots, lens, rows, plens, torch.float32)


def test_no_prefix_is_the_decode_kernel_bit_for_bit():
    """Without prefixes nothing goes through the prefix kernel and the own part is the
    decode kernel's splits: the same bits."""
    q, kc, vc, slots, lens, rows, plens = voices_case({}, [None, None, "pad", None], [5, 300, 0, 129])
    assert torch.equal(cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=SMALL),
                       decode_attention(q, kc, vc, slots, lens))


@pytest.mark.parametrize("fp8", [False, True])
def test_the_prefix_is_read_from_the_prefix_row(fp8):
    """Garbage in the followers' copies of their prompts changes nothing (each reads its
    voice's prompt from the first stream's row); without prefix rows it would."""
    case = dict(MIXED)
    q, kc, vc, slots, lens, rows, plens = voices_case(**case, fp8=fp8)
    clean = cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=SMALL)
    followers = [i for i in range(len(slots)) if plens[i] > 0 and rows[i] != slots[i]]
    for i in followers:
        for cache in (kc, vc):  # fp8: NaN codes and scales; else large values
            cache[slots[i], : plens[i]] = 255 if fp8 else 1e3
    assert torch.equal(cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=SMALL), clean)
    spoiled = decode_attention(q, kc, vc, slots, lens)
    assert not torch.equal(spoiled[followers], clean[followers])


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("launch", [None, SMALL], ids=["default", "small"])
def test_a_stream_gets_the_same_bits_alone_in_its_group(fp8, launch):
    """Every stream of a voice holds the same prompt bits, so pointing each at its own row
    (every stream a group of one) gives the same function: the cascade gives each stream
    the same bits either way (its rows' dots and softmax are its own)."""
    q, kc, vc, slots, lens, rows, plens = voices_case(**MIXED, fp8=fp8)
    grouped = cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=launch)
    alone = cascade_attention(q, kc, vc, slots, lens, slots, plens, prefix=launch)
    assert torch.equal(grouped, alone)
    # and the streams of voice A with B's streams and those without a voice dropped from the batch
    a = [i for i, v in enumerate(MIXED["voice_of"]) if v == "A"]
    only_a = cascade_attention(q[a], kc, vc, slots[a], lens[a], rows[a], plens[a], prefix=launch)
    if DEVICE == "cuda":
        assert torch.equal(only_a, grouped[a])
    else:
        # the interpreter's tl.dot is numpy's matmul, whose BLAS may sum a row in another
        # order when it sits at another row of the tile: on an AVX-512 host (2026-12-06)
        # the default launch (several streams a program) differed by up to 1e-7 in 41% of
        # the values, the same code and wheels that gave equal bits on an earlier host
        torch.testing.assert_close(only_a, grouped[a], rtol=1e-5, atol=1e-6)


def test_nothing_unwritten_is_read(monkeypatch):
    """The partial buffers start as NaN: a split the combine read without a kernel writing
    it in this call would show. Two calls with different groupings in a row (a stale
    split of the first would be read by the second)."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    q, kc, vc, slots, lens, rows, plens = voices_case(**MIXED)
    for r, p in ((rows, plens), (slots, torch.where(plens == 128, 64, plens)), (slots, torch.zeros_like(plens))):
        out = cascade_attention(q, kc, vc, slots, lens, r, p, prefix=SMALL)
        assert not out.isnan().any()
        assert_matches_reference(out, q, kc, vc, slots, lens, r, p, torch.float32)


def test_max_length_and_the_own_launch():
    q, kc, vc, slots, lens, rows, plens = voices_case(**MIXED)
    base = cascade_attention(q, kc, vc, slots, lens, rows, plens)
    for kwargs in (dict(max_length=300, split=64, block=32), dict(split=512, block=64, num_warps=2, num_stages=1),
                   dict(max_length=300, prefix=PrefixLaunch(streams=4, split=32, block=32))):
        torch.testing.assert_close(cascade_attention(q, kc, vc, slots, lens, rows, plens, **kwargs), base,
                                   rtol=1e-5, atol=1e-6)
    via = decode_attention(q, kc, vc, slots, lens, prefix_rows=rows, prefix_lens=plens, cascade=True)
    assert torch.equal(via, base)


def test_launcher_checks_its_arguments():
    q, kc, vc, slots, lens, rows, plens = voices_case({"A": 10}, ["A", "A"], [20, 20])
    with pytest.raises(ValueError, match="prefix_rows and prefix_lens"):
        decode_attention(q, kc, vc, slots, lens, cascade=True)
    with pytest.raises(ValueError, match="prefix_rows and prefix_lens"):
        cascade_attention(q, kc, vc, slots, lens, rows.int(), plens)
    with pytest.raises(ValueError, match="prefix launch"):
        cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=PrefixLaunch(streams=3, split=64, block=32))
    with pytest.raises(ValueError, match="prefix launch"):
        cascade_attention(q, kc, vc, slots, lens, rows, plens, prefix=PrefixLaunch(streams=2, split=48, block=32))


def test_cascade_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.attention_bench import main

    assert main(["--smoke", "--shared-prefix", "20", "--cascade", "--cascade-splits", "32", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_shared_prefix.json").read_text())["rows"]
    assert [r["fp8"] for r in rows] == [False, True]
    assert all(r["own_us"] > 0 and r["shared_us"] > 0 and r["cascade_us"] > 0 for r in rows)
    assert all(r["cascade_own32_us"] > 0 and r["cascade_own32_vs_shared"] > 0 for r in rows)
    for unused in (["--cascade"], ["--shared-prefix", "20", "--cascade-splits", "32"]):  # options that would do nothing
        with pytest.raises(SystemExit):
            main(["--smoke", *unused, "--out", str(tmp_path)])


# --- on a GPU, at the S2-Pro shape --------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_s2pro_shape_against_shared_reads(fp8):
    """Batch 64 (two voices of 40 and 20 streams, 4 without one) at context ~800 with a
    340-position prompt, S2-Pro heads (32 query, 8 KV of 128), bf16: the cascade against
    the decode kernel's shared reads and the reference; each stream's bits alone in its
    group as in it."""
    voice_of = ["A" if i % 3 else "B" for i in range(60)] + [None] * 4
    lengths = [700 + (37 * i) % 200 for i in range(64)]
    q, kc, vc, slots, lens, rows, plens = voices_case({"A": 340, "B": 340}, voice_of, lengths, fp8=fp8,
                                                      dtype=torch.bfloat16, h=32, k=8, d=128, cache_len=1024)
    out = cascade_attention(q, kc, vc, slots, lens, rows, plens, max_length=1024)
    shared = decode_attention(q, kc, vc, slots, lens, max_length=1024, prefix_rows=rows, prefix_lens=plens)
    assert_matches_reference(out, q, kc, vc, slots, lens, rows, plens, torch.bfloat16)
    err = ((out.float() - shared.float()).norm() / shared.float().norm()).item()
    assert err < TOL[torch.bfloat16], err
    assert torch.equal(cascade_attention(q, kc, vc, slots, lens, slots, plens, max_length=1024), out)
