"""`python -m latency_bench.attention_bench`: the decode-attention kernel alone, bf16 KV
cache against the FP8 one (kernels/kv_fp8.py), over its launch choices (positions per
program, per inner step, warps, stages). The cache is paged (`--page-size` positions a
page), each stream's pages consecutive.

The FP8 cache reads 0.56x the bytes, yet on an H200 the batch-64 step with it was slower
(kernels/FP8_NOTES.md): the bf16 kernel streams its KV at about the card's copy rate and
the FP8 one does not. This times one layer's attention at the decode shape (S2-Pro heads:
32 query heads, 8 KV heads of 128) for each (cache, block, warps, stages), reports each
one's effective bandwidth (the cache bytes it must read / its time) and the best FP8
choice against the best bf16 one: the ratio to beat is 1 / 0.56.

    python -m latency_bench.attention_bench --batch 64 --context 1000
    python -m latency_bench.attention_bench --smoke   # a CPU check of the script (interpreter)

With `--shared-prefix N` it times instead the default launch (launch_choice) of both
caches with every stream reading the full pages of its first N positions from its own
copy against from pages shared by every stream of its voice (kernels/decode_attention.py,
shared pages: N = 340 is the load benchmark's voice prompt), the same call's ratio;
`--voices V` splits the batch into V voices (stream i speaks voice i mod V):

    python -m latency_bench.attention_bench --batch 64 --context 700 --shared-prefix 340 --voices 2

Each call reads a different layer's cache (enough copies to overflow L2), inside a CUDA graph.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import L2_BYTES, Timer, bench_device


def make_cache(batch: int, context: int, kv_heads: int, head_dim: int, fp8: bool, page: int,
               device) -> tuple[tuple, torch.Tensor]:
    """(k, v) pages [1 + batch * ceil(context / page), page, K, D] and the page table
    [batch, ceil(context / page)]: stream b's pages consecutive after the scratch page 0."""
    from kernels.kv_fp8 import pack_kv

    per_row = -(-context // page)
    g = torch.Generator(device="cpu").manual_seed(0)
    k = torch.randn(1 + batch * per_row, page, kv_heads, head_dim, generator=g).to(device, torch.bfloat16)
    v = torch.randn(1 + batch * per_row, page, kv_heads, head_dim, generator=g).to(device, torch.bfloat16)
    table = torch.arange(1, 1 + batch * per_row, device=device, dtype=torch.int32).view(batch, per_row)
    return ((pack_kv(k), pack_kv(v)) if fp8 else (k, v)), table


def widened(table: torch.Tensor, max_length: int, page: int) -> torch.Tensor:
    """The page table with columns up to max_length, the new ones at the scratch page 0
    (never read: they lie past every length)."""
    width = max(table.shape[1], -(-max_length // page))
    return torch.nn.functional.pad(table, (0, width - table.shape[1])).contiguous()


def layer_copies(one: tuple, batch: int, context: int, smoke: bool) -> tuple[int, list[tuple]]:
    """The bytes one call must read, and copies of the (k, v) caches enough to overflow L2
    (each timed call reads another, as each layer of a step does)."""
    nbytes = sum(batch * context * c[0, 0].numel() * c.element_size() for c in one)
    copies = 2 if smoke else max(2, min(16, math.ceil(4 * L2_BYTES / nbytes)))
    return nbytes, [one] + [tuple(c.clone() for c in one) for _ in range(copies - 1)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.attention_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--splits", default="256,512", help="positions per program")
    p.add_argument("--blocks", default="32,64,128")
    p.add_argument("--warps", default="2,4,8")
    p.add_argument("--stages", default="1,2,3,4")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--page-size", type=int, default=16, help="positions a KV page")
    p.add_argument("--shared-prefix", type=int, default=0, metavar="N",
                   help="time own pages against the shared pages of an N-position prompt instead of the sweep")
    p.add_argument("--voices", type=int, default=1, help="with --shared-prefix: voices the batch speaks")
    p.add_argument("--max-length", type=int, default=0,
                   help="with --shared-prefix: the split count's bound (default the context; the engine's is its "
                        "--max-len, 4096: the splits past each length cost a program each)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="out/attention_bench")
    a = p.parse_args(argv)
    if a.voices != 1 and not a.shared_prefix:
        p.error("--voices times shared voice prompts: it needs --shared-prefix N")
    device = bench_device(a.smoke, "attention_bench")
    if device is None:
        return 2
    from kernels.decode_attention import decode_attention, decode_attention_reference

    heads, kv_heads, head_dim = (8, 2, 16) if a.smoke else (32, 8, 128)
    batch, context = (2, 40) if a.smoke else (a.batch, a.context)
    splits = [64] if a.smoke else [int(x) for x in a.splits.split(",")]
    blocks = [32] if a.smoke else [int(x) for x in a.blocks.split(",")]
    warps = [4] if a.smoke else [int(x) for x in a.warps.split(",")]
    stages = [2] if a.smoke else [int(x) for x in a.stages.split(",")]
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn(batch, heads, head_dim, generator=g).to(device, torch.bfloat16)
    slots = torch.arange(batch, device=device)  # page-table rows
    lengths = torch.full((batch,), context, device=device)
    timer = Timer(device, a.replays)
    if a.shared_prefix:
        return shared_prefix(a, q, slots, lengths, kv_heads, head_dim, timer, device)
    rows, t0 = [], time.perf_counter()
    for fp8 in (False, True):
        one, table = make_cache(batch, context, kv_heads, head_dim, fp8, a.page_size, device)
        nbytes, caches = layer_copies(one, batch, context, a.smoke)
        ref = decode_attention_reference(q.float(), *one, table, slots, lengths) if a.smoke else None
        for split, block, w, st in itertools.product(splits, blocks, warps, stages):
            if split % block:
                continue

            def call(kc, vc, split=split, block=block, w=w, st=st):
                return decode_attention(q, kc, vc, table, slots, lengths, max_length=context, block=block,
                                        num_warps=w, num_stages=st, split=split)
            if ref is not None:  # the smoke run checks what it times
                err = ((call(*one).float() - ref).norm() / ref.norm()).item()
                assert err < 0.05, err
            us = timer.us_per_call([lambda c=c: call(*c) for c in caches])
            rows.append({"fp8": fp8, "split": split, "block": block, "num_warps": w, "num_stages": st, "us": us,
                         "bytes": nbytes, "tb_per_s": nbytes / us / 1e6 if us == us else float("nan")})
            print(f"{'fp8 ' if fp8 else 'bf16'} split {split} block {block:>3} warps {w} stages {st}: {us:8.1f} us "
                  f"{rows[-1]['tb_per_s']:5.2f} TB/s", flush=True)
        del caches, one
    best = {fp8: min((r for r in rows if r["fp8"] == fp8 and r["us"] == r["us"]), key=lambda r: r["us"])
            for fp8 in (False, True)}
    ratio = best[False]["us"] / best[True]["us"]
    print(f"best bf16 {best[False]['us']:.1f} us, best fp8 {best[True]['us']:.1f} us: fp8 {ratio:.2f}x "
          f"(its bytes alone would give {best[False]['bytes'] / best[True]['bytes']:.2f}x)")
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
               "batch": batch, "context": context, "page_size": a.page_size, "heads": [heads, kv_heads, head_dim],
               "smoke": a.smoke,
               "seconds": time.perf_counter() - t0, "rows": rows, "fp8_vs_bf16": ratio}
    write_json(Path(a.out) / "attention_bench.json", results)
    return 0


def shared_prefix(a, q, slots, lengths, kv_heads, head_dim, timer, device) -> int:
    """The default launch of each cache kind, each stream's own copy of its voice prompt
    against the prompt's full pages shared by its voice's streams (those of the voice's
    first stream)."""
    from kernels.decode_attention import decode_attention

    batch, context, page = q.shape[0], int(lengths[0]), a.page_size
    n, voices = min(a.shared_prefix, context), max(1, min(a.voices, batch))
    full = n // page  # a prompt's partial last page stays each stream's own (the stream writes after it)
    max_length = max(a.max_length, context)
    rows, t0 = [], time.perf_counter()
    for fp8 in (False, True):
        one, own = make_cache(batch, context, kv_heads, head_dim, fp8, page, device)
        leaders = own[slots % voices, :full]  # stream i: voice i mod V, led by stream i mod V
        for cache in one:  # each stream holds its voice's prompt, as one voice's streams do
            cache[own[:, :full].flatten().long()] = cache[leaders.flatten().long()]
        shared = own.clone()
        shared[:, :full] = leaders
        tables = {"own": widened(own, max_length, page), "shared": widened(shared, max_length, page)}
        nbytes, caches = layer_copies(one, batch, context, a.smoke)
        outs = {name: decode_attention(q, *one, table, slots, lengths, max_length=max_length)
                for name, table in tables.items()}
        assert torch.equal(outs["own"], outs["shared"]), "shared pages changed the output"
        times = {name: timer.us_per_call([lambda c=c, table=table: decode_attention(
            q, *c, table, slots, lengths, max_length=max_length) for c in caches]) for name, table in tables.items()}
        unique = nbytes * (1 - full * page / context * (batch - voices) / batch)  # each shared page read once
        row = {"fp8": fp8, "voices": voices, "bytes": nbytes, "bytes_without_copies": unique}
        row |= {f"{name}_us": us for name, us in times.items()}
        row |= {"speedup": times["own"] / times["shared"]}
        rows.append(row)
        print(f"{'fp8 ' if fp8 else 'bf16'} batch {batch} context {context} prompt {n} ({full} shared pages of "
              f"{page}) voices {voices}: own pages {times['own']:.1f} us, shared pages {times['shared']:.1f} us: "
              f"{row['speedup']:.2f}x (bytes alone would allow {nbytes / unique:.2f}x)", flush=True)
        del caches, one
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
               "batch": batch, "context": context, "max_length": max_length, "page_size": page,
               "shared_prefix": n, "shared_pages": full, "voices": voices, "smoke": a.smoke,
               "seconds": time.perf_counter() - t0, "rows": rows}
    write_json(Path(a.out) / "attention_shared_prefix.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
