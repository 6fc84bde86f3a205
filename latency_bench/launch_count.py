"""Device operations per decode step, counted on the CPU: the kernel-launch proxy.

On an H200 the frame step of the `s2-pro` shape is launch-bound: its GEMMs take ~5 ms and
the ~3,900 small kernels around them (norms, RoPE, casts, sampling) ~5 ms more
(a profile of the step at `75f8c4a`: 3,996 kernels a step). Each
dispatched non-view ATen operation of the eager step is one kernel launch on a GPU (a CUDA
graph replays the same launches), so their count can be read on any machine, in seconds,
without weights that matter: the model keeps the preset's structure (layers, heads per
group, codebooks, vocabulary, sampling) at a small width.

    python -m latency_bench.launch_count --preset s2-pro --batch 1
    python -m latency_bench.launch_count --preset s2-pro --batch 1 --by-op 25
    TRITON_INTERPRET=1 python -m latency_bench.launch_count --preset s2-pro --kernels   # the GPU's path
    TRITON_INTERPRET=1 python -m latency_bench.launch_count --preset s2-pro --kernels --quant fp8 --batch 1 --context 20

With --quant the FP8 layers' launch choices are gemm_config's rule at the narrowed widths,
not the S2-Pro table (which quantizes in a launch of its own at some shapes and M): the
FP8 counts show the structure (one GEMM per linear, no host sync), not the table's
quantize launches. At batch 64 the interpreter takes over 15 minutes.

Counted: every ATen operation that is not a view (views launch nothing); `F.rms_norm`
counts as one (on CUDA it is one fused kernel, on a CPU it decomposes into ~6 operations),
plus one copy when its input is strided (the CUDA kernel makes it contiguous first).
Host syncs (`.item()`, `.tolist()`, `.cpu()` on device data) are counted apart: a decode
step must have none. The figure is a proxy: cuBLAS may add a split-K reduce kernel to a
GEMM, and the Triton decode-attention kernel (GPU only) is counted here as the PyTorch
reference's handful of operations unless `--kernels` runs the Triton path (each Triton
launcher counted as the kernels it launches).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from engine.bundle import ModelBundle, random_preset
from engine.config import ModelConfig, preset
from engine.prompt import PromptBuilder

SYNC_OPS = {"aten._local_scalar_dense.default", "aten.item.default"}
# Not views by their schema, but no kernel on CUDA either: a reshape of a contiguous
# tensor, a Python scalar wrapped for torch.where (a CPU scalar argument on CUDA), and an
# uninitialized allocation (the caching allocator; the FP8 launchers' outputs).
NO_KERNEL = {"aten._unsafe_view.default", "aten.scalar_tensor.default", "aten.empty.memory_format",
             "aten.empty_strided.default"}
FUSED_ON_CUDA = {F.rms_norm: "rms_norm (fused)"}


class _Dispatches(TorchDispatchMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and not func.is_view and str(func) not in NO_KERNEL:
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


class _FusedAsOne(TorchFunctionMode):
    """Counts the functions that are one kernel on CUDA as one, and hides what they
    decompose into on a CPU from the dispatch counter."""

    def __init__(self, dispatches: _Dispatches) -> None:
        super().__init__()
        self.dispatches = dispatches

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = FUSED_ON_CUDA.get(func)
        if name is None or self.dispatches.paused:
            return func(*args, **(kwargs or {}))
        self.dispatches.counts[name] += 1
        if not args[0].is_contiguous():  # the fused CUDA kernel copies a strided input first
            self.dispatches.counts[name + ": contiguous copy"] += 1
        self.dispatches.paused += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.dispatches.paused -= 1


@contextmanager
def count_launches():
    """with count_launches() as counts: ... -> Counter of op name -> launches."""
    counts: Counter = Counter()
    dispatches = _Dispatches(counts)
    with dispatches, _FusedAsOne(dispatches):
        yield counts


def syncs(counts: Counter) -> int:
    return sum(n for op, n in counts.items() if op in SYNC_OPS)


def launches(counts: Counter) -> int:
    return sum(n for op, n in counts.items() if op not in SYNC_OPS)


def narrow(config: ModelConfig, width: int = 64) -> ModelConfig:
    """The preset's structure at a small width: same layers, head grouping, codebooks,
    vocabulary and options; dims shrunk so that the step runs in milliseconds."""
    heads = max(2, config.n_head // 8)
    kv = max(1, heads * config.n_local_heads // config.n_head)
    fast_heads = max(2, config.fast_n_head // 8)
    fast_kv = max(1, fast_heads * config.fast_n_local_heads // config.fast_n_head)
    return config.replace(
        dim=width, n_head=heads, n_local_heads=kv, head_dim=16, intermediate_size=2 * width,
        fast_dim=width, fast_n_head=fast_heads, fast_n_local_heads=fast_kv, fast_head_dim=16,
        fast_intermediate_size=2 * width, max_seq_len=min(config.max_seq_len, 1024),
    )


def narrow_bundle(name: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> ModelBundle:
    config = narrow(preset(name))
    # the tiny codec: a decode step never touches it
    model, tokenizer, codec = random_preset(name, "cpu", dtype, seed, config=config, codec_name="tiny")
    return ModelBundle(name=f"{name}-narrow", model=model, tokenizer=tokenizer, codec=codec,
                       prompts=PromptBuilder(tokenizer, config), load_seconds=0.0)


# Triton launchers the GPU step calls (engine/attention.py, engine/layers.py), with the
# kernels each launches; counted as such when `kernels=True` (their torch.empty outputs
# launch nothing)
TRITON_LAUNCHERS = {
    ("kernels.decode_attention", "decode_attention"): 2,  # split + combine
    ("kernels.qk_rope_kv", "qk_rope_kv"): 1,
    ("kernels.add_rms_norm", "add_rms_norm"): 1,
    ("kernels.swiglu", "swiglu"): 1,
    ("kernels.fast_attention", "fast_attention"): 1,
    ("kernels.sample", "sample_tokens"): 1,
}


# The FP8 layers' kernels (engine/quant.py), counted by the Triton kernel itself: how many
# a launcher makes depends on its launch choice (a split-K sum in a second launch, a
# quantize launch first)
FP8_KERNELS = ("_fp8_gemm_kernel", "_fp8_gemm_tma_kernel", "_splitk_reduce_kernel", "_splitk_reduce_swiglu_kernel",
               "_quant_act_kernel", "_swiglu_quant_kernel")


@contextmanager
def _counting_fp8_kernels(counts: Counter):
    """Count each FP8 kernel run by the Triton interpreter (TRITON_INTERPRET=1)."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        name = getattr(self.fn, "__name__", "")
        if name not in FP8_KERNELS:
            return run(self, *args, **kwargs)
        counts[f"triton {name.strip('_')}"] += 1
        mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        if isinstance(mode, _Dispatches):  # the interpreter's own tensor work launches nothing on a GPU
            mode.paused += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            if isinstance(mode, _Dispatches):
                mode.paused -= 1

    InterpretedFunction.run = counted
    try:
        yield
    finally:
        InterpretedFunction.run = run


