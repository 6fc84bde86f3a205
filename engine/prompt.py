"""Conversation prompts of the upstream formats, as [1 + C, T] token tensors.

Row 0 holds token ids; rows 1..C hold the frame codes at semantic positions (zeros
elsewhere). Each text piece is tokenized on its own, as upstream does, so the ids match.

S2 (`fish_qwen3_omni`):
    <|im_start|>system\\n convert the provided text to speech reference to the following:\\n\\nText:\\n
        <|speaker:0|>transcript 1\\n<|speaker:1|>transcript 2 \\n\\nSpeech:\\n [codes 1][codes 2] <|im_end|>\\n
    <|im_start|>user\\n {text} <|im_end|>\\n
    <|im_start|>assistant\\n<|voice|>            <- generation starts here
  Without a reference the system text is only "convert the provided text to speech".
  A generated segment is closed with <|im_end|>\\n and stays in the context, so the next
  segment continues in the same voice (upstream appends it as an assistant turn).

S1 (`dual_ar`, interleave):
    <|interleave|> <|speaker:0|>transcript [codes] <|im_end|> ... <|speaker:0|>{text}
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.config import ModelConfig
from engine.text import normalize_text
from engine.tokenizer import IM_END, IM_START, INTERLEAVE, VOICE, TextTokenizer, speaker_token

S2_SYSTEM_WITH_REFERENCE = "convert the provided text to speech reference to the following:\n\nText:\n"
S2_SYSTEM_PLAIN = "convert the provided text to speech"
S2_SPEECH_HEADER = "\n\nSpeech:\n"


@dataclass(slots=True)
class Reference:
    """One reference utterance of a voice: its transcript and its codec codes [C, n]."""

    text: str
    codes: Tensor


@dataclass(slots=True)
class Voice:
    references: list[Reference] = field(default_factory=list)


class PromptBuilder:
    def __init__(self, tokenizer: TextTokenizer, config: ModelConfig) -> None:
        self.tok = tokenizer
        self.config = config
        self.num_codebooks = config.num_codebooks
        self._pieces: tuple[int, int] | None = None  # segment(): tokens before and after the text

    # --- pieces ------------------------------------------------------------------------

    def text(self, text: str) -> Tensor:
        ids = torch.tensor(self.tok.encode(text), dtype=torch.long)
        out = torch.zeros(1 + self.num_codebooks, ids.numel(), dtype=torch.long)
        out[0] = ids
        return out

    def codes(self, codes: Tensor) -> Tensor:
        if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(f"reference codes must be [{self.num_codebooks}, frames], got {list(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size):
            raise ValueError("reference codes are outside the codebook range")
        if codes.numel() and int(codes[0].max()) >= self.config.num_semantic:
            raise ValueError("reference semantic codes exceed the number of semantic tokens")
        codes = codes.long()
        return torch.cat([codes[:1] + self.config.semantic_begin_id, codes], dim=0)

    def _join(self, pieces: list[Tensor]) -> Tensor:
        return torch.cat(pieces, dim=1) if pieces else torch.zeros(1 + self.num_codebooks, 0, dtype=torch.long)

    # --- turns -------------------------------------------------------------------------

    def voice_prefix(self, voice: Voice | None) -> Tensor:
        """The part of the prompt that depends on the voice only (cacheable per voice)."""
        refs = voice.references if voice else []
        if self.config.prompt_format == "s1":
            return self._s1_prefix(refs)
        pieces = [self.text(f"{IM_START}system\n")]
        if refs:
            # Each reference is tagged with its own speaker index, as upstream does for
            # untagged transcripts (user text can carry no tags: normalize_text breaks "<|").
            transcripts = [f"{speaker_token(i)}{normalize_text(r.text)}" for i, r in enumerate(refs)]
            pieces += [
                self.text(S2_SYSTEM_WITH_REFERENCE),
                self.text("\n".join(transcripts)),
                self.text(S2_SPEECH_HEADER),
                self.codes(torch.cat([r.codes for r in refs], dim=1)),
            ]
        else:
            pieces.append(self.text(S2_SYSTEM_PLAIN))
        pieces.append(self.text(f"{IM_END}\n"))
        return self._join(pieces)

    def _s1_prefix(self, refs: list[Reference]) -> Tensor:
        pieces = [self.text(INTERLEAVE)]
        for r in refs:
            pieces += [
                self.text(speaker_token(0)),
                self.text(normalize_text(r.text)),
                self.codes(r.codes),
                self.text(IM_END),
            ]
        return self._join(pieces)

    def segment(self, text: str) -> Tensor:
        """A text segment to speak, ending where generation starts."""
        text = normalize_text(text)
        if self.config.prompt_format == "s1":
            return self._join([self.text(speaker_token(0)), self.text(text)])
        return self._join([
            self.text(f"{IM_START}user\n"),
            self.text(text),
            self.text(f"{IM_END}\n"),
            self.text(f"{IM_START}assistant\n{VOICE}"),
        ])

    def segment_text_span(self, segment: Tensor) -> tuple[int, int]:
        """Where a `segment()` prompt holds its text: (first token, tokens). Its pieces are
        tokenized one by one, so the text is what the fixed pieces around it leave."""
        if self._pieces is None:
            s1 = self.config.prompt_format == "s1"
            header = speaker_token(0) if s1 else f"{IM_START}user\n"
            trailer = [] if s1 else [f"{IM_END}\n", f"{IM_START}assistant\n{VOICE}"]
            self._pieces = (len(self.tok.encode(header)), sum(len(self.tok.encode(t)) for t in trailer))
        header, trailer = self._pieces
        return header, segment.shape[1] - header - trailer

    def segment_end(self) -> Tensor:
        """Closes a generated segment (its codes are already in the context)."""
        return self.text(IM_END if self.config.prompt_format == "s1" else f"{IM_END}\n")

    def full(self, voice: Voice | None, text: str) -> Tensor:
        return torch.cat([self.voice_prefix(voice), self.segment(text)], dim=1)
