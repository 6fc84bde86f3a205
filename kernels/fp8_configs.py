"""Measured launch choices of kernels/fp8_gemm.py for the S2-Pro / Qwen3-4B linear shapes.

(N, K, M class) -> GemmConfig's fields in order (block_m, block_n, swap_ab, splits,
num_warps, num_stages, reduce_in_kernel, quantize_in_gemm, backend, tma, programs_per_sm,
warp_specialize): the fastest candidate per shape, timed per call inside a CUDA graph that
streams each call's weights from HBM (bf16 activations quantized in the kernel, the
engine's path). Shapes and M classes not listed fall back to gemm_config's rule. Up to
M = 16 each shape has one K split, so a row's sums (and a greedy stream's tokens) do not
depend on how many streams share its step; larger batches may differ in the last bits.

The sweep that wrote this table (latency_bench/kernel_sweep.py) left the tree with the
other lab tools; restore it from git (f4046d8) to re-tune on another card. Its effect:
kernels/FP8_NOTES.md, "The TMA GEMM adopted".
"""

TUNED_ON = 'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-12-06 (latency_bench.kernel_sweep)'
TUNED: dict[tuple[int, int, int], tuple] = {  # GemmConfig's fields in order
    (6144, 2560, 1): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # wqkv, 7.77 us
    (6144, 2560, 2): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # wqkv, 8.55 us
    (6144, 2560, 4): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # wqkv, 8.58 us
    (6144, 2560, 8): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # wqkv, 8.75 us
    (6144, 2560, 16): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # wqkv, 9.09 us
    (6144, 2560, 32): (32, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # wqkv, 10.82 us
    (6144, 2560, 64): (64, 64, False, 1, 4, 4, True, False, 'triton', True, 0, False),  # wqkv, 11.66 us
    (6144, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas', False, 0, False),  # wqkv, 12.81 us
    (2560, 4096, 1): (16, 128, True, 6, 8, 3, True, True, 'triton', False, 0, False),  # wo, 8.17 us
    (2560, 4096, 2): (16, 128, True, 6, 8, 3, True, True, 'triton', False, 0, False),  # wo, 8.21 us
    (2560, 4096, 4): (16, 128, True, 6, 8, 3, True, True, 'triton', False, 0, False),  # wo, 8.36 us
    (2560, 4096, 8): (16, 128, True, 6, 8, 3, True, True, 'triton', False, 0, False),  # wo, 8.40 us
    (2560, 4096, 16): (16, 64, True, 6, 4, 3, True, True, 'triton', False, 0, False),  # wo, 8.56 us
    (2560, 4096, 32): (32, 128, True, 6, 8, 3, True, True, 'triton', False, 0, False),  # wo, 9.46 us
    (2560, 4096, 64): (64, 64, False, 4, 4, 4, True, False, 'triton', True, 2, False),  # wo, 10.83 us
    (2560, 4096, 128): (64, 64, False, 4, 4, 4, True, False, 'triton', True, 0, False),  # wo, 13.11 us
    (9728, 2560, 1): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # w1/w3, 10.57 us
    (9728, 2560, 2): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # w1/w3, 10.69 us
    (9728, 2560, 4): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # w1/w3, 10.74 us
    (9728, 2560, 8): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # w1/w3, 10.84 us
    (9728, 2560, 16): (16, 128, True, 5, 8, 3, True, True, 'triton', False, 0, False),  # w1/w3, 11.43 us
    (9728, 2560, 32): (32, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w1/w3, 12.69 us
    (9728, 2560, 64): (16, 64, True, 1, 4, 4, True, False, 'cublas', False, 0, False),  # w1/w3, 13.13 us
    (9728, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas', False, 0, False),  # w1/w3, 13.52 us
    (2560, 9728, 1): (16, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 13.05 us
    (2560, 9728, 2): (16, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 13.31 us
    (2560, 9728, 4): (16, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 13.43 us
    (2560, 9728, 8): (16, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 13.47 us
    (2560, 9728, 16): (16, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 13.61 us
    (2560, 9728, 32): (32, 64, True, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 14.78 us
    (2560, 9728, 64): (64, 64, False, 8, 4, 4, True, False, 'triton', True, 0, False),  # w2, 16.48 us
    (2560, 9728, 128): (64, 64, False, 4, 4, 4, True, False, 'triton', True, 0, False),  # w2, 22.64 us
    (19456, 2560, 1): (16, 128, True, 1, 8, 4, True, False, 'triton', True, 0, False),  # w13, 17.26 us
    (19456, 2560, 2): (16, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 16.81 us
    (19456, 2560, 4): (16, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 17.04 us
    (19456, 2560, 8): (16, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 16.98 us
    (19456, 2560, 16): (16, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 17.08 us
    (19456, 2560, 32): (32, 64, True, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 17.81 us
    (19456, 2560, 64): (64, 64, False, 1, 4, 4, True, False, 'triton', True, 0, False),  # w13, 19.08 us
    (19456, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas', False, 0, False),  # w13, 24.57 us
}
