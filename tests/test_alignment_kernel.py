"""The word-timestamp readout kernel (kernels/text_attention.py) against its PyTorch
reference over shuffled KV pages (Triton interpreter on the CPU, compiled on a GPU):
each row's selected heads' softmax over its own text span, zeros past it and for rows
without one."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_fp8 import pack_kv
from kernels.text_attention import text_attention, text_attention_reference
from tests.paged_kv import to_pages

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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


def test_the_decode_step_reads_the_same_through_the_kernels_and_the_references():
    """The readout inside a whole decode step (engine/device_state.py frame_step): the
    Triton path (the plan's attention kernels, as on a GPU) and the PyTorch one give the
    same frames and the same attention over each row's text; a row without a span reads
    zeros."""
    from engine.alignment import AlignHeads
    from engine.bundle import load_bundle
    from engine.kernel_plan import REFERENCE, KernelPlan
    from engine.runner import Runner
    from latency_bench.engine_bench import prepare_batch

    bundle = load_bundle("tiny", DEVICE)
    c = bundle.config
    heads = AlignHeads(((0, 1), (c.n_layer - 1, 0), (c.n_layer - 1, c.n_head - 1)), "test")
    out = {}
    for name, plan in (("kernels", KernelPlan(attention=True, text_attention=True)), ("reference", REFERENCE)):
        runner = Runner(bundle, 4, 256, plan, align_heads=heads, cuda_graphs=False)
        slots = prepare_batch(runner, 3, 120, 0, True)
        runner.state.text_spans[torch.tensor(slots)] = torch.tensor([[10, 40], [0, 0], [50, 64]], device=DEVICE)
        handle = runner.launch(slots, 128)
        out[name] = (runner.read(handle), runner.read_alignment(handle))
    (frames_k, align_k), (frames_r, align_r) = out["kernels"], out["reference"]
    assert (frames_k == frames_r).all()
    assert align_k.shape == (3, 256) and abs(align_k - align_r).max() < 1e-4
    assert abs(align_k[0, :40].sum() - 3) < 1e-4 and not align_k[0, 40:].any()  # three heads, each summing to 1
    assert not align_k[1].any() and abs(align_k[2, :64].sum() - 3) < 1e-4


def step_launches(kernels: bool, heads, batch: int = 2, context: int = 40):
    """Launches of one decode step at the s2-pro structure (latency_bench/launch_count.py),
    the readout's Triton launcher counted as one."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    import engine.alignment as alignment
    from engine.kernel_plan import KernelPlan
    from engine.runner import Runner
    from latency_bench.launch_count import _counting_triton_launchers, count_launches, narrow_bundle

    plan = KernelPlan(attention=kernels, fused_qkv=kernels, step=kernels, text_attention=kernels)
    runner = Runner(narrow_bundle("s2-pro"), max_running=batch, max_len=context + 64, plan=plan, cuda_graphs=False,
                    align_heads=heads)
    runner.decoder.batch_slots[:batch] = torch.arange(batch)
    runner.state.positions[:batch] = context
    runner.state.text_spans[:batch] = torch.tensor([5, 20])
    real = alignment.text_attention
    with torch.no_grad():
        runner.decoder._step(batch, context + 1)
        with count_launches() as counts, _counting_triton_launchers(counts):
            def counted(*args, **kwargs):
                counts["triton text_attention"] += 1
                mode = _get_current_dispatch_mode()
                mode.paused += 1
                try:
                    return real(*args, **kwargs)
                finally:
                    mode.paused -= 1

            alignment.text_attention = counted
            try:
                runner.decoder._step(batch, context + 1)
            finally:
                alignment.text_attention = real
    return counts


def test_the_readout_adds_two_launches_a_layer_and_no_host_sync():
    """On the GPU's path the readout of one layer (the fallback: all heads of the middle
    layer) is one Triton launch and the sum over its heads; on the reference path a
    handful of gathers and a softmax. Neither syncs with the host."""
    from engine.alignment import AlignHeads
    from latency_bench.launch_count import launches, narrow_bundle, syncs

    c = narrow_bundle("s2-pro").config
    heads = AlignHeads.for_model(None, c.n_layer, c.n_head)
    on, off = step_launches(True, heads), step_launches(True, None)
    assert syncs(on) == 0 and launches(on) - launches(off) == 2, (on - off)
    assert on["triton text_attention"] == 1 and on["aten.sum.IntList_out"] == off["aten.sum.IntList_out"] + 1
    ref_on, ref_off = step_launches(False, heads), step_launches(False, None)
    assert syncs(ref_on) == 0 and 0 < launches(ref_on) - launches(ref_off) <= 30, (ref_on - ref_off)


def test_self_check_passes_at_the_s2_pro_shape():
    """What the engine's kernel plan runs at start-up before the readout goes through the
    kernel (engine/kernel_plan.py): s2-pro's 32 query heads over 8 KV heads of 128."""
    from kernels.text_attention import self_check

    assert self_check(DEVICE, torch.bfloat16, 32, 8, 128, page=16, tokens=256) is None


def test_self_check_reports_a_kernel_that_disagrees(monkeypatch):
    import kernels.text_attention as ta

    monkeypatch.setattr(ta, "text_attention", lambda *a, **k: ta.text_attention_reference(*a[:7]) * 0.5)
    assert "differs" in ta.self_check(DEVICE, torch.float32, 4, 2, 32, page=16, tokens=64)
