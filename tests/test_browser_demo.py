"""The browser demo (clients/web) in a real Chromium against a real server.

One server (tiny random-weight model on the CPU) and one browser for the whole module; each
test gets a fresh page. The page exposes `window.demoStats`, so the checks do not scrape the
DOM except where what the user sees is the point (the server's error message).

Needs Chromium (`apt-get install chromium`, scripts/setup.sh does it) and the `playwright`
Python package; Playwright's own browser download is not used.
"""

from __future__ import annotations

import io
import os
import shutil
import wave

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")

from tests.server import running_server  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
SENTENCE = "Hello there, how are you today?"
WAIT_MS = 15_000

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("browser_demo")) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    except Exception as e:  # pragma: no cover - depends on the machine
        pw.stop()
        pytest.skip(f"Chromium does not start: {e}")
    yield b
    b.close()
    pw.stop()


@pytest.fixture
def page(browser, server):
    context = browser.new_context()
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    foreign: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("request", lambda r: None if r.url.startswith((server.http_url, "data:")) else foreign.append(r.url))
    pg.goto(server.http_url + "/")
    pg.wait_for_function("window.demoStats !== undefined")
    pg.problems, pg.foreign = problems, foreign
    yield pg
    context.close()


def stats(pg) -> dict:
    return pg.evaluate("window.demoStats")


def connect(pg, fmt: str = "pcm", max_new_tokens: int = 12, rate: int = 48000) -> None:
    pg.select_option("#format", fmt)
    if fmt == "pcm":
        pg.select_option("#sample-rate", str(rate))
    pg.fill("#max-new-tokens", str(max_new_tokens))
    pg.click("#connect")
    pg.wait_for_function("['ready', 'error', 'closed'].includes(demoStats.state)")
    s = stats(pg)
    assert s["state"] == "ready", s["errors"]


def type_and_speak(pg, text: str = SENTENCE) -> None:
    before = stats(pg)
    pg.click("#composer")
    pg.keyboard.type(text)
    # words go out as they are completed, before Enter
    pg.wait_for_function(f"demoStats.sentTexts.length >= {len(before['sentTexts']) + 2}")
    assert stats(pg)["sent"]["flush"] == before["sent"]["flush"]
    pg.keyboard.press("Enter")


def test_pcm_words_as_typed_play_back_to_back(page):
    connect(page, "pcm", 12)
    type_and_speak(page)
    page.wait_for_function(
        "demoStats.turnEnds.length >= 1 && demoStats.chunks > 0"
        " && demoStats.scheduledSamples === demoStats.receivedSamples")
    s = stats(page)
    assert s["readyMs"] > 0 and s["prefillMs"] is not None
    assert s["format"] == "pcm" and s["sampleRate"] == 48000
    assert "".join(s["sentTexts"]) == SENTENCE  # word by word, then the rest with the flush
    assert len(s["sentTexts"]) >= 4 and s["sent"]["flush"] == 1
    assert len(s["ttfaMs"]) == 1 and 0 < s["ttfaMs"][0] < 10_000
    assert s["receivedSamples"] == s["receivedBytes"] // 2 > 0
    assert s["scheduledSamples"] == s["receivedSamples"]
    assert s["serverSamples"] == s["receivedSamples"]  # the events' `samples` agree
    assert s["errors"] == [] and s["droppedChunks"] == 0
    assert "ms" in page.inner_text("#ttfa-ms") and "ms" in page.inner_text("#ready-ms")
    assert page.problems == [] and page.foreign == []  # no errors, nothing loaded from elsewhere


def test_opus_is_demuxed_and_decoded_with_webcodecs(page):
    supported = page.evaluate(
        "async () => typeof AudioDecoder !== 'undefined' && (await AudioDecoder.isConfigSupported("
        "{codec: 'opus', sampleRate: 48000, numberOfChannels: 1})).supported")
    if not supported:
        pytest.skip("this Chromium's WebCodecs has no Opus decoder (the page falls back to pcm)")
    connect(page, "opus", 12)
    type_and_speak(page)
    page.wait_for_function(
        "demoStats.turnEnds.length >= 1 && demoStats.decodedPackets > 0"
        " && demoStats.decodedPackets === demoStats.opusPackets && demoStats.scheduledSamples > 0")
    s = stats(page)
    assert s["format"] == "opus" and s["opusSupported"] is True
    assert len(s["ttfaMs"]) == 1 and s["ttfaMs"][0] > 0
    assert s["oggErrors"] == 0 and s["errors"] == []
    # 20 ms packets; the OpusHead pre-skip is dropped once
    assert s["opusPreSkip"] > 0
    assert s["scheduledSamples"] == s["receivedSamples"] == s["decodedPackets"] * 960 - s["opusPreSkip"]
    assert page.problems == []


