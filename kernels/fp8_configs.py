"""Measured launch choices of kernels/fp8_gemm.py for the S2-Pro / Qwen3-4B linear shapes.

(N, K, M class) -> (block_m, block_n, swap_ab, splits, num_warps, num_stages,
reduce_in_kernel, quantize_in_gemm[, backend]), the fastest
of `python -m latency_bench.kernel_sweep` (bf16 activations quantized in the kernel, the
engine's path: w2 behind the SwiGLU); shapes and M classes not listed fall back to
gemm_config's rule. The times are per call, bf16 activations in, inside a CUDA graph that
streams each call's weights from HBM (latency_bench/reference/h200-s2pro/kernel_sweep.json
holds every candidate's time). w1 and w3 have no entry: the MLP runs them stacked (w13).
The fast transformer's layers have the same widths, so the same entries. Up to M = 16 each
shape has one K split (kernel_sweep.batch_invariant): a row's sums, and so a greedy
stream's tokens, do not depend on how many streams share its step there (w2 takes 6
splits at M = 1 and 16 instead of the fastest 10: +0.14 / +0.02 us). Larger batches
change wqkv's, w13's and wo's split counts, so their rows can differ in the last bits.
"""

TUNED_ON = "NVIDIA H200, torch 2.11 + CUDA 13, triton 3.6, 2026-12-01 (latency_bench.kernel_sweep)"
TUNED: dict[tuple[int, int, int], tuple] = {  # GemmConfig's fields in order
    (6144, 2560, 1): (16, 128, True, 5, 8, 3, True, True),  # wqkv: 8.41 us
    (6144, 2560, 2): (16, 128, True, 5, 8, 3, True, True),  # wqkv: 8.55 us
    (6144, 2560, 4): (16, 128, True, 5, 8, 3, True, True),  # wqkv: 8.60 us
    (6144, 2560, 8): (16, 128, True, 5, 8, 3, True, True),  # wqkv: 8.75 us
    (6144, 2560, 16): (16, 128, True, 5, 8, 3, True, True),  # wqkv: 9.11 us
    (6144, 2560, 32): (32, 256, True, 5, 8, 3, True, True),  # wqkv: 10.60 us
    (6144, 2560, 64): (64, 64, True, 4, 4, 3, True, False),  # wqkv: 12.59 us
    (6144, 2560, 128): (64, 128, False, 1, 8, 4, True, False),  # wqkv: 14.97 us
    (2560, 4096, 1): (16, 128, True, 6, 8, 3, True, True),  # wo: 8.12 us
    (2560, 4096, 2): (16, 128, True, 6, 8, 3, True, True),  # wo: 8.20 us
    (2560, 4096, 4): (16, 128, True, 6, 8, 4, True, True),  # wo: 8.34 us
    (2560, 4096, 8): (16, 128, True, 6, 8, 4, True, True),  # wo: 8.41 us
    (2560, 4096, 16): (16, 64, True, 6, 4, 3, True, True),  # wo: 8.58 us
    (2560, 4096, 32): (32, 128, True, 6, 8, 3, True, True),  # wo: 9.53 us
    (2560, 4096, 64): (64, 128, False, 6, 4, 3, True, False),  # wo: 11.24 us
    (2560, 4096, 128): (64, 128, False, 3, 4, 3, True, False),  # wo: 13.66 us
    (2560, 9728, 1): (16, 128, True, 6, 8, 4, True, False),  # w2: 13.12 us
    (2560, 9728, 2): (16, 128, True, 6, 8, 4, True, False),  # w2: 13.28 us
    (2560, 9728, 4): (16, 128, True, 6, 8, 4, True, False),  # w2: 13.37 us
    (2560, 9728, 8): (16, 128, True, 6, 8, 4, True, False),  # w2: 13.35 us
    (2560, 9728, 16): (16, 128, True, 6, 8, 4, True, False),  # w2: 13.93 us
    (2560, 9728, 32): (32, 128, True, 6, 8, 4, True, False),  # w2: 14.81 us
    (2560, 9728, 64): (64, 128, False, 6, 8, 4, True, False),  # w2: 16.43 us
    (2560, 9728, 128): (64, 128, False, 6, 4, 3, True, False),  # w2: 22.54 us
    (19456, 2560, 1): (16, 64, True, 2, 4, 3, True, True),  # w13: 17.24 us
    (19456, 2560, 2): (16, 128, True, 2, 8, 3, True, True),  # w13: 17.43 us
    (19456, 2560, 4): (16, 128, True, 2, 8, 3, True, True),  # w13: 17.58 us
    (19456, 2560, 8): (16, 128, True, 2, 8, 3, True, True),  # w13: 17.91 us
    (19456, 2560, 16): (16, 128, True, 2, 8, 3, True, True),  # w13: 18.74 us
    (19456, 2560, 32): (32, 128, True, 1, 8, 4, True, False),  # w13: 19.49 us
    (19456, 2560, 64): (64, 128, False, 1, 8, 4, True, False),  # w13: 23.46 us
    (19456, 2560, 128): (64, 128, False, 1, 8, 4, True, False),  # w13: 34.78 us
}
