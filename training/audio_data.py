"""The teacher data in memory: shards decoded once, utterances as (start, length) views
into one array; random crops for codec training; per-utterance slices for encoding."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from training.datagen import read_manifest
from training.phone_targets import read_targets


@dataclass
class Utterance:
    id: str
    speaker: int
    text: str
    split: str
    start: int  # into AudioSet.audio
    samples: int
    phones: list[int] | None = None  # CTC targets (phone_targets.py), when the folder has them


def _one_thread() -> None:
    torch.set_num_threads(1)  # decoding pools run one process per core


def _decode(args: tuple[str, int]) -> np.ndarray:
    from training.opus_io import read_opus

    path, rate = args
    return (np.clip(read_opus(path, rate), -1, 1) * 32767).astype(np.int16)


class AudioSet:
    """All utterances of a teacher data folder (or several), int16 in one array."""

    def __init__(self, folders: list[Path], rate: int, splits: tuple[str, ...] = ("train",),
                 workers: int = 1) -> None:
        rows = [(folder, row) for folder in folders for row in read_manifest(folder) if row["split"] in splits]
        phones = {folder: read_targets(folder) for folder in folders}
        shards = sorted({(str(folder / row["shard"]), row["rate"]) for folder, row in rows})
        if any(r != rate for _, r in shards):
            raise ValueError(f"shards were made at {shards[0][1]} Hz; the codec runs at {rate} Hz")
        if workers > 1:
            with mp.get_context("spawn").Pool(workers, _one_thread) as pool:
                decoded = pool.map(_decode, shards)
        else:
            decoded = [_decode(s) for s in shards]
        offset, base = 0, {}
        for (path, _), pcm in zip(shards, decoded):
            base[path] = offset
            offset += pcm.size
        self.audio = np.concatenate(decoded) if decoded else np.zeros(0, np.int16)
        self.rate = rate
        self.utterances = []
        for folder, row in rows:
            start = base[str(folder / row["shard"])] + row["start"]
            samples = min(row["samples"], self.audio.size - start)
            targets = phones[folder].get(row["id"]) if phones[folder] else None
            self.utterances.append(Utterance(row["id"], row["speaker"], row["text"], row["split"], start, samples,
                                             targets))

    @property
    def seconds(self) -> float:
        return sum(u.samples for u in self.utterances) / self.rate

    def waveform(self, u: Utterance) -> np.ndarray:
        return self.audio[u.start : u.start + u.samples].astype(np.float32) / 32767.0


class CropSampler:
    """Random fixed-length crops of utterances, on the training device: the whole set lives
    there as int16 (5 h at 22.05 kHz is 0.8 GB), so a batch costs a gather, not a loader."""

    def __init__(self, data: AudioSet, segment: int, device: torch.device | str, seed: int = 0,
                 gain_db: float = 6.0) -> None:
        self.segment, self.gain_db = segment, gain_db
        self.audio = torch.from_numpy(data.audio).to(device)
        starts = torch.tensor([u.start for u in data.utterances], dtype=torch.long)
        lengths = torch.tensor([u.samples for u in data.utterances], dtype=torch.long)
        self.starts, self.lengths = starts.to(device), lengths.to(device)
        # utterances drawn in proportion to their length: every second equally likely
        self.weights = lengths.float().to(device)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def batch(self, size: int) -> Tensor:
        """[size, segment] float32 in [-1, 1]; short utterances are zero-padded at the end."""
        idx = torch.multinomial(self.weights, size, replacement=True, generator=self.gen)
        room = (self.lengths[idx] - self.segment).clamp(min=0)
        offset = (torch.rand(size, device=self.device, generator=self.gen) * (room + 1)).long()
        pos = self.starts[idx, None] + offset[:, None] + torch.arange(self.segment, device=self.device)[None]
        inside = pos < (self.starts[idx] + self.lengths[idx])[:, None]
        x = self.audio[pos.clamp(max=self.audio.numel() - 1)].float() / 32767.0 * inside
        # random level, so that references recorded louder or softer encode alike
        gain = 10 ** ((torch.rand(size, 1, device=self.device, generator=self.gen) * 2 - 1) * self.gain_db / 20)
        return (x * gain).clamp(-1, 1)


class UtteranceSampler:
    """Random whole utterances with their phone targets (for the codec's CTC loss): crops
    would cut phones whose place in the audio is unknown. Utterances up to `max_samples`,
    every batch zero-padded at the end to that one length (rounded up to whole frames).

    One length, not the batch's longest: the GPU trainer runs cuDNN with benchmark on,
    which times its kernels for every new input shape, and with a new length nearly every
    step the first GPU run with the phone head made 12 steps in 2 minutes (8.4 steps/s
    without it; H200, 2026-12-01). It costs little compute: the longest of 16 utterances
    up to 6 s is nearly always over 5 s."""

    def __init__(self, data: AudioSet, max_samples: int, hop: int, device: torch.device | str, seed: int = 0) -> None:
        self.items = [u for u in data.utterances if u.phones and u.samples <= max_samples]
        if not self.items:
            raise ValueError("no utterance has phone targets (phones.json) within the length limit")
        self.data, self.hop, self.device = data, hop, device
        self.length = -(-max_samples // hop) * hop  # every batch's length
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(audio [B, T], frames [B], targets [sum of lengths], target lengths [B])."""
        picked = [self.items[i] for i in self.rng.integers(0, len(self.items), size)]
        length = self.length
        x = np.zeros((size, length), np.float32)
        for j, u in enumerate(picked):
            x[j, : u.samples] = self.data.waveform(u)
        frames = torch.tensor([-(-u.samples // self.hop) for u in picked])
        targets = torch.tensor([i for u in picked for i in u.phones])
        lengths = torch.tensor([len(u.phones) for u in picked])
        return torch.from_numpy(x).to(self.device), frames, targets, lengths
