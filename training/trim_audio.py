"""`python -m training.trim_audio --audio A --to B --max-mb 48`: a smaller copy of a
teacher-data folder (training/recipe/make_data.sh's `audio/`), for a GPU call that must
carry something beside it in its 64 MiB upload: a resumed codec run carries its state.

Whole shards are kept in order, as many as fit the budget with the metadata: the first
shards hold the held-out sentences (datagen writes them first), so the held-out set stays
whole and the training hours shrink. manifest.jsonl and phones.json keep the utterances
of the kept shards; speakers.json is copied; stats.json says what was dropped. Shards are
hard links where the file system allows (no second copy on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from training.datagen import MANIFEST, audio_seconds, read_manifest


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def trim(audio: Path, to: Path, max_bytes: int) -> dict:
    rows = read_manifest(audio)
    phones_path = audio / "phones.json"
    phones = json.loads(phones_path.read_text()) if phones_path.exists() else None
    shards = sorted({r["shard"] for r in rows})
    # metadata first (an upper bound: the full files), then whole shards while they fit
    budget = max_bytes - sum((audio / n).stat().st_size for n in (MANIFEST, "phones.json", "speakers.json")
                             if (audio / n).exists())
    kept, used = [], 0
    for shard in shards:
        size = (audio / shard).stat().st_size
        if used + size > budget:
            break
        kept.append(shard)
        used += size
    if not kept:
        raise ValueError(f"{audio}: not even the first shard fits in {max_bytes} bytes")
    keep = set(kept)
    rows_kept = [r for r in rows if r["shard"] in keep]
    (to / "shards").mkdir(parents=True, exist_ok=True)
    for shard in kept:
        _link_or_copy(audio / shard, to / shard)
    (to / MANIFEST).write_text("".join(json.dumps(r) + "\n" for r in rows_kept))
    if phones is not None:
        ids = {r["id"] for r in rows_kept}
        (to / "phones.json").write_text(json.dumps({k: v for k, v in phones.items() if k in ids}))
    if (audio / "speakers.json").exists():
        shutil.copy2(audio / "speakers.json", to / "speakers.json")
    seconds, train = audio_seconds(rows_kept)
    stats = {"utterances": len(rows_kept), "hours": seconds / 3600, "train_hours": train / 3600,
             "held_out_utterances": sum(r["split"] != "train" for r in rows_kept),
             "trimmed": f"{len(shards) - len(kept)} of {len(shards)} shards of {audio} dropped "
                        f"({len(rows) - len(rows_kept)} utterances) to fit {max_bytes / 2**20:.1f} MiB"}
    (to / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.trim_audio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--audio", type=Path, required=True, help="a teacher-data folder (manifest.jsonl, shards/)")
    p.add_argument("--to", type=Path, required=True, help="the new, smaller folder")
    p.add_argument("--max-mb", type=float, required=True, help="its size limit in MiB")
    args = p.parse_args(argv)
    if args.to.exists() and any(args.to.iterdir()):
        print(f"{args.to} exists and is not empty", file=sys.stderr)
        return 2
    print(json.dumps(trim(args.audio, args.to, int(args.max_mb * 2**20))), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
