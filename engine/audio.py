"""Reference-audio I/O: decode any common container/codec with PyAV (FFmpeg), downmix to
mono, resample; and the 16-bit PCM / WAV writers.

Everything here is float32 mono in [-1, 1] as numpy arrays. Errors a caller can cause
(bad bytes, no audio, too long, odd rates) raise `AudioError`, a ValueError whose message
can be shown to the user as is.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np

MIN_RATE = 8_000
MAX_RATE = 192_000

AudioSource = bytes | bytearray | memoryview | str | Path


class AudioError(ValueError):
    pass


def pyav():
    """PyAV (FFmpeg), imported on first use: only decoding, resampling and the service's
    MP3/tempo/resampling stages need it, so the engine and a PCM/WAV/Opus service run
    where it is not installed (the GPU image)."""
    import av

    return av


def load_audio(source: AudioSource, target_rate: int, max_seconds: float = 60.0) -> np.ndarray:
    """Decode `source` (encoded bytes or a file path) to float32 mono at `target_rate`.

    Multi-channel audio is averaged. Decoding stops, with an error, as soon as more than
    `max_seconds` have been read, so a huge upload costs little.
    """
    _check_rate(target_rate, "target rate")
    x, rate = _decode_mono(source, max_seconds)
    return resample(x, rate, target_rate)


def resample(x: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Band-limited resampling of mono float audio with FFmpeg's swresample (delay
    compensated: the output is aligned with the input and has round(len * to / from)
    samples)."""
    _check_rate(from_rate, "source rate")
    _check_rate(to_rate, "target rate")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise AudioError(f"expected mono audio [T], got shape {x.shape}")
    if from_rate == to_rate or x.size == 0:
        return x.copy()
    av = pyav()
    frame = av.AudioFrame.from_ndarray(x[None], format="flt", layout="mono")
    frame.sample_rate = from_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to_rate)
    out = resampler.resample(frame) + resampler.resample(None)  # None flushes the tail
    return np.concatenate([f.to_ndarray()[0] for f in out]) if out else np.zeros(0, np.float32)


def to_pcm16(x: np.ndarray) -> bytes:
    """float [-1, 1] -> little-endian signed 16-bit bytes (clipped; NaN becomes 0)."""
    x = np.clip(np.nan_to_num(np.asarray(x, dtype=np.float32)), -1.0, 1.0)
    return np.rint(x * 32767.0).astype("<i2").tobytes()


def wav_bytes(x: np.ndarray, rate: int) -> bytes:
    """A complete 16-bit mono WAV file."""
    _check_rate(rate, "WAV rate")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(to_pcm16(x))
    return buf.getvalue()


def write_wav(path: str | Path, x: np.ndarray, rate: int) -> None:
    Path(path).write_bytes(wav_bytes(x, rate))


# ---------------------------------------------------------------------------------------


def _check_rate(rate: int, what: str) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"unsupported {what} {rate} Hz (supported: {MIN_RATE}..{MAX_RATE} Hz)")


