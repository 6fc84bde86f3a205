// Ogg Opus in the browser: an incremental Ogg page demuxer (RFC 3533) and a decoder that
// feeds the Opus packets to WebCodecs AudioDecoder (RFC 7845 mapping: OpusHead, OpusTags,
// then audio packets; the first `pre_skip` decoded samples are dropped, the EOS page's
// granule position trims the end).
//
// The server sends one Ogg stream split across `audio` events at arbitrary byte offsets,
// so bytes are buffered until a whole page is there.

export const OPUS_RATE = 48000;

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let k = 0; k < 8; k++) r = (r & 0x80000000) ? ((r << 1) ^ 0x04c11db7) : (r << 1);
    t[i] = r >>> 0;
  }
  return t;
})();

/** Ogg's CRC-32 (poly 0x04C11DB7, MSB first, init 0, no final xor) of a page whose CRC field is zeroed. */
export function oggCrc(page) {
  let crc = 0;
  for (let i = 0; i < page.length; i++) {
    const b = (i >= 22 && i < 26) ? 0 : page[i];
    crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ b) & 0xff]) >>> 0;
  }
  return crc;
}

/** Samples (48 kHz) in one Opus packet, from its TOC byte (RFC 6716 section 3.1). */
export function opusPacketSamples(packet) {
  if (!packet.length) return 0;
  const toc = packet[0];
  const config = toc >> 3;
  let frame; // samples at 48 kHz
  if (config < 12) frame = [480, 960, 1920, 2880][config & 3];
  else if (config < 16) frame = [480, 960][config & 1];
  else frame = [120, 240, 480, 960][config & 3];
  const code = toc & 3;
  const frames = code === 0 ? 1 : code < 3 ? 2 : (packet.length > 1 ? packet[1] & 0x3f : 0);
  return frame * frames;
}

export class OggDemuxer {
  constructor() {
    this.buf = new Uint8Array(0);
    this.partial = null; // parts of a packet that continues on the next page
    this.pages = 0;
    this.errors = 0; // CRC mismatches, lost sync, broken continuations
  }

  /** Add bytes; returns the packets completed: {data, bos, eos, granule, serial}. */
  push(bytes) {
    if (bytes.length) {
      const joined = new Uint8Array(this.buf.length + bytes.length);
      joined.set(this.buf);
      joined.set(bytes, this.buf.length);
      this.buf = joined;
    }
    const out = [];
    let pos = 0;
    const b = this.buf;
    while (b.length - pos >= 27) {
      if (!(b[pos] === 0x4f && b[pos + 1] === 0x67 && b[pos + 2] === 0x67 && b[pos + 3] === 0x53)) {
        this.errors++; // lost sync: look for the next capture pattern
        let next = pos + 1;
        while (next + 4 <= b.length && !(b[next] === 0x4f && b[next + 1] === 0x67 && b[next + 2] === 0x67 && b[next + 3] === 0x53)) next++;
        pos = next;
        continue;
      }
      const nseg = b[pos + 26];
      const headerLen = 27 + nseg;
      if (b.length - pos < headerLen) break;
      let bodyLen = 0;
      for (let i = 0; i < nseg; i++) bodyLen += b[pos + 27 + i];
      if (b.length - pos < headerLen + bodyLen) break;
      const page = b.subarray(pos, pos + headerLen + bodyLen);
      pos += headerLen + bodyLen;
      const view = new DataView(page.buffer, page.byteOffset, page.byteLength);
      if (view.getUint32(22, true) !== oggCrc(page)) { this.errors++; this.partial = null; continue; }
      this.pages++;
      const flags = page[5];
      const granule = Number(view.getBigInt64(6, true));
      const serial = view.getUint32(14, true);
      const continued = (flags & 0x01) !== 0;
      if (!continued && this.partial) { this.errors++; this.partial = null; }
      let parts = continued ? this.partial : null;
      let dropFirst = continued && !this.partial; // continuation of a packet we never saw
      this.partial = null;
      let offset = headerLen;
      let segStart = offset;
      const completed = [];
      for (let i = 0; i < nseg; i++) {
        const lace = page[27 + i];
        offset += lace;
        if (lace < 255) {
          const piece = page.slice(segStart, offset);
          let data = piece;
          if (parts) { parts.push(piece); data = concat(parts); parts = null; }
          if (dropFirst) dropFirst = false; else completed.push(data);
          segStart = offset;
        }
      }
      if (segStart < offset || (nseg && page[27 + nseg - 1] === 255)) {
        (parts = parts || []).push(page.slice(segStart, offset));
        this.partial = dropFirst ? null : parts;
      }
      completed.forEach((data, i) => out.push({
        data, bos: (flags & 0x02) !== 0 && i === 0, eos: (flags & 0x04) !== 0 && i === completed.length - 1,
        granule: i === completed.length - 1 ? granule : -1, serial,
      }));
    }
    this.buf = this.buf.slice(pos);
    return out;
  }
}

