// The demo page: one live TTS connection (WebSocket /v1/tts/live, or with word timestamps
// /v1/tts/live/with-timestamp; binary MessagePack), text sent word by word as it is typed,
// audio played as it arrives, the word being heard highlighted (captions.js).
//
// window.demoStats is a small, stable test hook (see tests/test_browser_demo.py).

import { Captions } from "./captions.js";
import { decode, encode } from "./msgpack.js";
import { OggOpusDecoder, opusDecodingSupported } from "./ogg_opus.js";
import { pcm16ToFloat, Player } from "./player.js";
import { Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const round = (x) => Math.round(x * 100) / 100;
const UPLOAD = "__upload__";
const MAX_TEXT_EVENT = 2000; // characters per text event on the paste path (the server takes up to 10 000)
// a word is complete when whitespace or punctuation follows it
const BOUNDARY = /[\s.,!?;:\u2026\u3002\uff01\uff1f\uff0c\u3001\uff1b\uff1a\u2014\u2013]/;

function freshStats(keep = {}) {
  return {
    state: "idle", // idle | connecting | preparing | ready | finished | closed | error
    readyMs: null, // WebSocket created -> `ready` received (open-to-ready)
    prefillMs: null, // the server's own prefill time, from `ready`
    voiceCached: null,
    format: null, sampleRate: null, opusSupported: null,
    ttfaMs: [], // per turn: flush sent -> first audio event received
    chunks: 0, // audio events received
    droppedChunks: 0, // audio events (or decoded opus chunks) dropped after a barge-in
    receivedBytes: 0,
    receivedSamples: 0, // samples accepted for playback (pcm: from the bytes; opus: decoded, trimmed)
    serverSamples: 0, // sum of the audio events' `samples` (audio per chunk, as the server counts it)
    scheduledSamples: 0, // samples handed to Web Audio
    decodedPackets: 0, opusPackets: 0, opusPreSkip: null, oggErrors: 0,
    underruns: 0, underrunMs: 0, activeSources: 0,
    sent: { start: 0, text: 0, flush: 0, cancel: 0 },
    sentTexts: [], // every text event, in order
    events: {}, // server events received, by name
    cancelled: [], // `cancelled` events: the turn they name
    turnEnds: [], // `turn_end` events: their turn
    errors: [], // {code, message}: `error` events and failures of this page
    finish: null, closeCode: null,
    timestamps: null, // the connection uses /v1/tts/live/with-timestamp
    alignments: 0, // audio events with an alignment snapshot
    words: [], // {text, start, end}: the words so far, on the server's audio timeline (s)
    highlighted: null, // the word highlighted now
    highlights: [], // every word highlighted: {i, text, at (timeline s), ctx (AudioContext s)}
    bufferedMs: 0, // audio scheduled, not yet played
    firstPlayCtx: null, // AudioContext time the first audio piece was scheduled at
    lastCancel: null, // the last `cancelled` event: {audio_seconds, last_word}
    ...keep,
  };
}

let stats = (window.demoStats = freshStats());
let ctx = null; // one AudioContext for the page
let player = null;
let conn = null; // the current connection (see connect())
const timeline = new Timeline($("timeline"));
const captions = new Captions($("caption"));

// --- small UI helpers -------------------------------------------------------------------

function setState(state) {
  stats.state = state;
  const el = $("state");
  el.textContent = state;
  el.dataset.state = state;
  const live = conn && ["connecting", "preparing", "ready"].includes(state);
  $("disconnect").disabled = !live;
}

function log(text, cls) {
  const li = document.createElement("li");
  const t = (performance.now() / 1000).toFixed(3);
  li.textContent = `${t}  ${text}`;
  if (cls) li.className = cls;
  const ol = $("log");
  ol.prepend(li);
  while (ol.children.length > 200) ol.lastChild.remove();
}

function showError(message, code = "client") {
  stats.errors.push({ code, message });
  const box = $("errors");
  box.hidden = false;
  const line = document.createElement("div");
  line.className = "error-line";
  line.textContent = code === "client" ? message : `${code}: ${message}`;
  box.append(line);
  log(`error: ${line.textContent}`, "err");
}

function clearErrors() {
  $("errors").replaceChildren();
  $("errors").hidden = true;
}

function apiUrl(path, scheme) {
  const u = new URL(path, location.href);
  if (scheme) u.protocol = scheme;
  const key = $("api-key").value.trim();
  if (key) u.searchParams.set("api_key", key); // browsers cannot set headers on a WebSocket
  return u.toString();
}

// --- stored voices ----------------------------------------------------------------------

async function loadVoices(selectId) {
  const select = $("voice");
  try {
    const r = await fetch(apiUrl("v1/voices"));
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.message || `HTTP ${r.status}`);
    const keep = select.value;
    for (const opt of [...select.options]) if (opt.dataset.stored) opt.remove();
    for (const v of body.voices || []) {
      const opt = new Option(`${v.name} (${v.id})`, v.id);
      opt.dataset.stored = "1";
      select.add(opt);
    }
    select.value = selectId || keep;
    if (select.selectedIndex < 0) select.value = "";
  } catch (e) {
    log(`could not list voices: ${e.message}`, "err");
  }
  $("upload").hidden = select.value !== UPLOAD;
}

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

