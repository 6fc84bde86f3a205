"""Text normalization before tokenization.

Conservative on purpose: numbers, punctuation and every script are kept as written
(the model reads them); only what cannot be spoken or would be misread is changed.
"""

from __future__ import annotations

import re
import unicodedata

_CURLY_SINGLE = str.maketrans({"\u2018": "'", "\u2019": "'"})
_EMOJI = re.compile("[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]+")
_REPEATED_COMMAS = re.compile(r",{2,}")
_SPACES = re.compile(r"[ \t\u00a0\u3000]+")
_BLANK_LINES = re.compile(r"\n{2,}")
# "<|" opens a special token (<|im_end|>, <|semantic:5|>, ...). User text must never
# produce one, so the pair is broken with a space.
_SPECIAL_OPEN = re.compile(r"<\|")


def normalize_text(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if ch == "\n" or unicodedata.category(ch)[0] != "C")
    text = text.translate(_CURLY_SINGLE)
    text = _EMOJI.sub("", text)
    text = _REPEATED_COMMAS.sub(",", text)
    text = _SPECIAL_OPEN.sub("< |", text)
    text = _SPACES.sub(" ", text)
    text = _BLANK_LINES.sub("\n", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()


# A sentence ends after . ! ? (and their CJK, Arabic and Devanagari forms), optionally
# followed by closing quotes or brackets; Latin ends need whitespace after them.
_SENTENCE_END = re.compile(r"[.!?\u061f\u0964][\"'\u201d)\]]*\s+|[\u3002\uff01\uff1f][\u201d\u300d)\]]*\s*")


def split_segments(text: str, max_chars: int = 200) -> list[str]:
    """Whole sentences grouped into segments of at most `max_chars` characters (a
    sentence longer than that is its own segment). The CLI speaks one segment per turn."""
    text = normalize_text(text)
    sentences, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        sentences.append(text[start : m.end()])
        start = m.end()
    sentences.append(text[start:])
    segments: list[str] = []
    for sentence in filter(str.strip, sentences):
        if segments and len((segments[-1] + sentence).strip()) <= max_chars:
            segments[-1] += sentence
        else:
            segments.append(sentence)
    return [s.strip() for s in segments]
