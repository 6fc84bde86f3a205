"""The docs hold together: every pointer into latency_bench/RESULTS.md names one of its
headings, the README stays short, and every frozen reference folder says what made it and
has the load file the gate reads."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from latency_bench.gate import levels

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "latency_bench" / "RESULTS.md"
README_MAX_CHARS = 15_000
SUFFIXES = (".py", ".sh", ".md", ".toml")
META_KEYS = ("card", "date", "commit", "command")

# A quoted section name: double quotes, or single quotes whose apostrophes inside a word
# ("worker's") are part of the name.
_DQ = r'"(?P<{0}>[^"]+)"'
_SQ = r"(?<!\w)'(?P<{0}>(?:[^'\n]|'(?=\w))+)'(?!\w)"
# `RESULTS.md, "Name"`, `RESULTS.md`, "Name"`, `RESULTS.md's "Name"`, `RESULTS.md, 'Name'`
_AFTER = re.compile(r"RESULTS\.md`?(?:,|'s)\s*(?:" + _DQ.format("a") + "|" + _SQ.format("b") + ")")
# `"Name" in latency_bench/RESULTS.md`, `'Name' in RESULTS.md`
_BEFORE = re.compile(r"(?:" + _DQ.format("a") + "|" + _SQ.format("b") + r")\s+in\s+`?(?:latency_bench/)?RESULTS\.md")
# a heading may go on past the name after one of these: its date and card, a second clause
_BREAKS = (" (", ", ", "; ", ": ")


def _files() -> list[Path]:
    found = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
        found += [Path(top) / n for n in sorted(names) if n.endswith(SUFFIXES)]
    return [f for f in found if f not in (RESULTS, Path(__file__).resolve())]  # this file's examples are no pointers


def _joined(text: str) -> str:
    """Lines joined with one space, comment markers at a line's start dropped, so a name
    that wraps inside a comment or docstring reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?", " ", text)


def pointers() -> list[tuple[str, str]]:
    """(file, quoted section name) for every pointer into RESULTS.md outside it."""
    found = []
    for path in _files():
        text = path.read_text(errors="replace")
        if "RESULTS.md" not in text:
            continue
        text = _joined(text)
        for pattern in (_AFTER, _BEFORE):
            for m in pattern.finditer(text):
                found.append((str(path.relative_to(ROOT)), m.group("a") or m.group("b")))
    return found


def headings() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,4} +(.+)$", RESULTS.read_text(), re.M)]


def names_heading(name: str, heads: list[str]) -> bool:
    return any(h == name or (h.startswith(name) and h[len(name):].startswith(_BREAKS)) for h in heads)


def test_the_pointer_patterns():
    heads = ["The capacity sweep past 64 streams, and the guard (2026-12-07, H100)", "Deleted arms (issue 48)"]
    assert names_heading("The capacity sweep past 64 streams", heads)
    assert names_heading("Deleted arms", heads)
    assert not names_heading("The capacity", heads)
    assert not names_heading("Deleted", heads)
    text = _joined(
        '# x (latency_bench/RESULTS.md, "The codec\n# worker\'s policy") y\n'
        "z ('The first replay' in latency_bench/RESULTS.md) and RESULTS.md's \"Deleted arms\"\n"
        "w `latency_bench/RESULTS.md`, 'A sampled draw'; the worker's ('Other' in RESULTS.md)"
    )
    got = [m.group("a") or m.group("b") for p in (_AFTER, _BEFORE) for m in p.finditer(text)]
    want = ["The codec worker's policy", "Deleted arms", "A sampled draw", "The first replay", "Other"]
    assert sorted(got) == sorted(want)


def test_every_results_pointer_names_a_heading():
    found, heads = pointers(), headings()
    assert len(found) >= 20, found  # the patterns still find the tree's pointers
    missing = [f"{path}: {name!r}" for path, name in found if not names_heading(name, heads)]
    assert not missing, "pointers into latency_bench/RESULTS.md with no such heading:\n" + "\n".join(missing)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text())
    assert n <= README_MAX_CHARS, f"README.md is {n:,} characters (at most {README_MAX_CHARS:,})"


def test_every_reference_folder_says_what_made_it():
    folders = sorted(p for p in (ROOT / "latency_bench" / "reference").iterdir() if p.is_dir())
    assert folders
    for folder in folders:
        meta = json.loads((folder / "meta.json").read_text())
        absent = [k for k in META_KEYS if not meta.get(k)]
        assert not absent, f"{folder.name}/meta.json lacks {absent}"
        load = json.loads((folder / "load.json").read_text())
        by_level = levels(load, "engine")
        assert 1 in by_level, f"{folder.name}/load.json has no c=1 level for the gate"
        for c, figures in by_level.items():
            assert figures["fps"] and figures["ttfa"], f"{folder.name}/load.json c={c}: {figures}"
