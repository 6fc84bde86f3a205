"""Streaming audio encoders: float32 PCM chunks from the engine -> the client's format.

One `AudioEncoder` per connection turns the codec's float32 mono chunks (44.1 kHz, a few
2048-sample frames at a time) into pcm, wav, Ogg Opus or mp3 bytes, chunk by chunk, on the
event loop. Every call is cheap and keeps all the state the next one needs. Mean cost per
2048-sample chunk, measured on a shared 2-core CPU (PyAV 18 / FFmpeg 8.1): pcm/wav 0.02-0.03 ms
at 44.1 kHz, 0.05-0.1 ms resampled; opus 0.25-0.4 ms; mp3 0.5-0.8 ms at 44.1 kHz; atempo
adds ~0.05 ms. flush() costs 0.2-3 ms (mp3 most: LAME's tail plus a new codec context).

    gain (numpy) -> atempo (FFmpeg filter graph, only when speed != 1)
                 -> resampler (swresample, only when the rates differ) -> format sink

The concatenation of every `encode()` result and the final `flush()` is one valid file.
After `flush()` the encoder starts a new, independent file on the next `encode()`.
`AudioEncoder` returns nothing until it has more than 1,024 bytes (MIN_CHUNK_BYTES); only
`drain()` and `flush()`, a turn's end, may return less.

`OpusPacketEncoder` gives the same Opus audio as raw 20 ms packets (no Ogg) for the browser
demo, which decodes them with WebCodecs `AudioDecoder` at 48 kHz.
"""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

import numpy as np

from engine.audio import MAX_RATE, MIN_RATE, pyav, to_pcm16
from realtime.protocol import FORMATS, MP3_BITRATES, OPUS_BITRATES, SAMPLE_RATES

OPUS_RATE = 48_000
OPUS_FRAME = 960  # samples of one 20 ms packet at 48 kHz
OPUS_AUTO = -1000  # OPUS_AUTO: libopus picks the bitrate
# Pipecat's Fish client (pipecat-ai 1.12 and older) drops audio messages of 1,024 bytes or
# less. What a turn's first audio waits for, in 46 ms engine frames, measured at the default
# rates: pcm/wav 0, mp3 (128 kbps) 1 more, opus (32 kbps) 4 more; pcm at 8 kHz 1 more
MIN_CHUNK_BYTES = 1025
STREAMING_SIZE = 0xFFFFFFFF  # RIFF/data size of a WAV whose length is unknown while streaming
SPEED_RANGE = (0.5, 2.0)
VOLUME_RANGE_DB = (-20.0, 20.0)

_EMPTY = np.zeros(0, np.float32)
_RESAMPLER_DELAY = 64  # output samples that cover swresample's filter delay (it is ~16-32)
_TEMPO_WINDOW = 60  # ms of input that push atempo's ~40 ms window out


# --- public API -----------------------------------------------------------------------------