@contextmanager
def _counting_triton_launchers(counts: Counter):
    import importlib

    patched = []
    for (module_name, fn_name), n in TRITON_LAUNCHERS.items():
        module = importlib.import_module(module_name)
        fn = getattr(module, fn_name)

        def counted(*args, _fn=fn, _n=n, _name=f"triton {fn_name}", **kwargs):
            counts[_name] += _n
            mode = torch.utils._python_dispatch._get_current_dispatch_mode()
            if isinstance(mode, _Dispatches):
                mode.paused += 1
            try:
                return _fn(*args, **kwargs)
            finally:
                if isinstance(mode, _Dispatches):
                    mode.paused -= 1

        # the engine imports launchers by name (some under another): patch every module holding this one
        for holder in [m for name, m in list(sys.modules.items()) if name.split(".")[0] in ("engine", "kernels")]:
            for attr, value in list(vars(holder).items()):
                if value is fn:
                    setattr(holder, attr, counted)
                    patched.append((holder, attr, fn))
    try:
        yield
    finally:
        for module, fn_name, fn in patched:
            setattr(module, fn_name, fn)


def step_counts(name: str, batch: int, context: int = 300, kernels: bool = False, quant: str = "none",
                norm_codes: bool = True) -> Counter:
    """Launches of one decode step (runner._step, what a CUDA graph captures) for `batch`
    streams at `context` positions. kernels=True: the GPU's path, with the Triton decode
    kernels (run by the interpreter on a CPU: set TRITON_INTERPRET=1 before importing)
    and the blocks' small ops as Triton kernels (TransformerBlock.forward_kernels).
    `quant` "fp8": the FP8 layers with their kernels (needs
    kernels=True), launch choices by gemm_config's rule at the narrowed widths;
    `norm_codes` False: their GEMMs quantize their inputs themselves (before 2026-12-05)."""
    from engine.kernel_plan import KernelPlan
    from engine.runner import Runner

    bundle = narrow_bundle(name)
    if quant != "none":
        if not kernels:
            raise ValueError("the FP8 layers' launches are counted on the kernels path (kernels=True)")
        from engine.quant import quantize_model_

        quantize_model_(bundle.model)
        for block in [*bundle.model.layers, *bundle.model.fast_layers]:
            block.norms_quantize = norm_codes
    plan = KernelPlan(attention=kernels, fused_qkv=kernels, step=kernels, fp8=kernels and quant != "none")
    runner = Runner(bundle, max_running=batch, max_len=context + 64, plan=plan, cuda_graphs=False)
    runner.decoder.batch_slots[:batch] = torch.arange(batch)
    runner.state.positions[:batch] = context
    # no_grad, not inference_mode: under inference_mode dtype casts (`.float()`, `.to`)
    # bypass the Python dispatch key and would go uncounted
    with torch.no_grad():
        runner.decoder._step(batch, context + 1)  # warm (lazy buffers)
        with count_launches() as counts, _counting_triton_launchers(counts), _counting_fp8_kernels(counts):
            runner.decoder._step(batch, context + 1)
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="s2-pro")
    ap.add_argument("--batch", default="1,64", help="comma-separated batch sizes")
    ap.add_argument("--by-op", type=int, default=0, help="also list the N most frequent operations")
    ap.add_argument("--kernels", action="store_true",
                    help="the GPU's path: Triton decode attention, the fused q/k/v kernel and the blocks' "
                         "small-op kernels (interpreted on a CPU)")
    ap.add_argument("--quant", default="none", choices=["none", "fp8"],
                    help="FP8 layers (with --kernels; interpreted, so minutes at batch 64)")
    ap.add_argument("--gemms-quantize", action="store_true",
                    help="with --quant: the GEMMs quantize their inputs (no codes from the norms)")
    ap.add_argument("--context", type=int, default=300, help="positions each stream holds (the count does not "
                                                                 "depend on it; a short one runs faster interpreted)")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)
    report = {}
    for b in (int(x) for x in args.batch.split(",")):
        counts = step_counts(args.preset, b, args.context, kernels=args.kernels, quant=args.quant,
                             norm_codes=not args.gemms_quantize)
        report[b] = {"launches": launches(counts), "host_syncs": syncs(counts), "by_op": dict(counts.most_common())}
        print(f"{args.preset} decode step, batch {b}: {launches(counts)} launches, {syncs(counts)} host syncs")
        for op, n in counts.most_common(args.by_op):
            print(f"  {n:6d}  {op}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "steps": report}, f, indent=1)


if __name__ == "__main__":
    main()
