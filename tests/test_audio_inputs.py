"""Reference audio as users send it: streamed WAVs with placeholder sizes, odd WAV headers
and sample formats, compressed files, damaged and silent ones. Each is either loaded (its
real duration, rate and downmix) or refused with `bad_audio` naming why; a few go through
a real server as `references` of a WebSocket session and as a stored voice."""

from __future__ import annotations

import asyncio
import base64
import struct

import httpx
import msgpack
import numpy as np
import pytest
import websockets

from engine.audio import AudioError, load_audio, load_reference, wav_bytes
from engine.engine import EngineConfig
from realtime.audio_out import AudioEncoder
from server import running_server
from test_audio import encode, tone

TARGET = 44_100
HOP = 2048  # the tiny model's codec: 2048 samples a frame at 44.1 kHz
PLACEHOLDER = 0xFFFFFFFF

# --- hand-built WAV files ------------------------------------------------------------------

KINDS = {"u8": (1, 8), "s16": (1, 16), "s24": (1, 24), "s32": (1, 32), "f32": (3, 32), "f64": (3, 64)}
SUBTYPE_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_*


def chunk(cid: bytes, body: bytes, size: int | None = None) -> bytes:
    """One RIFF chunk with its pad byte; `size` overrides the size the header states."""
    return cid + struct.pack("<I", len(body) if size is None else size) + body + b"\0" * (len(body) & 1)


def fmt_chunk(kind: str, channels: int, rate: int, extensible: bool = False, align: int | None = None) -> bytes:
    tag, bits = KINDS[kind]
    align = channels * bits // 8 if align is None else align
    body = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, rate, rate * align, align, bits)
    if extensible:  # cbSize, valid bits, channel mask, SubFormat GUID
        body += struct.pack("<HHIH", 22, bits, 0, tag) + SUBTYPE_TAIL
    return chunk(b"fmt ", body)


def pcm(x: np.ndarray, kind: str) -> bytes:
    """float [T] or [T, channels] -> interleaved samples of `kind`."""
    x = np.asarray(x, np.float64)
    if kind == "u8":
        return np.clip(np.round(x * 128 + 128), 0, 255).astype("u1").tobytes()
    if kind in ("f32", "f64"):
        return x.astype("<f4" if kind == "f32" else "<f8").tobytes()
    bits = KINDS[kind][1]
    v = np.round(x * (2 ** (bits - 1) - 1)).astype("<i4")
    if kind == "s24":
        return v.view("u1").reshape(-1, 4)[:, :3].tobytes()
    return v.astype("<i2" if kind == "s16" else "<i4").tobytes()


def wav(x: np.ndarray, rate: int, kind: str = "s16", *, before: bytes = b"", after: bytes = b"",
        riff_size: int | None = None, data_size: int | None = None, extensible: bool = False) -> bytes:
    """A WAV of `x` ([T] or [T, channels]): fmt, the `before` chunks, data, the `after` chunks;
    the RIFF and data sizes as given (default: right)."""
    channels = 1 if x.ndim == 1 else x.shape[1]
    body = (b"WAVE" + fmt_chunk(kind, channels, rate, extensible) + before
            + chunk(b"data", pcm(x, kind), data_size) + after)
    return b"RIFF" + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def channels_of(seconds: float, rate: int, n: int) -> np.ndarray:
    """[T, n]: channel c a tone of its own frequency and level, so a downmix is checkable."""
    return np.stack([tone(300.0 + 170 * c, rate, seconds, 0.5 / (1 + c)) for c in range(n)], axis=1)


def seconds(y: np.ndarray, rate: int = TARGET) -> float:
    return len(y) / rate


# --- streamed WAV: the service's own, FFmpeg's pipe output ------------------------------------

def service_streamed_wav(x: np.ndarray, rate: int) -> bytes:
    """A WAV made by the code the service streams `format: wav` with, chunk by chunk."""
    enc = AudioEncoder("wav", rate, input_rate=rate)
    return b"".join(enc.encode(x[i:i + 2048]) for i in range(0, len(x), 2048)) + enc.flush()


