"""Reference-audio I/O: decode any common container/codec with PyAV (FFmpeg), PCM and
float WAV with numpy (engine.wav, whatever sizes its header claims), downmix to mono,
resample; the checks a reference voice must pass; and the 16-bit PCM / WAV writers.

Everything here is float32 mono in [-1, 1] as numpy arrays. Errors a caller can cause
(bad bytes, no audio, too long, odd rates, silence) raise `AudioError`, a ValueError whose
message can be shown to the user as is.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import wave
from pathlib import Path

import numpy as np

from engine import wav

MIN_RATE = 8_000
MAX_RATE = 192_000
MIN_REFERENCE_SECONDS = 0.5
# -60 dBFS: a voice recording peaks far above it, and so does its room noise; only digital
# silence or a muted input stays below (16-bit dither sits near -90 dBFS)
SILENT_PEAK = 10 ** (-60 / 20)

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


def load_reference(source: AudioSource, target_rate: int, max_seconds: float = 30.0) -> np.ndarray:
    """`load_audio` for a reference voice, which must also hold a voice to learn from.

    Refused (AudioError, the reason in the message) rather than used: audio shorter than
    MIN_REFERENCE_SECONDS (0.5 s, hardly a syllable), silent audio (peak below -60 dBFS),
    and NaN or infinite samples (a broken float WAV). Used, each would make a voice prompt
    of nothing: the model would clone silence or noise, and the user would hear a wrong
    voice with no error saying why.
    """
    name = _name(source)
    x = load_audio(source, target_rate, max_seconds)
    if len(x) < int(MIN_REFERENCE_SECONDS * target_rate):  # floor: exactly 0.5 s passes after resampling
        raise AudioError(f"{name}: reference audio is {len(x) / target_rate:.2f} s long, shorter than "
                         f"the {MIN_REFERENCE_SECONDS:g} s minimum")
    if not np.isfinite(x).all():
        raise AudioError(f"{name}: reference audio has NaN or infinite samples")
    if np.abs(x).max() < SILENT_PEAK:
        raise AudioError(f"{name}: reference audio is silent (its peak is below -60 dBFS)")
    return x


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


def _name(source: AudioSource) -> str:
    return "audio data" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


def _open(source: AudioSource) -> tuple[av.container.InputContainer, str]:
    name = _name(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise AudioError("audio data is empty (0 bytes)")
        file: io.BytesIO | str = io.BytesIO(data)
        head = data[:12]
    else:
        path = Path(source)
        if not path.is_file():
            raise AudioError(f"{name}: no such audio file")
        if path.stat().st_size == 0:
            raise AudioError(f"{name}: audio file is empty (0 bytes)")
        file = name
        with open(path, "rb") as f:
            head = f.read(12)
    av = pyav()
    try:
        return av.open(file, mode="r"), name
    except av.FFmpegError as e:
        kind = _kind(head)
        if kind:
            raise AudioError(f"{name}: the {kind} file is cut short or damaged ({e.strerror or e})") from e
        raise AudioError(f"{name}: not a readable audio file ({e.strerror or e}; expected WAV, MP3, "
                         "Ogg/Opus, WebM, FLAC or M4A)") from e


# magic bytes -> a format's name, to tell "damaged" from "not audio" when FFmpeg cannot open a file
_MAGIC = ((8, b"WAVE", "WAV"), (0, b"OggS", "Ogg"), (0, b"\x1aE\xdf\xa3", "WebM/Matroska"),
          (0, b"fLaC", "FLAC"), (0, b"ID3", "MP3"), (4, b"ftyp", "MP4/M4A"))


def _kind(head: bytes) -> str | None:
    return next((kind for at, magic, kind in _MAGIC if head[at:at + len(magic)] == magic), None)


def _decode_mono(source: AudioSource, max_seconds: float) -> tuple[np.ndarray, int]:
    decoded = _decode_wav(source, max_seconds)
    if decoded is not None:
        return decoded
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
        except av.FFmpegError as e:
            # a file cut short fails at its last, partial packet: keep the audio before it,
            # as a WAV cut short is read to its end
            if not total:
                raise AudioError(f"{name}: audio could not be decoded ({e.strerror or e})") from e
        total += _append_mono(chunks, to_float.resample(None))
    _check_not_empty(name, total)
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


# the limits on a decoded source, the same for the PyAV and the numpy WAV paths
def _check_source_rate(name: str, rate: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: unsupported sample rate {rate} Hz (supported: {MIN_RATE}..{MAX_RATE} Hz)")


def _check_length(name: str, samples: int, rate: int, max_seconds: float) -> None:
    if samples > max_seconds * rate:
        raise AudioError(f"{name}: audio is longer than the {max_seconds:g} s limit")


def _check_not_empty(name: str, samples: int) -> None:
    if samples == 0:
        raise AudioError(f"{name}: contains no audio samples")


def _decode_wav(source: AudioSource, max_seconds: float) -> tuple[np.ndarray, int] | None:
    """A PCM or float WAV read with numpy (engine.wav), the same samples FFmpeg gives, its
    length counted from the bytes present (a streamed WAV's header claims 0xFFFFFFFF); None
    for anything else (PyAV decodes it, or reports why it cannot). Why not PyAV: a PCM/WAV
    service then needs no PyAV for WAV references at the codec's rate (the GPU image has
    no PyAV, and its 36 MB wheel does not fit beside the tree in a device call)."""
    name = _name(source)
    with _buffer(source) as buf:
        if buf is None:
            return None  # _open says why
        try:
            layout = wav.parse(buf)
        except wav.WavError as e:
            raise AudioError(f"{name}: {e}") from None
        if layout is None:
            return None
        _check_source_rate(name, layout.rate)
        _check_length(name, layout.frames, layout.rate, max_seconds)
        _check_not_empty(name, layout.frames)
        data = bytes(buf[layout.offset:layout.offset + layout.nbytes])  # after the checks: a long file costs little
    x = wav.samples(data, layout)  # [frames, channels]
    return (x.mean(axis=1) if layout.channels > 1 else x[:, 0]).astype(np.float32, copy=False), layout.rate


@contextlib.contextmanager
def _buffer(source: AudioSource):
    """The bytes of `source`, a file mapped rather than read; None for a path that is not a
    non-empty file."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield memoryview(source).cast("B")
        return
    path = Path(source)
    if not path.is_file() or path.stat().st_size == 0:
        yield None
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        yield m


def _append_mono(chunks: list[np.ndarray], frames: list[av.AudioFrame]) -> int:
    """Average the channels of planar float frames into `chunks`; returns samples added."""
    added = 0
    for f in frames:
        planes = f.to_ndarray()  # [channels, n]
        chunks.append(planes.mean(axis=0) if planes.shape[0] > 1 else planes[0])
        added += planes.shape[1]
    return added
