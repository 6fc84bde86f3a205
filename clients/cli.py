"""`python -m clients speak`: speak text through a live session, write the audio.

    python -m clients speak --text "Hello there." --format wav --out hello.wav
    llm ... | python -m clients speak --stdin --tokens --out - | ffplay -f s16le -ar 44100 -ch_layout mono -
    python -m clients speak --text "Hi." --reference me.wav --reference-text "what I say in me.wav" --out hi.mp3 --format mp3

With --stdin each line is sent as soon as it is read (like an LLM emitting tokens) and the
turn is flushed at the end of input. --timestamps uses /v1/tts/live/with-timestamp and prints
each word's start and end (seconds into the audio) to stderr. Audio is written as it arrives; timings go to stderr,
never to stdout. Exit status: 0 done, 1 an error (one line on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable
from typing import BinaryIO

from clients.client import DEFAULT_URL, TurnTiming, VoiceSession, connect
from clients.errors import VoiceServiceError

TOKEN_DELAY_S = 0.03  # between word pieces with --tokens: ~30 tokens/s, a fast LLM
_PIECE = re.compile(r"\s*\S{1,4}|\s+")  # " Hello" -> " Hell", "o": sub-word pieces


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m clients", description="Client of the realtime TTS service")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speak", help="speak text, write the audio", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to speak")
    src.add_argument("--stdin", action="store_true", help="read text from stdin, sending each line as it arrives")
    s.add_argument("--tokens", action="store_true", help="send the text as small word pieces with a delay (LLM-like)")
    s.add_argument("--token-delay", type=float, default=TOKEN_DELAY_S, help="seconds between pieces with --tokens")
    s.add_argument("--out", required=True, help="output file, or - for raw bytes on stdout")
    s.add_argument("--url", default=DEFAULT_URL)
    s.add_argument("--format", default="pcm", choices=("pcm", "wav", "opus", "mp3"))
    s.add_argument("--sample-rate", type=int, help="output rate (default: the format's default)")
    s.add_argument("--voice", help="reference_id of a voice stored on the server")
    s.add_argument("--reference", action="append", default=[], help="reference audio file (repeatable)")
    s.add_argument("--reference-text", action="append", default=[], help="transcript of each --reference")
    s.add_argument("--api-key", default=os.environ.get("REALTIME_API_KEY"), help="default: $REALTIME_API_KEY")
    s.add_argument("--latency", choices=("normal", "balanced", "low"))
    s.add_argument("--chunk-length", type=int)
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-p", type=float)
    s.add_argument("--max-new-tokens", type=int, help="frames per segment at most")
    s.add_argument("--seed", type=int)
    s.add_argument("--ignore-end", action="store_true",
                   help="never end a segment early: always --max-new-tokens frames (random-weight models)")
    s.add_argument("--open-timeout", type=float, default=60.0, help="seconds for the handshake and voice prefill")
    s.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the next server event")
    s.add_argument("--quiet", action="store_true", help="no timings on stderr")
    s.add_argument("--timestamps", action="store_true", help="print each word's start and end (s) to stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.reference) != len(args.reference_text):
        parser.error("give one --reference-text per --reference")
    if args.voice and args.reference:
        parser.error("give either --voice or --reference, not both")
    try:
        return asyncio.run(speak(args))
    except VoiceServiceError as e:
        return _fail(f"{e.message} [{e.code}]")
    except BrokenPipeError:  # the reader of stdout went away (`| head -c ...`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return _fail("the output pipe was closed")
    except OSError as e:  # the output or a reference file
        return _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
    except KeyboardInterrupt:
        return 130


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


async def speak(args: argparse.Namespace) -> int:
    references = [(_read(path), text) for path, text in zip(args.reference, args.reference_text)]
    out = Output(args.out, args.format)
    ok = False
    try:
        async with connect(
            args.url, api_key=args.api_key, open_timeout=args.open_timeout, read_timeout=args.timeout,
            format=args.format, sample_rate=args.sample_rate, reference_id=args.voice,
            references=references or None, latency=args.latency, chunk_length=args.chunk_length,
            temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
            ignore_end=args.ignore_end or None, timestamps=args.timestamps,
        ) as session:
            if not args.quiet:
                _report_ready(session)
            started = time.perf_counter()
            speech = session.speak(_text_source(args))
            async for chunk in speech:
                out.write(chunk.data)
            await session.stop()  # the encoder's tail (mp3, opus) comes with `finish`
            async for chunk in session.audio():
                out.write(chunk.data)
            if not args.quiet:
                _report_turn(speech.result.timing, out, time.perf_counter() - started)
            if args.timestamps and speech.result.turn is not None:
                for w in session.words(speech.result.turn):  # the final snapshots came before `finish`
                    _info(f"{w.start:8.3f} {w.end:8.3f}  {w.text}")
        ok = True
    finally:
        out.close(keep=ok or out.bytes > 0)
    return 0


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --- text sources ---------------------------------------------------------------------------

def _text_source(args: argparse.Namespace) -> AsyncIterator[str] | str:
    lines = _stdin_lines() if args.stdin else _once(args.text)
    return _tokens(lines, args.token_delay) if args.tokens else lines


async def _once(text: str) -> AsyncIterator[str]:
    yield text


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines of stdin as they are typed or piped; a thread reads, so the loop never blocks."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def pump() -> None:
        try:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)
        except RuntimeError:  # the loop closed first (an error ended the session)
            pass

    threading.Thread(target=pump, name="stdin", daemon=True).start()
    while (line := await lines.get()) is not None:
        yield line


async def _tokens(lines: AsyncIterator[str], delay: float) -> AsyncIterator[str]:
    async for line in lines:
        for piece in _pieces(line):
            yield piece
            await asyncio.sleep(delay)


def _pieces(line: str) -> Iterable[str]:
    return _PIECE.findall(line)


# --- output ---------------------------------------------------------------------------------

class Output:
    """Audio bytes to a file or stdout, written as they arrive. A WAV file gets its RIFF and
    data sizes filled in at the end (the stream carries 0xFFFFFFFF, the streaming convention)."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.format = path, fmt
        self.bytes = 0
        self._f: BinaryIO = sys.stdout.buffer if path == "-" else open(path, "wb")

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self._f.flush()  # a player reading the pipe hears it now
        self.bytes += len(data)

    def close(self, keep: bool = True) -> None:
        """keep=False: remove the file (nothing was written, an error ended the session)."""
        if self.path == "-":
            return
        if self.format == "wav":
            _finalize_wav(self._f, self.bytes)
        self._f.close()
        if not keep:
            os.unlink(self.path)

    def describe(self) -> str:
        return "stdout" if self.path == "-" else self.path


