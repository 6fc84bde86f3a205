// A small MessagePack encoder/decoder: maps, arrays, strings, integers, floats, booleans,
// nil and bin (Uint8Array). Ext values decode to {ext: type, data: Uint8Array}; they are
// never encoded. Integers outside the safe range decode to BigInt.

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.pos = 0;
  }

  ensure(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buf.subarray(0, this.pos));
    this.buf = grown;
    this.view = new DataView(grown.buffer);
  }

  u8(x) { this.ensure(1); this.buf[this.pos++] = x; }
  u16(x) { this.ensure(2); this.view.setUint16(this.pos, x); this.pos += 2; }
  u32(x) { this.ensure(4); this.view.setUint32(this.pos, x); this.pos += 4; }
  bytes(b) { this.ensure(b.length); this.buf.set(b, this.pos); this.pos += b.length; }

  head(fixBase, fixMax, len, c8, c16, c32) {
    if (fixBase !== null && len <= fixMax) this.u8(fixBase | len);
    else if (c8 !== null && len < 0x100) { this.u8(c8); this.u8(len); }
    else if (len < 0x10000) { this.u8(c16); this.u16(len); }
    else { this.u8(c32); this.u32(len); }
  }

  int(v) {
    if (v >= 0) {
      if (v < 0x80) this.u8(v);
      else if (v < 0x100) { this.u8(0xcc); this.u8(v); }
      else if (v < 0x10000) { this.u8(0xcd); this.u16(v); }
      else if (v < 0x100000000) { this.u8(0xce); this.u32(v); }
      else { this.u8(0xcf); this.ensure(8); this.view.setBigUint64(this.pos, BigInt(v)); this.pos += 8; }
    } else {
      if (v >= -32) this.u8(v & 0xff);
      else if (v >= -0x80) { this.u8(0xd0); this.ensure(1); this.view.setInt8(this.pos, v); this.pos += 1; }
      else if (v >= -0x8000) { this.u8(0xd1); this.ensure(2); this.view.setInt16(this.pos, v); this.pos += 2; }
      else if (v >= -0x80000000) { this.u8(0xd2); this.ensure(4); this.view.setInt32(this.pos, v); this.pos += 4; }
      else { this.u8(0xd3); this.ensure(8); this.view.setBigInt64(this.pos, BigInt(v)); this.pos += 8; }
    }
  }

  write(v) {
    if (v === null || v === undefined) this.u8(0xc0);
    else if (v === false) this.u8(0xc2);
    else if (v === true) this.u8(0xc3);
    else if (typeof v === "number") {
      if (Number.isSafeInteger(v)) this.int(v);
      else { this.u8(0xcb); this.ensure(8); this.view.setFloat64(this.pos, v); this.pos += 8; }
    } else if (typeof v === "bigint") {
      this.u8(v < 0n ? 0xd3 : 0xcf);
      this.ensure(8);
      if (v < 0n) this.view.setBigInt64(this.pos, v); else this.view.setBigUint64(this.pos, v);
      this.pos += 8;
    } else if (typeof v === "string") {
      const b = utf8Encoder.encode(v);
      this.head(0xa0, 31, b.length, 0xd9, 0xda, 0xdb);
      this.bytes(b);
    } else if (v instanceof Uint8Array || v instanceof ArrayBuffer || ArrayBuffer.isView(v)) {
      const b = v instanceof Uint8Array ? v
        : v instanceof ArrayBuffer ? new Uint8Array(v) : new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
      this.head(null, 0, b.length, 0xc4, 0xc5, 0xc6);
      this.bytes(b);
    } else if (Array.isArray(v)) {
      this.head(0x90, 15, v.length, null, 0xdc, 0xdd);
      for (const item of v) this.write(item);
    } else if (typeof v === "object") {
      const entries = (v instanceof Map ? [...v.entries()] : Object.entries(v)).filter(([, x]) => x !== undefined);
      this.head(0x80, 15, entries.length, null, 0xde, 0xdf);
      for (const [k, x] of entries) { this.write(k); this.write(x); }
    } else {
      throw new TypeError(`msgpack: cannot encode ${typeof v}`);
    }
  }
}

/** Encode a value to a Uint8Array. Keys whose value is undefined are left out. */
export function encode(value) {
  const w = new Writer();
  w.write(value);
  return w.buf.slice(0, w.pos);
}

class Reader {
  constructor(bytes) {
    this.buf = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }

  need(n) {
    if (this.pos + n > this.buf.length) throw new RangeError("msgpack: truncated data");
  }

  u8() { this.need(1); return this.buf[this.pos++]; }
  take(n) { this.need(n); const b = this.buf.slice(this.pos, this.pos + n); this.pos += n; return b; }
  num(kind, n) { this.need(n); const v = this.view[kind](this.pos); this.pos += n; return v; }
  big(kind) {
    const v = this.num(kind, 8);
    return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
  str(n) { return utf8Decoder.decode(this.take(n)); }
  array(n) { const out = new Array(n); for (let i = 0; i < n; i++) out[i] = this.read(); return out; }
  map(n) {
    const out = {};
    for (let i = 0; i < n; i++) { const k = this.read(); out[String(k)] = this.read(); }
    return out;
  }
  ext(n) { const type = this.num("getInt8", 1); return { ext: type, data: this.take(n) }; }

  read() {
    const c = this.u8();
    if (c < 0x80) return c;
    if (c < 0x90) return this.map(c & 0x0f);
    if (c < 0xa0) return this.array(c & 0x0f);
    if (c < 0xc0) return this.str(c & 0x1f);
    if (c >= 0xe0) return c - 0x100;
    switch (c) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.take(this.u8());
      case 0xc5: return this.take(this.num("getUint16", 2));
      case 0xc6: return this.take(this.num("getUint32", 4));
      case 0xc7: return this.ext(this.u8());
      case 0xc8: return this.ext(this.num("getUint16", 2));
      case 0xc9: return this.ext(this.num("getUint32", 4));
      case 0xca: return this.num("getFloat32", 4);
      case 0xcb: return this.num("getFloat64", 8);
      case 0xcc: return this.u8();
      case 0xcd: return this.num("getUint16", 2);
      case 0xce: return this.num("getUint32", 4);
      case 0xcf: return this.big("getBigUint64");
      case 0xd0: return this.num("getInt8", 1);
      case 0xd1: return this.num("getInt16", 2);
      case 0xd2: return this.num("getInt32", 4);
      case 0xd3: return this.big("getBigInt64");
      case 0xd4: return this.ext(1);
      case 0xd5: return this.ext(2);
      case 0xd6: return this.ext(4);
      case 0xd7: return this.ext(8);
      case 0xd8: return this.ext(16);
      case 0xd9: return this.str(this.u8());
      case 0xda: return this.str(this.num("getUint16", 2));
      case 0xdb: return this.str(this.num("getUint32", 4));
      case 0xdc: return this.array(this.num("getUint16", 2));
      case 0xdd: return this.array(this.num("getUint32", 4));
      case 0xde: return this.map(this.num("getUint16", 2));
      case 0xdf: return this.map(this.num("getUint32", 4));
      default: throw new RangeError(`msgpack: unknown type byte 0x${c.toString(16)}`);
    }
  }
}

/** Decode one value from an ArrayBuffer or Uint8Array (trailing bytes are an error). */
export function decode(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const r = new Reader(bytes);
  const value = r.read();
  if (r.pos !== bytes.length) throw new RangeError("msgpack: trailing bytes after the value");
  return value;
}
