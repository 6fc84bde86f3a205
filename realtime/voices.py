"""Stored voices, kept on disk so they survive a restart.

    <voices_dir>/<id>/voice.json   {"id", "name", "created", "references": [{"text", "frames"}]}
    <voices_dir>/<id>/ref<i>.npy   the codec codes of reference i, int16 [C, frames]

A voice is encoded once, when it is created; connections naming it (`reference_id`) get
its codes without touching the reference audio again. A voice is written into a hidden
folder and renamed into place, so it appears whole or not at all; a store that cannot be
written (disk full, read-only) refuses the voice and keeps nothing of it. A stored voice
that cannot be read is logged and skipped: the others still load. Several replicas may
share the folder (VoiceStore).
"""

from __future__ import annotations

import errno
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
    """The folder is the truth, so replicas sharing it (a ReadWriteMany volume, a host
    folder: deploy/README.md) see each other's voices: a voice is cached in memory with
    its voice.json's (inode, mtime), and every get and list checks that against the folder
    (one stat per voice), reading a voice another process stored and forgetting one it
    deleted."""

    def __init__(self, root: Path, num_codebooks: int, max_voices: int = 1000) -> None:
        self.max_voices = max_voices
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.num_codebooks = num_codebooks
        self._lock = threading.Lock()
        self._voices: dict[str, tuple[tuple[int, int], StoredVoice]] = {}  # id -> (stamp, voice)
        self._bad: dict[str, tuple[int, int]] = {}  # unreadable voices (logged once per stamp)
        self._unknown: set[str] = set()  # reference_ids warned about (warn_unknown)
        with self._lock:
            self._scan()

    def _scan(self) -> list[StoredVoice]:
        """Every readable stored voice in the folder, the cache brought up to date."""
        names = sorted(f.name for f in self.root.iterdir() if not f.name.startswith("."))  # hidden: being written or deleted
        voices = [v for v in (self._load(name) for name in names) if v is not None]
        for gone in set(self._voices) - set(names):
            del self._voices[gone]
        return voices

    def _load(self, voice_id: str) -> StoredVoice | None:
        """The voice in the folder now (cached while its voice.json is unchanged); None if
        there is none or it is unreadable. Called under the lock."""
        folder = self.root / voice_id
        try:
            st = (folder / "voice.json").stat()
        except OSError:  # none (deleted, perhaps by another replica), or not a voice folder
            self._voices.pop(voice_id, None)
            return None
        stamp = (st.st_ino, st.st_mtime_ns)
        cached = self._voices.get(voice_id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        if self._bad.get(voice_id) == stamp:
            return None
        try:
            voice = self._read(folder)
        except (OSError, ValueError, KeyError, TypeError) as e:  # one bad voice must not stop the service
            self._voices.pop(voice_id, None)
            if not (folder / "voice.json").exists():  # deleted (by another replica) while being read
                return None
            log.error("stored voice %s is unreadable and skipped: %s: %s", folder, type(e).__name__, e)
            self._bad[voice_id] = stamp
            return None
        self._voices[voice_id] = (stamp, voice)
        return voice

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
            return [v.summary() for v in self._scan()]

    def get(self, voice_id: str) -> StoredVoice | None:
        if not VOICE_ID.match(voice_id):  # a client's reference_id: never a path
            return None
        with self._lock:
            return self._load(voice_id)

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
            if (self.root / voice_id).exists():
                raise VoiceStoreError(f"voice {voice_id!r} already exists")
            if len(self._scan()) >= self.max_voices:
                raise VoiceStoreFull(f"the voice store is full ({self.max_voices} voices, --limit voices=N): delete one first")
            self._write(voice)
            self._load(voice_id)
        return voice

    def _write(self, voice: StoredVoice) -> None:
        tmp = self.root / f".{voice.id}.{uuid.uuid4().hex[:8]}.tmp"  # one per writer: replicas share the folder
        try:
            tmp.mkdir()
            for i, (_, codes) in enumerate(voice.references):
                np.save(tmp / f"ref{i}.npy", codes.numpy().astype(np.int16))
            (tmp / "voice.json").write_text(json.dumps(voice.summary(), ensure_ascii=False, indent=1))
            tmp.rename(self.root / voice.id)  # appears whole or not at all
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another replica stored this id first
                shutil.rmtree(tmp, ignore_errors=True)
                raise VoiceStoreError(f"voice {voice.id!r} already exists") from None
            shutil.rmtree(tmp, ignore_errors=True)  # what was written of it (if the store lets us)
            log.error("storing voice %s in %s failed: %s", voice.id, self.root, e)
            raise VoiceStoreUnwritable("store the voice", e) from e

    def delete(self, voice_id: str) -> bool:
        """False when there is no such voice (another replica may just have deleted it)."""
        if not VOICE_ID.match(voice_id):
            return False
        with self._lock:
            self._voices.pop(voice_id, None)
            if not (self.root / voice_id / "voice.json").exists():
                return False
            gone = self.root / f".{voice_id}.{uuid.uuid4().hex[:8]}.deleted"
            try:  # renamed out of sight first: a failed delete leaves the voice whole, not half removed
                (self.root / voice_id).rename(gone)
            except FileNotFoundError:
                return False
            except OSError as e:
                log.error("deleting voice %s in %s failed: %s", voice_id, self.root, e)
                raise VoiceStoreUnwritable("delete the voice", e) from e
            shutil.rmtree(gone, ignore_errors=True)
            return True
