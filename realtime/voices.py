"""Stored voices, kept on disk so they survive a restart.

    <voices_dir>/<id>/voice.json   {"id", "name", "created", "references": [{"text", "frames"}]}
    <voices_dir>/<id>/ref<i>.npy   the codec codes of reference i, int16 [C, frames]

A voice is encoded once, when it is created; connections naming it (`reference_id`) get
its codes without touching the reference audio again. A voice is written into a hidden
folder and renamed into place, so it appears whole or not at all; a store that cannot be
written (disk full, read-only) refuses the voice and keeps nothing of it. At start-up, a
stored voice that cannot be read is logged and skipped: the others still load.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.voice import ReferenceInput, VoiceInput

VOICE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# unknown reference_ids remembered for warning once each: clients choose them, so the
# set is bounded (past it, it starts over and an id may be warned about again)
MAX_UNKNOWN_IDS = 10_000

log = logging.getLogger("realtime.voices")

log = logging.getLogger("realtime.voices")


class VoiceStoreFull(Exception):
    """The store holds its most voices (ServiceConfig.max_voices)."""


class VoiceStoreError(ValueError):
    pass


class VoiceStoreUnwritable(Exception):
    """The voices folder could not be written (errno: ENOSPC for a full disk, EROFS, EACCES...)."""

    def __init__(self, action: str, e: OSError) -> None:
        super().__init__(f"the voice store could not {action} ({e.strerror or e})")
        self.errno = e.errno


@dataclass(slots=True)
class StoredVoice:
    id: str
    name: str
    created: float
    references: list[tuple[str, torch.Tensor]]  # (transcript, codes [C, frames])

    def as_input(self) -> VoiceInput:
        return VoiceInput(tuple(ReferenceInput(text, codes=codes) for text, codes in self.references))

    def summary(self) -> dict:
        return {
            "id": self.id, "name": self.name, "created": self.created,
            "references": [{"text": t, "frames": int(c.shape[1])} for t, c in self.references],
        }


class VoiceStore:
    def __init__(self, root: Path, num_codebooks: int, max_voices: int = 1000) -> None:
        self.max_voices = max_voices
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.num_codebooks = num_codebooks
        self._lock = threading.Lock()
        self._voices: dict[str, StoredVoice] = {}
        self._unknown: set[str] = set()  # reference_ids warned about (warn_unknown)
        for folder in sorted(self.root.iterdir()):
            # hidden: one being written or deleted when the process stopped
            if folder.name.startswith(".") or not (folder / "voice.json").exists():
                continue
            try:
                voice = self._read(folder)
            except (OSError, ValueError, KeyError, TypeError) as e:  # one bad voice must not stop the service
                log.error("stored voice %s is unreadable and skipped: %s: %s", folder, type(e).__name__, e)
                continue
            self._voices[voice.id] = voice

    def _read(self, folder: Path) -> StoredVoice:
        meta = json.loads((folder / "voice.json").read_text())
        refs = [
            (r["text"], torch.from_numpy(np.load(folder / f"ref{i}.npy").astype(np.int64)))
            for i, r in enumerate(meta["references"])
        ]
        if meta["id"] != folder.name or not refs:
            raise ValueError(f"voice.json names id {meta['id']!r} and {len(refs)} references")
        for _, codes in refs:
            if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
                raise ValueError(f"codes of shape {tuple(codes.shape)}, not [{self.num_codebooks}, frames]")
        return StoredVoice(meta["id"], meta["name"], meta["created"], refs)

    def list(self) -> list[dict]:
        with self._lock:
            return [v.summary() for v in self._voices.values()]

    def get(self, voice_id: str) -> StoredVoice | None:
        with self._lock:
            return self._voices.get(voice_id)

    def warn_unknown(self, voice_id: str) -> None:
        """--unknown-voice default: say once per id that it is spoken with the default voice."""
        with self._lock:
            if voice_id in self._unknown:
                return
            if len(self._unknown) >= MAX_UNKNOWN_IDS:
                self._unknown.clear()
            self._unknown.add(voice_id)
        log.warning("reference_id %r is not a stored voice: speaking with the default voice (--unknown-voice default)",
                    voice_id)

    def add(self, name: str, references: list[tuple[str, torch.Tensor]], voice_id: str | None = None) -> StoredVoice:
        voice_id = voice_id or uuid.uuid4().hex
        if not VOICE_ID.match(voice_id):
            raise VoiceStoreError("voice id must be 1-64 letters, digits, '-' or '_'")
        for _, codes in references:
            if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
                raise VoiceStoreError("reference codes do not match the model's codebooks")
        voice = StoredVoice(voice_id, name, time.time(), references)
        with self._lock:
            if voice_id in self._voices:
                raise VoiceStoreError(f"voice {voice_id!r} already exists")
            if len(self._voices) >= self.max_voices:
                raise VoiceStoreFull(f"the voice store is full ({self.max_voices} voices, --limit voices=N): delete one first")
            self._write(voice)
            self._voices[voice_id] = voice
        return voice

    def _write(self, voice: StoredVoice) -> None:
        tmp = self.root / f".{voice.id}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            for i, (_, codes) in enumerate(voice.references):
                np.save(tmp / f"ref{i}.npy", codes.numpy().astype(np.int16))
            (tmp / "voice.json").write_text(json.dumps(voice.summary(), ensure_ascii=False, indent=1))
            tmp.rename(self.root / voice.id)  # appears whole or not at all
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)  # what was written of it (if the store lets us)
            log.error("storing voice %s in %s failed: %s", voice.id, self.root, e)
            raise VoiceStoreUnwritable("store the voice", e) from e

    def delete(self, voice_id: str) -> bool:
        with self._lock:
            if voice_id not in self._voices:
                return False
            gone = self.root / f".{voice_id}.deleted"
            shutil.rmtree(gone, ignore_errors=True)  # left by a delete the process did not finish
            try:  # renamed out of sight first: a failed delete leaves the voice whole, not half removed
                (self.root / voice_id).rename(gone)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.error("deleting voice %s in %s failed: %s", voice_id, self.root, e)
                raise VoiceStoreUnwritable("delete the voice", e) from e
            del self._voices[voice_id]
            shutil.rmtree(gone, ignore_errors=True)
            return True
