"""Prints the measured parity errors against the upstream fixtures (for notes and reviews):

    .venv/bin/python scripts/upstream_parity/report.py

The tests (tests/test_checkpoint.py, tests/test_codec.py) assert the same quantities
against their bounds; this script only reports the numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_checkpoint import expected, greedy_frames  # noqa: E402  (the tests' own helpers)

from engine.checkpoint import load_checkpoint  # noqa: E402
from engine.codec.loader import load_codec  # noqa: E402
from engine.codec.streaming import StreamingDecoder  # noqa: E402
from engine.prompt import PromptBuilder, Reference, Voice  # noqa: E402

UPSTREAM = ROOT / "tests" / "fixtures" / "upstream"


def model_report(layout: str) -> str:
    model, tok = load_checkpoint(UPSTREAM / layout, "cpu", torch.float32)
    exp = expected(layout)
    voice = Voice([Reference(text, codes) for text, codes in exp["references"]])
    prompt_ok = torch.equal(PromptBuilder(tok, model.config).full(voice, exp["text"]), exp["prompt"])
    logits = model.full_logits(exp["prompt"])
    rel = ((logits - exp["logits"]).norm() / exp["logits"].norm()).item()
    worst = ((logits - exp["logits"]).abs().max() / exp["logits"].abs().max()).item()
    frames = greedy_frames(model, exp["prompt"], exp["greedy"].shape[1])
    same = int((frames == exp["greedy"]).all(dim=0).sum())
    return (f"{layout}: prompt tokens {'identical' if prompt_ok else 'DIFFER'} ({exp['prompt'].shape[1]} positions); "
            f"logits relative error {rel:.2e} (norm), {worst:.2e} (max abs / max); "
            f"greedy frames {same}/{exp['greedy'].shape[1]} identical")


def codec_report() -> str:
    folder = UPSTREAM / "codec"
    exp = load_file(folder / "expected.safetensors")
    codec = load_codec(folder / "codec.pth")
    with torch.no_grad():
        decoded = codec.decode(exp["decode_codes"])
        codes = codec.encode(exp["audio"])
        stream = StreamingDecoder(codec, max_streams=2)
        chunks, t = [], 0
        for n in (1, 3, 7, 3):
            chunks.append(stream.decode(torch.tensor([1, 0]), exp["decode_codes"][:, :, t:t + n]))
            t += n
    ref = exp["decoded"]
    whole = ((decoded - ref).abs().max() / ref.abs().max()).item()
    streamed = ((torch.cat(chunks, dim=-1) - ref).abs().max() / ref.abs().max()).item()
    return (f"codec: decode relative error {whole:.2e}, streamed in chunks of 1/3/7/3 frames {streamed:.2e} "
            f"(max abs / max); encode codes {'identical' if torch.equal(codes, exp['codes']) else 'DIFFER'}")


if __name__ == "__main__":
    for line in (model_report("s1"), model_report("s2"), codec_report()):
        print(line)
