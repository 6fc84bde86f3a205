"""The browser demo's captions (issue 51) in a real Chromium against a real server with the
default voice: the word being heard is highlighted, driven by the alignment of
/v1/tts/live/with-timestamp and the page's AudioContext clock.

Needs Chromium and the playwright package, as tests/test_browser_demo.py (whose fixtures
this module shares).
"""

from __future__ import annotations

import re

import pytest

sync_api = pytest.importorskip("playwright.sync_api")

from tests.server import running_server  # noqa: E402
from tests.test_browser_demo import browser, page, stats  # noqa: E402,F401  (fixtures)

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("captions"), model="default") as srv:
        yield srv


def words_of(text: str) -> list[str]:
    return [w for w in (re.sub(r"^\W+|\W+$", "", p) for p in text.split()) if w]


def speak_all(pg, text: str) -> None:
    pg.select_option("#format", "pcm")
    pg.select_option("#sample-rate", "48000")
    # playback starts 1.5 s after the first audio: the words of a segment may come as late
    # as its end (the engine's side of the contract), and every word should be seen here
    pg.fill("#lead-ms", "1500")
    pg.click("#connect")
    pg.wait_for_function("demoStats.state === 'ready'")
    pg.click("summary:has-text('Paste a longer text')")
    pg.fill("#paste", text)
    pg.click("#speak-all")


def test_the_word_being_heard_is_highlighted(page):
    speak_all(page, TEXT)
    page.wait_for_function("demoStats.highlighted !== null", timeout=60_000)
    # what the user sees: the highlighted span is the word stats name
    now = page.evaluate("[demoStats.highlighted, document.querySelector('#caption span.now')?.textContent]")
    assert now[0] is not None and now[0] == now[1] or now[1] is None  # (it may move on between the two reads)
    page.wait_for_function("demoStats.turnEnds.length >= 1", timeout=60_000)
    # the turn plays to its end (real time): then nothing is highlighted
    page.wait_for_function("demoStats.bufferedMs === 0 && demoStats.highlights.length > 0", timeout=60_000)
    assert stats(page)["highlighted"] is None
    s = stats(page)
    assert s["timestamps"] is True and s["alignments"] > 0 and s["errors"] == []
    words = s["words"]
    assert [w["text"] for w in words] == words_of(TEXT)
    seen = [h["i"] for h in s["highlights"]]
    assert seen == sorted(set(seen))  # in order, each once
    assert len(seen) >= 0.8 * len(words), (s["highlights"], words)  # nearly all (a 20 ms clock may skip a short one)
    for h in s["highlights"]:
        w = words[h["i"]]
        # the playback clock: when it was highlighted, the audio at the word's time was playing
        assert w["start"] - 1e-6 <= h["at"] < w["end"]
        assert abs((h["ctx"] - s["firstPlayCtx"]) - h["at"]) < 0.1  # one turn, no underrun
    assert page.problems == [] and page.foreign == []


def test_plain_path_still_plays_without_captions(page):
    page.uncheck("#timestamps")
    speak_all(page, "Just the audio.")
    page.wait_for_function("demoStats.turnEnds.length >= 1 && demoStats.scheduledSamples > 0", timeout=60_000)
    s = stats(page)
    assert s["timestamps"] is False and s["alignments"] == 0 and s["words"] == []
    assert s["scheduledSamples"] == s["receivedSamples"] and s["errors"] == []


def test_stop_talking_says_the_last_word_heard(page):
    speak_all(page, TEXT + " " + TEXT)
    page.wait_for_function("demoStats.highlights.length >= 3", timeout=60_000)
    page.click("#stop-talking")
    page.wait_for_function("demoStats.lastCancel !== null")
    s = stats(page)
    last = s["lastCancel"]["last_word"]
    assert last is not None and last["text"] in words_of(TEXT) and s["lastCancel"]["audio_seconds"] > 0
    assert page.evaluate("document.querySelector('#caption span.now')") is None  # playback stopped