def _finalize_wav(f: BinaryIO, size: int) -> None:
    """Fill in the sizes of a streamed 44-byte-header PCM WAV (the service's layout)."""
    if size < 44:
        return
    f.seek(4)
    f.write(struct.pack("<I", size - 8))
    f.seek(40)
    f.write(struct.pack("<I", size - 44))
    f.seek(0, os.SEEK_END)


# --- reporting (stderr) ---------------------------------------------------------------------

def _report_ready(session: VoiceSession) -> None:
    r = session.ready
    cached = "yes" if r.voice_cached else "no"
    _info(f"open-to-ready {r.open_to_ready_ms:.0f} ms (voice prefill {r.prefill_ms:.0f} ms, cached: {cached}), "
          f"{r.format} at {r.sample_rate} Hz")


def _report_turn(timing: TurnTiming | None, out: Output, wall_s: float) -> None:
    if timing is None:
        _info("nothing to speak: the text was empty")
        return
    if timing.ttfa_ms is not None:
        _info(f"TTFA {timing.ttfa_ms:.0f} ms (flush -> first audio)")
    elif timing.first_audio_ms is not None:
        _info(f"first audio {timing.first_audio_ms:.0f} ms after the first text (before the flush)")
    _info(f"{out.bytes} bytes of audio to {out.describe()} in {wall_s:.2f} s")


def _info(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
