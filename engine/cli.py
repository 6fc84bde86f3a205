"""`python -m engine`: synthesize text to a WAV file with the single-stream path."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from engine.audio import write_wav
from engine.bundle import QUANT_MODES, load_bundle
from engine.generate import GenerateOptions, Synthesizer
from engine.prompt import Voice
from engine.sampling import SamplingParams
from engine.text import split_segments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    p.add_argument("--text", required=True, help="text to speak ('-' reads stdin)")
    p.add_argument("--out", default="out.wav", help="output WAV path (default: out.wav)")
    p.add_argument("--model", default="default", help="default | tiny | s1-mini | s2-pro | checkpoint folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--quant", default="none", choices=QUANT_MODES,
                   help="weight quantization (fp8: block-scaled FP8 linears; fp8-swiglu-epilogue: the MLP's SwiGLU in its "
                        "gate/up GEMM, measured slower than fp8; fp8-mlp-one-launch: that and both MLP GEMMs in one "
                        "launch, measured slower than fp8)")
    p.add_argument("--reference", action="append", default=[], help="reference audio file (repeatable)")
    p.add_argument("--reference-text", action="append", default=[], help="transcript of each --reference")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-frames", type=int, default=1024, help="frame limit per segment")
    p.add_argument("--segment-chars", type=int, default=200, help="longest text segment per turn")
    args = p.parse_args(argv)
    if len(args.reference) != len(args.reference_text):
        p.error("give one --reference-text per --reference")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = sys.stdin.read() if args.text == "-" else args.text
    segments = split_segments(text, args.segment_chars)
    if not segments:
        print("error: nothing to say (the text is empty after normalization)", file=sys.stderr)
        return 2
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    bundle = load_bundle(args.model, args.device, quant=args.quant)
    print(f"model {bundle.name} on {bundle.device} ({bundle.dtype}), loaded in {bundle.load_seconds:.2f} s")
    synth = Synthesizer(bundle)
    voice = Voice([synth.encode_reference(a, t) for a, t in zip(args.reference, args.reference_text)])
    t0 = time.perf_counter()
    chunks, first = [], None
    for chunk in synth.audio(segments, voice, params, GenerateOptions(max_frames=args.max_frames)):
        first = first or time.perf_counter() - t0
        chunks.append(chunk)
    elapsed = time.perf_counter() - t0
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    rate = bundle.codec.sample_rate
    write_wav(Path(args.out), audio, rate)
    seconds = len(audio) / rate
    print(
        f"wrote {args.out}: {seconds:.2f} s of audio at {rate} Hz in {elapsed:.2f} s "
        f"(real-time factor {elapsed / max(seconds, 1e-9):.2f}, first audio after {(first or 0) * 1000:.0f} ms)"
    )
    return 0
