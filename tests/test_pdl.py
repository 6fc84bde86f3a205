"""Programmatic dependent launch (kernels/pdl.py) in the kernel plan: off where the GPU or
Triton lacks it, on only for the batch-1 decode graph, and the same frames either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.kernel_plan import PDL_BATCHES, KernelPlan, build_plan
from engine.runner import Runner
from kernels import pdl


def test_off_on_the_cpu(tiny_bundle):
    assert pdl.supported("cpu") == "not a CUDA device"
    assert pdl.launch_args(False) == {"PDL": False}
    assert pdl.launch_args(True) == {"PDL": True, "launch_pdl": True}
    plan = build_plan(tiny_bundle.model, torch.device("cpu"), torch.float32)
    assert plan == KernelPlan()  # the PyTorch path everywhere on a CPU


def test_only_the_batch_1_decode_graph_launches_with_it():
    plan = KernelPlan(attention=True, step=True, pdl=True)
    assert PDL_BATCHES == (1,)
    assert plan.for_decode_batch(1).pdl and not plan.for_decode_batch(2).pdl
    assert not KernelPlan(pdl=False).for_decode_batch(1).pdl
    assert not plan.without_pdl().pdl


gpu_hopper = pytest.mark.skipif(not torch.cuda.is_available() or pdl.supported("cuda") is not None,
                                reason="needs a GPU with PDL (Hopper on) and a Triton that launches with it")


@pytest.mark.gpu
@gpu_hopper
def test_gpu_a_chain_with_pdl_is_the_chain_without():
    assert pdl.self_check("cuda", links=64) is None


@pytest.mark.gpu
@gpu_hopper
def test_gpu_the_engine_gives_the_same_greedy_frames_with_and_without_pdl():
    """CUDA graphs, three streams together and one alone (the batch-1 graph is the one
    launched with PDL), 32 steps: every frame equal either way."""
    from test_gpu import GREEDY, TEXTS, s2_fixture

    bundle = s2_fixture(torch.bfloat16)
    runs = []
    for on in (False, True):
        runner = Runner(bundle, 8, 512)
        if not on:
            runner = Runner(bundle, 8, 512, dataclasses.replace(runner.plan, pdl=False))
        assert runner.plan.pdl is on and runner.cuda_graphs
        frames = []
        for i, text in enumerate(TEXTS):
            frames.append(np.asarray(runner.prefill_segment(2 * i + 1, 0, bundle.prompts.full(None, text), GREEDY)))
        length = max(int(runner.state.positions[2 * i + 1]) for i in range(len(TEXTS))) + 70
        for _ in range(32):
            frames.append(np.asarray(runner.read(runner.launch([1, 3, 5], length))))
            frames.append(np.asarray(runner.read(runner.launch([3], length))))
        runs.append(np.concatenate([f.reshape(-1) for f in frames]))
        del runner
    assert np.array_equal(runs[0], runs[1])