def test_the_services_streamed_wav_is_read_to_its_end():
    """Issue 50: 4.3 s streamed by this service was refused as longer than 30 s."""
    x = tone(220.0, 24_000, 4.3)
    data = service_streamed_wav(x, 24_000)
    assert struct.unpack_from("<I", data, 4)[0] == PLACEHOLDER == struct.unpack_from("<I", data, 40)[0]
    y = load_audio(data, 24_000, max_seconds=30.0)
    assert len(y) == len(x) and np.abs(y - x).max() < 1.5 / 32767
    assert abs(seconds(load_reference(data, TARGET, max_seconds=30.0)) - 4.3) < 1e-4


class Pipe:
    """A write-only file: FFmpeg cannot seek back to fill in the sizes, as on a pipe."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b) -> int:
        self.data += b
        return len(b)


def test_ffmpegs_pipe_output_is_read_to_its_end():
    import av

    x = tone(440.0, 16_000, 1.5)
    out = Pipe()
    with av.open(out, "w", format="wav") as c:
        stream = c.add_stream("pcm_s16le", rate=16_000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.round(x * 32767).astype(np.int16)[None], format="s16", layout="mono")
        frame.sample_rate = 16_000
        for packet in stream.encode(frame) + stream.encode(None):
            c.mux(packet)
    data = bytes(out.data)
    assert struct.unpack_from("<I", data, 4)[0] == PLACEHOLDER and b"LIST" in data[:80]  # with its INFO chunk
    y = load_audio(data, 16_000)
    assert len(y) == len(x) and np.abs(y - x).max() < 1.5 / 32767


# --- WAV headers whose sizes are wrong, and extra chunks ---------------------------------------

X = tone(330.0, 16_000, 1.0)  # 16,000 samples, 32,000 bytes of s16
LIST_INFO = chunk(b"LIST", b"INFO" + chunk(b"ISFT", b"recorder 1.0\0"))


@pytest.mark.parametrize("riff_size, data_size, before", [
    (PLACEHOLDER, PLACEHOLDER, b""),  # streamed: this service
    (PLACEHOLDER, PLACEHOLDER, LIST_INFO),  # streamed with an INFO chunk first: FFmpeg's pipe output
    (0, 0, b""),  # streamed, sizes left at 0
    (None, 64_000, b""),  # claims 2 s, holds 1 s (cut short): what is there
    (None, 10_000, b""),  # claims less, samples follow (header written mid-recording): to the end
    (None, 10_001, LIST_INFO),  # an odd data size, and stale
    (12, None, b""),  # a wrong RIFF size is ignored
], ids=["placeholder", "placeholder-LIST", "zero", "too-large", "too-small", "odd", "riff-size"])
def test_wav_sizes_are_checked_against_the_bytes_present(riff_size, data_size, before):
    y = load_audio(wav(X, 16_000, riff_size=riff_size, data_size=data_size, before=before), 16_000)
    assert len(y) == len(X) and np.abs(y - X).max() < 1.5 / 32767


def test_wav_cut_mid_sample_keeps_whole_frames():
    data = wav(channels_of(1.0, 16_000, 2), 16_000, "s24")  # 6-byte frames
    y = load_audio(data[:-4], 16_000)
    assert len(y) == 16_000 - 1


def test_wav_extra_chunks_are_skipped():
    """Chunks before the samples are skipped; one after them ends the data where its size says."""
    before = (chunk(b"fact", struct.pack("<I", len(X))) + chunk(b"JUNK", bytes(28)) + LIST_INFO
              + chunk(b"odd ", b"abc") + chunk(b"bext", bytes(603)))  # odd sizes, each with its pad byte
    data = wav(X, 16_000, before=before, after=chunk(b"id3 ", b"ID3" + bytes(7)))
    assert data.index(b"odd ") % 2 == 0 and data.index(b"data") % 2 == 0
    y = load_audio(data, 16_000)
    assert len(y) == len(X) and np.abs(y - X).max() < 1.5 / 32767


# --- sample formats, channels, rates --------------------------------------------------------

@pytest.mark.parametrize("kind, channels, extensible, tolerance", [
    ("u8", 1, False, 1 / 128), ("s16", 1, False, 2 / 32768), ("s24", 2, False, 1e-6), ("s32", 1, False, 1e-6),
    ("f32", 1, False, 1e-7), ("f64", 2, False, 1e-7), ("s24", 2, True, 1e-6), ("f32", 6, True, 1e-7),
    ("s16", 6, False, 2 / 32768), ("u8", 2, True, 1 / 128),
], ids=["u8", "s16", "s24-stereo", "s32", "f32", "f64-stereo", "s24-stereo-extensible", "f32-5.1-extensible",
        "s16-5.1", "u8-stereo-extensible"])
def test_sample_formats_and_channels_are_downmixed(kind, channels, extensible, tolerance):
    rate = 22_050
    x = channels_of(0.6, rate, channels) if channels > 1 else tone(440.0, rate, 0.6)
    y = load_audio(wav(x, rate, kind, extensible=extensible), rate)  # same rate: the samples themselves
    expected = x.mean(axis=1) if channels > 1 else x
    assert y.dtype == np.float32 and len(y) == len(expected)
    assert np.abs(y - expected).max() < tolerance


@pytest.mark.parametrize("rate", [8_000, 11_025, 22_050, 32_000, 44_100, 48_000, 96_000, 192_000])
def test_any_supported_rate_is_resampled(rate):
    y = load_audio(wav(tone(440.0, rate, 0.6), rate, "f32"), TARGET)
    assert abs(len(y) - round(0.6 * TARGET)) <= 1
    rms = float(np.sqrt(np.mean(y[len(y) // 4: -len(y) // 4] ** 2)))
    assert abs(rms - 0.5 / np.sqrt(2)) < 0.01


@pytest.mark.parametrize("rate", [7_999, 192_001])
def test_rates_outside_the_range_are_refused(rate):
    with pytest.raises(AudioError, match=f"unsupported sample rate {rate} Hz"):
        load_audio(wav(tone(440.0, 8_000, 0.6), rate), TARGET)


# --- compressed formats (PyAV) --------------------------------------------------------------

# container, codec, rate, channels, slack in seconds (codec frame padding / priming)
COMPRESSED = [
    ("ogg", "libopus", 48_000, 1, 0.03),
    ("webm", "libopus", 48_000, 2, 0.03),
    ("mp3", "libmp3lame", 44_100, 2, 0.06),
    ("flac", "flac", 96_000, 1, 0.0),
    ("ipod", "aac", 24_000, 2, 0.1),  # .m4a
]
COMPRESSED_IDS = ["ogg-opus", "webm-opus", "mp3", "flac", "m4a-aac"]


def compressed(container, codec, rate, channels, duration=1.0) -> bytes:
    x = channels_of(duration, rate, channels).T if channels > 1 else tone(440.0, rate, duration)
    return encode(x, rate, container, codec)


@pytest.mark.parametrize("container, codec, rate, channels, slack", COMPRESSED, ids=COMPRESSED_IDS)
def test_compressed_formats_decode(container, codec, rate, channels, slack):
    y = load_reference(compressed(container, codec, rate, channels), TARGET)
    assert -1e-3 < seconds(y) - 1.0 <= slack + 1e-3
    level = 0.5 / np.sqrt(2) if channels == 1 else np.sqrt(0.5 ** 2 + 0.25 ** 2) / 2 / np.sqrt(2)
    rms = float(np.sqrt(np.mean(y[len(y) // 4: 3 * len(y) // 4] ** 2)))
    assert abs(rms - level) < 0.03


@pytest.mark.parametrize("container, codec, rate, channels, slack",
                         [c for c in COMPRESSED if c[0] != "ipod"], ids=[i for i in COMPRESSED_IDS if i != "m4a-aac"])
def test_compressed_file_cut_short_keeps_the_audio_before_the_cut(container, codec, rate, channels, slack):
    data = compressed(container, codec, rate, channels, duration=2.0)
    y = load_audio(data[:len(data) // 2], TARGET)
    assert 0.8 < seconds(y) < 1.2


# --- refused, with the reason ---------------------------------------------------------------

def _ok() -> bytes:
    return wav(X, 16_000)


def _swap_fmt_and_data(data: bytes) -> bytes:
    fmt, rest = data[12:36], data[36:]
    return data[:12] + rest + fmt


REFUSED = {
    "empty": (lambda: b"", "audio data is empty (0 bytes)"),
    "text": (lambda: b"name,text\nalice,hello\n" * 40, "not a readable audio file"),
    "png": (lambda: b"\x89PNG\r\n\x1a\n" + bytes(200), "no audio stream"),
    "wav-cut-in-fmt": (lambda: _ok()[:28], "WAV fmt chunk is cut short"),
    "wav-cut-before-data": (lambda: _ok()[:40], "WAV file ends before its data chunk"),
    "wav-header-only": (lambda: _ok()[:44], "contains no audio samples"),
    "wav-no-fmt": (lambda: b"RIFF" + bytes(4) + b"WAVE" + chunk(b"data", bytes(64)),
                   "data chunk comes before any fmt chunk"),
    "wav-data-before-fmt": (lambda: _swap_fmt_and_data(_ok()), "data chunk comes before any fmt chunk"),
    "wav-zero-channels": (lambda: _ok()[:22] + b"\0\0" + _ok()[24:], "WAV header says 0 channels"),
    "wav-float16": (lambda: _ok()[:20] + b"\x03\x00" + _ok()[22:], "unsupported WAV float sample size 16 bits"),
    "wav-bad-align": (lambda: b"RIFF\0\0\0\0WAVE" + fmt_chunk("s16", 2, 16_000, align=6) + chunk(b"data", bytes(600)),
                      "block align 6 for 2 channels of 16 bits"),
    "mp3-cut-in-header": (lambda: compressed("mp3", "libmp3lame", 44_100, 1)[:40], "MP3 file is cut short or damaged"),
    "ogg-cut-in-header": (lambda: compressed("ogg", "libopus", 48_000, 1)[:40], "Ogg file is cut short or damaged"),
    "flac-cut-in-header": (lambda: compressed("flac", "flac", 48_000, 1)[:30], "FLAC file is cut short or damaged"),
    "m4a-cut-short": (lambda: (lambda d: d[:len(d) // 2])(compressed("ipod", "aac", 24_000, 1)),
                      "MP4/M4A file is cut short or damaged"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unreadable_inputs_are_refused_with_the_reason(name):
    make, reason = REFUSED[name]
    with pytest.raises(AudioError) as e:
        load_reference(make(), TARGET)
    assert reason in str(e.value)


def test_short_and_silent_references_are_refused_and_quiet_ones_used():
    """The choice documented in engine.audio.load_reference."""
    with pytest.raises(AudioError, match=r"0\.30 s long, shorter than the 0\.5 s minimum"):
        load_reference(wav(tone(440.0, 16_000, 0.3), 16_000), TARGET)
    assert len(load_reference(wav(tone(440.0, 16_000, 0.5), 16_000), TARGET)) == TARGET // 2  # exactly 0.5 s: used
    for silent in (wav_bytes(np.zeros(16_000, np.float32), 16_000), wav(np.zeros(8_000), 8_000, "u8"),
                   encode(np.zeros(48_000, np.float32), 48_000, "ogg", "libopus")):
        with pytest.raises(AudioError, match="reference audio is silent"):
            load_reference(silent, TARGET)
    rng = np.random.default_rng(0)
    room = rng.uniform(-1, 1, 16_000) * 10 ** (-50 / 20)  # a quiet room at -50 dBFS: a level, not silence
    assert len(load_reference(wav(room, 16_000, "f32"), TARGET)) == TARGET
    broken = tone(440.0, 16_000, 1.0)
    broken[100] = np.nan
    with pytest.raises(AudioError, match="NaN or infinite"):
        load_reference(wav(broken, 16_000, "f32"), TARGET)


def test_the_length_limit_counts_real_audio_not_header_sizes():
    rate = 8_000
    streamed = service_streamed_wav(tone(200.0, rate, 29.5), rate)
    assert abs(seconds(load_reference(streamed, rate, max_seconds=30.0), rate) - 29.5) < 1e-6
    with pytest.raises(AudioError, match="longer than the 30 s limit"):
        load_reference(service_streamed_wav(tone(200.0, rate, 30.5), rate), rate, max_seconds=30.0)
    claims_an_hour = wav(tone(200.0, rate, 2.0), rate, data_size=3600 * rate * 2)
    assert seconds(load_reference(claims_an_hour, rate, max_seconds=30.0), rate) == 2.0
    with pytest.raises(AudioError, match="longer than the 30 s limit"):  # decoded (PyAV) audio too
        load_reference(encode(tone(200.0, rate, 31.0), rate, "mp3", "libmp3lame"), rate, max_seconds=30.0)


# --- through a real server --------------------------------------------------------------------

FRAMES = 24  # ~1.1 s of the tiny model's audio


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("srv"), engine=EngineConfig(max_running=4, max_len=2048),
                        ignore_end=True) as s:
        yield s


@pytest.fixture(scope="module")
def streamed(srv) -> bytes:
    """`POST /v1/tts` format wav, streamed: the placeholder-size WAV of issue 50."""
    r = httpx.post(f"{srv.http_url}/v1/tts", json={"text": "A streamed reference.", "format": "wav",
                                                   "max_new_tokens": FRAMES}, timeout=60)
    assert r.status_code == 200 and struct.unpack_from("<I", r.content, 40)[0] == PLACEHOLDER
    return r.content


def test_the_services_streamed_response_loads(streamed):
    y = load_audio(streamed, TARGET, max_seconds=30.0)
    assert len(y) == FRAMES * HOP


async def _session(url: str, reference: bytes) -> list[dict]:
    """One session with `reference` as its voice: start, a line, stop; every event."""
    events = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(msgpack.packb({"event": "start", "request": {
            "format": "pcm", "max_new_tokens": 4, "references": [{"audio": reference, "text": "A reference."}]}}))
        await ws.send(msgpack.packb({"event": "text", "text": "In that voice."}))
        await ws.send(msgpack.packb({"event": "stop"}))
        async with asyncio.timeout(60):
            async for frame in ws:
                events.append(msgpack.unpackb(frame))
                if events[-1]["event"] == "finish":
                    break
    return events


SESSION_INPUTS = {
    "streamed-wav": None,  # the server's own response (fixture)
    "stereo-24-bit-wav": lambda: wav(channels_of(1.0, 48_000, 2), 48_000, "s24"),
    "mp3": lambda: compressed("mp3", "libmp3lame", 22_050, 1),
    "silent": lambda: wav_bytes(np.zeros(TARGET, np.float32), TARGET),
    "short": lambda: wav(tone(440.0, 16_000, 0.2), 16_000),
}
REFUSAL = {"silent": "reference audio is silent", "short": "shorter than the 0.5 s minimum"}


@pytest.mark.parametrize("name", list(SESSION_INPUTS))
def test_a_session_uses_the_reference_or_says_why_not(srv, streamed, name):
    reference = streamed if name == "streamed-wav" else SESSION_INPUTS[name]()
    events = asyncio.run(_session(srv.ws_url, reference))
    if name in REFUSAL:
        error = next(e for e in events if e["event"] == "error")
        assert error["code"] == "bad_audio" and REFUSAL[name] in error["message"], error
        assert events[-1]["event"] == "finish" and events[-1]["reason"] == "error"
        return
    assert events[0]["event"] == "ready" and events[0]["voice_cached"] is False, events[:2]
    assert any(e["event"] == "audio" for e in events) and events[-1]["reason"] == "stop"


def test_stored_voice_from_a_streamed_wav_and_a_silent_one_refused(srv, streamed):
    ok = httpx.post(f"{srv.http_url}/v1/voices", json={
        "name": "streamed", "references": [{"audio": base64.b64encode(streamed).decode(), "text": "A reference."}]})
    assert ok.status_code == 201, ok.text
    assert ok.json()["references"][0]["frames"] == FRAMES
    silent = base64.b64encode(wav_bytes(np.zeros(TARGET, np.float32), TARGET)).decode()
    bad = httpx.post(f"{srv.http_url}/v1/voices", json={"references": [{"audio": silent, "text": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"] == "bad_audio"
    assert "reference audio is silent" in bad.json()["message"]
