"""Training sequences for the DualAR model, in the S2 prompt format the engine serves
(built by engine/prompt.py's PromptBuilder itself, so training and serving agree token for
token):

    system: reference transcript(s) + reference codes   (a different utterance, same speaker)
    user: text 1 / assistant: <|voice|> codes 1 <|im_end|>
    user: text 2 / assistant: <|voice|> codes 2 <|im_end|>   (1-4 turns, as a conversation)

Speaker 0 (the teacher's own voice) also appears without a reference (the plain system
prompt), which is what the service speaks when no voice is given.

Targets, aligned with the tokens [1 + C, L]:
  slow [L]:      at the `<|voice|>` position and each frame of an assistant turn, the next
                 frame's semantic code (0..S-1) or S for <|im_end|> (the head the engine
                 samples: semantic rows + end); -100 elsewhere.
  fast [C, L]:   the codes of that next frame (row 0 = its semantic code), -100 elsewhere.
  align [3, L]:  for the guided-attention loss (lm_forward.guided_attention_loss): at each
                 position that predicts a frame of an assistant turn, the first position and
                 the length of that turn's text, and how far through the turn's frames the
                 position is (0..1); zeros elsewhere (length 0: no guide).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from engine.config import ModelConfig
from engine.prompt import PromptBuilder, Reference, Voice
from engine.tokenizer import IM_START, TextTokenizer

IGNORE = -100


@dataclass
class CodeSet:
    """The encoded data set (training.codec_train encode's codes.npz)."""

    codes: np.ndarray  # int16 [C, frames]
    offsets: np.ndarray  # [n + 1]
    ids: list[str]
    speakers: np.ndarray
    texts: list[str]
    splits: list[str]

    @classmethod
    def load(cls, path: str | Path) -> "CodeSet":
        z = np.load(path)
        return cls(z["codes"], z["offsets"], [str(s) for s in z["ids"]], z["speakers"],
                   [str(s) for s in z["texts"]], [str(s) for s in z["splits"]])

    def utterance(self, i: int) -> Tensor:
        return torch.from_numpy(self.codes[:, self.offsets[i] : self.offsets[i + 1]].astype(np.int64))

    def frames(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])


class CachedPromptBuilder(PromptBuilder):
    """PromptBuilder with the tokenization of each text piece cached (the fixed prompt
    pieces and the corpus sentences repeat across thousands of sequences)."""

    def __init__(self, tokenizer: TextTokenizer, config: ModelConfig) -> None:
        super().__init__(tokenizer, config)
        self._cache: dict[str, Tensor] = {}

    def text(self, text: str) -> Tensor:
        t = self._cache.get(text)
        if t is None:
            t = self._cache[text] = super().text(text)
        return t


@dataclass
class Sequence:
    tokens: Tensor  # [1 + C, L]
    slow: Tensor  # [L]
    fast: Tensor  # [C, L]
    align: Tensor  # [3, L] float: text start, text length, progress through the frames


@dataclass
class SequenceConfig:
    max_tokens: int = 1536
    max_turns: int = 4
    no_reference: float = 0.15  # share of sequences with the plain prompt (speaker 0)
    two_references: float = 0.2
    max_reference_frames: int = 320  # ~15 s


