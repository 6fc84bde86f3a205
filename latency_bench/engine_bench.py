"""`python -m latency_bench.engine_bench`: the engine without the network.

Decode frames/s and per-step latency against batch size (the pipelined step loop the
engine runs: launch step t + 1, then read step t), prefill time against prompt length,
and memory per stream; the eager path is the baseline in the same run when CUDA graphs
are on.

    python -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,2,4,8,16,32,64
    python -m latency_bench.engine_bench --model tiny --device cpu --batch 1,2,4,8
    python -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,64 --kv-quant none,fp8 --context 1000

`--kv-quant none,fp8`: the first KV layout runs every mode; each further one runs the
fastest mode again (graphs on a GPU) as `<mode>_kv_<layout>`, so the FP8 KV cache and
its bf16 baseline are timed in the same run.

`--shared-prefix N`: every stream of the decode batch speaks one voice whose prompt is
its first N positions, prefilled once; as in the service, each stream's page-table row
points its first N // P pages at that voice's pages (and holds its own copy of the
partly filled last one), so a step reads the prompt's KV once for the batch. One more
mode times the same steps with every stream holding its own copy of the prompt's pages
(graphs_own_pages, the baseline):

    python -m latency_bench.engine_bench --model s2-pro --device cuda --batch 16,54,64 --skip-eager --context 800 --shared-prefix 340
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from engine.bundle import QUANT_MODES, load_bundle
from engine.kernel_plan import build_plan
from engine.kv_cache import KV_QUANTS
from engine.runner import Runner
from engine.sampling import SamplingParams
from latency_bench.jsonfile import write_json


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare_batch(runner: Runner, batch: int, context: int, shared_prefix: int = 0, share: bool = True) -> list[int]:
    """Rows 0..batch-1 hold a stream at position `context` with a valid input frame (KV
    contents do not change the cost of a step, only its length does). With
    `shared_prefix` N, each row's first N positions are one voice's prompt, prefilled
    into row 0's pages (runner.Runner with pages=None: every row its own pages), then
    shared as the service shares a cached voice's pages, or with `share` False copied
    into every row's own pages."""
    st = runner.state
    c = st.config
    slots = list(range(batch))
    if shared_prefix:
        load_voice(runner, slots, min(shared_prefix, context), share)
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, c.fast_vocab, (batch, 1 + c.num_codebooks), generator=g)
    frames[:, 0] += c.semantic_begin_id
    idx = torch.tensor(slots, device=st.device)
    st.tokens[idx] = frames.to(st.device)
    st.positions[idx] = context
    st.frame_index[idx] = 1
    for s in slots:
        st.params.set_row(s, SamplingParams(temperature=0.7, top_p=0.7, seed=s, allow_end=False))
    _sync(st.device)  # these writes ran on the default stream; the steps run on the decode stream
    return slots


