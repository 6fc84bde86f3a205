"""Load time and single-stream speed of each preset on this machine (issue notes):

    .venv/bin/python scripts/preset_times.py tiny fp32 50
    .venv/bin/python scripts/preset_times.py s1-mini fp32 5
    .venv/bin/python scripts/preset_times.py s2-pro bf16 3
"""

import sys
import time

import torch

from engine.bundle import load_bundle
from engine.generate import GenerateOptions, Synthesizer
from engine.sampling import SamplingParams

name, dtype_name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
t0 = time.perf_counter()
bundle = load_bundle(name, "cpu", dtype)
loaded = time.perf_counter() - t0
synth = Synthesizer(bundle, max_len=512)
text, params, opts = ["Hello there, how are you?"], SamplingParams(seed=1), GenerateOptions(max_frames=n)
t0 = time.perf_counter()
frames = list(synth.frames(text, None, params, opts))
gen = time.perf_counter() - t0
t0 = time.perf_counter()
list(synth.audio(text, None, params, GenerateOptions(max_frames=n, chunk_frames=n)))
with_codec = time.perf_counter() - t0
print(f"{name} {dtype_name}: {bundle.config.num_parameters() / 1e6:.1f}M parameters, loaded in {loaded:.2f} s; "
      f"{len(frames)} frames in {gen:.2f} s ({1000 * gen / max(1, len(frames)):.0f} ms/frame incl. prefill); "
      f"with the codec {with_codec:.2f} s")