function concat(parts) {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}

export function parseOpusHead(p) {
  const magic = String.fromCharCode(...p.subarray(0, 8));
  if (magic !== "OpusHead" || p.length < 19) throw new Error("Ogg stream does not start with OpusHead");
  const v = new DataView(p.buffer, p.byteOffset, p.byteLength);
  return {
    version: p[8], channels: p[9], preSkip: v.getUint16(10, true), inputRate: v.getUint32(12, true),
    gainDb: v.getInt16(16, true) / 256, mapping: p[18],
  };
}

/** Whether this browser's WebCodecs can decode mono Opus at 48 kHz. */
export async function opusDecodingSupported() {
  if (typeof AudioDecoder === "undefined" || typeof EncodedAudioChunk === "undefined") return false;
  try {
    const r = await AudioDecoder.isConfigSupported({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: 1 });
    return !!r.supported;
  } catch (e) {
    return false;
  }
}

/**
 * Ogg Opus bytes in, float32 mono 48 kHz chunks out.
 *
 * push(bytes, tag) demuxes and queues the packets; once every packet of that push is decoded,
 * onChunk(samples, tag) is called with their samples (pre-skip and end trimming applied), so
 * one `audio` event gives one playable chunk. onError(message) reports decoder failures.
 */
export class OggOpusDecoder {
  constructor({ onChunk, onError }) {
    this.onChunk = onChunk;
    this.onError = onError;
    this.demux = new OggDemuxer();
    this.decoder = null;
    this.head = null;
    this.stage = "head"; // head -> tags -> audio (again on a new BOS page: a chained stream)
    this.packetsIn = 0; // audio packets given to the decoder
    this.packetsOut = 0; // decoded outputs received
    this.samplesOut = 0; // samples emitted (after trimming)
    this.groups = []; // per push: {tag, pending packets, parts}
    this.streams = 0;
  }

  get preSkip() { return this.head ? this.head.preSkip : 0; }

  push(bytes, tag) {
    const group = { tag, pending: 0, parts: [] };
    for (const pkt of this.demux.push(bytes)) {
      if (pkt.bos) this._newStream();
      if (this.stage === "head") {
        try {
          this.head = parseOpusHead(pkt.data);
        } catch (e) {
          this.onError(String(e.message || e));
          continue;
        }
        this._configure();
        this.stage = "tags";
        continue;
      }
      if (this.stage === "tags") { this.stage = "audio"; continue; } // OpusTags: nothing we need
      const n = opusPacketSamples(pkt.data);
      const st = this.stream;
      if (pkt.eos && pkt.granule >= 0) st.endAt = pkt.granule - st.preSkip; // samples to keep, in total
      if (!this.decoder || this.decoder.state !== "configured") continue;
      const chunk = new EncodedAudioChunk({
        type: "key", timestamp: Math.round(st.packetSamples * 1e6 / OPUS_RATE),
        duration: Math.round(n * 1e6 / OPUS_RATE), data: pkt.data,
      });
      st.packetSamples += n;
      group.pending++;
      this.packetsIn++;
      this.decoder.decode(chunk);
    }
    if (group.pending) this.groups.push(group);
    return group.pending;
  }

  _newStream() {
    if (this.decoder && this.decoder.state === "configured") {
      const old = this.decoder;
      old.flush().catch(() => {}).finally(() => old.state !== "closed" && old.close());
    }
    this.decoder = null;
    this.stage = "head";
    this.streams++;
  }

  _configure() {
    // No `description`: the pre-skip is applied here, so the decoder must not apply it too.
    this.stream = { preSkip: this.head.preSkip, skip: this.head.preSkip, packetSamples: 0, emitted: 0, endAt: -1 };
    const stream = this.stream;
    const decoder = new AudioDecoder({
      output: (data) => this._output(data, stream),
      error: (e) => this.onError(`AudioDecoder: ${e.message || e}`),
    });
    decoder.configure({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: this.head.channels || 1 });
    this.decoder = decoder;
  }

  _output(data, stream) {
    this.packetsOut++;
    let samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" }); // first channel (mono)
    data.close();
    if (stream.skip > 0) {
      const cut = Math.min(stream.skip, samples.length);
      stream.skip -= cut;
      samples = samples.subarray(cut);
    }
    if (stream.endAt >= 0) samples = samples.subarray(0, Math.max(0, stream.endAt - stream.emitted));
    stream.emitted += samples.length;
    const group = this.groups[0];
    if (!group) return;
    if (samples.length) group.parts.push(samples);
    if (--group.pending === 0) {
      this.groups.shift();
      const all = concat32(group.parts);
      this.samplesOut += all.length;
      this.onChunk(all, group.tag);
    }
  }

  close() {
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = null;
  }
}

function concat32(parts) {
  if (parts.length === 1) return parts[0];
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Float32Array(n);
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}