def test_bad_setting_shows_the_server_error(page):
    page.fill("#max-new-tokens", "100000")  # over the server's limit (2048)
    page.click("#connect")
    page.wait_for_function("demoStats.errors.length > 0 && demoStats.state === 'error'")
    s = stats(page)
    assert s["errors"][0]["code"] == "invalid_field"
    message = s["errors"][0]["message"]
    assert "max_new_tokens" in message
    page.wait_for_selector("#errors:not([hidden])")
    assert message in page.inner_text("#errors")
    assert page.get_attribute("#state", "data-state") == "error"


def test_stop_talking_cancels_and_silences(page, server):
    # fixed-length turns: the random-weight default model could otherwise end a turn
    # before the click, and there would be nothing left to cancel
    page.goto(server.http_url + "/?ignore_end=1")
    page.wait_for_function("window.demoStats !== undefined")
    connect(page, "pcm", 300)  # 300 frames: still speaking when stopped
    type_and_speak(page, "This turn goes on and on, until somebody interrupts it.")
    page.wait_for_function("demoStats.chunks >= 3")
    page.click("#stop-talking")
    s = stats(page)
    assert s["sent"]["cancel"] == 1
    assert s["activeSources"] == 0  # playback stopped at once, before the server answered
    page.wait_for_function("demoStats.cancelled.length === 1")
    scheduled = stats(page)["scheduledSamples"]
    page.wait_for_timeout(300)
    s = stats(page)
    assert s["cancelled"] == [1]
    assert s["scheduledSamples"] == scheduled  # nothing of the cancelled turn plays later
    assert s["activeSources"] == 0 and s["state"] == "ready" and s["errors"] == []
    # the voice stays ready: the next turn speaks, and its TTFA is measured
    type_and_speak(page, "Next one, please.")
    page.wait_for_function("demoStats.ttfaMs.length === 2 && demoStats.scheduledSamples > %d" % scheduled)
    page.click("#stop-talking")
    page.wait_for_function("demoStats.cancelled.length === 2")
    assert stats(page)["cancelled"] == [1, 2]
    assert page.problems == []


def _wav(seconds: float = 1.0, rate: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(x.tobytes())
    return buf.getvalue()


def test_reference_voice_inline_and_stored(page, server):
    page.select_option("#voice", "__upload__")
    page.wait_for_selector("#upload:not([hidden])")
    page.set_input_files("#ref-file", files=[{"name": "ref.wav", "mimeType": "audio/wav", "buffer": _wav()}])
    page.fill("#ref-text", "A short reference sentence.")
    # inline: the audio goes with `start` as a msgpack bin
    connect(page, "pcm", 12)
    assert stats(page)["voiceCached"] is False
    # stored: POST /v1/voices (base64 JSON), then picked from the list by reference_id
    page.fill("#ref-name", "browser voice")
    page.click("#store-voice")
    page.wait_for_function("document.querySelector('#voice').selectedOptions[0].dataset.stored === '1'")
    voice_id = page.eval_on_selector("#voice", "s => s.value")
    assert [v["name"] for v in server.services.voices.list() if v["id"] == voice_id] == ["browser voice"]
    connect(page, "pcm", 12)
    type_and_speak(page, "Hello from a stored voice.")
    page.wait_for_function("demoStats.turnEnds.length >= 1 && demoStats.scheduledSamples > 0")
    assert stats(page)["errors"] == [] and page.problems == []


def test_api_key_goes_in_the_query(browser, tmp_path):
    with running_server(tmp_path, api_keys=frozenset({"secret"})) as srv:
        context = browser.new_context()
        try:
            pg = context.new_page()
            pg.set_default_timeout(WAIT_MS)
            pg.goto(srv.http_url + "/")
            pg.fill("#max-new-tokens", "12")
            pg.click("#connect")  # no key: the handshake is refused
            pg.wait_for_function("demoStats.state === 'error'")
            assert "API key" in pg.inner_text("#errors")
            pg.fill("#api-key", "secret")
            pg.click("#connect")
            pg.wait_for_function("demoStats.state === 'ready'")
            assert stats(pg)["errors"] == []
        finally:
            context.close()


def test_opus_falls_back_to_pcm_without_webcodecs(browser, server):
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.set_default_timeout(WAIT_MS)
        pg.add_init_script("delete window.AudioDecoder; delete window.EncodedAudioChunk;")
        pg.goto(server.http_url + "/")
        connect(pg, "opus", 12)
        s = stats(pg)
        assert s["opusSupported"] is False and s["format"] == "pcm" and s["sampleRate"] == 48000
        assert "pcm" in pg.inner_text("#format-note")
    finally:
        context.close()
