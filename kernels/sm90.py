"""Compile a Triton kernel for Hopper (sm90) on any machine, and read what the compiler
made of it.

Why: the GPU machine is lent for minutes at a time, and a kernel variant that does not
compile there, or compiles without the software pipeline its design counts on, costs a
device call to find out. Triton's wheel carries ptxas, so its whole pipeline down to a
cubin runs on a CPU machine for `GPUTarget("cuda", 90, 32)`; what that shows:

- whether the variant compiles at all (shared memory within the SM's 227 KiB included);
- how much shared memory it takes: a loop whose loads are pipelined over S stages holds
  S copies of its tiles (one stage: nothing is prefetched, each load's latency is paid);
- whether its loads are TMA copies and whether Triton split it into warp-specialized
  partitions;
- its registers per thread and any spill to local memory (the wheel's cuobjdump on the
  cubin): a spilling variant streams its registers through memory every iteration.

The JIT specializes integer arguments divisible by 16 (and 16-byte aligned pointers) and
the pipeliner relies on that to prove aligned rows; `divisible_by_16` names the
arguments to treat so, as they are at the engine's shapes. Caveat: this compiles with
the Triton installed here (the CPU machines' pin), which may differ from the GPU
machine's; a variant that compiles here can still fail there, but one that fails here
is worth fixing before spending device time. To compile with the GPU machine's Triton,
install that wheel aside and put it first on the path:

    pip install --no-deps --target /tmp/tri36 triton==3.6.0
    PYTHONPATH=/tmp/tri36:$PWD python -m kernels.sm90

    python -m kernels.sm90          # the FP8 GEMM variants: shared memory, TMA, cp.async, partitions, registers (JSON)
    python -m kernels.sm90 --attention  # decode attention (pages of 16 and 64), blocked prefill attention

Not under the Triton interpreter (TRITON_INTERPRET=1 replaces every @triton.jit function
by its interpreted form, which has nothing to compile): the CLI turns it off for itself,
so tests run it in a process of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

if __name__ == "__main__":  # before Triton is imported: compile, do not interpret
    os.environ["TRITON_INTERPRET"] = "0"

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.decode_attention import LARGE_BF16, _decode_attention_split_kernel
from kernels.fp8_gemm import _fp8_gemm_kernel
from kernels.fp8_gemm_tma import _fp8_gemm_tma_kernel
from kernels.prefill_attention import BLOCK_N, BLOCK_Q, NUM_WARPS, _prefill_attention_kernel


@dataclass(frozen=True)
class Compiled:
    shared_bytes: int
    ttgir: str
    registers: int | None = None  # per thread (cuobjdump; None where it is not at hand)
    local_bytes: int | None = None  # local memory per thread: spills (and stack)

    @property
    def tma_copies(self) -> int:
        """TMA copy operations in the kernel (0: pointer loads only)."""
        return self.ttgir.count("async_tma_copy_global_to_local")

    @property
    def async_copies(self) -> int:
        """cp.async copies (pipelined pointer loads; 0: loads straight into registers)."""
        return self.ttgir.count("async_copy_global_to_local")

    @property
    def warp_specialized(self) -> bool:
        """Split into partitions (a loop's warp_specialize request alone leaves only an
        attribute where Triton did not partition it, e.g. at 8 warps on Hopper)."""
        return "ttg.warp_specialize" in self.ttgir


def compile_sm90(fn, types: dict[str, str], constexprs: dict, num_warps: int = 4, num_stages: int = 3,
                 divisible_by_16: frozenset[str] | set[str] = frozenset()) -> Compiled:
    """Compile `fn` (a @triton.jit kernel) for sm90. `types`: a Triton type for every
    argument that is not in `constexprs` ("*fp8e4nv", "i32", "tensordesc<bf16[64, 128]>",
    ...); raises what the compiler raises."""
    names = list(fn.arg_names)
    missing = [n for n in names if n not in types and n not in constexprs]
    if missing:
        raise ValueError(f"no type or constexpr value for {missing}")
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible_by_16 if n in names and n in types}
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(constexprs), attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    registers, local = _resource_usage(kernel.asm["cubin"])
    return Compiled(shared_bytes=kernel.metadata.shared, ttgir=kernel.asm["ttgir"], registers=registers,
                    local_bytes=local)


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, local + stack bytes per thread) of a cubin, read by the
    cuobjdump that ships with Triton's NVIDIA backend; (None, None) without it."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if found is None:
        return None, None
    return int(found.group(1)), int(found.group(2)) + int(found.group(3))


# --- the FP8 GEMM kernels' variants ------------------------------------------------------

_SCALARS = {"M": "i32", "N": "i32", "K": "i32", "KB": "i32", "GROUPS_PER_SPLIT": "i32", "UP_OFFSET": "i32",
            "stride_am": "i32", "stride_bn": "i32", "stride_cm": "i32", "UNITS": "i32", "TILES_N": "i32",
            "TILES_M": "i32"}
# aligned as at every engine shape (K and N multiples of 128, contiguous rows)
_ALIGNED = frozenset({"a_ptr", "as_ptr", "b_ptr", "bs_ptr", "c_ptr", "p_ptr", "cnt_ptr", "N", "K",
                      "stride_am", "stride_bn", "stride_cm", "UP_OFFSET"})


def pointer_gemm(block_m=16, block_n=128, swap=True, a_mode=0, split_mode=0, splits=1, warps=8,
                 stages=3) -> Compiled:
    """kernels/fp8_gemm.py's kernel as `_launch` would launch it (A_MODE 0: codes, 1: bf16
    quantized in the K loop, 2: the SwiGLU in the K loop), bf16 out."""
    types = {"a_ptr": "*bf16" if a_mode else "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*fp8e4nv", "bs_ptr": "*fp32",
             "c_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32", **_SCALARS}
    consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, SWAP_AB=swap, EVEN_K=True, A_MODE=a_mode, SPLIT_MODE=split_mode,
                  SOFT_ROUND=False, SPLITS=splits, PDL=False)
    return compile_sm90(_fp8_gemm_kernel, types, consts, warps, stages, _ALIGNED)


def tma_gemm(block_m=16, block_n=128, swap=True, split_mode=0, splits=1, persistent=False, ws=False,
             warps=8, stages=3, a_bf16=False) -> Compiled:
    """kernels/fp8_gemm_tma.py's kernel as `launch_tma` would launch it (`a_bf16`: bf16
    activations quantized in its K loop), bf16 out."""
    a = "bf16" if a_bf16 else "fp8e4nv"
    types = {"a_desc": f"tensordesc<{a}[{block_m}, 128]>", "as_ptr": "*bf16" if a_bf16 else "*fp32",
             "b_desc": f"tensordesc<fp8e4nv[{block_n}, 128]>", "bs_ptr": "*fp32", "c_ptr": "*bf16", "p_ptr": "*fp32",
             "cnt_ptr": "*i32", **_SCALARS}
    consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, SWAP_AB=swap, SPLIT_MODE=split_mode, SPLITS=splits,
                  PERSISTENT=persistent, WARP_SPECIALIZE=ws, PDL=False, SOFT_ROUND=False, A_BF16=a_bf16)
    return compile_sm90(_fp8_gemm_tma_kernel, types, consts, warps, stages, _ALIGNED)


# name -> (builder, keyword arguments): the variants the sweep and the engine launch
VARIANTS = {
    "pointer decode tile": (pointer_gemm, {}),
    "pointer split 5, summed in the launch": (pointer_gemm, dict(split_mode=2, splits=5)),
    "pointer bf16 in, quantized in the K loop": (pointer_gemm, dict(a_mode=1, split_mode=2, splits=5)),
    "pointer SwiGLU in the K loop": (pointer_gemm, dict(a_mode=2, split_mode=2, splits=6)),
    "pointer plain 64 x 128": (pointer_gemm, dict(block_m=64, swap=False)),
    "tma decode tile": (tma_gemm, {}),
    "tma split 5, summed in the launch": (tma_gemm, dict(split_mode=2, splits=5)),
    "tma bf16 in, quantized in the K loop": (tma_gemm, dict(split_mode=2, splits=5, a_bf16=True)),
    "tma plain 64 x 128, warp-specialized": (tma_gemm, dict(block_m=64, swap=False, ws=True, warps=4)),
    "tma persistent, split 4 (second launch)": (tma_gemm, dict(persistent=True, split_mode=1, splits=4)),
    "tma persistent plain, warp-specialized": (tma_gemm, dict(block_m=64, swap=False, persistent=True, ws=True,
                                                              warps=4)),
}


def attention_kernels() -> dict[str, Compiled]:
    """The attention kernels at the S2-Pro heads (32 query heads, 8 KV heads of 128, bf16
    cache) as the engine launches them: decode attention at its large-batch launch over
    pages of 16 and of 64 positions (the smallest page takes the most page-table loads a
    block, the largest the fewest), and the blocked prefill attention over pages of 16."""
    strides = ["stride_qb", "stride_qh", "stride_kp", "stride_kl", "stride_kk", "stride_vp", "stride_vl", "stride_vk",
               "stride_tr"]
    decode = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr")} | {"table_ptr": "*i32"}
    decode |= {"ks_ptr": "*fp32", "vs_ptr": "*fp32", "part_ptr": "*fp32", "lse_ptr": "*fp32", "scale": "fp32"}
    decode |= {n: "*i64" for n in ("slots_ptr", "lengths_ptr")}
    decode |= {n: "i32" for n in strides + ["stride_pb", "stride_ph", "stride_ps", "stride_lb", "stride_lh"]}
    # the page table's row stride (max_pages) is whatever the engine's max length gives: not assumed aligned
    aligned = {n for n in decode if n.endswith("_ptr")} | {"stride_kp", "stride_kl", "stride_vp", "stride_vl"}
    out = {}
    for page in (16, 64):
        consts = {"GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "PAGE": page, "SPLIT_SIZE": LARGE_BF16.split,
                  "BLOCK": LARGE_BF16.block, "DOT_FP32": False, "KV_FP8": False, "PDL": False}
        out[f"decode_page{page}"] = compile_sm90(
            _decode_attention_split_kernel, decode, consts, LARGE_BF16.num_warps, LARGE_BF16.num_stages, aligned)
    prefill = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")} | {"table_ptr": "*i32"}
    prefill |= {n: "*i64" for n in ("slots_ptr", "starts_ptr", "lengths_ptr")} | {"scale": "fp32", "seq_len": "i32"}
    prefill |= {n: "i32" for n in strides + ["stride_qs", "stride_ob", "stride_os", "stride_oh"]}
    aligned = {n for n in prefill if n.endswith("_ptr")} | {"stride_qb", "stride_qs", "stride_kp", "stride_kl",
                                                             "stride_vp", "stride_vl", "stride_ob", "stride_os"}
    consts = {"GROUP": 4, "HEAD_DIM": 128, "PAGE": 16, "BLOCK_Q": BLOCK_Q, "BLOCK_N": BLOCK_N, "DOT_FP32": False,
              "PDL": False}
    out["prefill_blocked"] = compile_sm90(_prefill_attention_kernel, prefill, consts, NUM_WARPS, 2, aligned)
    return out


def report(names=None) -> dict:
    """Each variant compiled: its shared memory, TMA and cp.async copies, partitions; or
    the error that stopped it."""
    out = {"triton": triton.__version__, "variants": {}}
    for name in names or VARIANTS:
        build, kwargs = VARIANTS[name]
        try:
            k = build(**kwargs)
            out["variants"][name] = {"kwargs": kwargs, "shared_bytes": k.shared_bytes, "tma_copies": k.tma_copies,
                                     "async_copies": k.async_copies, "warp_specialized": k.warp_specialized,
                                     "registers": k.registers, "local_bytes": k.local_bytes}
        except Exception as e:  # noqa: BLE001 - the report says which variant fails and why
            out["variants"][name] = {"kwargs": kwargs, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--attention"]:
        json.dump({name: {"shared_bytes": k.shared_bytes, "registers": k.registers, "local_bytes": k.local_bytes}
                   for name, k in attention_kernels().items()}, sys.stdout, indent=1)
    else:
        json.dump(report(sys.argv[1:] or None), sys.stdout, indent=1)
    print()
