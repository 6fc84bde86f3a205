"""The decode step's device work, counted on the CPU (latency_bench/launch_count.py): no
host sync, a bounded number of kernel launches at the s2-pro structure, and one frame's
shared noise giving the same draws as noise made per draw."""

from __future__ import annotations

import torch

from engine.sampling import RAS_DRAW, SamplingParams, SamplingTensors, frame_gumbel, gumbel_noise, sample_codebook
from latency_bench.launch_count import count_launches, launches, step_counts, syncs

# Launches of one s2-pro-structured decode step (eager, PyTorch decode attention): 1,955
# at batch 1 and 1,991 at batch 64 as of this bound; 3,728 before the norms, RoPE, the
# sampling noise and the MLP's gate/up GEMM were restructured (the H200 profile of that
# code counted 3,996 kernels, split-K reduces included). The bound leaves room for small
# changes, not for a return of per-draw noise (~450 launches) or unfused norms (~700).
S2_PRO_STEP_BUDGET = 2_100
# The GPU's path (Triton decode attention, the fused q/k/v kernel in the slow and fast
# layers, the blocks' add + norm, SwiGLU and fast attention kernels, one sampling launch
# per draw): 795 launches (1,363 before the last four).
S2_PRO_KERNEL_STEP_BUDGET = 850


def test_decode_step_has_no_host_sync_and_stays_within_its_launch_budget():
    for batch in (1, 8):
        counts = step_counts("s2-pro", batch)
        assert syncs(counts) == 0, {op: n for op, n in counts.items() if "item" in op or "scalar_dense" in op}
        assert 1_000 < launches(counts) <= S2_PRO_STEP_BUDGET, counts.most_common(10)


def test_gpu_path_fuses_each_layers_small_ops_and_stays_within_its_budget():
    counts = step_counts("s2-pro", 2, context=20, kernels=True)  # Triton interpreted here
    # one per slow layer, one per fast layer and codebook step
    assert counts["triton qk_rope_kv"] == 36 + 4 * 10 and counts["triton decode_attention"] == 2 * 36
    # every add with the norm after it, in one launch: 2 per block and the final norm, slow
    # and fast; at the fast transformer's step 0 the last block writes its keys and values
    # and stops (no attention, no MLP, no final norm)
    assert counts["triton add_rms_norm"] == (2 * 36 + 1) + 9 * (2 * 4 + 1) + (2 * 3 + 1)
    assert counts["triton swiglu"] == 36 + 9 * 4 + 3 and counts["triton fast_attention"] == 9 * 4 + 3
    assert "aten.silu.default" not in counts and "rms_norm (fused)" not in counts
    # one launch per draw (the semantic token and 9 residual codes), and no noise tensor
    assert counts["triton sample_tokens"] == 10 and "aten.topk.default" not in counts
    # the KV writes moved into the kernel: the 4 left are the runner's per-slot state scatter
    assert counts["aten.index_copy_.default"] == 4 and counts["aten.copy_.default"] <= 2
    assert syncs(counts) == 0 and launches(counts) <= S2_PRO_KERNEL_STEP_BUDGET, counts.most_common(10)


def test_counter_sees_casts_and_skips_views():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.no_grad(), count_launches() as counts:
        y = x.float().view(8, 4).t()  # one cast, two views
        y.sum().item()  # one reduction, one host sync
    assert launches(counts) == 2 and syncs(counts) == 1, counts


def test_rms_norm_counts_as_one_kernel_plus_a_copy_when_strided():
    x = torch.randn(2, 3, 8)
    w = torch.ones(4)
    with torch.no_grad(), count_launches() as counts:
        torch.nn.functional.rms_norm(x, (8,), eps=1e-6)
        torch.nn.functional.rms_norm(x[..., :4], (4,), w, eps=1e-6)
    assert counts["rms_norm (fused)"] == 2 and counts["rms_norm (fused): contiguous copy"] == 1
    assert launches(counts) == 3, counts


