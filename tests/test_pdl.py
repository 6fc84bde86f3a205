"""kernels/pdl.py (programmatic dependent launch of the step's kernels): where it is off
and why, the runner's switch, and on a Hopper GPU the same greedy frames with and without
it (a kernel that read its predecessor's output before that finished would change them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.runner import Runner
from kernels import pdl


def test_off_on_the_cpu_with_the_reason():
    assert pdl.supported("cpu") == "not a CUDA device"
    pdl.enable(False)
    assert pdl.launch_args() == {"PDL": False}


def test_a_cpu_runner_leaves_it_off_and_refuses_to_force_it():
    from engine.bundle import load_bundle

    bundle = load_bundle("tiny", "cpu", torch.float32)
    runner = Runner(bundle, 2, 256)
    assert runner.pdl is False and runner.pdl_buckets == [] and not pdl.enabled()
    assert Runner(bundle, 2, 256, pdl_all_batches=True).pdl_buckets == []  # asks for PDL nowhere it is off
    with pytest.raises(RuntimeError, match="PDL asked for but not available: not a CUDA device"):
        Runner(bundle, 2, 256, pdl=True)


def test_launch_args_name_the_kernel_flag_and_the_launch_option():
    with pdl.launching(True):
        assert pdl.launch_args() == {"PDL": True, "launch_pdl": True}
    assert pdl.launch_args() == {"PDL": False}  # back to what it was


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
    captured with PDL: engine/runner.py PDL_BATCHES; with pdl_all_batches every graph
    is), 32 steps: every frame equal in the three."""
    from test_gpu import GREEDY, TEXTS, s2_fixture

    bundle = s2_fixture(torch.bfloat16)
    runs = []
    for on, everywhere in ((False, False), (True, False), (True, True)):
        runner = Runner(bundle, 8, 512, pdl=on, pdl_all_batches=everywhere)
        assert runner.pdl is on and runner.cuda_graphs
        assert runner.pdl_buckets == (runner.buckets if everywhere else [1] if on else [])
        assert not pdl.enabled()  # on only while capturing
        frames = []
        for i, text in enumerate(TEXTS):
            frames.append(np.asarray(runner.prefill_segment(2 * i + 1, 0, bundle.prompts.full(None, text), GREEDY)))
        length = max(int(runner.positions[2 * i + 1]) for i in range(len(TEXTS))) + 70
        for _ in range(32):
            frames.append(np.asarray(runner.read(runner.launch([1, 3, 5], length))))
            frames.append(np.asarray(runner.read(runner.launch([3], length))))
        runs.append(np.concatenate([f.reshape(-1) for f in frames]))
        del runner
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


def test_the_server_flag_sets_pdl_on_every_graph():
    from realtime.config import parse_args

    assert parse_args(["--pdl-all-batches"]).engine.pdl_all_batches
    assert not parse_args([]).engine.pdl_all_batches


def test_pdl_on_every_graph_with_pdl_off_is_refused():
    from engine.engine import EngineConfig
    from realtime.config import parse_args

    with pytest.raises(ValueError, match="pdl_all_batches"):
        EngineConfig(pdl=False, pdl_all_batches=True)
    with pytest.raises(SystemExit):
        parse_args(["--pdl-all-batches", "--no-pdl"])
