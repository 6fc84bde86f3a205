"""The fused QK-norm + RoPE + KV-write kernel against its PyTorch reference (Triton
interpreter on the CPU, compiled on a GPU), and the model's decode step with it."""

from __future__ import annotations

import pytest
import torch

from engine.layers import rope_table
from kernels.kv_fp8 import packed_dim, unpack_kv
from kernels.qk_rope_kv import qk_rope_kv, qk_rope_kv_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: the interpreter truncates fp32 -> bf16 where the GPU rounds (kernels/FP8_NOTES.md):
# with QK-norm a key is rounded three times (norm, scale, rotation), each truncation biased
# toward zero by up to one ulp (2^-8 relative): measured 1.2% here, so 2% on the CPU
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2 if DEVICE == "cpu" else 8e-3}


def case(b, h, kv, dh, qk_norm, dtype, rows=6, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, (h + 2 * kv) * dh, generator=g).to(DEVICE, dtype)
    scales = (torch.rand(dh, generator=g) + 0.5, torch.rand(dh, generator=g) + 0.5) if qk_norm else (None, None)
    scales = tuple(None if s is None else s.to(DEVICE, dtype) for s in scales)
    positions = torch.randint(0, length, (b,), generator=g)
    cos_sin = rope_table(length, dh, 10000.0)[positions].to(DEVICE)
    slots = torch.randperm(rows, generator=g)[:b].to(DEVICE)
    caches = [torch.zeros(rows, length, kv, dh, device=DEVICE, dtype=dtype) for _ in range(4)]
    return qkv, scales, cos_sin, slots, positions.to(DEVICE), caches


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, kv, dh, qk_norm", [
    (1, 4, 2, 16, True),
    (3, 8, 2, 32, True),
    (5, 2, 1, 8, False),  # the fast transformer: no QK-norm
    (2, 6, 3, 16, False),  # a head group that is not a power of two
])
def test_matches_reference(b, h, kv, dh, qk_norm, dtype):
    qkv, (qs, ks), cos_sin, slots, positions, (k1, v1, k2, v2) = case(b, h, kv, dh, qk_norm, dtype)
    q = qk_rope_kv(qkv, qs, ks, cos_sin, 1e-6, k1, v1, slots, positions, h)
    q_ref = qk_rope_kv_reference(qkv, qs, ks, cos_sin, 1e-6, k2, v2, slots, positions, h)
    assert q.shape == (b, h, dh) and rel(q, q_ref) < TOL[dtype]
    assert rel(k1, k2) < TOL[dtype]
    assert torch.equal(v1, v2)  # values are copied bit for bit
    # nothing but the (slot, position) rows was written
    written = torch.zeros(k1.shape[:2], dtype=torch.bool, device=DEVICE)
    written[slots, positions] = True
    assert (k1[~written] == 0).all() and (v1[~written] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_at_one_position_match_reference(dtype):
    """The fast transformer's addressing: row b of the cache, all at one position."""
    qkv, _, cos_sin, _, _, (k1, v1, k2, v2) = case(4, 4, 2, 16, False, dtype)
    q = qk_rope_kv(qkv, None, None, cos_sin, 1e-6, k1, v1, None, 3, 4)
    q_ref = qk_rope_kv_reference(qkv, None, None, cos_sin, 1e-6, k2, v2, None, 3, 4)
    assert rel(q, q_ref) < TOL[dtype] and rel(k1, k2) < TOL[dtype] and torch.equal(v1, v2)
    written = torch.zeros(k1.shape[:2], dtype=torch.bool, device=DEVICE)
    written[:4, 3] = True
    assert (k1[~written] == 0).all() and (v1[~written] != 0).any(dim=-1).sum() == 0
    with pytest.raises(ValueError, match="one int position"):
        qk_rope_kv(qkv, None, None, cos_sin, 1e-6, k1, v1, None, 99, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, h, kv, dh, qk_norm", [(3, 8, 2, 32, True), (2, 32, 8, 128, True), (5, 2, 1, 16, False)])
def test_fp8_caches_hold_the_references_codes(b, h, kv, dh, qk_norm, dtype):
    """Into packed FP8 caches (kernels/kv_fp8.py): values are the reference's bytes
    exactly (the same power-of-two scale and e4m3 rounding), keys within the tolerance
    of the rotation they come from, and no other (row, position) is touched."""
    qkv, (qs, ks), cos_sin, slots, positions, caches = case(b, h, kv, dh, qk_norm, dtype)
    k1, v1, k2, v2 = (torch.zeros(*c.shape[:3], packed_dim(dh), dtype=torch.uint8, device=DEVICE) for c in caches)
    q = qk_rope_kv(qkv, qs, ks, cos_sin, 1e-6, k1, v1, slots, positions, h)
    q_ref = qk_rope_kv_reference(qkv, qs, ks, cos_sin, 1e-6, k2, v2, slots, positions, h)
    assert rel(q, q_ref) < TOL[dtype]
    assert torch.equal(v1, v2)
    assert rel(unpack_kv(k1, torch.float32), unpack_kv(k2, torch.float32)) < TOL[dtype] + 0.07  # one e4m3 step apart at most
    written = torch.zeros(k1.shape[:2], dtype=torch.bool, device=DEVICE)
    written[slots, positions] = True
    assert (k1[~written] == 0).all() and (v1[~written] == 0).all()
    # and the stored keys are the bf16/fp32 keys to e4m3 precision
    k_plain = caches[0]
    qk_rope_kv_reference(qkv, qs, ks, cos_sin, 1e-6, k_plain, caches[1], slots, positions, h)
    assert rel(unpack_kv(k1, torch.float32)[slots, positions], k_plain[slots, positions]) < 0.05


def test_shapes_and_dtypes_are_checked():
    qkv, (qs, ks), cos_sin, slots, positions, (k1, v1, _, _) = case(2, 4, 2, 16, True, torch.float32)
    with pytest.raises(ValueError, match="qkv must be"):
        qk_rope_kv(qkv[:, :-16], qs, ks, cos_sin, 1e-6, k1, v1, slots, positions, 4)
    with pytest.raises(ValueError, match="cos_sin"):
        qk_rope_kv(qkv, qs, ks, cos_sin.bfloat16(), 1e-6, k1, v1, slots, positions, 4)
    with pytest.raises(ValueError, match="int64"):
        qk_rope_kv(qkv, qs, ks, cos_sin, 1e-6, k1, v1, slots.int(), positions, 4)
    with pytest.raises(ValueError, match="share a dtype"):
        qk_rope_kv(qkv.double(), qs, ks, cos_sin, 1e-6, k1, v1, slots, positions, 4)
    with pytest.raises(ValueError, match="q_scale and k_scale"):
        qk_rope_kv(qkv, qs, None, cos_sin, 1e-6, k1, v1, slots, positions, 4)
    packed = [torch.zeros(*k1.shape[:3], packed_dim(16), dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    with pytest.raises(ValueError, match="share a layout"):
        qk_rope_kv(qkv, qs, ks, cos_sin, 1e-6, packed[0], v1, slots, positions, 4)
    with pytest.raises(ValueError, match="slow transformer"):
        qk_rope_kv(qkv, qs, ks, cos_sin, 1e-6, *packed, None, 3, 4)


@pytest.mark.parametrize("kv_quant", ["none", "fp8"])
def test_decode_step_with_the_fused_kernel_gives_the_same_frames(kv_quant):
    """The runner's eager step with both Triton decode kernels (fused QK/RoPE/KV write and
    decode attention) against the PyTorch path: the same greedy frames, batch of 3, with
    either KV layout."""
    from engine.bundle import load_bundle
    from engine.kernel_plan import KernelPlan
    from engine.runner import Runner
    from engine.sampling import SamplingParams

    frames = []
    for fused in (False, True):
        bundle = load_bundle("tiny", DEVICE, torch.float32)
        runner = Runner(bundle, max_running=3, max_len=128, plan=KernelPlan(attention=fused, fused_qkv=fused),
                        kv_quant=kv_quant, cuda_graphs=False)
        prompt = bundle.prompts.segment("Hello there.")
        for slot in range(3):
            runner.prefill_segment(slot, 8 * slot, prompt, SamplingParams(temperature=0.0))
        out = []
        for _ in range(4):
            out.append(runner.read(runner.launch([0, 1, 2], 64)))
        frames.append(out)
    for a, b in zip(*frames):
        assert (a == b).all()


def test_benchmark_script_runs(tmp_path):
    from latency_bench.qk_rope_bench import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = __import__("json").loads((tmp_path / "qk_rope_bench.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3] and all(r["fused_us"] > 0 for r in rows)