def _open(source: AudioSource) -> tuple[av.container.InputContainer, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        name, data = "audio data", bytes(source)
        if not data:
            raise AudioError("audio data is empty (0 bytes)")
        file: io.BytesIO | str = io.BytesIO(data)
    else:
        path = Path(source)
        name = str(path)
        if not path.is_file():
            raise AudioError(f"{name}: no such audio file")
        if path.stat().st_size == 0:
            raise AudioError(f"{name}: audio file is empty (0 bytes)")
        file = name
    av = pyav()
    try:
        return av.open(file, mode="r"), name
    except av.FFmpegError as e:
        raise AudioError(f"{name}: not a readable audio file ({e.strerror or e})") from e


def _decode_mono(source: AudioSource, max_seconds: float) -> tuple[np.ndarray, int]:
    wav = _decode_pcm_wav(source, max_seconds)
    if wav is not None:
        return wav
    container, name = _open(source)
    with container:
        if not container.streams.audio:
            raise AudioError(f"{name}: no audio stream")
        stream = container.streams.audio[0]
        av = pyav()
        to_float = av.AudioResampler(format="fltp")  # same layout and rate, planar float
        chunks: list[np.ndarray] = []
        rate, total = 0, 0
        try:
            for frame in container.decode(stream):
                if not rate:
                    rate = frame.sample_rate
                    _check_source_rate(name, rate)
                total += _append_mono(chunks, to_float.resample(frame))
                _check_length(name, total, rate, max_seconds)
            total += _append_mono(chunks, to_float.resample(None))
        except av.FFmpegError as e:
            raise AudioError(f"{name}: audio could not be decoded ({e.strerror or e})") from e
    _check_not_empty(name, total)
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


# the limits on a decoded source, the same for the PyAV and the standard-library paths
def _check_source_rate(name: str, rate: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: unsupported sample rate {rate} Hz (supported: {MIN_RATE}..{MAX_RATE} Hz)")


def _check_length(name: str, samples: int, rate: int, max_seconds: float) -> None:
    if samples > max_seconds * rate:
        raise AudioError(f"{name}: audio is longer than the {max_seconds:g} s limit")


def _check_not_empty(name: str, samples: int) -> None:
    if samples == 0:
        raise AudioError(f"{name}: contains no audio samples")


# integer PCM sample widths the stdlib reads -> (numpy dtype, offset, full scale); FFmpeg
# converts them to float the same way (8-bit is unsigned around 128)
_PCM = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2147483648.0)}


def _decode_pcm_wav(source: AudioSource, max_seconds: float) -> tuple[np.ndarray, int] | None:
    """A plain integer-PCM WAV decoded with the standard library, the same samples FFmpeg
    gives; None for anything else (PyAV decodes it, or reports why it cannot). Why: a
    PCM/WAV service then needs no PyAV for WAV references at the codec's rate (the GPU
    image has no PyAV, and its 36 MB wheel does not fit beside the tree in a device call)."""
    in_memory = isinstance(source, (bytes, bytearray, memoryview))
    if in_memory:
        name, head = "audio data", bytes(source[:12])
    else:
        name = str(source)
        if not Path(source).is_file():
            return None  # _open says so
        with open(source, "rb") as f:
            head = f.read(12)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None  # checked first, so that other formats are not copied for the stdlib
    file = io.BytesIO(bytes(source)) if in_memory else name
    try:
        with wave.open(file, "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width not in (1, 2, 3, 4) or channels < 1:
                return None
            _check_source_rate(name, rate)
            _check_length(name, frames, rate, max_seconds)
            raw = w.readframes(frames)
    except (wave.Error, EOFError):
        return None  # not a WAV the stdlib reads (float, compressed, damaged): PyAV's turn
    raw = raw[: len(raw) - len(raw) % (channels * width)]
    _check_not_empty(name, len(raw))
    if width == 3:  # 24-bit: widen to 32 (the low byte zero), then as 32-bit
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        raw = np.concatenate([np.zeros((b.shape[0], 1), np.uint8), b], axis=1).tobytes()
        width = 4
    dtype, offset, scale = _PCM[width]
    x = (np.frombuffer(raw, dtype).astype(np.float32) - offset) / scale
    x = x.reshape(-1, channels)
    return (x.mean(axis=1) if channels > 1 else x[:, 0]).astype(np.float32, copy=False), rate


def _append_mono(chunks: list[np.ndarray], frames: list[av.AudioFrame]) -> int:
    """Average the channels of planar float frames into `chunks`; returns samples added."""
    added = 0
    for f in frames:
        planes = f.to_ndarray()  # [channels, n]
        chunks.append(planes.mean(axis=0) if planes.shape[0] > 1 else planes[0])
        added += planes.shape[1]
    return added
