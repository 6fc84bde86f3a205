"""`python -m latency_bench.qk_rope_bench`: the fused QK-norm + RoPE + KV-write kernel
(kernels/qk_rope_kv.py) against the PyTorch ops it replaces, same run.

Per batch size, at the S2-Pro slow layer's shape (32 query heads, 8 KV heads, head dim
128, QK-norm, KV cache of 1,536 positions): microseconds per layer of the fused kernel
and of the reference (the model's eager ops: norm, scale, RoPE, two cache writes), each
captured in one CUDA graph of 36 calls (one step's layers, as the decode graph replays
them; latency_bench/kernel_bench.py's Timer). Prints a table, writes <out>/qk_rope_bench.json.

    python -m latency_bench.qk_rope_bench --out out/qk_rope_bench          # H200
    python -m latency_bench.qk_rope_bench --smoke                          # CPU: checks the script
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from latency_bench.jsonfile import write_json
from latency_bench.kernel_bench import Timer, bench_device

LAYERS = 36
HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 32, 8, 128, 1536
BATCHES = [1, 4, 16, 64]


def bench(timer, batch: int, device: torch.device, dims: tuple[int, int, int, int]) -> dict:
    from engine.layers import rope_table
    from kernels.qk_rope_kv import qk_rope_kv, qk_rope_kv_reference

    h, kv, dh, length = dims
    dtype = torch.bfloat16
    qkv = torch.randn(batch, (h + 2 * kv) * dh, device=device, dtype=dtype)
    qs, ks = (torch.rand(dh, device=device, dtype=dtype) + 0.5 for _ in range(2))
    positions = torch.randint(0, length, (batch,), device=device)
    cos_sin = rope_table(length, dh, 1e6).to(device)[positions]
    slots = torch.randperm(batch, device=device)
    caches = [(torch.zeros(batch, length, kv, dh, device=device, dtype=dtype),
               torch.zeros(batch, length, kv, dh, device=device, dtype=dtype)) for _ in range(2)]
    args = lambda c: (qkv, qs, ks, cos_sin, 1e-6, *c, slots, positions, h)  # noqa: E731
    layers = 2 if device.type != "cuda" else LAYERS
    fused = timer.us_per_call([lambda: qk_rope_kv(*args(caches[0]))] * layers)
    reference = timer.us_per_call([lambda: qk_rope_kv_reference(*args(caches[1]))] * layers)
    return {"batch": batch, "fused_us": fused, "reference_us": reference, "speedup": reference / fused}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default=",".join(map(str, BATCHES)))
    p.add_argument("--smoke", action="store_true", help="CPU + Triton interpreter, small shapes: checks the script")
    p.add_argument("--out", default="out/qk_rope_bench")
    a = p.parse_args(argv)
    device = bench_device(a.smoke, "qk_rope_bench")
    if device is None:
        return 2
    cuda = device.type == "cuda"
    dims = (HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN) if cuda else (4, 2, 16, 32)
    batches = [1, 3] if a.smoke else [int(x) for x in a.batch.split(",")]
    rows = [bench(Timer(device), b, device, dims) for b in batches]
    print(f"fused QK-norm + RoPE + KV write vs PyTorch, per layer, on "
          f"{torch.cuda.get_device_name(device) if cuda else 'cpu (interpreter: means nothing)'}")
    print(" batch   fused us   reference us   speedup")
    for r in rows:
        print(f"{r['batch']:6d} {r['fused_us']:10.2f} {r['reference_us']:14.2f} {r['speedup']:8.2f}x")
    out = Path(a.out)
    write_json(out / "qk_rope_bench.json", {"device": str(device), "dims": dims, "rows": rows})
    print(f"wrote {out / 'qk_rope_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