class SequenceBuilder:
    def __init__(self, data: CodeSet, tokenizer: TextTokenizer, config: ModelConfig,
                 cfg: SequenceConfig | None = None, split: str = "train", seed: int = 0) -> None:
        self.data, self.config, self.cfg = data, config, cfg or SequenceConfig()
        self.prompts = CachedPromptBuilder(tokenizer, config)
        self.rng = random.Random(seed)
        self.by_speaker: dict[int, list[int]] = defaultdict(list)
        for i, (spk, sp) in enumerate(zip(data.speakers, data.splits)):
            if sp == split:
                self.by_speaker[int(spk)].append(i)
        if not self.by_speaker:
            raise ValueError(f"no utterances of split {split!r}")
        self.speakers = sorted(self.by_speaker)

    def sample(self) -> Sequence:
        cfg, rng = self.cfg, self.rng
        plain = 0 in self.by_speaker and rng.random() < cfg.no_reference
        speaker = 0 if plain else rng.choice(self.speakers)
        pool = self.by_speaker[speaker]
        refs: list[int] = []
        if not plain:
            n_refs = 2 if rng.random() < cfg.two_references else 1
            frames = 0
            for i in rng.sample(pool, min(n_refs, len(pool))):
                if refs and frames + self.data.frames(i) > cfg.max_reference_frames:
                    break
                refs.append(i)
                frames += self.data.frames(i)
        turns = [i for i in rng.sample(pool, min(len(pool), cfg.max_turns + len(refs))) if i not in refs]
        turns = turns[: rng.randint(1, cfg.max_turns)]
        return self.build(refs, turns)

    def build(self, refs: list[int], turns: list[int]) -> Sequence:
        """The sequence of references `refs` then assistant turns `turns` (utterance indices);
        turns that would pass max_tokens are left out (the first one always stays, cut)."""
        p, c = self.prompts, self.config
        voice = Voice([Reference(self.data.texts[i], self.data.utterance(i)[:, : self.cfg.max_reference_frames])
                       for i in refs]) if refs else None
        pieces = [p.voice_prefix(voice)]
        slow = [torch.full((pieces[0].shape[1],), IGNORE)]
        fast = [torch.full((c.num_codebooks, pieces[0].shape[1]), IGNORE)]
        align = [torch.zeros(3, pieces[0].shape[1])]
        length = pieces[0].shape[1]
        # a segment is fixed pieces around the text: where its text starts, and how long
        # the fixed pieces are (the text's length is the rest)
        text_offset, fixed = p.text(f"{IM_START}user\n").shape[1], p.segment("").shape[1]
        for k, i in enumerate(turns):
            seg, codes, end = p.segment(self.data.texts[i]), self.data.utterance(i), p.segment_end()
            n = codes.shape[1]
            if k and length + seg.shape[1] + n + end.shape[1] > self.cfg.max_tokens:
                break
            turn = torch.cat([seg, p.codes(codes), end], dim=1)
            s = torch.full((turn.shape[1],), IGNORE)
            f = torch.full((c.num_codebooks, turn.shape[1]), IGNORE)
            v = seg.shape[1] - 1  # the <|voice|> position predicts frame 0
            s[v : v + n] = codes[0]
            s[v + n] = c.num_semantic  # the last frame predicts <|im_end|>
            f[:, v : v + n] = codes
            a = torch.zeros(3, turn.shape[1])
            a[0, v : v + n] = length + text_offset
            a[1, v : v + n] = seg.shape[1] - fixed
            a[2, v : v + n] = torch.arange(n) / n
            pieces.append(turn)
            slow.append(s)
            fast.append(f)
            align.append(a)
            length += turn.shape[1]
        tokens, slow_t, fast_t, align_t = torch.cat(pieces, 1), torch.cat(slow), torch.cat(fast, 1), torch.cat(align, 1)
        if tokens.shape[1] > self.cfg.max_tokens:  # a single over-long turn: cut (its end unseen)
            m = self.cfg.max_tokens
            tokens, slow_t, fast_t, align_t = tokens[:, :m], slow_t[:m], fast_t[:, :m], align_t[:, :m]
        return Sequence(tokens, slow_t, fast_t, align_t)


@dataclass
class Batch:
    tokens: Tensor  # [B, 1 + C, L]
    slow: Tensor  # [B, L]
    fast: Tensor  # [B, C, L]
    align: Tensor  # [B, 3, L]

    def to(self, device, non_blocking: bool = True) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in (self.tokens, self.slow, self.fast, self.align)))

    def pin_memory(self) -> "Batch":  # called by the DataLoader with pin_memory=True
        return Batch(*(t.pin_memory() for t in (self.tokens, self.slow, self.fast, self.align)))


def collate(seqs: list[Sequence], pad_to: int = 64) -> Batch:
    """Right-padded batch (padding is never attended to by real positions: causal), its
    length rounded up to `pad_to` so that few distinct shapes reach the GPU."""
    length = max(s.tokens.shape[1] for s in seqs)
    length = -(-length // pad_to) * pad_to
    b, rows = len(seqs), seqs[0].tokens.shape[0]
    tokens = torch.zeros(b, rows, length, dtype=torch.long)
    slow = torch.full((b, length), IGNORE, dtype=torch.long)
    fast = torch.full((b, rows - 1, length), IGNORE, dtype=torch.long)
    align = torch.zeros(b, 3, length)
    for j, s in enumerate(seqs):
        n = s.tokens.shape[1]
        tokens[j, :, :n], slow[j, :n], fast[j, :, :n], align[j, :, :n] = s.tokens, s.slow, s.fast, s.align
    return Batch(tokens, slow, fast, align)


def batches(builder: SequenceBuilder, batch_tokens: int, pool: int = 256):
    """Endless batches of about `batch_tokens` tokens (padding included): a pool of
    sequences is sorted by length and cut into batches, so padding stays small."""
    while True:
        seqs = sorted((builder.sample() for _ in range(pool)), key=lambda s: s.tokens.shape[1])
        groups, current = [], []
        for s in seqs:
            if current and (len(current) + 1) * s.tokens.shape[1] > batch_tokens:
                groups.append(current)
                current = []
            current.append(s)
        if current:
            groups.append(current)
        builder.rng.shuffle(groups)
        for g in groups:
            yield collate(g)


class BatchStream(torch.utils.data.IterableDataset):
    """Endless batches for a DataLoader: each worker process builds its own (reseeded), so
    sequence building (~0.3 ms a sequence, ~30 ms a 32k-token batch) runs beside the GPU."""

    def __init__(self, builder: SequenceBuilder, batch_tokens: int) -> None:
        self.builder, self.batch_tokens = builder, batch_tokens

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            self.builder.rng.seed(self.builder.rng.random() + info.id)
        return batches(self.builder, self.batch_tokens)
