// Captions that follow the voice: the words of /v1/tts/live/with-timestamp, the one being
// heard highlighted.
//
// The server's times are seconds on the timeline of all the audio it sent (every audio
// event in a row: `chunk_audio_offset_sec` + a segment's `start`/`end`). The player puts
// each piece of that audio at some AudioContext time; `map()` remembers where, so the
// context's clock (what the listener hears now) converts back to the server's timeline.
// Alignment snapshots replace each other by `chunk_seq`, as the Fish docs say.

const KEEP_PIECES = 2000; // audio pieces remembered for the clock mapping (minutes of audio)

export class Captions {
  constructor(el) {
    this.el = el;
    this.clear();
  }

  clear() {
    this.chunks = new Map(); // chunk_seq -> {offset, segments}
    this.words = []; // [{text, start, end}] on the server's timeline, in order
    this.spans = [];
    this.pieces = []; // [{t0, ctx0, dur}]: server timeline t0.. played from context time ctx0
    this.current = -1; // index of the word being heard, -1: none
    this.log = []; // every word highlighted: {i, text, at (server timeline s), ctx (context s)}
    this.el.replaceChildren();
  }

  /** An audio event of the timestamp path: keep its alignment snapshot, if any. */
  onAudioEvent(m) {
    if (typeof m.chunk_seq !== "number" || !m.alignment || !Array.isArray(m.alignment.segments)) return;
    this.chunks.set(m.chunk_seq, { offset: Number(m.chunk_audio_offset_sec) || 0, segments: m.alignment.segments });
    this.words = [...this.chunks.entries()].sort((a, b) => a[0] - b[0]).flatMap(([, c]) =>
      c.segments.map((s) => ({ text: String(s.text), start: c.offset + Number(s.start), end: c.offset + Number(s.end) })));
    this.render();
  }

  /** Server-timeline seconds t0 .. t0 + dur are played from context time ctx0. */
  map(t0, ctx0, dur) {
    this.pieces.push({ t0, ctx0, dur });
    if (this.pieces.length > KEEP_PIECES) this.pieces.splice(0, this.pieces.length - KEEP_PIECES);
  }

  /** Barge-in: nothing scheduled is heard any more. */
  stopPlayback() {
    this.pieces = [];
    this.highlight(-1);
  }

  /** The server-timeline second being heard at context time `now`, or null (silence). */
  heardAt(now) {
    for (let i = this.pieces.length - 1; i >= 0; i--) {
      const p = this.pieces[i];
      if (now >= p.ctx0 && now < p.ctx0 + p.dur) return p.t0 + (now - p.ctx0);
      if (now >= p.ctx0 + p.dur) break; // later pieces start after `now`
    }
    return null;
  }

  /** Follow the playback clock: highlight the word whose audio plays now. */
  tick(now) {
    const t = this.heardAt(now);
    let i = -1;
    if (t !== null) i = this.words.findIndex((w) => w.start <= t && t < w.end);
    if (i !== this.current) {
      this.highlight(i);
      if (i >= 0) this.log.push({ i, text: this.words[i].text, at: t, ctx: now });
    }
  }

  highlight(i) {
    if (this.current >= 0 && this.spans[this.current]) this.spans[this.current].classList.remove("now");
    this.current = i;
    for (let k = 0; k < this.spans.length; k++) this.spans[k].classList.toggle("heard", i >= 0 && k < i);
    if (i >= 0 && this.spans[i]) this.spans[i].classList.add("now");
  }

  render() {
    this.spans = this.words.map((w, k) => {
      const span = document.createElement("span");
      span.textContent = w.text;
      span.title = `${w.start.toFixed(2)}-${w.end.toFixed(2)} s`;
      if (k === this.current) span.className = "now";
      return span;
    });
    const parts = [];
    for (const s of this.spans) parts.push(s, " ");
    this.el.replaceChildren(...parts);
  }
}
