"""Measured launch choices of kernels/fp8_gemm.py for the S2-Pro / Qwen3-4B linear shapes.

(N, K, M class) -> (block_m, block_n, swap_ab, splits, num_warps, num_stages,
reduce_in_kernel, quantize_in_gemm[, backend]), the fastest
of `python -m latency_bench.kernel_sweep` (bf16 activations quantized in the kernel, the
engine's path: w2 behind the SwiGLU); shapes and M classes not listed fall back to
gemm_config's rule. The times are per call, bf16 activations in, inside a CUDA graph that
streams each call's weights from HBM (latency_bench/reference/h200-s2pro/kernel_sweep.json
holds every candidate's time). The engine's MLP runs w1 and w3 stacked (w13); their own
entries serve a model with separate gate/up linears and the kernel benchmark's MLP.
The fast transformer's layers have the same widths, so the same entries. Up to M = 16 each
shape has one K split (kernel_sweep.batch_invariant): a row's sums, and so a greedy
stream's tokens, do not depend on how many streams share its step there (w2 takes 6
splits at M = 1 and 16 instead of the fastest 10: +0.14 / +0.02 us). Larger batches
change wqkv's, w13's and wo's split counts or go to cuBLAS's block-scaled GEMM
(backend 'cublas': wqkv from M = 64, w13 at 128), so their rows can differ in the last bits.

Regenerate on the GPU with `bash scripts/gpu_check.sh adopt` (it writes this file's table
and returns it); the table below is from the run of 2026-12-01 at commit b53c62f.
"""

TUNED_ON = 'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-12-01 (latency_bench.kernel_sweep)'
TUNED: dict[tuple[int, int, int], tuple] = {  # GemmConfig's fields in order
    (6144, 2560, 1): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 8.35 us
    (6144, 2560, 2): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 8.56 us
    (6144, 2560, 4): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 8.64 us
    (6144, 2560, 8): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 8.76 us
    (6144, 2560, 16): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 9.12 us
    (6144, 2560, 32): (32, 256, True, 5, 8, 3, True, True, 'triton'),  # wqkv, 10.62 us
    (6144, 2560, 64): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # wqkv, 12.42 us
    (6144, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # wqkv, 12.79 us
    (2560, 4096, 1): (16, 128, True, 6, 8, 3, True, True, 'triton'),  # wo, 8.12 us
    (2560, 4096, 2): (16, 128, True, 6, 8, 3, True, True, 'triton'),  # wo, 8.16 us
    (2560, 4096, 4): (16, 128, True, 6, 8, 3, True, True, 'triton'),  # wo, 8.29 us
    (2560, 4096, 8): (16, 128, True, 6, 8, 3, True, True, 'triton'),  # wo, 8.34 us
    (2560, 4096, 16): (16, 64, True, 6, 4, 3, True, True, 'triton'),  # wo, 8.56 us
    (2560, 4096, 32): (32, 128, True, 6, 8, 3, True, True, 'triton'),  # wo, 9.52 us
    (2560, 4096, 64): (64, 128, False, 6, 8, 4, True, False, 'triton'),  # wo, 11.20 us
    (2560, 4096, 128): (64, 128, False, 3, 4, 3, True, False, 'triton'),  # wo, 13.64 us
    (9728, 2560, 1): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # w1/w3, 10.63 us
    (9728, 2560, 2): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # w1/w3, 10.72 us
    (9728, 2560, 4): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # w1/w3, 10.77 us
    (9728, 2560, 8): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # w1/w3, 10.88 us
    (9728, 2560, 16): (16, 128, True, 5, 8, 3, True, True, 'triton'),  # w1/w3, 11.45 us
    (9728, 2560, 32): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # w1/w3, 12.88 us
    (9728, 2560, 64): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # w1/w3, 13.18 us
    (9728, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # w1/w3, 13.33 us
    (2560, 9728, 1): (16, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 13.01 us
    (2560, 9728, 2): (16, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 13.14 us
    (2560, 9728, 4): (16, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 13.18 us
    (2560, 9728, 8): (16, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 13.28 us
    (2560, 9728, 16): (16, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 13.89 us
    (2560, 9728, 32): (32, 128, True, 6, 8, 4, True, False, 'triton'),  # w2, 14.61 us
    (2560, 9728, 64): (64, 128, False, 6, 8, 4, True, False, 'triton'),  # w2, 16.75 us
    (2560, 9728, 128): (64, 128, False, 6, 4, 3, True, False, 'triton'),  # w2, 22.38 us
    (19456, 2560, 1): (16, 64, True, 2, 4, 3, True, True, 'triton'),  # w13, 17.10 us
    (19456, 2560, 2): (16, 64, True, 2, 4, 3, True, True, 'triton'),  # w13, 17.39 us
    (19456, 2560, 4): (16, 64, True, 2, 4, 3, True, True, 'triton'),  # w13, 17.65 us
    (19456, 2560, 8): (16, 128, True, 2, 8, 3, True, True, 'triton'),  # w13, 17.98 us
    (19456, 2560, 16): (16, 128, True, 2, 8, 3, True, True, 'triton'),  # w13, 18.86 us
    (19456, 2560, 32): (32, 128, True, 1, 8, 4, True, False, 'triton'),  # w13, 19.44 us
    (19456, 2560, 64): (64, 128, False, 1, 8, 4, True, False, 'triton'),  # w13, 23.40 us
    (19456, 2560, 128): (16, 64, True, 1, 4, 4, True, False, 'cublas'),  # w13, 24.54 us
}
