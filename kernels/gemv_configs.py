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

TUNED_ON = 'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-12-03, M = 1 (latency_bench.gemv_bench --sweep)'
TUNED: dict[tuple[int, int, str], GemvConfig] = {
    (6144, 2560, 'bf16'): GemvConfig(4, 512, 4, 1),  # wqkv, 9.41 us
    (6144, 2560, 'fp8'): GemvConfig(4, 512, 2, 1),  # wqkv, 6.99 us
    (2560, 4096, 'bf16'): GemvConfig(2, 1024, 2, 1),  # wo, 7.22 us
    (2560, 4096, 'fp8'): GemvConfig(4, 1024, 4, 1),  # wo, 5.79 us
    (2560, 9728, 'bf16'): GemvConfig(4, 1024, 4, 2),  # w2, 15.74 us
    (2560, 9728, 'fp8'): GemvConfig(8, 1024, 4, 1),  # w2, 14.45 us
    (19456, 2560, 'bf16'): GemvConfig(4, 512, 4, 1),  # w13, 25.27 us
    (19456, 2560, 'fp8'): GemvConfig(4, 512, 2, 1),  # w13, 17.28 us
}