async function referenceFromForm() {
  const file = $("ref-file").files[0];
  const text = $("ref-text").value.trim();
  if (!file || !text) throw new Error("pick a reference audio file and type its transcript");
  return { audio: new Uint8Array(await file.arrayBuffer()), text };
}

async function storeVoice() {
  try {
    const ref = await referenceFromForm();
    const name = $("ref-name").value.trim() || "voice";
    log(`storing voice "${name}" (${ref.audio.length} bytes)`);
    const r = await fetch(apiUrl("v1/voices"), {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ name, references: [{ audio: toBase64(ref.audio), text: ref.text }] }),
    });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.message || `HTTP ${r.status}`);
    log(`stored voice ${body.id}`);
    await loadVoices(body.id);
  } catch (e) {
    showError(`storing the voice failed: ${e.message}`);
  }
}

// --- connection -------------------------------------------------------------------------

function ensureAudio() {
  if (!ctx) {
    ctx = new AudioContext({ sampleRate: 48000, latencyHint: "interactive" });
    player = new Player(ctx);
  }
  if (ctx.state === "suspended") ctx.resume().catch(() => {});
  const lead = Number($("lead-ms").value);
  player.leadMs = Number.isFinite(lead) && lead >= 0 ? lead : 80;
}

function numberField(id, parse) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  const v = parse(raw);
  return Number.isFinite(v) ? v : undefined;
}

async function buildRequest(format) {
  const request = {
    format,
    sample_rate: format === "opus" ? 48000 : Number($("sample-rate").value),
    latency: $("latency").value,
    max_new_tokens: numberField("max-new-tokens", (s) => Number(s)),
    temperature: numberField("temperature", parseFloat),
  };
  // `/?ignore_end=1`: fixed-length mode (every turn speaks max_new_tokens frames), for
  // models with random weights, which otherwise stop at random
  if (new URLSearchParams(location.search).get("ignore_end") === "1") request.ignore_end = true;
  const voice = $("voice").value;
  if (voice === UPLOAD) request.references = [await referenceFromForm()];
  else if (voice) request.reference_id = voice;
  return request;
}

/** Open a connection. Messages sent before it is open are queued. */
function connect() {
  if (conn) disconnect();
  clearErrors();
  ensureAudio();
  player.stop();
  timeline.clear();
  captions.clear();
  $("turns").replaceChildren();
  stats = window.demoStats = freshStats({ opusSupported: stats.opusSupported });
  const c = {
    ws: null, t0: performance.now(), format: null, rate: null, opened: false, failed: false,
    queue: [], // messages waiting for the socket
    held: [], // text/flush typed while a cancel waits for its acknowledgement
    turn: 1, turnHasText: false, turns: new Map(),
    dropping: false, epoch: 0, cancelledTurns: new Set(), turnAtCancel: 0,
    carry: null, opus: null,
    tl: 0, // seconds of audio received so far: the server's timeline (played or dropped)
  };
  conn = c;
  setState("connecting");
  open(c).catch((e) => {
    if (c !== conn) return;
    showError(e.message || String(e));
    setState("error");
    c.ws?.close();
  });
  return c;
}

