"""The voice's benchmark: training.evaluate (teacher, codec round trip, engine path,
cloning, CPU speed) plus the full service path: the model served by `python -m realtime`'s
app in this process, one WebSocket connection, each held-out plain sentence sent as text +
flush and the streamed PCM scored with pocketsphinx; TTFA and real-time factor of that path.

    python training/recipe/evaluate.py --model runs/voice --data .carry/voice/audio --out runs/voice/eval.json

Run it on the 2-core CPU machine: the CPU gates (real-time factor, TTFA) are defined there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from training import evaluate as ev  # noqa: E402
from training.presets import SAMPLE_RATE  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(model: str, voices_dir: Path):
    """The service app on a free localhost port in a background thread; returns (url, server)."""
    import uvicorn

    from engine.bundle import load_bundle
    from engine.engine import Engine
    from realtime.app import build_app
    from realtime.config import ServiceConfig

    port = _free_port()
    config = ServiceConfig(port=port, model=model, device="cpu", voices_dir=voices_dir, demo_page=False)
    app = build_app(config, Engine(load_bundle(model, "cpu"), config.engine))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                                           ws="websockets-sansio", log_level="warning", lifespan="on"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.05)
    return f"ws://127.0.0.1:{port}/v1/tts/live", server


async def service_path(url: str, items: list[ev.Item], asr: ev.Recognizer) -> dict:
    from clients import connect

    wer, ttfa, spent, produced = ev.WER(), [], 0.0, 0.0
    async with await connect(url, format="pcm", sample_rate=ev.ASR_RATE, latency="balanced", seed=0) as session:
        for it in items:
            t0 = time.perf_counter()
            result = await session.speak(it.text)
            spent += time.perf_counter() - t0
            pcm = np.frombuffer(result.audio, dtype="<i2").astype(np.float32) / 32768.0
            produced += pcm.size / ev.ASR_RATE
            wer.add(it.text, asr.transcribe(pcm, ev.ASR_RATE))
            if result.ttfa_ms is not None:
                ttfa.append(result.ttfa_ms)
    return {**wer.report(), "ttfa_ms_median": float(np.median(ttfa)) if ttfa else None,
            "ttfa_ms_p90": float(np.percentile(ttfa, 90)) if ttfa else None,
            "rtf": round(spent / max(produced, 1e-9), 4), "sentences": len(items)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder, or 'default'")
    p.add_argument("--data", type=Path, action="append", required=True, help="teacher data folder (held-out audio)")
    p.add_argument("--sentences", type=int, default=40, help="sentences per split for the engine path")
    p.add_argument("--service-sentences", type=int, default=40, help="plain sentences through the service")
    p.add_argument("--clone-trials", type=int, default=60)
    p.add_argument("--clone-min-reference-seconds", type=float, default=0.0, metavar="S",
                   help="cloning references of 1-2 utterances totalling S seconds or more (0: one utterance)")
    p.add_argument("--limit", type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--service-only", action="store_true",
                   help="only the service path (a few minutes: e.g. after a change to the service)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    report = {} if args.service_only else ev.evaluate(args.data, args.model, None, args.limit, args.sentences,
                                                       args.clone_trials, args.threads,
                                                       args.clone_min_reference_seconds)
    held = ev.HeldOut.load(args.data, SAMPLE_RATE, args.limit)
    with tempfile.TemporaryDirectory() as voices:
        url, server = start_service(args.model, Path(voices))
        try:
            report["service"] = asyncio.run(service_path(url, held.split("plain")[: args.service_sentences],
                                                         ev.Recognizer()))
        finally:
            server.should_exit = True
    text = json.dumps(report, indent=1, default=float)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    gates = summary(report)
    print(json.dumps(gates, indent=1), file=sys.stderr)
    return 0


def summary(report: dict) -> dict:
    """The issue's gates, with the measured figure next to each target."""
    m = report.get("model", {})
    return {
        "teacher WER (plain)": report.get("teacher", {}).get("plain", {}).get("wer"),
        "codec round trip WER (plain) <= 0.20": report.get("codec_round_trip", {}).get("plain", {}).get("wer"),
        "service path WER (plain) <= 0.30": report.get("service", {}).get("wer"),
        "cloning similarity >= 0.90": m.get("cloning", {}).get("similarity_accuracy"),
        "teacher's own speaker separability (ceiling)": report.get("speaker_space"),
        "CPU RTF <= 0.5 (service)": report.get("service", {}).get("rtf"),
        "CPU TTFA ms <= 250 (service, median)": report.get("service", {}).get("ttfa_ms_median"),
    }


if __name__ == "__main__":
    raise SystemExit(main())
