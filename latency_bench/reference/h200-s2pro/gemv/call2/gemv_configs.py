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

TUNED_ON = 'NVIDIA H200, torch 2.11.0+cu130'
TUNED: dict[tuple[int, int, str], GemvConfig] = {
    (6144, 2560, 'bf16'): GemvConfig(2, 512, 2, 1),  # wqkv, M=1 10.65, M=4 15.74 us
    (6144, 2560, 'fp8'): GemvConfig(4, 512, 2, 1),  # wqkv, M=1 6.97, M=4 24.45 us
    (2560, 4096, 'bf16'): GemvConfig(2, 1024, 4, 1),  # wo, M=1 7.82, M=4 10.02 us
    (2560, 4096, 'fp8'): GemvConfig(4, 1024, 4, 1),  # wo, M=1 6.34, M=4 21.72 us
    (2560, 9728, 'bf16'): GemvConfig(4, 1024, 4, 2),  # w2, M=1 15.62, M=4 42.99 us
    (2560, 9728, 'fp8'): GemvConfig(8, 1024, 8, 1),  # w2, M=1 15.33, M=4 71.39 us
    (19456, 2560, 'bf16'): GemvConfig(4, 256, 2, 2),  # w13, M=1 25.85, M=4 42.72 us
    (19456, 2560, 'fp8'): GemvConfig(4, 512, 2, 1),  # w13, M=1 17.32, M=4 71.90 us
}