class _Encoder:
    """The shared pipeline; subclasses pick the sink (what one output chunk is)."""

    def __init__(self, fmt: str, output_rate: int, input_rate: int, mp3_bitrate: int,
                 opus_bitrate: int, speed: float, volume_db: float) -> None:
        _validate(fmt, output_rate, input_rate, mp3_bitrate, opus_bitrate, speed, volume_db)
        self.format, self.output_rate, self.input_rate = fmt, output_rate, input_rate
        self.mp3_bitrate, self.opus_bitrate = mp3_bitrate, opus_bitrate  # kbps
        self._gain = 10.0 ** (volume_db / 20.0)
        self._speed = speed
        self.samples_out = 0  # samples at output_rate handed to the format so far (all files)
        self.samples_in = 0  # samples at input_rate fed in so far, drain padding included (all files)
        self._coded_done = 0  # decodable output samples of the files already flushed
        self._start()

    def _start(self) -> None:
        self._tempo = _Tempo(self.input_rate, self._speed) if self._speed != 1.0 else None
        self._resampler = _Resampler(self.input_rate, self.output_rate)
        self._sink = self._new_sink()

    def _new_sink(self):
        raise NotImplementedError

    def encode(self, pcm: np.ndarray):
        """pcm: [T] float at input_rate, nominally in [-1, 1]."""
        x = np.asarray(pcm, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono PCM of shape [T], got {x.shape}")
        self.samples_in += x.size
        if self._gain != 1.0:
            x = np.clip(x * self._gain, -1.0, 1.0)
        if self._tempo is not None:
            x = self._tempo.process(x)
        return self._emit(self._resampler.process(x))

    def flush(self):
        """End of the utterance: drain every stage and close the file."""
        tail = self._tempo.flush() if self._tempo is not None else _EMPTY
        x = np.concatenate([self._resampler.process(tail), self._resampler.flush()])
        out = self._emit(x) + self._sink.flush()
        self._coded_done += self._sink.coded
        self._start()  # the next encode() begins a new file
        return out

    def drain(self):
        """End of a turn: push out every real sample still held by a stage (resampler
        filter, tempo window, a partial codec frame, the codec's lookahead) by feeding
        silence, without ending the file. The next turn continues the same file after a
        few ms of silence."""
        pad_out = _RESAMPLER_DELAY if self._resampler.active else 0
        pad_out += self._sink.drain_padding(pad_out)
        pad_in = math.ceil(pad_out * self.input_rate / self.output_rate)
        if self._tempo is not None:
            pad_in = math.ceil(pad_in * self._speed) + _TEMPO_WINDOW * self.input_rate // 1000
        return self.encode(np.zeros(pad_in, np.float32)) if pad_in else self._sink.encode(_EMPTY)

    def _emit(self, x: np.ndarray):
        self.samples_out += x.size
        return self._sink.encode(x)

    @property
    def coded_samples(self) -> int:
        """Samples at output_rate that a decoder gives for every byte produced so far (all
        files): what a client plays, codec delay and padding included (realtime/timestamps.py)."""
        return self._coded_done + self._sink.coded

    @property
    def decoder_delay(self) -> int:
        """Output samples a decoder plays before the first input sample (LAME's delay: the
        mp3 stream has no LAME header to trim it; Ogg Opus signals its pre-skip)."""
        return _LAME_DELAY if self.format == "mp3" else 0


class AudioEncoder(_Encoder):
    """float32 mono chunks -> bytes of one pcm | wav | opus (Ogg) | mp3 file, streamed.

    `encode()` returns b"" while a codec buffers (mp3, opus) and until more than 1,024 bytes
    are there (MIN_CHUNK_BYTES); `drain()` and `flush()` return the rest. Bitrates are in kbps
    (opus: -1000 = automatic); speed changes tempo, not pitch; volume_db is a gain with
    clipping to [-1, 1].
    """

    def __init__(self, fmt: str, output_rate: int, input_rate: int = 44100, mp3_bitrate: int = 128,
                 opus_bitrate: int = 32, speed: float = 1.0, volume_db: float = 0.0) -> None:
        self._held = b""  # output not returned yet: fewer than MIN_CHUNK_BYTES
        self.released_samples = 0  # coded_samples of the bytes returned so far: what the client has
        self._returned = False  # bytes of the current file were returned (its header is out)
        super().__init__(fmt, output_rate, input_rate, mp3_bitrate, opus_bitrate, speed, volume_db)

    def encode(self, pcm: np.ndarray) -> bytes:
        out = self._held + super().encode(pcm)
        if len(out) < MIN_CHUNK_BYTES:
            self._held = out
            return b""
        self._held = b""
        self.released_samples = self.coded_samples
        self._returned = True
        return out

    def drain(self) -> bytes:
        return self._release(super().drain())  # may run encode(): it returns or holds first

    def flush(self) -> bytes:
        out = self._release(super().flush())
        self._returned = False  # the next encode() begins a new file
        return out

    def discard(self) -> bool:
        """Barge-in: the audio inside is dropped, not sent. Once bytes of the file went out,
        that is drain() with its output thrown away; before, the file starts over, so that
        the next audio still carries the file's header (WAV, Ogg). True: it started over."""
        if self._returned:
            self.drain()
            return False
        self._held = b""
        self._start()
        return True

    def _release(self, tail: bytes) -> bytes:
        out, self._held = self._held + tail, b""
        self.released_samples = self.coded_samples
        self._returned = self._returned or bool(out)
        return out

    def _new_sink(self):
        if self.format == "pcm":
            return _PcmSink()
        if self.format == "wav":
            return _WavSink(self.output_rate)
        if self.format == "mp3":
            return _Mp3Sink(self.output_rate, self.mp3_bitrate)
        return _OggOpusSink(self.opus_bitrate)


class OpusPacketEncoder(_Encoder):
    """float32 mono chunks -> raw 20 ms Opus packets at 48 kHz (no container).

    The decoder's first `pre_skip` output samples are encoder delay and should be dropped;
    the last packet of `flush()` is padded with silence to a whole 20 ms.
    """

    def __init__(self, input_rate: int = 44100, opus_bitrate: int = 32, speed: float = 1.0,
                 volume_db: float = 0.0) -> None:
        super().__init__("opus", OPUS_RATE, input_rate, 128, opus_bitrate, speed, volume_db)  # 128: unused mp3 rate
        self.pre_skip = self._sink.pre_skip  # samples at 48 kHz

    def encode(self, pcm: np.ndarray) -> list[bytes]:
        return super().encode(pcm)

    def flush(self) -> list[bytes]:
        return super().flush()

    def _new_sink(self):
        return _OpusPackets(self.opus_bitrate)


def finalize_wav(data: bytes) -> bytes:
    """A complete WAV from the streaming encoder with its RIFF and data sizes filled in
    (for a non-streaming response, where players may trust the sizes)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    if len(data) - 8 > 0xFFFFFFFE:
        raise ValueError("WAV data larger than 4 GiB cannot be finalized")
    pos = 12
    while pos + 8 <= len(data):  # walk the chunks up to `data`
        chunk_id, size = struct.unpack_from("<4sI", data, pos)
        if chunk_id == b"data":
            out = bytearray(data)
            struct.pack_into("<I", out, 4, len(data) - 8)
            struct.pack_into("<I", out, pos + 4, len(data) - pos - 8)
            return bytes(out)
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    raise ValueError("WAV file has no data chunk")


# --- validation -----------------------------------------------------------------------------

def _validate(fmt: str, output_rate: int, input_rate: int, mp3_bitrate: int, opus_bitrate: int,
              speed: float, volume_db: float) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unsupported audio format {fmt!r} (use one of {', '.join(FORMATS)})")
    if output_rate not in SAMPLE_RATES[fmt]:
        raise ValueError(f"sample rate {output_rate} is not supported for {fmt} "
                         f"(use one of {', '.join(map(str, SAMPLE_RATES[fmt]))})")
    if not isinstance(input_rate, int) or not MIN_RATE <= input_rate <= MAX_RATE:
        raise ValueError(f"input rate {input_rate} is out of range ({MIN_RATE}..{MAX_RATE} Hz)")
    if mp3_bitrate not in MP3_BITRATES:
        raise ValueError(f"mp3 bitrate {mp3_bitrate} is not supported "
                         f"(use one of {', '.join(map(str, MP3_BITRATES))} kbps)")
    if opus_bitrate not in OPUS_BITRATES:
        raise ValueError(f"opus bitrate {opus_bitrate} is not supported "
                         f"(use one of {', '.join(map(str, OPUS_BITRATES))} kbps; -1000 = auto)")
    lo, hi = SPEED_RANGE
    if not (math.isfinite(speed) and lo <= speed <= hi):
        raise ValueError(f"speed must be in [{lo}, {hi}], got {speed}")
    lo, hi = VOLUME_RANGE_DB
    if not (math.isfinite(volume_db) and lo <= volume_db <= hi):
        raise ValueError(f"volume must be in [{lo}, {hi}] dB, got {volume_db}")


# --- PCM stages -----------------------------------------------------------------------------

def _frame(x: np.ndarray, rate: int):
    frame = pyav().AudioFrame.from_ndarray(np.ascontiguousarray(x)[None], format="flt", layout="mono")
    frame.sample_rate = rate
    return frame


def _samples(frames) -> np.ndarray:
    arrays = [f.to_ndarray()[0] for f in frames]  # flt mono frames: [1, n] each
    return np.concatenate(arrays) if arrays else _EMPTY


class _Resampler:
    """Streaming swresample; keeps its filter state between chunks, so chunked output equals
    one-shot output sample for sample (and engine.audio.resample)."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self._rate = from_rate
        self._av = pyav().AudioResampler(format="flt", layout="mono", rate=to_rate) if from_rate != to_rate else None

    @property
    def active(self) -> bool:
        return self._av is not None

    def process(self, x: np.ndarray) -> np.ndarray:
        if self._av is None or x.size == 0:
            return x
        return _samples(self._av.resample(_frame(x, self._rate)))

    def flush(self) -> np.ndarray:
        return _samples(self._av.resample(None)) if self._av is not None else _EMPTY


class _Tempo:
    """Tempo change without pitch change: FFmpeg's atempo (WSOLA) in a filter graph, fed chunk
    by chunk. atempo holds back about one window (~40 ms) of audio until flush()."""

    def __init__(self, rate: int, speed: float) -> None:
        graph = pyav().filter.Graph()
        src = graph.add_abuffer(format="flt", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))
        tempo = graph.add("atempo", f"tempo={speed}")
        src.link_to(tempo)
        tempo.link_to(graph.add("abuffersink"))
        graph.configure()
        self._graph, self._rate, self._speed = graph, rate, speed
        self._n_in = self._n_out = 0  # samples pushed / pulled

    def process(self, x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return _EMPTY
        frame = _frame(x, self._rate)
        frame.pts, frame.time_base = self._n_in, Fraction(1, self._rate)
        self._n_in += x.size
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> np.ndarray:
        self._graph.push(None)
        pulled_before = self._n_out
        tail = self._pull()
        # atempo's end is off by up to ~15 ms (measured at speed 0.5); cut or pad its tail so
        # the output lasts exactly input / speed
        want = max(0, round(self._n_in / self._speed) - pulled_before)
        return np.pad(tail[:want], (0, max(0, want - tail.size)))

    def _pull(self) -> np.ndarray:
        frames, error = [], pyav().error
        while True:
            try:
                frames.append(self._graph.pull())
            except (error.BlockingIOError, error.EOFError):  # needs more input / drained
                break
        y = _samples(frames)
        self._n_out += y.size
        return y


class _Blocker:
    """Cuts a stream of samples into fixed-size blocks (codec frames)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pending = _EMPTY  # [< size] samples waiting for the next block

    def push(self, x: np.ndarray) -> np.ndarray:
        """Returns [n_blocks, size]."""
        buf = np.concatenate([self.pending, x]) if self.pending.size else x
        n = buf.size // self.size
        self.pending = buf[n * self.size:].copy()
        return buf[: n * self.size].reshape(n, self.size)


# --- format sinks: encode([T] float at output_rate) -> output chunk; flush() -> last chunk ----

class _PcmSink:
    coded = 0  # samples written

    def encode(self, x: np.ndarray) -> bytes:
        self.coded += x.size
        return to_pcm16(x)  # s16le mono

    def drain_padding(self, incoming: int) -> int:
        return 0  # holds nothing

    def flush(self) -> bytes:
        return b""


class _WavSink:
    """A 44-byte PCM WAV header, sent with the first output, then s16le samples.

    The length is unknown while streaming, so the RIFF and data sizes are 0xFFFFFFFF, the
    usual streaming convention: FFmpeg (and so PyAV) reads such a file to its end, Python's
    `wave` reads what is there. `finalize_wav` fixes the sizes once the whole file is known.
    """

    def __init__(self, rate: int) -> None:
        self._header = struct.pack(
            "<4sI4s4sIHHIIHH4sI", b"RIFF", STREAMING_SIZE, b"WAVE",
            b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16,  # PCM, mono, rate, bytes/s, align, bits
            b"data", STREAMING_SIZE,
        )
        self.coded = 0  # samples written

    def encode(self, x: np.ndarray) -> bytes:
        if x.size == 0:
            return b""
        self.coded += x.size
        out, self._header = self._header + to_pcm16(x), b""
        return out

    def drain_padding(self, incoming: int) -> int:
        return 0

    def flush(self) -> bytes:
        out, self._header = self._header, b""  # an empty utterance is still a valid WAV
        return out


_LAME_DELAY = 1105  # libmp3lame's encoder delay in samples (576 + 529)


class _Mp3Sink:
    """MPEG audio layer III frames from libmp3lame (PyAV). Concatenated frames are a valid mp3
    stream. There is no LAME/Xing header, so a decoder keeps LAME's ~1105-sample encoder delay
    (25 ms at 44.1 kHz) and the last frame's padding. Below 32 kHz (MPEG-2) LAME caps the
    bitrate at 160 kbps, so 192 becomes 160."""

    def __init__(self, rate: int, kbps: int) -> None:
        ctx = pyav().CodecContext.create("libmp3lame", "w")
        ctx.sample_rate, ctx.layout, ctx.format, ctx.bit_rate = rate, "mono", "fltp", kbps * 1000
        ctx.open()
        self._ctx, self._rate = ctx, rate
        self._blocks = _Blocker(ctx.frame_size)  # 1152 samples (MPEG-1) or 576 (MPEG-2)
        self._pts = 0
        self.coded = 0  # samples a decoder gives for the frames written: frame_size each

    def encode(self, x: np.ndarray) -> bytes:
        return b"".join(self._encode(block) for block in self._blocks.push(x))

    def drain_padding(self, incoming: int) -> int:
        # complete the partial frame past LAME's ~1105-sample delay, plus the frames LAME
        # keeps for its psychoacoustic lookahead (measured: 4 at 44.1 kHz, 3 at 16/24 kHz)
        frame = self._blocks.size
        held = self._blocks.pending.size + incoming + _LAME_DELAY
        return _LAME_DELAY + (-held) % frame + 4 * frame

    def flush(self) -> bytes:
        tail = self._blocks.pending  # libmp3lame accepts a short last frame
        out = self._encode(tail) if tail.size else b""
        return out + self._frames(self._ctx.encode(None))

    def _encode(self, block: np.ndarray) -> bytes:
        frame = pyav().AudioFrame.from_ndarray(block[None], format="fltp", layout="mono")
        frame.sample_rate, frame.pts = self._rate, self._pts
        self._pts += block.size
        return self._frames(self._ctx.encode(frame))

    def _frames(self, packets) -> bytes:
        self.coded += len(packets) * self._blocks.size
        return b"".join(bytes(p) for p in packets)


class _OpusPackets:
    """48 kHz float -> raw 20 ms Opus packets (libopus through opuslib).

    Application "audio", not "voip": TTS output is a clean, full-band signal whose timbre
    (a cloned voice) should come out as close to the input as possible; "voip" adds speech
    processing (high-pass filtering, a bias to intelligibility) meant for noisy microphones.
    Both have the same 312-sample (6.5 ms) lookahead.
    """

    def __init__(self, kbps: int) -> None:
        import opuslib  # loads libopus: only connections that ask for opus need it

        self._enc = opuslib.Encoder(OPUS_RATE, 1, opuslib.APPLICATION_AUDIO)
        self._enc.bitrate = kbps * 1000 if kbps > 0 else OPUS_AUTO
        self.pre_skip = self._enc.lookahead  # encoder delay, samples at 48 kHz
        self._blocks = _Blocker(OPUS_FRAME)
        self.coded = 0  # samples a decoder gives for the packets made (pre-skip dropped)

    def _count(self, packets: list[bytes]) -> list[bytes]:
        self.coded = max(0, self.coded + len(packets) * OPUS_FRAME - (self.pre_skip if not self.coded else 0))
        return packets

    def encode(self, x: np.ndarray) -> list[bytes]:
        return self._count([self._enc.encode_float(block.tobytes(), OPUS_FRAME) for block in self._blocks.push(x)])

    def drain_padding(self, incoming: int) -> int:
        # the lookahead, then up to a whole 20 ms packet
        return self.pre_skip + (-(self._blocks.pending.size + incoming + self.pre_skip)) % OPUS_FRAME

    def flush(self) -> list[bytes]:
        # push the lookahead out with silence, then pad the last packet to a whole 20 ms
        pad = self.pre_skip + (-(self._blocks.pending.size + self.pre_skip)) % OPUS_FRAME
        return self.encode(np.zeros(pad, np.float32))


class _OggOpusSink:
    """Ogg Opus (RFC 7845): an OpusHead page, an OpusTags page, then one page per call that
    has packets, so a packet is never held back waiting to fill a page."""

    def __init__(self, kbps: int) -> None:
        self._opus = _OpusPackets(kbps)
        self._ogg = _OggStream(random.getrandbits(32))
        self._headers = self._ogg.page([_opus_head(self._opus.pre_skip)], 0, _BOS) + \
            self._ogg.page([_OPUS_TAGS], 0, 0)
        self._samples_in = 0  # real samples at 48 kHz, before padding
        self.coded = 0  # samples a decoder gives for the pages written (pre-skip and end trimmed)

    def encode(self, x: np.ndarray) -> bytes:
        self._samples_in += x.size
        return self._write(self._opus.encode(x), eos=False)

    def drain_padding(self, incoming: int) -> int:
        return self._opus.drain_padding(incoming)

    def flush(self) -> bytes:
        return self._write(self._opus.flush(), eos=True)

    def _write(self, packets: list[bytes], eos: bool) -> bytes:
        if not packets:
            return b""
        out, self._headers = self._headers, b""  # headers go out with the first audio page
        # the EOS page's granule counts only real samples: the decoder trims the padding
        end = self._opus.pre_skip + self._samples_in if eos else None
        pages = self._ogg.pages(packets, OPUS_FRAME, end)
        self.coded = max(0, (end if eos else self._ogg.granule) - self._opus.pre_skip)
        return out + pages


# --- Ogg muxing -----------------------------------------------------------------------------

_BOS, _EOS = 0x02, 0x04  # page header flags


def _opus_head(pre_skip: int) -> bytes:
    # version 1, 1 channel, pre-skip, input rate (informational), output gain 0, mapping 0
    return struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, pre_skip, OPUS_RATE, 0, 0)


def _opus_tags(vendor: bytes) -> bytes:
    return b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)  # no comments


_OPUS_TAGS = _opus_tags(b"fish-realtime")


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


_CRC_TABLE = _crc_table()


def _ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32: polynomial 0x04C11DB7, MSB first, initial value 0, no final xor.
    (zlib's CRC-32 is the bit-reflected variant, so it cannot be used directly.)"""
    crc, table = 0, _CRC_TABLE
    for b in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ table[(crc >> 24) ^ b]
    return crc


class _OggStream:
    """Pages of one logical Ogg bitstream. Packets never span pages (Opus packets are at most
    1275 bytes, far below a page's 255 * 255)."""

    def __init__(self, serial: int) -> None:
        self._serial, self._seq = serial, 0
        self.granule = 0  # samples (48 kHz) of every packet written, incl. pre-skip and padding

    def pages(self, packets: list[bytes], samples_per_packet: int, eos_granule: int | None) -> bytes:
        """Audio pages for `packets`; with eos_granule, the last page ends the stream with
        that granule position (end trimming, RFC 7845 section 4.4)."""
        out, group, n_seg = [], [], 0
        for p in packets:
            seg = len(p) // 255 + 1
            if n_seg + seg > 255:  # a page holds at most 255 lacing values
                self.granule += len(group) * samples_per_packet
                out.append(self.page(group, self.granule, 0))
                group, n_seg = [], 0
            group.append(p)
            n_seg += seg
        self.granule += len(group) * samples_per_packet
        last = self.granule if eos_granule is None else eos_granule
        out.append(self.page(group, last, 0 if eos_granule is None else _EOS))
        return b"".join(out)

    def page(self, packets: list[bytes], granule: int, flags: int) -> bytes:
        lacing = bytearray()
        for p in packets:  # a packet is 255-byte segments plus one shorter (maybe empty) one
            lacing += b"\xff" * (len(p) // 255) + bytes([len(p) % 255])
        header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, self._serial, self._seq, 0, len(lacing))
        self._seq += 1
        page = bytearray(header + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, _ogg_crc(page))  # CRC computed with its field zeroed
        return bytes(page)