def load_voice(runner: Runner, rows: list[int], length: int, share: bool) -> None:
    """A voice prompt of `length` positions into row rows[0]'s pages; the other rows'
    page-table entries point at its full pages (`share`) and each row copies the partly
    filled last page into its own, as the engine does before a segment writes into it
    (engine/scheduler.py _reserve); or each row copies every page of the prompt."""
    st = runner.state
    runner.prefill_prefix(rows[0], _segment_tokens(runner, length))
    table, P = st.kv.page_table, st.kv.page_size
    full = length // P if share else 0
    voice = table[rows[0], : -(-length // P)].tolist()
    copies = []
    for row in rows[1:]:
        table[row, :full] = table[rows[0], :full]
        own = table[row, full : len(voice)].tolist()
        copies += zip(voice[full:], own)
    if copies:
        st.copy_pages(copies)


def bench_decode(runner: Runner, batch: int, context: int, steps: int, shared_prefix: int = 0,
                 share: bool = True) -> dict:
    slots = prepare_batch(runner, batch, context, shared_prefix, share)
    kv_len = context + steps + 8
    pending = None
    for _ in range(3):  # warm-up (and graph capture, when on)
        handle = runner.launch(slots, kv_len)
        runner.read(handle)
    _sync(runner.state.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        handle = runner.launch(slots, kv_len)
        if pending is not None:
            runner.read(pending)
        pending = handle
    runner.read(pending)
    elapsed = time.perf_counter() - t0
    step_ms = 1000 * elapsed / steps
    return {"batch": batch, "step_ms": step_ms, "frames_per_s": batch * steps / elapsed,
            "stream_frames_per_s": steps / elapsed}


def kv_bytes_per_stream(runner: Runner) -> int:
    """KV bytes of one stream's whole context (--max-len positions, in pages)."""
    return runner.kv_bytes_per_page() * runner.state.kv.page_table.shape[1]


def median_ms(fn, device: torch.device, repeats: int = 5, warmups: int = 1) -> float:
    """Median wall time of fn() in ms, each call started with the device idle."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1000 * times[len(times) // 2]


def _segment_tokens(runner: Runner, length: int) -> torch.Tensor:
    tokens = torch.zeros(1 + runner.state.config.num_codebooks, length, dtype=torch.long)
    tokens[0] = torch.randint(0, 200, (length,))
    return tokens


def bench_prefill(runner: Runner, length: int, repeats: int = 5) -> dict:
    tokens, params = _segment_tokens(runner, length), SamplingParams(temperature=0.7, seed=1)
    # prefill_segment returns after the first frame is on the host
    return {"tokens": length, "ms": median_ms(lambda: runner.prefill_segment(0, 0, tokens, params), runner.state.device, repeats)}


def bench_segments(runner: Runner, batch: int, start: int = 340, length: int = 40, repeats: int = 5) -> dict:
    """What the service does when `batch` streams flush at once: a text segment of
    `length` tokens after a voice prefix of `start` positions, for each of them, in one
    batched prefill, to every first frame on the host."""
    tokens, params = _segment_tokens(runner, length), SamplingParams(temperature=0.7, seed=1)
    items = [(slot, start, tokens, params) for slot in range(batch)]
    ms = median_ms(lambda: runner.prefill_segments(items), runner.state.device, repeats)
    return {"batch": batch, "start": start, "tokens": length, "ms": ms}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.engine_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--context", type=int, default=400, help="KV positions already filled per stream")
    p.add_argument("--prompt-lengths", default="100,300,1000")
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--no-graphs", action="store_true", help="eager only (CUDA)")
    p.add_argument("--quant", default="none", choices=QUANT_MODES)
    p.add_argument("--kv-quant", default="none", help="KV cache layouts, comma-separated: none, fp8")
    p.add_argument("--step-kernels-baseline", action="store_true",
                   help="also run CUDA graphs with the blocks' small ops in PyTorch (mode graphs_torch_ops)")
    p.add_argument("--gemv-baseline", action="store_true",
                   help="also run CUDA graphs with every linear layer on its GEMM (mode graphs_no_gemv)")
    p.add_argument("--pdl-baseline", action="store_true",
                   help="also run CUDA graphs without programmatic dependent launch (mode graphs_no_pdl)")
    p.add_argument("--shared-prefix", type=int, default=0, metavar="N",
                   help="the decode batch speaks one voice whose prompt is each stream's first N positions, its "
                        "pages shared; adds the mode graphs_own_pages (each stream its own copy: the baseline)")
    p.add_argument("--page-size", default="32", help="KV page sizes, comma-separated (16, 32, 64): each further one "
                   "adds the mode graphs_p<N>, timed against the first")
    p.add_argument("--skip-eager", action="store_true", help="on a GPU, time the graph modes only (saves minutes)")
    p.add_argument("--out", default="out/engine_bench")
    a = p.parse_args(argv)
    batches = [int(x) for x in a.batch.split(",")]
    kv_quants = a.kv_quant.split(",")
    if any(q not in KV_QUANTS for q in kv_quants):
        p.error(f"--kv-quant takes {', '.join(KV_QUANTS)}, got {a.kv_quant}")
    bundle = load_bundle(a.model, a.device, quant=a.quant)
    device = bundle.device
    # mode -> what differs from the full plan with graphs (engine/kernel_plan.py)
    modes = {"eager": {"graphs": False}}
    if device.type == "cuda" and not a.no_graphs:
        modes["graphs"] = {}
        if a.step_kernels_baseline:
            modes["graphs_torch_ops"] = {"plan": {"step": False}}
        if a.gemv_baseline:
            modes["graphs_no_gemv"] = {"plan": {"gemv": False}}
        if a.pdl_baseline:
            modes["graphs_no_pdl"] = {"plan": {"pdl": False}}
        if a.shared_prefix:
            modes["graphs_own_pages"] = {"share": False}
        if a.skip_eager:
            del modes["eager"]
    fastest = "graphs" if "graphs" in modes else next(iter(modes))
    for q in kv_quants:
        for m in list(modes):
            modes[m].setdefault("kv", kv_quants[0])
        if q != kv_quants[0]:
            modes[f"{fastest}_kv_{q}"] = {**modes[fastest], "kv": q}
    page_sizes = [int(x) for x in a.page_size.split(",")]
    for m in list(modes):
        modes[m].setdefault("page", page_sizes[0])
    for size in page_sizes[1:]:
        modes[f"{fastest}_p{size}"] = {**modes[fastest], "page": size}
    results: dict = {"model": bundle.name, "quant": a.quant, "device": str(device), "dtype": str(bundle.dtype), "context": a.context,
                     "load_s": bundle.load_seconds, "params": bundle.config.num_parameters()}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name(device)
    for mode, differs in modes.items():
        plan = build_plan(bundle.model, device, bundle.dtype, differs["kv"])
        plan = dataclasses.replace(plan, **differs.get("plan", {}))
        runner = Runner(bundle, max(batches), a.max_len, plan, kv_quant=differs["kv"], page_size=differs["page"],
                        cuda_graphs=differs.get("graphs", device.type == "cuda"))
        share = differs.get("share", True)
        results[mode] = {
            "plan": dataclasses.asdict(plan),
            "kv_quant": differs["kv"],
            "page_size": differs["page"],
            "kv_bytes_per_stream": kv_bytes_per_stream(runner),
            "shared_prefix": a.shared_prefix if share else 0,
            "decode": [bench_decode(runner, b, a.context, a.steps, a.shared_prefix, share) for b in batches],
            "prefill": [bench_prefill(runner, n) for n in map(int, a.prompt_lengths.split(",")) if n < a.max_len],
            "segments": [bench_segments(runner, b) for b in (1, 16) if b <= max(batches) and 380 < a.max_len],
        }
        results.setdefault("kv_bytes_per_stream", kv_bytes_per_stream(runner))
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if device.type == "cuda":
        results["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    out = Path(a.out)
    write_json(out / "engine_bench.json", results)
    print(f"engine bench: {bundle.name} on {device} ({bundle.dtype}), context {a.context}, KV per stream "
          f"{results['kv_bytes_per_stream'] / 2**20:.1f} MiB at {a.max_len} positions")
    print(f"{'batch':>6} " + " ".join(f"{m + ' step ms':>16} {m + ' frames/s':>16}" for m in modes))
    for i, b in enumerate(batches):
        print(f"{b:>6} " + " ".join(
            f"{results[m]['decode'][i]['step_ms']:>16.2f} {results[m]['decode'][i]['frames_per_s']:>16.1f}" for m in modes))

    def step_ratios(base_mode: str, mode: str) -> str:  # per batch, how much faster `mode`'s step is
        base, new = results[base_mode]["decode"], results[mode]["decode"]
        return ", ".join(f"batch {b} {base[i]['step_ms'] / new[i]['step_ms']:.2f}x" for i, b in enumerate(batches))

    for base_mode in ("graphs_torch_ops", "graphs_no_gemv", "graphs_no_pdl", "graphs_own_pages"):
        if base_mode in results and "graphs" in results:
            print(f"graphs against {base_mode} (step time ratio, higher is faster): {step_ratios(base_mode, 'graphs')}")
    for m in [m for m in modes if m.startswith(f"{fastest}_p")]:
        print(f"{m} against {fastest}, pages of {page_sizes[0]} (step time ratio, higher is faster): "
              f"{step_ratios(fastest, m)}")
    for m in [m for m in modes if "_kv_" in m]:  # each further KV layout against the same mode's first
        base = results[fastest]
        print(f"{m} against {fastest} (step time ratio, higher is faster): {step_ratios(fastest, m)}; KV per stream "
              f"{results[m]['kv_bytes_per_stream'] / 2**20:.1f} vs {base['kv_bytes_per_stream'] / 2**20:.1f} MiB")
    for m in modes:
        for pf in results[m]["prefill"]:
            print(f"{m} prefill {pf['tokens']:>5} tokens: {pf['ms']:.1f} ms (to the first frame on the host)")
        for sg in results[m]["segments"]:
            print(f"{m} prefill of {sg['batch']:>2} segments of {sg['tokens']} tokens after {sg['start']}: {sg['ms']:.1f} ms")
    print(f"wrote {out / 'engine_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
