"""English text -> IPA phonemes (espeak-ng, through its C library) -> Piper phoneme ids.

Piper voices were trained on espeak-ng IPA, one clause at a time, with the clause's
punctuation written after its phonemes and decomposed (NFD) code points mapped through
the voice's `phoneme_id_map`; the id sequence is `^ _ p1 _ p2 _ ... pn _ $` (bos, the pad
id after every phoneme, eos). This module reproduces that with the espeak-ng shipped by
Debian (`apt-get install espeak-ng`): only the data machine needs it; the phoneme ids it
makes are small and travel to the machines that synthesize.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import unicodedata
from collections.abc import Mapping, Sequence

ESPEAK_LIBRARIES = ("libespeak-ng.so.1", "libespeak-ng.so")
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
# espeak marks a switch of language inside a clause as "(fr)" ... "(en)"
_LANGUAGE_SWITCH = re.compile(r"\([a-z\-]+\)")
_CLAUSE_PUNCTUATION = ".,;:!?"
_CLOSING = " \t\n\"')]\u2019\u201d"


class PhonemizerError(RuntimeError):
    pass


class Espeak:
    """One espeak-ng instance per process (the library keeps global state)."""

    def __init__(self, voice: str = "en-us", library: str | None = None) -> None:
        self._lib = _load_library(library)
        self._lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self._lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        if self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0) < 0:
            raise PhonemizerError("espeak_Initialize failed (is espeak-ng-data installed?)")
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise PhonemizerError(f"espeak-ng has no voice {voice!r}")

    def clauses(self, text: str) -> list[tuple[str, str]]:
        """(IPA phonemes, closing punctuation or '') of each clause, in order."""
        data = text.encode("utf-8")
        buf = ctypes.create_string_buffer(data)
        ptr = ctypes.c_char_p(ctypes.addressof(buf))
        start = ctypes.addressof(buf)
        out: list[tuple[str, str]] = []
        clause_start = 0
        while ptr.value:
            ipa = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEMES_IPA)
            # espeak leaves the pointer one byte past the start of the next clause (it
            # reads ahead one character), and NULL after the last clause
            end = _address(ptr) - start - 1 if ptr.value else len(data)
            consumed = data[clause_start:end].decode("utf-8", "ignore").rstrip(_CLOSING)
            clause_start = end
            punct = consumed[-1] if consumed and consumed[-1] in _CLAUSE_PUNCTUATION else ""
            ipa = _LANGUAGE_SWITCH.sub("", (ipa or b"").decode("utf-8")).strip()
            if ipa:
                out.append((ipa, punct))
        return out

    def phonemize(self, text: str) -> str:
        """Piper-style phoneme string of `text`: clauses joined with their punctuation."""
        parts = [ipa + punct for ipa, punct in self.clauses(text)]
        return unicodedata.normalize("NFD", " ".join(parts))


def _address(ptr: ctypes.c_char_p) -> int:
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def _load_library(name: str | None) -> ctypes.CDLL:
    names = [name] if name else [*ESPEAK_LIBRARIES, ctypes.util.find_library("espeak-ng")]
    for candidate in filter(None, names):
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    raise PhonemizerError("espeak-ng's library is not installed (Debian: apt-get install espeak-ng)")


def phoneme_ids(phonemes: str, id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Piper's id sequence: bos, pad, then each known phoneme followed by pad, then eos.
    Phonemes the voice does not know are dropped (as Piper does)."""
    pad, bos, eos = id_map["_"][0], id_map["^"][0], id_map["$"][0]
    ids = [bos, pad]
    for ch in phonemes:
        if ch in id_map:
            ids.extend(id_map[ch])
            ids.append(pad)
    ids.append(eos)
    return ids
