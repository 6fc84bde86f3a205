"""Reference-audio I/O: real files encoded here with PyAV, decoded by engine.audio."""

from __future__ import annotations

import io
import math
import wave

import av
import numpy as np
import pytest

from engine.audio import AudioError, load_audio, resample, to_pcm16, wav_bytes, write_wav

TARGET = 44_100


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def encode(x: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """Encode float audio ([T] mono or [2, T] stereo) into a real file, in memory."""
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo" if x.shape[0] == 2 else "mono")
        ctx = stream.codec_context
        frame = av.AudioFrame.from_ndarray(x, format="fltp", layout=ctx.layout.name)
        frame.sample_rate = rate
        # the encoder's own sample format and frame size (mp3 1152, opus 960, aac 1024)
        converter = av.AudioResampler(format=ctx.format.name, layout=ctx.layout.name, rate=rate,
                                      frame_size=ctx.frame_size or None)
        for f in converter.resample(frame) + converter.resample(None):
            out.mux(stream.encode(f))
        out.mux(stream.encode(None))
    return buf.getvalue()


def peak_frequencies(y: np.ndarray, rate: int, count: int) -> list[float]:
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    peaks = []
    for _ in range(count):
        i = int(np.argmax(spectrum))
        peaks.append(i * rate / len(y))
        spectrum[max(0, i - 20):i + 21] = 0  # suppress the main lobe, find the next tone
    return sorted(peaks)


# container, codec, source rate, slack in source samples (codec frame padding / priming)
FORMATS = [
    ("wav", "pcm_s16le", 16_000, 0),
    ("mp3", "libmp3lame", 22_050, 1152),
    ("flac", "flac", 48_000, 0),
    ("ogg", "libopus", 48_000, 960),
    ("ipod", "aac", 24_000, 2 * 1024),  # .m4a; AAC keeps its priming samples
]


@pytest.mark.parametrize("container,codec,rate,slack", FORMATS, ids=[f[0] for f in FORMATS])
def test_decodes_and_resamples(container, codec, rate, slack):
    seconds = 1.0
    data = encode(tone(440.0, rate, seconds), rate, container, codec)
    y = load_audio(data, TARGET)
    assert y.dtype == np.float32 and y.ndim == 1
    expected = round(seconds * TARGET)
    tolerance = math.ceil(slack * TARGET / rate) + 1  # +1: the resampler's rounding
    assert expected - 1 <= len(y) <= expected + tolerance
    assert abs(peak_frequencies(y, TARGET, 1)[0] - 440.0) < 2.0
    rms = float(np.sqrt(np.mean(y[len(y) // 4: 3 * len(y) // 4] ** 2)))
    assert abs(rms - 0.5 / math.sqrt(2)) < 0.03  # the level survives the codec


def test_stereo_is_averaged_to_mono():
    rate = 32_000
    left, right = tone(440.0, rate, 1.0, 0.4), tone(1000.0, rate, 1.0, 0.4)
    y = load_audio(encode(np.stack([left, right]), rate, "flac", "flac"), TARGET)
    # both channels are present, each at half its level (a left-only decode would miss 1 kHz)
    assert [round(f) for f in peak_frequencies(y, TARGET, 2)] == [440, 1000]
    assert abs(np.abs(y).max() - 0.4) < 0.05  # (0.4 sin a + 0.4 sin b) / 2 peaks near 0.4


def test_path_input(tmp_path):
    x = tone(300.0, 16_000, 0.5)
    path = tmp_path / "ref.wav"
    write_wav(path, x, 16_000)
    for source in (path, str(path)):
        y = load_audio(source, 16_000)
        assert np.abs(y - x).max() < 1.5 / 32767  # 16-bit quantization only


def test_silence_is_fine():
    y = load_audio(wav_bytes(np.zeros(8000, np.float32), 16_000), TARGET)
    assert len(y) == round(0.5 * TARGET) and not y.any()


def test_garbage_bytes():
    with pytest.raises(AudioError, match="not a readable audio file"):
        load_audio(b"this is not audio" * 64, TARGET)


def test_empty_inputs(tmp_path):
    with pytest.raises(AudioError, match="empty"):
        load_audio(b"", TARGET)
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        load_audio(empty, TARGET)
    with pytest.raises(AudioError, match="no audio samples"):
        load_audio(wav_bytes(np.zeros(0, np.float32), 16_000), TARGET)


def test_missing_file(tmp_path):
    with pytest.raises(AudioError, match="no such audio file"):
        load_audio(tmp_path / "nope.wav", TARGET)


def test_too_long():
    data = wav_bytes(tone(440.0, 8_000, 3.0), 8_000)
    with pytest.raises(AudioError, match="longer than the 2 s limit"):
        load_audio(data, TARGET, max_seconds=2.0)
    assert len(load_audio(data, 8_000, max_seconds=3.0)) == 24_000  # exactly at the limit


@pytest.mark.parametrize("rate", [4_000, 7_999])
def test_source_rate_outside_range(rate):
    data = encode(tone(440.0, rate, 0.5, 0.3), rate, "wav", "pcm_s16le")
    with pytest.raises(AudioError, match=f"unsupported sample rate {rate} Hz"):
        load_audio(data, TARGET)


def test_lowest_supported_rate():
    y = load_audio(encode(tone(440.0, 8_000, 0.5), 8_000, "wav", "pcm_s16le"), TARGET)
    assert len(y) == round(0.5 * TARGET)


def test_target_rate_outside_range():
    with pytest.raises(AudioError, match="unsupported target rate 200000 Hz"):
        load_audio(wav_bytes(tone(440.0, 16_000, 0.1), 16_000), 200_000)


def test_resample_lengths_and_content():
    x = tone(440.0, 16_000, 1.0)
    up = resample(x, 16_000, TARGET)
    assert len(up) == TARGET
    reference = tone(440.0, TARGET, 1.0)
    # aligned (no resampler delay): the middle matches a tone generated at 44.1 kHz
    assert np.abs(up[1000:-1000] - reference[1000:-1000]).max() < 1e-3
    down = resample(up, TARGET, 24_000)
    assert len(down) == 24_000
    same = resample(x, 16_000, 16_000)
    assert np.array_equal(same, x) and same is not x


def test_pcm16():
    pcm = np.frombuffer(to_pcm16(np.array([0.0, 0.5, 1.0, -1.0, 2.0, -3.0, np.nan])), "<i2")
    assert pcm.tolist() == [0, 16384, 32767, -32767, 32767, -32767, 0]


def test_wav_bytes_header_and_round_trip():
    x = tone(1000.0, 24_000, 0.25)
    data = wav_bytes(x, 24_000)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24_000, 6000)
    assert np.abs(load_audio(data, 24_000) - x).max() < 1.5 / 32767


def plain_wav(extensible: bytes, channels: int, rate: int, width: int) -> bytes:
    """A WAVE_FORMAT_EXTENSIBLE file's samples rewritten under a plain PCM header."""
    data = extensible[extensible.index(b"data") + 8:]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_f64le"])
@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_and_float_wav_decode_without_pyav_to_ffmpegs_samples(codec, channels, monkeypatch):
    """PCM and float WAV are read with numpy (engine.audio._decode_wav): the same samples
    as FFmpeg's decode, bit for bit, every sample width, mono and stereo, plain and
    WAVE_FORMAT_EXTENSIBLE headers; and with PyAV not importable (the GPU image) a WAV at
    the target rate still loads."""
    import engine.audio as audio

    rate = 24_000
    x = tone(440.0, rate, 0.3, 0.6) if channels == 1 else np.stack([tone(440.0, rate, 0.3, 0.6),
                                                                     tone(1000.0, rate, 0.3, 0.3)])
    data = encode(x, rate, "wav", codec)
    variants = [data]
    if codec in ("pcm_s24le", "pcm_s32le"):  # FFmpeg writes those as WAVE_FORMAT_EXTENSIBLE
        assert data[20:22] == b"\xfe\xff"
        variants.append(plain_wav(data, channels, rate, int(codec[5:7]) // 8))
    for data in variants:
        assert audio._decode_wav(data, 60.0) is not None  # numpy's path takes it
        ours = load_audio(data, rate)
        with monkeypatch.context() as m:
            m.setattr(audio, "_decode_wav", lambda source, max_seconds: None)
            ffmpeg = load_audio(data, rate)
        assert ours.dtype == np.float32 and np.array_equal(ours, ffmpeg)
        with monkeypatch.context() as m:
            m.setitem(__import__("sys").modules, "av", None)  # import av now fails
            assert np.array_equal(load_audio(data, rate), ffmpeg)
            with pytest.raises(ImportError):
                load_audio(data, TARGET)  # resampling still needs PyAV


def test_wav_limits_without_pyav(tmp_path, monkeypatch):
    """The numpy WAV path keeps every limit and message of the PyAV one: too long, rate
    out of range, no samples; a path is read too."""
    monkeypatch.setitem(__import__("sys").modules, "av", None)
    with pytest.raises(AudioError, match="longer than the 2 s limit"):
        load_audio(wav_bytes(tone(440.0, 8_000, 3.0), 8_000), 8_000, max_seconds=2.0)
    assert len(load_audio(wav_bytes(tone(440.0, 8_000, 3.0), 8_000), 8_000, max_seconds=3.0)) == 24_000
    with pytest.raises(AudioError, match="unsupported sample rate 7999 Hz"):
        load_audio(wav_bytes(tone(440.0, 8_000, 0.1), 8_000)[:24] + (7999).to_bytes(4, "little")
                   + wav_bytes(tone(440.0, 8_000, 0.1), 8_000)[28:], 8_000)
    with pytest.raises(AudioError, match="no audio samples"):
        load_audio(wav_bytes(np.zeros(0, np.float32), 16_000), 16_000)
    path = tmp_path / "ref.wav"
    write_wav(path, tone(300.0, 16_000, 0.5), 16_000)
    assert len(load_audio(path, 16_000)) == 8_000
