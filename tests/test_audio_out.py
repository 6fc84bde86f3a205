"""Streaming audio encoders: what a client receives, concatenated, must be one valid file of
its format that FFmpeg (PyAV) decodes to the input's content and duration."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import opuslib
import pytest

from realtime.audio_out import MIN_CHUNK_BYTES, AudioEncoder, OpusPacketEncoder, finalize_wav

RATE = 44_100  # the codec rate the engine produces
SECONDS = 1.5
SIZES = (2048, 4096, 1000, 3, 0, 1, 2500, 777, 6144)  # irregular engine chunks, incl. empty
MP3_DELAY = 1105  # LAME's encoder delay (576 + 529); a bare mp3 stream cannot declare it


def tones(seconds: float = SECONDS, rate: int = RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)


X = tones()


def stream(enc, x: np.ndarray = X, sizes=SIZES) -> list:
    """Every output of encode() over irregular chunks, then flush()'s."""
    outs, pos, i = [], 0, 0
    while pos < x.size:
        n = sizes[i % len(sizes)]
        outs.append(enc.encode(x[pos:pos + n]))
        pos, i = pos + n, i + 1
    outs.append(enc.flush())
    return outs


def decode(data: bytes, fmt: str, rate: int) -> tuple[str, str, int, int, np.ndarray]:
    """-> (container, codec, sample rate, channels, [T] float samples)."""
    if fmt == "pcm":  # raw s16le: nothing to probe
        assert len(data) % 2 == 0
        return "raw", "pcm_s16le", rate, 1, np.frombuffer(data, "<i2").astype(np.float32) / 32768
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.audio[0]
        chunks = []
        for f in c.decode(s):
            a = f.to_ndarray()  # [channels, n] planar or [1, n * channels] packed
            chunks.append(a.astype(np.float32) / 32768 if a.dtype == np.int16 else a.astype(np.float32))
        return c.format.name, s.codec_context.name, s.rate, s.channels, np.concatenate(chunks, axis=1)[0]


