"""Measured launch choices of kernels/fp8_gemm.py for the S2-Pro / Qwen3-4B linear shapes.

(N, K, M class) -> (block_m, block_n, swap_ab, splits, num_warps, num_stages,
reduce_in_kernel, quantize_in_gemm), the fastest
of `python -m latency_bench.kernel_sweep` (bf16 activations quantized in the kernel, the
engine's path); shapes and M classes not listed fall back to gemm_config's rule.
"""

TUNED_ON = "not yet measured"
TUNED: dict[tuple[int, int, int], tuple[int, int, bool, int, int, int, bool, bool]] = {}
