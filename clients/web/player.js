// Gapless playback of streamed chunks on one AudioContext clock.
//
// Chunks are AudioBufferSourceNodes started back to back: each starts exactly where the
// previous one ends (positions are kept in whole frames of the context, so rounding never
// makes them overlap or leave a gap). The first chunk of a turn starts `leadMs` after it
// arrives (the jitter buffer). If a chunk of a turn arrives after the audio scheduled so far
// has finished playing, that is an underrun: it starts `leadMs` after arrival again, and
// the silence is counted.

export class Player {
  constructor(ctx, { leadMs = 80 } = {}) {
    this.ctx = ctx;
    this.leadMs = leadMs;
    this.out = ctx.createGain();
    this.out.connect(ctx.destination);
    this.sources = new Set();
    this.nextFrame = 0; // context frame where the next chunk starts; 0: nothing scheduled
    this.turn = null; // turn of the last chunk scheduled
    this.scheduledSamples = 0; // source samples scheduled, all chunks
    this.underruns = 0;
    this.underrunMs = 0;
  }

  /** Seconds of audio scheduled but not yet played. */
  get bufferedSeconds() {
    return Math.max(0, this.nextFrame / this.ctx.sampleRate - this.ctx.currentTime);
  }

  get active() { return this.sources.size; }

  /**
   * Schedule float32 mono samples at `rate` Hz. Returns {start, end, gapMs, leadMs}: context
   * times of the chunk, the underrun silence before it (0 if none) and how far ahead of the
   * playhead it was queued.
   */
  schedule(samples, rate, turn) {
    const ctx = this.ctx;
    const sr = ctx.sampleRate;
    const now = ctx.currentTime;
    const nowFrame = Math.ceil(now * sr);
    const safety = Math.ceil(0.005 * sr); // never start a chunk in the past
    let startFrame;
    let gapMs = 0;
    if (this.nextFrame >= nowFrame + safety) {
      startFrame = this.nextFrame; // back to back with the previous chunk
    } else {
      startFrame = nowFrame + Math.max(safety, Math.round(this.leadMs / 1000 * sr));
      if (this.nextFrame > 0 && turn === this.turn) { // the turn ran dry: an underrun
        gapMs = (startFrame - this.nextFrame) / sr * 1000;
        this.underruns++;
        this.underrunMs += gapMs;
      }
    }
    const frames = Math.round(samples.length * sr / rate);
    this.turn = turn;
    this.nextFrame = startFrame + frames;
    this.scheduledSamples += samples.length;
    if (samples.length) {
      const buffer = ctx.createBuffer(1, samples.length, rate);
      buffer.copyToChannel(samples, 0);
      const src = ctx.createBufferSource();
      src.buffer = buffer;
      src.connect(this.out);
      src.onended = () => { this.sources.delete(src); src.disconnect(); };
      src.start(startFrame / sr);
      this.sources.add(src);
    }
    return { start: startFrame / sr, end: this.nextFrame / sr, gapMs, leadMs: (startFrame / sr - now) * 1000 };
  }

  /** Stop everything now (barge-in). */
  stop() {
    for (const src of this.sources) {
      src.onended = null;
      try { src.stop(); } catch (e) { /* not started yet in some engines */ }
      src.disconnect();
    }
    this.sources.clear();
    this.nextFrame = 0;
    this.turn = null;
  }
}

/** s16le bytes -> float32 in [-1, 1). `bytes` must hold a whole number of samples. */
export function pcm16ToFloat(bytes) {
  const n = bytes.length >> 1;
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = view.getInt16(i * 2, true) / 32768;
  return out;
}
