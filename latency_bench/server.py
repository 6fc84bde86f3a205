"""`python -m latency_bench.server`: the service with the benchmark-only baselines.

Takes every `python -m realtime` option plus the flags below, which set
engine.settings.BenchSettings; they are baselines to compare against, never for serving.
"""

from __future__ import annotations

import argparse
import sys

from engine.settings import BenchSettings
from realtime.__main__ import serve
from realtime.config import parse_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.server", add_help=False)
    p.add_argument("--naive", action="store_true",
                   help="one utterance at a time, a host sync after every step, no CUDA graphs")
    p.add_argument("--ignore-end", action="store_true", help="every segment is max_new_tokens frames (random weights)")
    p.add_argument("--no-gemv", dest="gemv", action="store_false", help="single-stream steps on cuBLAS")
    p.add_argument("--no-pdl", dest="pdl", action="store_false", help="no programmatic dependent launch")
    p.add_argument("--no-prefill-second-frame", dest="prefill_second_frame", action="store_false",
                   help="a segment's second frame comes from the decode batch")
    p.add_argument("--no-alignment", dest="alignment", action="store_false",
                   help="no word-timestamp readout in the decode step (its cost's A/B)")
    bench, rest = p.parse_known_args(argv)
    return serve(parse_args(rest, bench=BenchSettings(**vars(bench))))


if __name__ == "__main__":
    sys.exit(main())
