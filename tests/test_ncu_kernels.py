"""latency_bench/ncu_kernels.py (the step's heaviest kernels for Nsight Compute): its
launch argument and its refusal without a GPU; the profiled run itself needs the device
machine (`bash scripts/gpu_check.sh ncu`)."""

from __future__ import annotations

import pytest
import torch

from latency_bench.ncu_kernels import main, parse_launch


def test_a_launch_names_split_block_warps_and_stages():
    assert parse_launch("512,32,1,3") == {"split": 512, "block": 32, "num_warps": 1, "num_stages": 3}
    with pytest.raises(ValueError):
        parse_launch("512,32,1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_and_fails(capsys):
    assert main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
