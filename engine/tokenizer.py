"""Text tokenizers of the checkpoint folders, behind one small interface.

- S2 (and our own models): a Hugging Face `tokenizer.json` (Qwen3's for S2-Pro), read
  with the `tokenizers` library; special tokens written in the text are parsed as such.
- S1-mini: `tokenizer.tiktoken` (base64 token + rank per line) plus `special_tokens.json`
  ({token: id}), with the S1 split pattern.
- tiny: a byte-level tokenizer built in memory (256 byte tokens, then the special
  tokens, then the semantic tokens), for tests and the random-weight tiny preset.

Semantic tokens are `<|semantic:i|>`; their ids must be contiguous (the model maps
code i to id semantic_begin_id + i).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"
INTERLEAVE = "<|interleave|>"


def semantic_token(i: int) -> str:
    return f"<|semantic:{i}|>"


def speaker_token(i: int) -> str:
    return f"<|speaker:{i}|>"


# The S1 (tiktoken) pre-tokenizer split pattern: GPT-4o's, tuned for punctuation.
S1_SPLIT_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"\p{P}",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(\?!\S)",
        r"\s+",
    ]
)


class TokenizerError(ValueError):
    pass


class TextTokenizer:
    def __init__(self, encode: Callable[[str], list[int]], vocab: dict[str, int], name: str) -> None:
        self._encode = encode
        self._vocab = vocab  # special/added tokens (at least) -> id
        self.name = name
        ids = []
        i = 0
        while semantic_token(i) in vocab:
            ids.append(vocab[semantic_token(i)])
            i += 1
        if not ids:
            raise TokenizerError(f"{name}: no <|semantic:i|> tokens in the vocabulary")
        if ids != list(range(ids[0], ids[0] + len(ids))):
            raise TokenizerError(f"{name}: semantic token ids are not contiguous")
        self.semantic_begin_id = ids[0]
        self.semantic_end_id = ids[-1]
        self.im_end_id = self.token_id(IM_END)

    @property
    def num_semantic(self) -> int:
        return self.semantic_end_id - self.semantic_begin_id + 1

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def token_id(self, token: str) -> int:
        try:
            return self._vocab[token]
        except KeyError:
            raise TokenizerError(f"{self.name}: token {token!r} is not in the vocabulary") from None

    def has_token(self, token: str) -> bool:
        return token in self._vocab

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: str | Path) -> "TextTokenizer":
        folder = Path(folder)
        if (folder / "tokenizer.json").exists():
            return cls.from_hf_json(folder / "tokenizer.json")
        if (folder / "tokenizer.tiktoken").exists():
            return cls.from_tiktoken(folder / "tokenizer.tiktoken", folder / "special_tokens.json")
        raise TokenizerError(f"{folder}: no tokenizer.json or tokenizer.tiktoken found")

    @classmethod
    def from_hf_json(cls, path: str | Path) -> "TextTokenizer":
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises its own exception types
            raise TokenizerError(f"{path}: cannot read tokenizer ({e})") from e
        return cls._from_hf(tok, str(path))

    @classmethod
    def _from_hf(cls, tok, name: str) -> "TextTokenizer":
        vocab = tok.get_vocab(with_added_tokens=True)
        return cls(lambda text: tok.encode(text, add_special_tokens=False).ids, vocab, name)

    @classmethod
    def from_tiktoken(cls, bpe_path: Path, special_path: Path) -> "TextTokenizer":
        import tiktoken

        ranks: dict[bytes, int] = {}
        for line in bpe_path.read_text().splitlines():
            if not line:
                continue
            token, rank = line.split()
            ranks[b"" if token == "=" else base64.b64decode(token)] = int(rank)
        if not special_path.exists():
            raise TokenizerError(f"{special_path}: missing (S1 tokenizers need it)")
        special = json.loads(special_path.read_text())
        enc = tiktoken.Encoding(
            name=bpe_path.stem, pat_str=S1_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special
        )
        return cls(lambda text: enc.encode(text, allowed_special="all"), dict(special), str(bpe_path))

    @classmethod
    def tiny(cls) -> "TextTokenizer":
        return cls._from_hf(build_tiny_tokenizer(), "tiny")


# --- the tiny byte-level tokenizer ---------------------------------------------------

TINY_SPECIALS = ["<|endoftext|>", IM_START, IM_END, "<|text|>", VOICE, INTERLEAVE] + [
    speaker_token(i) for i in range(8)
]


@dataclass(frozen=True, slots=True)
class TinyLayout:
    codebook_size: int = 256
    num_codebooks: int = 4

    @property
    def semantic_begin_id(self) -> int:
        return 256 + len(TINY_SPECIALS)

    @property
    def semantic_end_id(self) -> int:
        return self.semantic_begin_id + self.codebook_size - 1

    @property
    def im_end_id(self) -> int:
        return 256 + TINY_SPECIALS.index(IM_END)

    @property
    def vocab_size(self) -> int:
        return self.semantic_end_id + 1


TINY_LAYOUT = TinyLayout()


def build_tiny_tokenizer(layout: TinyLayout = TINY_LAYOUT):
    """Byte-level BPE with no merges: every UTF-8 byte is one token (ids 0..255), so any
    script round-trips; then the special tokens and the semantic tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _byte_level_chars()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = TINY_SPECIALS + [semantic_token(i) for i in range(layout.codebook_size)]
    tok.add_special_tokens(specials)
    return tok


def _byte_level_chars() -> dict[int, str]:
    # GPT-2's byte -> printable character map used by ByteLevel pre-tokenizers.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