async function open(c) {
  let format = $("format").value;
  if (format === "opus") {
    stats.opusSupported = await opusDecodingSupported();
    if (!stats.opusSupported) {
      $("format-note").textContent = "This browser's WebCodecs cannot decode Opus: using pcm instead.";
      log("no WebCodecs Opus decoder: falling back to pcm", "err");
      format = "pcm";
    }
  }
  const request = await buildRequest(format);
  if (c !== conn) return;
  c.format = format;
  c.rate = request.sample_rate;
  stats.format = format;
  if (format === "opus") {
    c.opus = new OggOpusDecoder({
      onChunk: (samples, tag) => onDecoded(c, samples, tag),
      onError: (message) => { if (c === conn) showError(message); },
    });
  }
  stats.timestamps = $("timestamps").checked;
  const path = stats.timestamps ? "v1/tts/live/with-timestamp" : "v1/tts/live";
  const ws = new WebSocket(apiUrl(path, location.protocol === "https:" ? "wss:" : "ws:"));
  ws.binaryType = "arraybuffer";
  c.ws = ws;
  ws.onopen = () => {
    if (c !== conn) return ws.close();
    c.opened = true;
    log(`open after ${Math.round(performance.now() - c.t0)} ms; start (${format} ${request.sample_rate} Hz)`);
    rawSend(c, { event: "start", request });
    setState("preparing");
    for (const m of c.queue.splice(0)) rawSend(c, m);
  };
  ws.onmessage = (e) => {
    if (c !== conn) return;
    let m;
    try {
      m = decode(e.data);
    } catch (err) {
      showError(`undecodable message from the server: ${err.message}`);
      return;
    }
    onMessage(c, m);
  };
  ws.onclose = (e) => {
    if (c !== conn) return;
    stats.closeCode = e.code;
    if (!c.opened) {
      showError("could not connect: the server refused the WebSocket (wrong or missing API key?)");
      c.failed = true;
    }
    log(`closed (code ${e.code}${e.reason ? `, ${e.reason}` : ""})`);
    if (!["error", "finished"].includes(stats.state)) setState(c.failed ? "error" : "closed");
    $("disconnect").disabled = true;
    c.opus?.close();
  };
}

function disconnect() {
  const c = conn;
  if (!c) return;
  conn = null;
  c.ws?.close(1000);
  c.opus?.close();
  player?.stop();
  stats.state = "closed";
  setState("closed");
}

function rawSend(c, m) {
  track(c, m);
  stats.sent[m.event] = (stats.sent[m.event] || 0) + 1;
  if (m.event === "text") stats.sentTexts.push(m.text);
  c.ws.send(encode(m));
}

function isLive() {
  return conn !== null && !["error", "finished", "closed"].includes(stats.state);
}

function send(m) {
  const c = isLive() ? conn : connect();
  if ((m.event === "text" || m.event === "flush") && c.dropping) {
    c.held.push(m); // the turn numbers are known once the cancel is acknowledged
    return;
  }
  if (c.ws && c.ws.readyState === WebSocket.OPEN) rawSend(c, m);
  else c.queue.push(m);
}

/** Mirror the server's turn numbers: text joins the open turn, a flush with text closes it. */
function track(c, m) {
  if (m.event === "text") {
    const r = turnInfo(c, c.turn);
    r.text += m.text;
    if (/\S/.test(m.text)) c.turnHasText = true;
    renderTurn(r);
  } else if (m.event === "flush" && c.turnHasText) {
    const r = turnInfo(c, c.turn);
    r.flushAt = performance.now();
    r.state = "speaking";
    if (r.firstAudioAt !== null) { // audio of this turn came before its flush
      r.ttfaMs = 0;
      stats.ttfaMs.push(0);
      showTtfa(r);
    }
    timeline.addMark({ at: r.flushAt, kind: "flush", turn: r.turn });
    renderTurn(r);
    c.turn++;
    c.turnHasText = false;
  }
}

function turnInfo(c, turn) {
  let r = c.turns.get(turn);
  if (!r) {
    r = { turn, text: "", flushAt: null, firstAudioAt: null, ttfaMs: null, chunks: 0, samples: 0, rate: c.rate,
      underruns: 0, audioSeconds: null, state: "typing", row: null };
    c.turns.set(turn, r);
  }
  return r;
}

