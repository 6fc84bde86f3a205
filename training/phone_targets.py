"""Phone targets for the codec's semantic codebook (a CTC loss in codec training).

Why: the first full run (2026-12-01) trained the codec on reconstruction alone. Its
"semantic" codebook then carries acoustics, not content: on held-out sentences the DualAR
model predicted it no better than a bigram of the codes (teacher-forced accuracy 0.08 vs
0.055), with its attention on the right text (guided-attention loss 0.056), and it spoke
fluent babble (WER 0.98). The released Fish codecs distil a speech model into that
codebook; this project has the teacher's phonemes instead, so a small CTC head reads the
phone sequence off the quantized semantic latent, which makes that codebook phonetic and
predictable from text. No alignment is needed (CTC), and the head is not exported.

The targets are the Piper phoneme ids of each utterance (made by training.corpus with
espeak-ng) without what has no sound of its own: Piper's pad / begin / end ids, word
spaces, punctuation, stress and length marks. Blank is id 0 (Piper's pad, never a target).

    python -m training.phone_targets --text .carry/voice/text.jsonl --audio .carry/voice/audio

writes `phones.json` ({utterance id: [ids]}) into the audio folder (make_data.sh runs it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.datagen import read_manifest

BLANK = 0
NUM_CLASSES = 256  # Piper's ids are < 256 (the joe voice's map has 151 symbols)
SILENT_SYMBOLS = "_^$ !'(),-.:;?" + "\u02c8\u02cc\u02d0"  # pad, bos, eos, space, punctuation, ˈ ˌ ː
FILE = "phones.json"


def silent_ids(id_map: dict[str, list[int]]) -> set[int]:
    return {i for s in SILENT_SYMBOLS if s in id_map for i in id_map[s]}


def phone_sequence(ids: list[int], silent: set[int]) -> list[int]:
    out = [i for i in ids if i not in silent]
    if any(not 0 < i < NUM_CLASSES for i in out):
        raise ValueError(f"phoneme ids outside 1..{NUM_CLASSES - 1}: {out}")
    return out


def write_targets(text_path: Path, audio_folder: Path, id_map: dict[str, list[int]]) -> int:
    """phones.json for every utterance of the audio folder's manifest; returns the count."""
    silent = silent_ids(id_map)
    by_text = {}
    for line in text_path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            by_text[item["id"]] = item["ids"]
    rows = read_manifest(audio_folder)
    missing = [r["id"] for r in rows if r["id"] not in by_text]
    if missing:
        raise ValueError(f"{len(missing)} utterances of {audio_folder} have no phonemes in {text_path}: {missing[:3]}")
    phones = {r["id"]: phone_sequence(by_text[r["id"]], silent) for r in rows}
    (audio_folder / FILE).write_text(json.dumps(phones, separators=(",", ":")))
    return len(phones)


def read_targets(audio_folder: Path) -> dict[str, list[int]] | None:
    path = audio_folder / FILE
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, required=True, help="text.jsonl with phoneme ids (training.corpus)")
    p.add_argument("--audio", type=Path, required=True, help="teacher data folder (manifest.jsonl)")
    args = p.parse_args(argv)
    from training.teacher import default_voice_files

    id_map = json.loads(default_voice_files()[1].read_text())["phoneme_id_map"]
    n = write_targets(args.text, args.audio, id_map)
    print(f"{args.audio / FILE}: phone targets of {n} utterances")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
