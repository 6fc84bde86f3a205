"""Shared fixtures. Tests run on the CPU; GPU tests are marked `gpu` and skip without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Triton kernels run under the interpreter on machines without a GPU (set before any
# module imports triton).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = FIXTURES / "upstream"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def tiny_bundle():
    """The tiny random-weight model in fp32, on the GPU where there is one (the runner's
    kernel tests run it compiled there and interpreted here)."""
    from engine.bundle import load_bundle

    return load_bundle("tiny", "cuda" if torch.cuda.is_available() else "cpu", torch.float32)
