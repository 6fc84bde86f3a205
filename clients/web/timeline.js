// A live timeline on a canvas: when each chunk arrived (top lane) and when it plays
// (bottom lane), over the last few seconds. Flushes are blue lines, cancels red lines,
// underruns red gaps, chunks dropped by a barge-in grey ticks (time: seconds since page load).

export class Timeline {
  constructor(canvas, { windowMs = 8000 } = {}) {
    this.canvas = canvas;
    this.windowMs = windowMs;
    this.chunks = []; // {arrival, start, end, gapMs, turn, dropped} in performance.now() ms
    this.marks = []; // {at, kind: 'flush' | 'cancel', turn}
    this.frame = 0;
  }

  addChunk(c) { this.chunks.push(c); this._trim(); this.request(); }
  addMark(m) { this.marks.push(m); this._trim(); this.request(); }
  clear() { this.chunks = []; this.marks = []; this.request(); }

  /** Playback stopped at `at` (barge-in): what was queued after it never plays. */
  cutAt(at) {
    for (const c of this.chunks) {
      if (c.dropped || c.end <= at) continue;
      if (c.start >= at) c.dropped = true;
      else c.end = at;
    }
    this.request();
  }

  _trim() {
    const old = performance.now() - 4 * this.windowMs;
    while (this.chunks.length > 2000 || (this.chunks.length && this.chunks[0].end < old)) this.chunks.shift();
    while (this.marks.length > 200 || (this.marks.length && this.marks[0].at < old)) this.marks.shift();
  }

  request() {
    if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = 0; this.draw(); });
  }

  draw() {
    const cv = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = cv.clientWidth, h = cv.clientHeight;
    if (!w || !h) return;
    if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) {
      cv.width = Math.round(w * dpr);
      cv.height = Math.round(h * dpr);
    }
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const now = performance.now();
    const last = this.chunks.length ? this.chunks[this.chunks.length - 1].end : now;
    const t1 = Math.max(now, last) + 200, t0 = t1 - this.windowMs;
    const left = 70, right = w - 8;
    const x = (t) => left + (t - t0) / (t1 - t0) * (right - left);
    const laneA = [22, 50], laneP = [78, 112];

    g.font = "12px system-ui, sans-serif";
    g.fillStyle = "#667";
    g.fillText("arrived", 8, (laneA[0] + laneA[1]) / 2 + 4);
    g.fillText("playing", 8, (laneP[0] + laneP[1]) / 2 + 4);
    g.strokeStyle = "#dde";
    g.lineWidth = 1;
    for (let s = Math.max(0, Math.ceil(t0 / 1000) * 1000); s <= t1; s += 1000) { // one grid line a second
      g.beginPath(); g.moveTo(x(s), 14); g.lineTo(x(s), h - 18); g.stroke();
      g.fillText(`${(s / 1000).toFixed(0)} s`, x(s) - 8, h - 4);
    }
    for (const m of this.marks) {
      if (m.at < t0) continue;
      g.strokeStyle = m.kind === "flush" ? "#2a6fdb" : "#c0392b";
      g.lineWidth = 2;
      g.beginPath(); g.moveTo(x(m.at), 10); g.lineTo(x(m.at), h - 18); g.stroke();
      g.fillStyle = g.strokeStyle;
      if (m.kind === "flush") g.fillText(`flush #${m.turn}`, x(m.at) + 3, 12);
      else g.fillText("cancel", x(m.at) + 3, h - 22);
    }
    let i = 0;
    for (const c of this.chunks) {
      i++;
      if (c.end < t0 && c.arrival < t0) continue;
      if (c.dropped) {
        g.fillStyle = "#aaa";
        g.fillRect(x(c.arrival) - 1, laneA[0], 2, laneA[1] - laneA[0]);
        continue;
      }
      g.strokeStyle = "rgba(80, 80, 120, 0.35)";
      g.lineWidth = 1;
      g.beginPath(); g.moveTo(x(c.arrival), laneA[1]); g.lineTo(x(c.start), laneP[0]); g.stroke();
      g.fillStyle = "#334";
      g.fillRect(x(c.arrival) - 1, laneA[0], 2, laneA[1] - laneA[0]);
      if (c.gapMs > 0) {
        g.fillStyle = "rgba(220, 40, 40, 0.75)";
        g.fillRect(x(c.start - c.gapMs), laneP[0], Math.max(2, x(c.start) - x(c.start - c.gapMs)), laneP[1] - laneP[0]);
      }
      g.fillStyle = i % 2 ? "#27ae60" : "#1e8449";
      g.fillRect(x(c.start), laneP[0], Math.max(1, x(c.end) - x(c.start)), laneP[1] - laneP[0]);
    }
    g.strokeStyle = "#111";
    g.lineWidth = 1;
    g.beginPath(); g.moveTo(x(now), laneP[0] - 6); g.lineTo(x(now), laneP[1] + 6); g.stroke();
    if (last > now) this.request(); // keep the playhead moving while audio is queued
  }
}
