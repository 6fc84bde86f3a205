"""`python -m engine` writes a playable WAV of the right length and format."""

from __future__ import annotations

import subprocess
import sys

import av
import pytest
import numpy as np

from engine.audio import wav_bytes

HOP, RATE = 2048, 44100


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def read_wav(path):
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        fmt = (stream.codec_context.name, stream.rate, stream.channels)
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    return fmt, samples


def test_synthesizes_a_wav(tmp_path):
    out = tmp_path / "hello.wav"
    result = run("--text", "Hello there. How are you today?", "--out", str(out), "--model", "tiny",
                 "--max-frames", "20", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    fmt, samples = read_wav(out)
    assert fmt == ("pcm_s16le", RATE, 1)
    # two sentences fit one segment: at most 20 frames, a whole number of frames
    assert 0 < len(samples) <= 20 * HOP and len(samples) % HOP == 0
    assert np.abs(samples).max() > 0
    assert "real-time factor" in result.stdout


def test_reference_voice_and_stdin(tmp_path):
    t = np.arange(RATE) / RATE
    (tmp_path / "ref.wav").write_bytes(wav_bytes(0.3 * np.sin(2 * np.pi * 220 * t).astype(np.float32), RATE))
    out = tmp_path / "cloned.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "--text", "-", "--out", str(out), "--model", "tiny", "--max-frames", "8",
         "--reference", str(tmp_path / "ref.wav"), "--reference-text", "A low hum.", "--seed", "3"],
        input="Read from standard input.", cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    fmt, samples = read_wav(out)
    assert fmt == ("pcm_s16le", RATE, 1) and 0 < len(samples) <= 8 * HOP


def test_usage_errors(tmp_path):
    bad = run("--text", "x", "--reference", "a.wav", cwd=tmp_path)
    assert bad.returncode == 2 and "one --reference-text per --reference" in bad.stderr
    empty = run("--text", "   ", "--model", "tiny", cwd=tmp_path)
    assert empty.returncode == 2 and "nothing to say" in empty.stderr
    unknown = run("--text", "hi", "--model", "no-such-model", cwd=tmp_path)
    assert unknown.returncode != 0 and "neither 'default', a preset" in unknown.stderr



def test_many_segments_fit_a_short_context():
    """Segments keep coming after the context is full: it restarts from the voice prefix,
    and a segment is cut where the KV length ends instead of overrunning it."""
    from engine.bundle import load_bundle
    from engine.generate import GenerateOptions, Synthesizer

    synth = Synthesizer(load_bundle("tiny", "cpu"), max_len=200)
    segments = [f"Sentence number {i} is right here." for i in range(8)]
    frames = list(synth.frames(segments, options=GenerateOptions(max_frames=120)))
    assert 8 <= len(frames) <= 8 * 120
    with pytest.raises(ValueError, match="KV length 200"):
        list(synth.frames(["x" * 400]))
