"""The FP8 tile sweep's plan and its output table (the timing itself runs on the GPU:
`python -m latency_bench.kernel_sweep`)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from kernels.fp8_gemm import GemmConfig
from latency_bench.kernel_bench import SHAPES
from latency_bench.kernel_sweep import MAX_PROGRAMS, candidates, cdiv, compile_key, split_choices, tuned_table


def test_splits_leave_no_split_empty_and_stream_two_groups_or_more():
    for shape in SHAPES:
        groups = cdiv(shape.k, 128)
        for s in split_choices(shape.k):
            per = cdiv(groups, s)
            assert cdiv(groups, per) == s and (s == 1 or per >= 2), (shape, s)


def test_candidates_fit_the_batch_and_the_grid():
    for shape in SHAPES:
        for m in (1, 16, 64, 128):
            cands = candidates(shape, m)
            assert cands and len(set(cands)) == len(cands)
            # cuBLAS's block-scaled GEMM, once, where it takes M (a multiple of 4)
            assert sum(c.backend == "cublas" for c in cands) == (m % 4 == 0)
            for c in (c for c in cands if c.backend == "triton"):
                if c.swap_ab:
                    assert m <= 64 and c.block_m >= m  # one M tile on the narrow side
                assert c.splits == 1 or cdiv(shape.n, c.block_n) * cdiv(m, c.block_m) * c.splits <= MAX_PROGRAMS
            # both ways of quantizing the activations are timed for every tile choice
            assert {c.quantize_in_gemm for c in cands} == {True, False}


def test_compile_keys_ignore_the_runtime_values():
    shape = SHAPES[0]
    a, b = GemmConfig(16, 64, True, splits=2), GemmConfig(16, 64, True, splits=4)
    assert compile_key(shape, 1, a, 1) == compile_key(shape, 16, a, 1)  # M is a runtime value
    # the split length is one too, but the in-kernel sum is unrolled over the split count
    assert compile_key(shape, 1, a, 1) != compile_key(shape, 1, b, 1)
    second = GemmConfig(16, 64, True, splits=2, reduce_in_kernel=False)
    assert compile_key(shape, 1, second, 1) == compile_key(shape, 1, dataclasses.replace(second, splits=4), 1)
    assert compile_key(shape, 1, a, 1) != compile_key(shape, 1, GemmConfig(16, 64, True), 1)  # no split: another variant
    # quantizing in a launch first compiles the plain-codes variant, whatever the mode
    assert compile_key(shape, 1, GemmConfig(16, 64, True, quantize_in_gemm=False), 2)[4] == 0


def test_tuned_table_is_python_that_builds_the_configs():
    best = GemmConfig(16, 128, True, 5, 8, 3, True, False)
    cublas = GemmConfig(16, 64, True, quantize_in_gemm=False, backend="cublas")
    rows = [{"shape": "wqkv", "n": 6144, "k": 2560, "m": m, "best": dataclasses.asdict(c), "best_us": 8.41}
            for m, c in ((1, best), (64, cublas))]
    text = tuned_table(rows)
    table = ast.literal_eval(text.split("=", 1)[1].strip())
    assert GemmConfig(*table[(6144, 2560, 1)]) == best and GemmConfig(*table[(6144, 2560, 64)]) == cublas
    # a sweep of some shapes keeps the other shapes' entries of the table it replaces
    old = {(6144, 2560, 1): (16, 64, True), (2560, 4096, 1): (16, 128, True, 6, 8, 3, True, True, "triton")}
    table = ast.literal_eval(tuned_table(rows, keep=old).split("=", 1)[1].strip())
    assert table[(2560, 4096, 1)] == old[(2560, 4096, 1)] and GemmConfig(*table[(6144, 2560, 1)]) == best


def test_write_configs_rewrites_the_table_and_keeps_the_docstring(tmp_path):

    from latency_bench.kernel_sweep import write_configs

    module = tmp_path / "fp8_configs.py"
    module.write_text(Path("kernels/fp8_configs.py").read_text())
    cublas = GemmConfig(64, 128, False, quantize_in_gemm=False, backend="cublas")
    rows = [{"shape": "wo", "n": 2560, "k": 4096, "m": 64, "best": dataclasses.asdict(cublas), "best_us": 7.1}]
    write_configs(module, tuned_table(rows), "a GPU, today")
    spec = importlib.util.spec_from_file_location("tuned", module)
    tuned = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tuned)
    assert tuned.TUNED_ON == "a GPU, today"
    assert {k: GemmConfig(*v) for k, v in tuned.TUNED.items()} == {(2560, 4096, 64): cublas}
    assert tuned.__doc__ == importlib.import_module("kernels.fp8_configs").__doc__
    module.write_text("TUNED = {}\n")
    with pytest.raises(ValueError, match="TUNED_ON"):
        write_configs(module, tuned_table(rows), "x")


def test_batch_invariant_picks_one_split_per_shape_at_least_total_cost():
    from latency_bench.kernel_sweep import batch_invariant

    def cfg(splits, block_n=64):
        return dataclasses.asdict(GemmConfig(16, block_n, True, splits))

    def row(m, times):  # times: {(splits, block_n): us}
        top = sorted(({"us": us, "config": cfg(s, bn)} for (s, bn), us in times.items()), key=lambda t: t["us"])
        return {"shape": "w2", "n": 2560, "k": 9728, "m": m, "best": top[0]["config"], "best_us": top[0]["us"], "top": top}

    rows = [row(1, {(10, 64): 13.0, (6, 128): 13.1}), row(2, {(6, 128): 13.3, (10, 64): 13.35}),
            row(16, {(10, 64): 13.9, (6, 128): 14.2}), row(64, {(3, 64): 16.0, (6, 128): 16.4})]
    out = batch_invariant(rows, up_to=16)
    # 10 splits: 13.0 + 13.35 + 13.9 = 40.25 < 6 splits: 13.1 + 13.3 + 14.2 = 40.6
    assert [r["best"]["splits"] for r in out] == [10, 10, 10, 3]
    assert out[1]["best_us"] == 13.35 and rows[1]["best_us"] == 13.3  # the input rows are not changed


def test_a_wrong_result_is_refused_before_timing():
    import pytest
    import torch

    from kernels.fp8_quant import quantize_weight
    from latency_bench.kernel_bench import Weights
    from kernels.fp8_gemm import fp8_linear_reference
    from latency_bench.kernel_sweep import _check_result, reference

    w = 0.02 * torch.randn(64, 256)
    weights = Weights(*quantize_weight(w), w)
    x = torch.randn(3, 256)
    good = fp8_linear_reference(x, weights.wq, weights.ws)
    expected = reference(x, weights, 1)
    _check_result(good, expected)
    with pytest.raises(ValueError, match="wrong result"):
        _check_result(good.flip(1), expected)  # right values, wrong places: a layout bug


def test_tma_candidates_time_the_table_beside_every_way_of_running_the_tma_kernel():
    from kernels.fp8_gemm import gemm_config

    for shape in SHAPES:
        for m in (1, 16, 64, 128):
            cands = candidates(shape, m, tma=True)
            assert len(set(cands)) == len(cands)
            assert gemm_config(m, shape.n, shape.k) in cands  # the current table: the baseline of the same run
            tma = [c for c in cands if c.tma]
            # bf16 quantized in the K loop as well as in a launch first, at M <= 32 (not behind the SwiGLU)
            assert {c.quantize_in_gemm for c in tma} == ({False, True} if m <= 32 and shape.name != "w2" else {False})
            # warp-specialized: plain tiles at 4 warps only (what Hopper's partitioning takes)
            assert all(not c.swap_ab and c.num_warps == 4 for c in tma if c.warp_specialize)
            both = (0, 1) if m >= 32 else (0,)
            assert {(c.programs_per_sm, c.warp_specialize) for c in tma} == {(p, w) for p in (0, 1, 2) for w in both}
            assert {c.splits for c in tma} >= {1}
            for c in tma:
                if c.swap_ab:
                    assert m <= 64 and c.block_m >= m
            keys = {compile_key(shape, m, c, 1) for c in tma}
            assert len(keys) >= 4  # persistent (and warp-specialized) grids compile apart


def test_kernel_bench_smoke_times_both_mlp_layouts(tmp_path):
    """latency_bench.kernel_bench --smoke (interpreter): the MLP block is timed unfused,
    with the SwiGLU in the gate/up GEMM and in one launch (kernels/fp8_mlp.py), and the
    GEMM table is written."""
    import json

    from latency_bench.kernel_bench import main

    assert main(["--smoke", "--m", "1", "--out", str(tmp_path)]) == 0
    mlp = json.loads((tmp_path / "kernel_bench.json").read_text())["mlp"]["us"]
    assert mlp["fp8"] > 0 and mlp["fp8_swiglu_epilogue"] > 0 and mlp["fp8_one_launch"] > 0
