"""Read character vectors out of an R package's lazy-load data base (data/Rdata.rdx +
Rdata.rdb), in plain Python: the teacher sentences come from the Debian package
`r-cran-janeaustenr`, and this saves installing R to read them.

Format (R Internals, "Serialization Formats" and "Lazy loading"): the .rdx file is a
gzip-compressed serialized list whose `variables` element maps each object's name to
(offset, length) in the .rdb file; each .rdb entry is a 4-byte big-endian length and a
zlib stream (or a type byte then xz/bzip2/raw data) holding one serialized object. Only
what character vectors, their attributes and the index need is decoded.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from pathlib import Path

_NIL, _REF, _SYM, _LIST, _CHAR = 254, 255, 1, 2, 9
_LGL, _INT, _REAL, _STR, _VEC, _EXPR = 10, 13, 14, 16, 19, 20
_PAIRLIKE = {2, 3, 5, 6, 17}  # LISTSXP, CLOSXP, PROMSXP, LANGSXP, DOTSXP
_SPECIAL = {253, 252, 251, 250, 242, 241}  # environments and markers without payload


class RDataError(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        if data[:2] != b"X\n":
            raise RDataError("only XDR (binary big-endian) R serialization is supported")
        self.data, self.pos, self.refs = data, 2, []
        version = self.int()
        self.int(), self.int()  # writer and minimal reader R versions
        if version == 3:
            n = self.int()
            self.pos += n  # native encoding name

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def bytes(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def length(self) -> int:
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == _NIL or kind in _SPECIAL:
            return None
        if kind == _REF:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == _SYM:
            name = self.item()
            self.refs.append(name)
            return name
        if kind in _PAIRLIKE:
            return self._pairlist(has_attr, has_tag)
        value = self._vector(kind)
        if has_attr:
            attrs = self.item()
            if isinstance(value, list) and isinstance(attrs, dict) and "names" in attrs:
                return dict(zip(attrs["names"], value))
        return value

    def _pairlist(self, has_attr: int, has_tag: int) -> dict:
        out: dict = {}
        if has_attr:
            self.item()
        tag = self.item() if has_tag else None
        car = self.item()
        cdr = self.item()
        out[tag] = car
        if isinstance(cdr, dict):
            out.update(cdr)
        return out

    def _vector(self, kind: int):
        if kind == _CHAR:
            n = self.int()
            return None if n == -1 else self.bytes(n).decode("utf-8", "replace")
        n = self.length()
        if kind in (_LGL, _INT):
            return list(struct.unpack_from(f">{n}i", self.bytes(4 * n)))
        if kind == _REAL:
            return list(struct.unpack_from(f">{n}d", self.bytes(8 * n)))
        if kind in (_STR, _VEC, _EXPR):
            return [self.item() for _ in range(n)]
        raise RDataError(f"unsupported R object type {kind}")


def unserialize(data: bytes):
    return _Reader(data).item()


def _entry(rdb: bytes, offset: int, length: int) -> bytes:
    blob = rdb[offset : offset + length]
    (size,) = struct.unpack_from(">I", blob)
    body = blob[4:]
    if body[:1] == b"Z":
        return lzma.decompress(body[1:])[:size]
    if body[:1] == b"2":
        return bz2.decompress(body[1:])[:size]
    if body[:1] == b"0":
        return body[1 : 1 + size]
    return zlib.decompress(body)[:size]


def read_lazyload(rdx_path: str | Path) -> dict[str, object]:
    """{name: value} of every object in a lazy-load data base (path of the .rdx)."""
    rdx_path = Path(rdx_path)
    index = unserialize(gzip.decompress(rdx_path.read_bytes()))
    if not isinstance(index, dict) or not isinstance(index.get("variables"), dict):
        raise RDataError(f"{rdx_path}: not a lazy-load index")
    rdb = rdx_path.with_suffix(".rdb").read_bytes()
    return {name: unserialize(_entry(rdb, *pos)) for name, pos in index["variables"].items()}
