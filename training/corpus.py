"""The teacher's sentences: Jane Austen's six novels (public domain; Project Gutenberg
texts) as shipped by the Debian package `r-cran-janeaustenr` (MIT), read without R (see
rdata.py), cut into sentences, filtered to plain speakable ones, split into train and
held-out sets by a hash of the text, and phonemized for the teacher.

    apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb /tmp/janeausten
    python -m training.corpus --rdata /tmp/janeausten --out data/voice/text.jsonl

Output: JSON lines {id, text, phonemes, ids, split, book}; `text` is what the model reads
(as a user would type it), `phonemes`/`ids` what the teacher speaks (Piper ids). Splits:
`train`, `test` (2% of the Austen sentences, by hash) and `plain`: the project's own
plain modern sentences (plain_sentences.txt), for evaluation only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

DEB_RDATA = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdx"
PLAIN_SENTENCES = Path(__file__).with_name("plain_sentences.txt")
BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")

MIN_CHARS, MAX_CHARS = 12, 180  # ~1-12 s of speech
MIN_WORDS = 3
HELD_OUT_PERCENT = 2

_ALLOWED = re.compile(r"^[A-Za-z0-9 ,.;:!?'\-]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")
_ABBREVIATION = re.compile(r"\b(Mr|Mrs|Dr|St|Col|Capt|Esq)\.$")
# spoken forms for the teacher only (the model reads the text as written)
_SPOKEN = [(re.compile(r"\bMrs\.\s"), "Missus "), (re.compile(r"\bMr\.\s"), "Mister "),
           (re.compile(r"\bDr\.\s"), "Doctor "), (re.compile(r"\bSt\.\s"), "Saint "),
           (re.compile(r"\bCol\.\s"), "Colonel "), (re.compile(r"\bCapt\.\s"), "Captain ")]


def find_rdata(path: str | Path) -> Path:
    """The .rdx of the package: `path` itself, or inside an unpacked .deb / an R library."""
    path = Path(path)
    for candidate in (path, path / DEB_RDATA, path / "janeaustenr/data/Rdata.rdx", path / "data/Rdata.rdx"):
        if candidate.is_file() and candidate.suffix == ".rdx":
            return candidate
    raise FileNotFoundError(
        f"{path}: no {DEB_RDATA}; run `apt-get download r-cran-janeaustenr && "
        f"dpkg -x r-cran-janeaustenr_*.deb {path}`")


def paragraphs(lines: list[str]) -> Iterator[str]:
    """Blank-line separated paragraphs, joined into one line each; headings dropped."""
    block: list[str] = []
    for line in [*lines, ""]:
        line = line.strip()
        if line:
            block.append(line)
            continue
        if block:
            text = " ".join(block)
            if not (text.isupper() or text.lower().startswith(("chapter", "volume"))):
                yield text
            block = []


def clean(text: str) -> str:
    text = text.replace("_", "")  # Gutenberg italics
    text = re.sub(r"\s*--\s*", ", ", text)  # dashes read as a pause
    text = text.replace('"', "").replace("`", "'")
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+([,.;:!?])", r"\1", text)
    text = re.sub(r",\s*([,.;:!?])", r"\1", text)
    text = re.sub(r"([.;:!?]),", r"\1", text)
    return text.strip(" ,")


def sentences(paragraph: str) -> Iterator[str]:
    pieces = _SENTENCE_END.split(paragraph)
    current = ""
    for piece in pieces:
        current = f"{current} {piece}".strip() if current else piece
        if _ABBREVIATION.search(current):  # "Mr." does not end a sentence
            continue
        yield current
        current = ""
    if current:
        yield current


def speakable(text: str) -> bool:
    words = text.split()
    return (MIN_CHARS <= len(text) <= MAX_CHARS and len(words) >= MIN_WORDS
            and bool(_ALLOWED.match(text)) and text[-1] in ".!?" and text[0].isupper()
            and not any(w.isupper() and len(w) > 1 for w in words))


def spoken_form(text: str) -> str:
    for pattern, replacement in _SPOKEN:
        text = pattern.sub(replacement, text)
    return text


def split_of(text: str) -> str:
    digest = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
    return "test" if digest % 100 < HELD_OUT_PERCENT else "train"


def extract(rdx: Path) -> Iterator[dict]:
    from training.rdata import read_lazyload

    books = read_lazyload(rdx)
    seen: set[str] = set()
    for book in BOOKS:
        for paragraph in paragraphs(books[book]):
            for sentence in sentences(clean(paragraph)):
                if speakable(sentence) and sentence not in seen:
                    seen.add(sentence)
                    yield {"text": sentence, "book": book, "split": split_of(sentence)}


def plain_sentences(path: Path = PLAIN_SENTENCES) -> Iterator[dict]:
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            yield {"text": line.strip(), "book": "plain", "split": "plain"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.corpus", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rdata", required=True, help="unpacked r-cran-janeaustenr .deb (or its Rdata.rdx)")
    p.add_argument("--out", required=True, help="JSON lines output")
    p.add_argument("--no-phonemes", action="store_true", help="skip espeak-ng (text only)")
    args = p.parse_args(argv)
    from training.phonemes import Espeak, phoneme_ids
    from training.teacher import default_voice_files

    espeak = None if args.no_phonemes else Espeak()
    id_map = None if args.no_phonemes else json.loads(default_voice_files()[1].read_text())["phoneme_id_map"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "test": 0, "plain": 0}
    items = list(extract(find_rdata(args.rdata))) + list(plain_sentences())
    with out.open("w") as f:
        for i, item in enumerate(items):
            item = {"id": f"{'pl' if item['split'] == 'plain' else 'ja'}{i:06d}", **item}
            if espeak is not None:
                item["phonemes"] = espeak.phonemize(spoken_form(item["text"]))
                item["ids"] = phoneme_ids(item["phonemes"], id_map)
            counts[item["split"]] += 1
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{out}: {counts['train']} train + {counts['test']} held-out + {counts['plain']} plain sentences",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