def test_frame_noise_is_the_noise_each_draw_would_make_itself():
    params = SamplingTensors.from_params(
        [SamplingParams(seed=s, temperature=1.0, top_p=1.0, top_k=0) for s in (3, 4, 3)], "cpu"
    )
    step = torch.tensor([7, 7, 8])
    g = frame_gumbel(params, step, num_codebooks=4)  # [B, 5, K]
    assert g.shape == (3, 5, 128) and torch.isfinite(g).all()
    for codebook in range(4):
        own = gumbel_noise(params.seed, step, torch.tensor([codebook]), 128)[:, 0]
        assert torch.equal(g[:, codebook], own)
    assert torch.equal(g[:, 4], gumbel_noise(params.seed, step, torch.tensor([RAS_DRAW]), 128)[:, 0])
    # different streams, frames and draws get different noise; the same ones the same
    assert not torch.equal(g[0, 1], g[1, 1]) and not torch.equal(g[0, 1], g[2, 1]) and not torch.equal(g[0, 1], g[0, 2])
    logits = torch.randn(3, 50)
    window = torch.full((3, 10), -1, dtype=torch.int32)
    shared = sample_codebook(logits, params, window, step, 2, g[:, 2])
    assert torch.equal(shared, sample_codebook(logits, params, window, step, 2))


def test_uniform_noise_never_reaches_0_or_1():
    from engine.sampling import uniform_open

    extremes = torch.tensor([0, 1, 255, 2**31, 2**32 - 129, 2**32 - 128, 2**32 - 1])
    u = uniform_open(extremes)
    assert (u > 0).all() and (u < 1).all()
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_gumbel_noise_is_gumbel_distributed():
    seed = torch.arange(64)
    g = gumbel_noise(seed, torch.zeros(64, dtype=torch.long), torch.arange(8), 128).flatten()
    # Gumbel(0, 1): mean = Euler-Mascheroni 0.5772, variance pi^2 / 6 = 1.645 (65,536 samples)
    assert abs(g.mean().item() - 0.5772) < 0.02 and abs(g.var().item() - 1.645) < 0.05


def test_fused_gate_up_projection_computes_the_same_swiglu():
    from engine.layers import FeedForward

    torch.manual_seed(0)
    ff = FeedForward(24, 40)
    x = torch.randn(3, 5, 24)
    want = ff(x)
    w1, w3 = ff.w1.weight.clone(), ff.w3.weight.clone()
    ff.fuse_gate_up_()
    assert ff.fused and not hasattr(ff, "w1") and set(ff.state_dict()) == {"w13.weight", "w2.weight"}
    assert torch.equal(ff.gate_up_weight(), torch.cat([w1, w3]))
    torch.testing.assert_close(ff(x), want, rtol=1e-6, atol=1e-6)
    assert ff.fuse_gate_up_() is ff  # idempotent


def test_served_model_fuses_gate_up_and_still_matches_upstream_greedy():
    """The runner fuses every block's gate/up GEMM; the upstream parity fixture's greedy
    frames must come out unchanged."""
    from conftest import UPSTREAM
    from test_checkpoint import expected, greedy_frames

    from engine.checkpoint import load_checkpoint
    from engine.device_state import fuse_feed_forwards_

    model, _ = load_checkpoint(UPSTREAM / "s2", "cpu", torch.float32)
    exp = expected("s2")
    fuse_feed_forwards_(model)
    assert all(b.feed_forward.fused for b in [*model.layers, *model.fast_layers])
    assert torch.equal(greedy_frames(model, exp["prompt"], exp["greedy"].shape[1]), exp["greedy"])


def test_fp8_step_has_no_host_sync_and_one_gemm_launch_per_linear():
    """--quant fp8 on the GPU's path: no host sync; each linear one GEMM launch (wqkv, wo,
    w13, and w2 with the SwiGLU and its quantization in its K loop; at the fast
    transformer's step 0 the last block's wqkv only). Triton interpreted here."""
    counts = step_counts("s2-pro", 1, context=20, kernels=True, quant="fp8")
    assert syncs(counts) == 0
    assert counts["triton fp8_gemm_kernel"] == 4 * 36 + 9 * 4 * 4 + (4 * 3 + 1)
    assert not counts["triton swiglu"]
