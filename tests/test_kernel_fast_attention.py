"""The fast transformer's attention kernel against its PyTorch reference and the model's
own SDPA path (Triton interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from engine.attention import FastMeta, fast_cached
from kernels.fast_attention import fast_attention, fast_attention_reference, self_check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2 if DEVICE == "cpu" else 8e-3}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


def case(b, h, kv, d, positions, dtype, rows=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=g).to(DEVICE, dtype)
    k, v = (torch.randn(rows or b, positions, kv, d, generator=g).to(DEVICE, dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, kv, d, positions", [(1, 4, 2, 16, 10), (3, 8, 8, 32, 4), (2, 6, 2, 8, 9)])
def test_matches_reference_and_sdpa_at_every_step(b, h, kv, d, positions, dtype):
    q, k, v = case(b, h, kv, d, positions, dtype, rows=b + 2)
    for step in range(positions):
        out = fast_attention(q, k, v, step)
        assert rel(out, fast_attention_reference(q, k, v, step)) < TOL[dtype]
        sdpa = fast_cached(q[:, None], k, v, FastMeta(step))[:, 0]  # the PyTorch path it replaces
        assert rel(out, sdpa) < TOL[dtype]


def test_positions_after_step_are_not_read():
    q, k, v = case(2, 4, 2, 16, 10, torch.float32)
    out = fast_attention(q, k, v, 3)
    k[:, 4:], v[:, 4:] = float("nan"), float("nan")
    assert torch.equal(fast_attention(q, k, v, 3), out)


def test_step_zero_returns_the_one_value():
    q, k, v = case(2, 4, 2, 16, 10, torch.float32)
    want = v[:, 0].repeat_interleave(2, dim=1)  # [B, H, D]: heads 2g, 2g+1 share KV head g
    assert rel(fast_attention(q, k, v, 0), want) < 1e-6


def test_bad_inputs_are_refused():
    q, k, v = case(2, 4, 2, 16, 10, torch.float32)
    with pytest.raises(ValueError, match="step"):
        fast_attention(q, k, v, 10)
    with pytest.raises(ValueError, match="multiple"):
        fast_attention(q[:, :3], k, v, 1)
    with pytest.raises(ValueError, match="dtype"):
        fast_attention(q.bfloat16(), k, v, 1)


def test_self_check_passes_at_the_s2_fast_shape():
    assert self_check(DEVICE, torch.bfloat16, 32, 8, 128, 10) is None


def test_warps_change_how_it_runs_not_what_it_computes():
    """num_warps is latency_bench.fast_attention_bench's launch choice; the default follows
    the grid (fewer warps once rows x KV heads fill the GPU a few times over)."""
    from kernels.fast_attention import warps_for

    q, k, v = case(3, 8, 2, 16, 10, torch.float32)
    base = fast_attention(q, k, v, 9, num_warps=4)
    for w in (1, 2, 8):
        torch.testing.assert_close(fast_attention(q, k, v, 9, num_warps=w), base, rtol=1e-5, atol=1e-6)
    assert [warps_for(b * 8) for b in (1, 16, 32, 54, 64)] == [4, 4, 2, 1, 1]


def test_fast_attention_benchmark_script_runs(tmp_path):
    import json

    from latency_bench.fast_attention_bench import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fast_attention_bench.json").read_text())["rows"]
    assert rows and all(r["kernel_us"] > 0 and r["pytorch_us"] > 0 for r in rows)