// --- server events ----------------------------------------------------------------------

function onMessage(c, m) {
  const ev = m.event;
  stats.events[ev] = (stats.events[ev] || 0) + 1;
  switch (ev) {
    case "ready":
      stats.readyMs = round(performance.now() - c.t0);
      stats.prefillMs = m.prefill_ms ?? null;
      stats.voiceCached = m.voice_cached ?? null;
      stats.sampleRate = m.sample_rate ?? c.rate;
      if (m.sample_rate) c.rate = m.sample_rate;
      $("ready-ms").textContent = `${Math.round(stats.readyMs)} ms`;
      log(`ready in ${Math.round(stats.readyMs)} ms (server prefill ${m.prefill_ms} ms, voice ${m.voice_cached ? "cached" : "new"}, ${m.format} ${m.sample_rate} Hz)`);
      setState("ready");
      break;
    case "audio":
      onAudio(c, m);
      break;
    case "turn_end": {
      stats.turnEnds.push(m.turn);
      const r = turnInfo(c, m.turn);
      r.state = c.cancelledTurns.has(m.turn) ? "cancelled" : "done";
      r.audioSeconds = m.audio_seconds;
      renderTurn(r);
      log(`turn ${m.turn} end: ${m.audio_seconds} s of audio in ${r.chunks} chunks`);
      break;
    }
    case "cancelled":
      onCancelled(c, m);
      break;
    case "error":
      c.failed = true;
      showError(String(m.message ?? "unknown error"), String(m.code ?? "error"));
      setState("error");
      break;
    case "finish":
      stats.finish = m.reason;
      log(`finish (${m.reason}${m.message ? `: ${m.message}` : ""})`, m.reason === "error" ? "err" : undefined);
      if (m.reason === "error") {
        if (!c.failed) showError(String(m.message || "the server ended the stream with an error"), "finish");
        c.failed = true;
        setState("error");
      } else {
        setState("finished");
      }
      break;
    default:
      log(`event ${ev}`);
  }
}

function onAudio(c, m) {
  const now = performance.now();
  const bytes = m.audio instanceof Uint8Array ? m.audio : new Uint8Array(0);
  if (typeof m.chunk_seq === "number") {
    if (m.alignment) stats.alignments++;
    captions.onAudioEvent(m);
    stats.words = captions.words;
  }
  if (!bytes.length) return; // an alignment only (the docs' trailing correction)
  stats.chunks++;
  stats.receivedBytes += bytes.length;
  if (typeof m.samples === "number") stats.serverSamples += m.samples;
  const turn = m.turn ?? c.turn;
  const tag = { turn, seq: m.seq, arrival: now, epoch: c.epoch, rate: m.sample_rate || c.rate };
  const dropped = c.dropping || c.cancelledTurns.has(turn);
  if (c.format === "opus") {
    // always demux and decode, so the decoder stays in step with the stream; drop afterwards
    c.opus.push(bytes, { ...tag, dropped });
    stats.opusPackets = c.opus.packetsIn;
    stats.opusPreSkip = c.opus.preSkip;
    stats.oggErrors = c.opus.demux.errors;
  }
  if (dropped) {
    if (c.format !== "opus") {
      stats.droppedChunks++;
      c.tl += (bytes.length >> 1) / tag.rate; // sent, so on the server's timeline, but not played
    }
    timeline.addChunk({ arrival: now, start: now, end: now, gapMs: 0, turn, dropped: true });
    return;
  }
  const r = turnInfo(c, turn);
  r.chunks++;
  if (r.firstAudioAt === null) {
    r.firstAudioAt = now;
    if (r.flushAt !== null) {
      r.ttfaMs = round(now - r.flushAt);
      stats.ttfaMs.push(r.ttfaMs);
      showTtfa(r);
      log(`turn ${turn}: first audio ${Math.round(r.ttfaMs)} ms after the flush (server gen_ms ${m.gen_ms})`);
    } else {
      log(`turn ${turn}: first audio before the flush (the segmenter cut a segment early)`);
    }
  }
  renderTurn(r);
  if (c.format !== "opus") {
    let data = bytes;
    if (c.carry) { // a sample split across events (never seen; s16le events are whole samples)
      data = new Uint8Array(c.carry.length + bytes.length);
      data.set(c.carry);
      data.set(bytes, c.carry.length);
      c.carry = null;
    }
    if (data.length & 1) { c.carry = data.slice(-1); data = data.subarray(0, data.length - 1); }
    const samples = pcm16ToFloat(data);
    tag.tl = c.tl;
    c.tl += samples.length / tag.rate;
    play(c, samples, tag);
  }
}

