"""Measured launch choices of kernels/gemv.py for the S2-Pro / Qwen3-4B linear shapes.

(N, K, weight kind) -> GemvConfig, the fastest of `python -m latency_bench.gemv_bench
--sweep` (bf16 activations in; w2 from the fused gate/up output with the SwiGLU inside, as
the MLP runs it; "fp8": e4m3 block-scaled weights, activations quantized in the kernel).
Unlisted shapes take DEFAULT_CONFIG. The fast transformer's layers have the same widths,
so the same entries.

Regenerate on the GPU with `python -m latency_bench.gemv_bench --sweep --write-configs`.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8  # weight rows per program (divides 128 for e4m3 weights)
    block_k: int = 512  # columns per loop step (a multiple of 128 when x is quantized)
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_CONFIG = GemvConfig()

TUNED_ON = 'not yet measured'
TUNED: dict[tuple[int, int, str], GemvConfig] = {
}
