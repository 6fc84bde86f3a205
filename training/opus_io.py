"""Teacher audio shards: Ogg Opus files (48 kHz mono), written with PyAV and read with PyAV
or, where PyAV is missing (the GPU image), with a small Ogg page parser and libopus through
ctypes (carry Debian's libopus.so.0 there and point OPUS_LIBRARY at it).

A shard holds many utterances back to back; the manifest gives each one's first sample and
length at the rate the shard is read at (the codec's), so a shard decodes once into memory.
At 32 kbit/s, Opus keeps the teacher's whole band (it codes up to 20 kHz; Piper's medium
voices stop at 11 kHz) and 5 hours take ~70 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np

OPUS_RATE = 48_000
OPUS_FRAME = 960  # 20 ms at 48 kHz


# --- writing (PyAV) ------------------------------------------------------------------

class OggOpusWriter:
    """Append float32 mono chunks at `rate`; they are resampled to 48 kHz and encoded."""

    def __init__(self, path: str | Path, rate: int, bitrate: int = 32_000) -> None:
        import av

        self._av = av
        self.rate = rate
        self._container = av.open(str(path), "w", format="ogg")
        self._stream = self._container.add_stream("libopus", rate=OPUS_RATE, layout="mono")
        self._stream.bit_rate = bitrate
        # complexity 5 of 10: ~2x faster than the default for no audible loss at 32 kbit/s;
        # constrained VBR: at complexity 5, unconstrained VBR overshot 24 kbit/s by ~37%
        # (measured 32.9 kbit/s on teacher speech; 24.7 with this), which breaks the size budget
        self._stream.codec_context.options = {"compression_level": "5", "vbr": "constrained"}
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=OPUS_RATE)
        self._fifo = av.AudioFifo()
        self._pts = 0

    def write(self, x: np.ndarray) -> None:
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(x, dtype=np.float32)[None],
                                                 format="flt", layout="mono")
        frame.sample_rate = self.rate
        for f in self._resampler.resample(frame):
            self._push(f)

    def _push(self, frame) -> None:
        frame.pts = None
        self._fifo.write(frame)
        while self._fifo.samples >= OPUS_FRAME:
            self._encode(self._fifo.read(OPUS_FRAME))

    def _encode(self, frame) -> None:
        frame.pts, frame.time_base = self._pts, Fraction(1, OPUS_RATE)
        self._pts += frame.samples
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        for f in self._resampler.resample(None):
            self._push(f)
        if self._fifo.samples:
            self._encode(self._fifo.read())
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()


# --- reading ---------------------------------------------------------------------------

def read_opus(path: str | Path, rate: int) -> np.ndarray:
    """The whole shard as float32 mono at `rate`."""
    import torch

    from training.resample import resample

    x48 = _decode_av(path) if _has_av() else _decode_libopus(path)
    return resample(torch.from_numpy(x48), OPUS_RATE, rate).numpy()


def _has_av() -> bool:
    if os.environ.get("FISH_TRAIN_NO_AV"):  # tests force the fallback path
        return False
    return importlib.util.find_spec("av") is not None


def _decode_av(path: str | Path) -> np.ndarray:
    import av

    chunks = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            chunks.append(frame.to_ndarray().reshape(-1) if frame.format.is_packed else frame.to_ndarray()[0])
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


def ogg_packets(data: bytes) -> tuple[list[bytes], int]:
    """The packets of a single-stream Ogg file (RFC 3533 pages) and the last page's granule
    position (for Opus: pre-skip + the stream's length in 48 kHz samples)."""
    packets, current, pos, granule = [], b"", 0, 0
    while pos < len(data):
        if data[pos : pos + 4] != b"OggS":
            raise ValueError(f"not an Ogg page at byte {pos}")
        (page_granule,) = struct.unpack_from("<q", data, pos + 6)
        granule = page_granule if page_granule >= 0 else granule
        n_segments = data[pos + 26]
        table = data[pos + 27 : pos + 27 + n_segments]
        pos += 27 + n_segments
        for size in table:
            current += data[pos : pos + size]
            pos += size
            if size < 255:
                packets.append(current)
                current = b""
    return packets, granule


def _libopus() -> ctypes.CDLL:
    names = [os.environ.get("OPUS_LIBRARY"), "libopus.so.0", ctypes.util.find_library("opus")]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.opus_decoder_create.restype = ctypes.c_void_p
        lib.opus_decoder_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.opus_decode_float.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                          ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int]
        lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
        return lib
    raise RuntimeError("neither PyAV nor libopus is available: install av, or set OPUS_LIBRARY "
                       "to a libopus.so.0 (Debian's libopus0)")


def _decode_libopus(path: str | Path) -> np.ndarray:
    packets, granule = ogg_packets(Path(path).read_bytes())
    if len(packets) < 2 or not packets[0].startswith(b"OpusHead"):
        raise ValueError(f"{path}: not an Ogg Opus file")
    channels, pre_skip = packets[0][9], struct.unpack_from("<H", packets[0], 10)[0]
    if channels != 1:
        raise ValueError(f"{path}: expected mono, found {channels} channels")
    lib = _libopus()
    err = ctypes.c_int()
    dec = lib.opus_decoder_create(OPUS_RATE, 1, ctypes.byref(err))
    if err.value != 0:
        raise RuntimeError(f"opus_decoder_create failed ({err.value})")
    buf = (ctypes.c_float * 5760)()  # 120 ms, the longest Opus packet
    out = []
    try:
        for packet in packets[2:]:  # after OpusHead and OpusTags
            n = lib.opus_decode_float(dec, packet, len(packet), buf, 5760, 0)
            if n < 0:
                raise RuntimeError(f"{path}: opus_decode_float failed ({n})")
            out.append(np.ctypeslib.as_array(buf)[:n].copy())
    finally:
        lib.opus_decoder_destroy(dec)
    x = np.concatenate(out) if out else np.zeros(0, np.float32)
    # the last granule position marks the true end (the last packet is padded)
    return x[pre_skip:granule].astype(np.float32)