function onDecoded(c, samples, tag) {
  if (c !== conn) return;
  stats.decodedPackets = c.opus.packetsOut;
  const tl = c.tl;
  c.tl += samples.length / 48000;
  if (tag.dropped || tag.epoch !== c.epoch || c.cancelledTurns.has(tag.turn)) {
    stats.droppedChunks++;
    return;
  }
  play(c, samples, { ...tag, rate: 48000, tl });
}

function play(c, samples, tag) {
  stats.receivedSamples += samples.length;
  const res = player.schedule(samples, tag.rate, tag.turn);
  captions.map(tag.tl, res.start, samples.length / tag.rate);
  if (stats.firstPlayCtx === null) stats.firstPlayCtx = res.start;
  stats.scheduledSamples = player.scheduledSamples;
  stats.underruns = player.underruns;
  stats.underrunMs = round(player.underrunMs);
  stats.activeSources = player.active;
  const r = turnInfo(c, tag.turn);
  r.samples += samples.length;
  r.rate = tag.rate;
  if (res.gapMs > 0) {
    r.underruns++;
    log(`underrun: turn ${tag.turn} chunk ${tag.seq} came ${Math.round(res.gapMs)} ms late`, "err");
  }
  renderTurn(r);
  const nowPerf = performance.now(), nowCtx = ctx.currentTime;
  timeline.addChunk({
    arrival: tag.arrival, turn: tag.turn, gapMs: res.gapMs,
    start: nowPerf + (res.start - nowCtx) * 1000, end: nowPerf + (res.end - nowCtx) * 1000,
  });
}

function onCancelled(c, m) {
  const turns = Array.isArray(m.turns) ? m.turns : [m.turn];
  for (const t of turns) {
    c.cancelledTurns.add(t);
    const r = c.turns.get(t);
    if (r) { r.state = "cancelled"; renderTurn(r); }
  }
  stats.cancelled.push(m.turn);
  stats.lastCancel = { audio_seconds: m.audio_seconds ?? null, last_word: m.last_word ?? null };
  if (m.last_word) log(`heard until "${m.last_word.text}" (${m.audio_seconds} s of audio sent)`);
  log(`cancelled (turn ${m.turn}${turns.length ? `; turns ${turns.join(", ")}` : ""})`);
  if (!c.dropping) return;
  c.dropping = false;
  // the server moves to a new turn only if the open one had text cut into segments
  if (turns.includes(c.turnAtCancel)) c.turn = c.turnAtCancel + 1;
  for (const held of c.held.splice(0)) send(held);
}

// --- talking ----------------------------------------------------------------------------

let sentText = ""; // the part of the composer already sent

/** Length of the prefix of `s` that ends with a completed word: up to and including the last
 * boundary character (space, punctuation) that directly follows a word character. */
function lastWordEnd(s) {
  for (let i = s.length - 1; i > 0; i--) {
    if (BOUNDARY.test(s[i]) && !BOUNDARY.test(s[i - 1])) return i + 1;
  }
  return 0;
}

/** Send the words of the composer completed since the last call (all of it if `all`). */
function pumpWords(all) {
  const value = $("composer").value;
  if (!value.startsWith(sentText)) { // sent text was edited: carry on from where it differs
    let n = 0;
    while (n < sentText.length && n < value.length && sentText[n] === value[n]) n++;
    sentText = value.slice(0, n);
  }
  const rest = value.slice(sentText.length);
  const cut = all ? rest.length : lastWordEnd(rest);
  if (cut > 0 && /\S/.test(rest.slice(0, cut))) {
    send({ event: "text", text: rest.slice(0, cut) });
    sentText += rest.slice(0, cut);
  }
  renderComposer();
}

