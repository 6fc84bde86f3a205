"""Result files: JSON with NaN (a measurement that has no data) written as null.

Its own module so that the GPU-side benchmarks (engine_bench, kernel_bench, profile_step)
import neither the load generator nor its WebSocket packages, which the GPU machine's
image lacks unless the wheels travel (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=1))


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
