"""Reading WAV (RIFF/WAVE) files as they arrive in practice, with numpy only.

The sizes in a WAV header are often wrong: a streamed WAV (this service's own, FFmpeg's
pipe output, browser recorders) carries the placeholder 0xFFFFFFFF or 0, and a file cut
short or still being written claims more or fewer bytes than it holds. So the samples
are the bytes actually present, never the header's sizes:

  * the RIFF size is ignored;
  * a data size of 0xFFFFFFFF, or larger than the bytes present: read to the end;
  * a data size smaller than the bytes present: trusted when another chunk (LIST, id3)
    or nothing follows it, else it is stale and the data runs to the end (a recording
    whose header was written before it ended);
  * chunks before `data` (LIST/INFO, fact, JUNK, bext...) are skipped, odd sizes with
    their pad byte.

Integer PCM (8-bit unsigned, 16/24/32-bit signed, any bits in those containers) and IEEE
float (32/64-bit), plain or WAVE_FORMAT_EXTENSIBLE. Other codecs in a WAV (ADPCM, µ-law,
MP3) are not read here: `parse` returns None and FFmpeg decodes them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

_PLACEHOLDER = 0xFFFFFFFF
_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# the KSDATAFORMAT_SUBTYPE GUIDs of PCM and float share this tail after their 2-byte tag
_SUBTYPE_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_MAX_CHANNELS = 64
_WIDTH = {"u1": 1, "<i2": 2, "i3": 3, "<i4": 4, "<f4": 4, "<f8": 8}  # bytes per sample


class WavError(ValueError):
    """A RIFF/WAVE file that cannot be read; the message says why (no file name)."""


@dataclass(frozen=True, slots=True)
class WavLayout:
    sample: str  # numpy dtype of one sample: "u1", "<i2", "i3" (24-bit, no numpy type), "<i4", "<f4", "<f8"
    channels: int
    rate: int
    offset: int  # where the samples start
    frames: int  # whole frames present (not the header's claim)

    @property
    def width(self) -> int:
        return _WIDTH[self.sample]

    @property
    def nbytes(self) -> int:
        return self.frames * self.channels * self.width


def is_wav(head: bytes) -> bool:
    return len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WAVE"


def parse(buf) -> WavLayout | None:
    """The layout of a RIFF/WAVE file in `buf` (bytes-like, or an mmap); None when it is not
    RIFF/WAVE or holds a codec this module does not read. Raises WavError for a WAV
    that is damaged beyond reading."""
    if not is_wav(bytes(buf[:12])):
        return None
    n, pos, fmt = len(buf), 12, None
    while True:
        if pos + 8 > n:
            raise WavError("WAV file ends before its data chunk (cut short?)" if fmt
                           else "WAV file ends before its fmt chunk (cut short?)")
        chunk, size = struct.unpack_from("<4sI", buf, pos)
        body = pos + 8
        if chunk == b"fmt ":
            if size < 16 or body + 16 > n:
                raise WavError("WAV fmt chunk is cut short")
            fmt = _format(bytes(buf[body:body + min(size, 40)]))
            if fmt is None:
                return None  # another codec: FFmpeg's
        elif chunk == b"data":
            if fmt is None:
                raise WavError("WAV data chunk comes before any fmt chunk")
            sample, channels, rate = fmt
            frames = (_data_end(buf, body, size) - body) // (channels * _WIDTH[sample])
            return WavLayout(sample, channels, rate, body, frames)
        pos = body + size + (size & 1)  # chunks are padded to an even size


def samples(data: bytes, layout: WavLayout) -> np.ndarray:
    """The frames' bytes (`layout.nbytes` from `layout.offset`) -> float32 [frames, channels],
    scaled as FFmpeg scales them (integers by 2^(bits-1); 8-bit is unsigned around 128)."""
    if layout.sample == "i3":  # 24-bit: widen to 32 with a zero low byte, then as 32-bit
        b = np.frombuffer(data, np.uint8).reshape(-1, 3)
        data = np.concatenate([np.zeros((b.shape[0], 1), np.uint8), b], axis=1).tobytes()
        x = np.frombuffer(data, "<i4").astype(np.float32) / 2147483648.0
    elif layout.sample == "u1":
        x = (np.frombuffer(data, "u1").astype(np.float32) - 128.0) / 128.0
    elif layout.sample[1] == "i":
        x = np.frombuffer(data, layout.sample).astype(np.float32) / float(2 ** (8 * layout.width - 1))
    else:
        x = np.frombuffer(data, layout.sample).astype(np.float32)
    return x.reshape(-1, layout.channels)


# ---------------------------------------------------------------------------------------


def _format(fmt: bytes) -> tuple[str, int, int] | None:
    """A fmt chunk -> (sample dtype, channels, rate); None for a codec other than PCM/float."""
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _EXTENSIBLE:
        if len(fmt) < 40:
            raise WavError("WAV fmt chunk is cut short (WAVE_FORMAT_EXTENSIBLE needs 40 bytes)")
        if fmt[26:40] != _SUBTYPE_TAIL:
            return None
        tag = struct.unpack_from("<H", fmt, 24)[0]  # the SubFormat GUID starts with the tag
    if tag not in (_PCM, _FLOAT):
        return None
    if not 1 <= channels <= _MAX_CHANNELS:
        raise WavError(f"WAV header says {channels} channels (supported: 1..{_MAX_CHANNELS})")
    if tag == _FLOAT:
        if bits not in (32, 64):
            raise WavError(f"unsupported WAV float sample size {bits} bits (supported: 32, 64)")
        sample = "<f4" if bits == 32 else "<f8"
    else:
        width = (bits + 7) // 8  # e.g. 20 valid bits sit left-justified in 3 bytes
        if not 1 <= width <= 4:
            raise WavError(f"unsupported WAV sample size {bits} bits (supported: 8..32)")
        sample = {1: "u1", 2: "<i2", 3: "i3", 4: "<i4"}[width]
    if align not in (0, channels * _WIDTH[sample]):  # frames would be misread: say so rather than guess
        raise WavError(f"WAV header is inconsistent: block align {align} for {channels} channels of {bits} bits")
    return sample, channels, rate


def _data_end(buf, body: int, size: int) -> int:
    """Where the data chunk's samples end: the header's size only where it is believable."""
    n = len(buf)
    if size == _PLACEHOLDER or body + size > n:
        return n  # streaming placeholder, or a file cut short: the samples that are there
    end = body + size
    after = end + (size & 1)
    if after >= n or _chunk_follows(buf, after):
        return end
    return n  # a stale size (0 from a streaming writer, or written before the recording ended)


def _chunk_follows(buf, pos: int) -> bool:
    """Whether a plausible chunk header is at `pos`: a printable 4-character id and a size
    that fits the file (8 bytes of samples pass both at odds below 1e-4 in a 10 MB file)."""
    if pos + 8 > len(buf):
        return False
    chunk, size = struct.unpack_from("<4sI", buf, pos)
    return all(0x20 <= c <= 0x7E for c in chunk) and chunk[0] != 0x20 and size <= len(buf) - pos - 8