function renderComposer() {
  const value = $("composer").value;
  $("sent-text").textContent = sentText;
  $("unsent-text").textContent = value.startsWith(sentText) ? value.slice(sentText.length) : "";
}

function speak() {
  ensureAudio();
  pumpWords(true);
  if (isLive()) send({ event: "flush" });
  $("composer").value = "";
  sentText = "";
  renderComposer();
}

function speakAll() {
  ensureAudio();
  const text = $("paste").value;
  if (!text.trim()) return;
  for (let i = 0; i < text.length; i += MAX_TEXT_EVENT) send({ event: "text", text: text.slice(i, i + MAX_TEXT_EVENT) });
  send({ event: "flush" });
}

function stopTalking() {
  player?.stop(); // silence at once; late audio of the cancelled turns is dropped
  captions.stopPlayback();
  timeline.cutAt(performance.now());
  stats.activeSources = 0;
  $("composer").value = "";
  sentText = "";
  renderComposer();
  const c = conn;
  if (!c || !c.ws || c.ws.readyState !== WebSocket.OPEN || c.dropping) return;
  rawSend(c, { event: "cancel" });
  c.dropping = true;
  c.epoch++;
  c.turnAtCancel = c.turn;
  c.turnHasText = false;
  timeline.addMark({ at: performance.now(), kind: "cancel", turn: c.turn });
  log("cancel sent (barge-in)");
}

// --- rendering --------------------------------------------------------------------------

function showTtfa(r) {
  $("ttfa-ms").textContent = `${Math.round(r.ttfaMs)} ms (turn ${r.turn})`;
}

function renderTurn(r) {
  if (!r.row) {
    r.row = document.createElement("tr");
    $("turns").prepend(r.row);
  }
  const audio = r.samples ? `${(r.samples / r.rate).toFixed(2)} s` : "";
  const cells = [r.turn, r.text.trim(), r.ttfaMs === null ? "" : `${Math.round(r.ttfaMs)} ms`, r.chunks || "",
    audio, r.underruns || "", r.state];
  r.row.replaceChildren(...cells.map((v) => { const td = document.createElement("td"); td.textContent = v; return td; }));
  r.row.cells[1].title = r.text;
}

setInterval(() => { // the caption follows the playback clock
  if (!ctx) return;
  captions.tick(ctx.currentTime);
  stats.highlighted = captions.current >= 0 ? captions.words[captions.current].text : null;
  stats.highlights = captions.log;
  stats.bufferedMs = player ? Math.round(player.bufferedSeconds * 1000) : 0; // 0: all played
}, 20);

setInterval(() => {
  if (!player) return;
  stats.activeSources = player.active;
  $("buffered-ms").textContent = `${Math.round(player.bufferedSeconds * 1000)} ms`;
  $("underruns").textContent = player.underruns ? `${player.underruns} (${Math.round(player.underrunMs)} ms)` : "0";
}, 100);

// --- wiring -----------------------------------------------------------------------------

$("settings").addEventListener("submit", (e) => { e.preventDefault(); connect(); });
$("disconnect").addEventListener("click", () => disconnect());
$("speak").addEventListener("click", () => speak());
$("speak-all").addEventListener("click", () => speakAll());
$("stop-talking").addEventListener("click", () => stopTalking());
$("store-voice").addEventListener("click", () => storeVoice());
$("refresh-voices").addEventListener("click", () => loadVoices());
$("api-key").addEventListener("change", () => loadVoices());
$("voice").addEventListener("change", () => { $("upload").hidden = $("voice").value !== UPLOAD; });
$("format").addEventListener("change", () => {
  $("sample-rate").disabled = $("format").value === "opus";
  $("format-note").textContent = conn ? "Reconnect to use the new settings." : "";
});
const composer = $("composer");
composer.addEventListener("input", () => pumpWords(false));
composer.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    speak();
  }
});

loadVoices();
opusDecodingSupported().then((ok) => {
  if (stats.opusSupported === null) stats.opusSupported = ok;
  if (!ok) $("format").querySelector('option[value="opus"]').textContent = "opus (not supported here: pcm)";
});
window.demo = { connect, disconnect, speak, stopTalking }; // for the console