def dominant_hz(y: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    return float(np.argmax(spectrum) * rate / y.size)


def band_levels(y: np.ndarray, rate: int) -> np.ndarray:
    """Magnitude spectrum in 50 Hz bands up to 4 kHz, normalised: a coarse fingerprint."""
    spectrum = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    freqs = np.fft.rfftfreq(y.size, 1 / rate)
    bands = np.array([spectrum[(freqs >= lo) & (freqs < lo + 50)].sum() for lo in range(0, 4000, 50)])
    return bands / np.linalg.norm(bands)


CASES = [  # (format, output rate, container, codec)
    ("pcm", 16000, "raw", "pcm_s16le"),
    ("wav", 24000, "wav", "pcm_s16le"),
    ("wav", 44100, "wav", "pcm_s16le"),
    ("mp3", 44100, "mp3", "mp3float"),
    ("mp3", 24000, "mp3", "mp3float"),
    ("opus", 48000, "ogg", "opus"),
]


def expected_samples(rate: int, speed: float = 1.0) -> int:
    return round(round(X.size / speed) * rate / RATE)


def check_duration(fmt: str, n: int, want: int, rate: int) -> None:
    if fmt == "mp3":  # encoder delay at the start, the last frame's padding at the end
        assert want <= n <= want + MP3_DELAY + 1152, (n, want)
    else:  # Ogg Opus declares pre-skip and end trimming; pcm/wav are exact
        assert abs(n - want) <= rate // 1000, (n, want)


@pytest.mark.parametrize("fmt,rate,container,codec", CASES)
def test_stream_decodes_to_the_input(fmt, rate, container, codec):
    enc = AudioEncoder(fmt, rate)
    data = b"".join(stream(enc))
    got_container, got_codec, got_rate, channels, y = decode(data, fmt, rate)
    assert (got_container, got_codec, got_rate, channels) == (container, codec, rate, 1)
    check_duration(fmt, y.size, expected_samples(rate), rate)
    assert enc.samples_out == expected_samples(rate)
    assert dominant_hz(y, rate) == pytest.approx(440, abs=2)
    assert np.sqrt(np.mean(y**2)) == pytest.approx(np.sqrt(0.3**2 / 2 + 0.2**2 / 2), rel=0.1)


@pytest.mark.parametrize("fmt,rate", [(c[0], c[1]) for c in CASES])
def test_chunked_equals_one_shot(fmt, rate):
    chunked = decode(b"".join(stream(AudioEncoder(fmt, rate))), fmt, rate)[4]
    one_shot = decode(b"".join(stream(AudioEncoder(fmt, rate), sizes=(X.size,))), fmt, rate)[4]
    assert chunked.size == one_shot.size
    if fmt in ("pcm", "wav"):  # the streaming resampler is exact, up to 16-bit rounding
        assert np.abs(chunked - one_shot).max() <= 1 / 32768
    else:
        assert band_levels(chunked, rate) @ band_levels(one_shot, rate) > 0.999


def test_pcm_has_no_discontinuity_at_chunk_boundaries():
    # tiny chunks put a boundary every few samples: any glitch would show as a jump
    y = decode(b"".join(stream(AudioEncoder("pcm", 24000), sizes=(3, 1, 2048, 7, 500))), "pcm", 24000)[4]
    ref = decode(b"".join(stream(AudioEncoder("pcm", 24000), sizes=(X.size,))), "pcm", 24000)[4]
    assert np.abs(np.diff(y)).max() <= np.abs(np.diff(ref)).max() + 2 / 32768


@pytest.mark.parametrize("fmt,rate", [("pcm", 16000), ("wav", 44100), ("mp3", 24000), ("opus", 48000)])
def test_speed_changes_tempo_not_pitch(fmt, rate):
    enc = AudioEncoder(fmt, rate, speed=1.5)
    y = decode(b"".join(stream(enc)), fmt, rate)[4]
    check_duration(fmt, y.size, expected_samples(rate, 1.5), rate)
    assert enc.samples_out == expected_samples(rate, 1.5)
    assert dominant_hz(y, rate) == pytest.approx(440, abs=2)


def test_slow_speed_and_one_shot_agree_on_length():
    for sizes in (SIZES, (X.size,)):
        y = decode(b"".join(stream(AudioEncoder("pcm", 44100, speed=0.5), sizes=sizes)), "pcm", 44100)[4]
        assert y.size == 2 * X.size
        assert dominant_hz(y, 44100) == pytest.approx(440, abs=2)


@pytest.mark.parametrize("fmt,rate", [("pcm", 24000), ("opus", 48000)])
def test_volume_is_a_gain(fmt, rate):
    def rms(volume_db):
        y = decode(b"".join(stream(AudioEncoder(fmt, rate, volume_db=volume_db))), fmt, rate)[4]
        return np.sqrt(np.mean(y[rate // 10: -rate // 10] ** 2))

    assert rms(-6.0) / rms(0.0) == pytest.approx(10 ** (-6 / 20), rel=0.02)


def test_loud_volume_clips_instead_of_wrapping():
    y = decode(b"".join(stream(AudioEncoder("pcm", 44100, volume_db=20.0))), "pcm", 44100)[4]
    assert np.abs(y).max() == pytest.approx(32767 / 32768)
    assert dominant_hz(y, 44100) == pytest.approx(440, abs=2)


# --- WAV ------------------------------------------------------------------------------------

def test_wav_header_comes_once_with_the_first_audio():
    outs = [o for o in stream(AudioEncoder("wav", 24000)) if o]
    assert outs[0][:4] == b"RIFF" and outs[0][8:16] == b"WAVEfmt "
    assert struct.unpack_from("<I", outs[0], 4)[0] == 0xFFFFFFFF  # streaming: size unknown
    assert not any(b"RIFF" in o for o in outs[1:])
    assert sum(map(len, outs)) == 44 + 2 * expected_samples(24000)


def test_finalize_wav_fills_in_the_sizes():
    data = finalize_wav(b"".join(stream(AudioEncoder("wav", 24000))))
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == expected_samples(24000)
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8
    with pytest.raises(ValueError, match="RIFF/WAVE"):
        finalize_wav(b"ID3\x03" + bytes(40))


def test_empty_utterance_is_a_valid_wav():
    data = AudioEncoder("wav", 16000).flush()
    with wave.open(io.BytesIO(finalize_wav(data))) as w:
        assert (w.getframerate(), w.getnframes()) == (16000, 0)


def test_encoder_starts_a_new_file_after_flush():
    enc = AudioEncoder("wav", 16000)
    first, second = b"".join(stream(enc)), b"".join(stream(enc, X[: RATE // 2]))
    assert decode(first, "wav", 16000)[4].size == expected_samples(16000)
    assert decode(second, "wav", 16000)[4].size == 8000
    assert enc.samples_out == expected_samples(16000) + 8000


# --- Ogg Opus -------------------------------------------------------------------------------

def ogg_crc_bitwise(data: bytes) -> int:
    """The Ogg CRC, one bit at a time (independent of the table in audio_out)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def parse_pages(data: bytes) -> list[dict]:
    pages, pos = [], 0
    while pos < len(data):
        magic, version, flags, granule, serial, seq, crc, n_seg = struct.unpack_from("<4sBBqIIIB", data, pos)
        assert (magic, version) == (b"OggS", 0)
        lacing = data[pos + 27: pos + 27 + n_seg]
        end = pos + 27 + n_seg + sum(lacing)
        page = bytearray(data[pos:end])
        page[22:26] = bytes(4)
        assert ogg_crc_bitwise(page) == crc
        packets, cur = [], bytearray()
        body = pos + 27 + n_seg
        for lace in lacing:
            cur += data[body: body + lace]
            body += lace
            if lace < 255:
                packets.append(bytes(cur))
                cur = bytearray()
        assert not cur  # we never continue a packet on the next page
        pages.append(dict(flags=flags, granule=granule, serial=serial, seq=seq, packets=packets))
        pos = end
    return pages


def test_ogg_pages_are_well_formed():
    outs = stream(AudioEncoder("opus", 48000, opus_bitrate=64))
    pages = parse_pages(b"".join(outs))
    head, tags, audio = pages[0], pages[1], pages[2:]
    assert head["packets"][0][:8] == b"OpusHead" and head["flags"] == 0x02
    pre_skip = struct.unpack_from("<H", head["packets"][0], 10)[0]
    assert tags["packets"][0][:8] == b"OpusTags" and tags["granule"] == 0
    assert [p["seq"] for p in pages] == list(range(len(pages)))
    assert len({p["serial"] for p in pages}) == 1
    granules = [p["granule"] for p in audio]
    assert granules == sorted(granules)
    assert [p["flags"] for p in audio] == [0] * (len(audio) - 1) + [0x04]  # EOS only on the last
    assert granules[-1] == pre_skip + expected_samples(48000)  # end trimming: real samples only
    for page in audio[:-1]:  # every 20 ms packet counts 960 samples
        assert page["granule"] % 960 == 0
    # low latency: each non-empty output is whole pages, sent as soon as it has a packet
    for out in outs:
        if out:
            assert out[:4] == b"OggS"


def test_opus_pages_go_out_as_soon_as_they_pass_a_kilobyte():
    enc = AudioEncoder("opus", 48000)  # 32 kbps: ~170 bytes an engine frame
    outs = [enc.encode(X[i:i + 2048]) for i in range(0, 8 * 2048, 2048)]  # 46 ms each
    first = next(i for i, out in enumerate(outs) if out)
    pages = parse_pages(outs[first])
    assert [p["packets"][0][:8] for p in pages[:2]] == [b"OpusHead", b"OpusTags"]
    # one audio page a call, each with a packet; held only until the bytes pass 1,024
    assert len(pages) == 2 + first + 1 and all(p["packets"] for p in pages[2:])
    last_page = 27 + sum(len(p) // 255 + 1 + len(p) for p in pages[-1]["packets"])
    assert len(outs[first]) - last_page < MIN_CHUNK_BYTES <= len(outs[first])


@pytest.mark.parametrize("kbps", [24, 64, -1000])
def test_opus_bitrate(kbps):
    data = b"".join(stream(AudioEncoder("opus", 48000, opus_bitrate=kbps)))
    y = decode(data, "opus", 48000)[4]
    assert dominant_hz(y, 48000) == pytest.approx(440, abs=2)
    if kbps > 0:  # the payload rate follows the requested bitrate
        assert len(data) * 8 / SECONDS / 1000 == pytest.approx(kbps, rel=0.35)


def test_raw_opus_packets_decode():
    enc = OpusPacketEncoder(opus_bitrate=32)
    packets = [p for out in stream(enc) for p in out]
    decoder = opuslib.Decoder(48000, 1)
    pcm = []
    for p in packets:
        y = np.frombuffer(decoder.decode(p, 5760), "<i2")  # 5760 = the longest Opus packet
        assert y.size == 960  # 20 ms
        pcm.append(y)
    y = np.concatenate(pcm)[enc.pre_skip:].astype(np.float32) / 32768
    assert expected_samples(48000) <= y.size < expected_samples(48000) + 960
    assert dominant_hz(y[: expected_samples(48000)], 48000) == pytest.approx(440, abs=2)
    assert enc.samples_out == expected_samples(48000)


# --- MP3 ------------------------------------------------------------------------------------

def test_mp3_bitrate_and_frames():
    sizes = {}
    for kbps in (64, 192):
        data = b"".join(stream(AudioEncoder("mp3", 44100, mp3_bitrate=kbps)))
        assert data[:2] == b"\xff\xfb"  # MPEG-1 layer III frame sync, no ID3 or Xing prefix
        sizes[kbps] = len(data)
    assert sizes[192] / sizes[64] == pytest.approx(3, rel=0.1)


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(fmt="flac", output_rate=44100), "unsupported audio format 'flac'"),
    (dict(fmt="opus", output_rate=44100), "sample rate 44100 is not supported for opus"),
    (dict(fmt="wav", output_rate=12345), "sample rate 12345 is not supported for wav"),
    (dict(fmt="mp3", output_rate=8000), "sample rate 8000 is not supported for mp3"),
    (dict(fmt="pcm", output_rate=16000, input_rate=1000), "input rate 1000"),
    (dict(fmt="mp3", output_rate=44100, mp3_bitrate=100), "mp3 bitrate 100"),
    (dict(fmt="opus", output_rate=48000, opus_bitrate=10), "opus bitrate 10"),
    (dict(fmt="pcm", output_rate=16000, speed=3.0), r"speed must be in \[0.5, 2.0\]"),
    (dict(fmt="pcm", output_rate=16000, speed=float("nan")), "speed"),
    (dict(fmt="pcm", output_rate=16000, volume_db=30.0), "volume must be in"),
])
def test_bad_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AudioEncoder(**kwargs)


def test_non_mono_input_is_rejected():
    with pytest.raises(ValueError, match="mono"):
        AudioEncoder("pcm", 44100).encode(np.zeros((2, 100), np.float32))


@pytest.mark.parametrize("fmt, rate", [("pcm", 16000), ("wav", 44100), ("opus", 48000), ("mp3", 44100), ("mp3", 24000)])
def test_drain_delivers_a_whole_turn_and_keeps_one_file(fmt, rate):
    """At a turn's end everything encoded so far comes out (as silence-padded audio), and
    the stream goes on as one valid file for the next turn."""
    enc = AudioEncoder(fmt, rate)
    sr = 44100
    t = np.arange(int(0.5 * sr)) / sr
    turn = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    first = enc.encode(turn) + enc.drain()
    out_first = enc.samples_out
    rest = enc.encode(turn) + enc.drain() + enc.flush()
    # the first turn's audio (0.5 s) is all emitted by the drain
    assert out_first >= 0.5 * rate
    # plus a little silence at most (mp3 needs the most: LAME's delay and lookahead frames)
    assert out_first <= 0.5 * rate + (0.2 if fmt == "mp3" else 0.04) * rate
    data = first + rest
    if fmt == "pcm":
        assert len(first) == 2 * out_first
        return

    def decoded(blob):
        with av.open(io.BytesIO(blob)) as c:
            stream = c.streams.audio[0]
            return stream, np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(stream)])

    # what was sent up to the drain already decodes to the whole first turn
    stream, head = decoded(first)
    delay = 1105 if fmt == "mp3" else 0  # kept by mp3 decoders
    assert len(head) >= 0.5 * stream.rate + delay - 2
    # its last real 10 ms are the tone, not silence
    tail = head[delay + int(0.49 * stream.rate) : delay + int(0.5 * stream.rate)]
    assert np.abs(tail).max() > 0.2
    stream, pcm = decoded(data)
    # a bare mp3 stream keeps LAME's delay and the last frame's padding (see _Mp3Sink)
    tolerance = (1105 + 2 * 1152) / rate if fmt == "mp3" else 0.06
    assert abs(len(pcm) / stream.rate - enc.samples_out / rate) < tolerance


@pytest.mark.parametrize("fmt, rate, kbps", [
    ("pcm", 8000, 0), ("pcm", 44100, 0), ("wav", 8000, 0), ("mp3", 16000, 64), ("mp3", 44100, 128),
    ("mp3", 48000, 64), ("opus", 48000, 24), ("opus", 48000, -1000),
])
def test_only_a_turns_end_returns_a_kilobyte_or_less(fmt, rate, kbps):
    """Pipecat's Fish client (up to pipecat-ai 1.12) drops audio messages of 1,024 bytes or
    less: every encode() output is empty or larger; drain() and flush() return the rest."""
    bitrate = {"mp3_bitrate": kbps} if fmt == "mp3" else {"opus_bitrate": kbps} if fmt == "opus" else {}
    enc = AudioEncoder(fmt, rate, **bitrate)
    frames = [X[i:i + 2048] for i in range(0, 16 * 2048, 2048)]  # the engine's 2048-sample frames
    outs = []
    for turn in (frames, frames[:3], frames[:1]):  # long, short and one-frame turns
        outs += [enc.encode(x) for x in turn]
        enc.drain()
    enc.flush()
    assert all(len(out) == 0 or len(out) >= MIN_CHUNK_BYTES for out in outs)
    assert any(outs)
