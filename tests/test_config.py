"""The service's command line: settings a user tunes (at most 29 options: the 24 of issue 48,
the KV pool's two, --unknown-voice and --drain-timeout of issue 50), the client
limits through --limit NAME=VALUE, and the benchmark baselines only through
`python -m latency_bench.server`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.settings import BenchSettings
from realtime.config import build_parser, parse_args


def test_help_lists_at_most_29_options_and_no_benchmark_arm():
    result = subprocess.run([sys.executable, "-m", "realtime", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    options = [a for a in build_parser()._actions if a.option_strings]
    assert len(options) <= 29
    for arm in ("--naive", "--ignore-end", "--no-gemv", "--no-pdl", "--codec-silent", "--prefix-cascade",
                "--codec-cut-in", "--max-text-chars"):
        assert arm not in result.stdout


def test_limits_are_set_by_name():
    config = parse_args(["--limit", "text-chars=500", "--limit", "message-mb=0.5", "--limit", "voices=3",
                         "--limit", "reference-seconds=12.5"])
    assert config.limits.max_text_chars == 500 and config.limits.max_message_bytes == 2**19
    assert config.max_voices == 3 and config.limits.max_reference_seconds == 12.5
    assert config.engine.max_reference_seconds == 12.5  # the engine refuses longer references too
    assert parse_args([]).limits.max_new_tokens == 2048


@pytest.mark.parametrize("bad", ["text-chars", "colour=3", "text-chars=many", "references=-1"])
def test_a_bad_limit_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--limit", bad])
    assert "--limit" in capsys.readouterr().err


def test_debug_switches():
    config = parse_args(["--debug", "timing", "--debug", "stalls"])
    assert config.engine.log_timing and config.debug_stalls
    assert not parse_args([]).engine.log_timing


def test_benchmark_baselines_come_only_through_the_benchmark_server(monkeypatch):
    with pytest.raises(SystemExit):
        parse_args(["--naive"])
    assert parse_args([]).engine.bench == BenchSettings()
    import latency_bench.server as server

    seen = []
    monkeypatch.setattr(server, "serve", seen.append)
    server.main(["--naive", "--ignore-end", "--no-gemv", "--port", "9001", "--max-running", "4"])
    (config,) = seen
    assert config.port == 9001 and config.engine.max_running == 4
    assert config.engine.bench == BenchSettings(naive=True, ignore_end=True, gemv=False)
    seen.clear()
    server.main(["--no-pdl", "--no-prefill-second-frame"])
    assert seen[0].engine.bench == BenchSettings(pdl=False, prefill_second_frame=False)
    # shared voice-prompt pages are how the paged KV cache works, not a baseline any more
    with pytest.raises(SystemExit):
        server.main(["--no-shared-prefix-reads"])
