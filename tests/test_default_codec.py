"""The packaged codec of the default voice (engine/assets/default/codec.pth, issue 6) keeps
the words: the fast subset of its round-trip gate (the full one: `python -m
training.evaluate --codec engine/assets/default --data <teacher data> --limit 30`).

Teacher clips of held-out plain sentences and of Austen sentences (tests/fixtures/voice,
never in training; training/recipe/make_codec_fixtures.py made the plain ones) are encoded
and decoded on the CPU, offline and through the engine's streaming decoder in the chunk
sizes the codec worker uses, and pocketsphinx scores each beside the teacher itself. A
decode path that produces garbage at full speed (here: the codebooks in the wrong order)
scores near 1.0, and the test shows that it does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.audio import load_audio
from engine.bundle import DEFAULT_FOLDER
from engine.codec.loader import load_codec
from engine.codec.streaming import StreamingDecoder
from training.evaluate import WER, Recognizer

FIXTURES = Path(__file__).parent / "fixtures" / "voice"
CODEC = DEFAULT_FOLDER / "codec.pth"
# 6 clips, ~60 words: the teacher scores ~0.21 on them, the packaged codec ~0.25 (2026-12-02)
MAX_WER = 0.45
MAX_WER_OVER_TEACHER = 0.25
CHUNKS = (1, 2, 4, 8, 16)  # the codec worker's chunk sizes; the last repeats


@pytest.fixture(scope="module")
def codec():
    return load_codec(CODEC)


@pytest.fixture(scope="module")
def clips(codec):
    rows = json.loads((FIXTURES / "plain.json").read_text()) + json.loads((FIXTURES / "references.json").read_text())
    return [(r["text"], load_audio(FIXTURES / r["file"], codec.sample_rate)) for r in rows]


def stream(codec, codes: torch.Tensor) -> np.ndarray:
    decoder = StreamingDecoder(codec, max_streams=2)
    out, t, i = [], 0, 0
    while t < codes.shape[-1]:
        n = CHUNKS[min(i, len(CHUNKS) - 1)]
        out.append(decoder.decode(torch.tensor([1]), codes[:, :, t:t + n]))
        t, i = t + n, i + 1
    return torch.cat(out, dim=-1)[0].numpy()


def test_packaged_codec_is_the_trained_istft_codec_within_budget(codec):
    assert CODEC.stat().st_size <= 16 * 10**6  # of the voice's 40 MB
    assert codec.config.decoder_kind == "istft" and codec.config.istft_lookahead > 0
    assert codec.sample_rate == 22_050 and codec.num_codebooks == 6


def test_round_trip_keeps_the_words_offline_and_streamed(codec, clips):
    asr = Recognizer()
    wer = {name: WER() for name in ("teacher", "offline", "streamed", "codebooks_rotated")}
    for text, x in clips:
        with torch.no_grad():
            codes = codec.encode(torch.from_numpy(x)[None])
            offline = codec.decode(codes)[0].numpy()
            rotated = codec.decode(codes[:, torch.roll(torch.arange(codes.shape[1]), 1)])[0].numpy()
        streamed = stream(codec, codes)
        assert offline.shape == streamed.shape == (codes.shape[-1] * codec.hop_length,)
        for name, audio in (("teacher", x), ("offline", offline), ("streamed", streamed),
                            ("codebooks_rotated", rotated)):
            assert np.isfinite(audio).all()
            wer[name].add(text, asr.transcribe(audio, codec.sample_rate))
    report = {name: w.report() for name, w in wer.items()}
    for name in ("offline", "streamed"):
        assert wer[name].value <= MAX_WER, report
        assert wer[name].value <= wer["teacher"].value + MAX_WER_OVER_TEACHER, report
    assert wer["codebooks_rotated"].value > 0.8, report  # the measure tells garbage apart
