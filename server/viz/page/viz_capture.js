/*
 * viz_capture.js - q, k and v captured from a model, read from a safetensors file in the page.
 *
 * The capture (docs/visualizer.md gives the Python that writes one) is a safetensors file:
 * an 8-byte little-endian header length, a JSON header, then the data.  It holds a tensor
 * `layer.L.q` and `layer.L.k` of shape [heads, tokens, head_dim] for each layer L = 0, 1, ...
 * (F32, F16 or BF16), and its `__metadata__` has `tokens`: a JSON array of the token strings,
 * as text (safetensors metadata values are strings).  A model whose k has fewer heads than its
 * q (grouped-query attention) is read too: q head h uses k head h / (heads of q / heads of k).
 * A capture may also hold `layer.L.v` [heads of k, tokens, v's head_dim] for every layer: the
 * census does without it (it asks for reductions of the weights only), the Generation view
 * (viz_generation.js) needs it, since a cache policy's damage to the output is measured on v.
 *
 * The file is checked by the rules the server applies to the safetensors it stores
 * (server/checkpoint/safetensors.c): the header is a JSON object without duplicate keys,
 * `__metadata__` an object of strings, every tensor's dtype, shape and data_offsets agree with
 * its bytes, which lie inside the data and overlap no other tensor's.  The file is read here
 * and nothing of it is sent but the q and k (and v) of the head being computed, as FP16.
 *
 * Loaded before viz_census.js and viz_generation.js, which call window.vizCapture.
 */
'use strict';

(function () {
  const SIZES = { F64: 8, F32: 4, F16: 2, BF16: 2 };
  const NAME = /^layer\.(0|[1-9][0-9]*)\.(q|k|v)$/;

  /* FP16 bits -> float, all 65536 of them (exact: every half is a float32). */
  const HALF = (function () {
    const t = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
      t[h] = e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1024 + m) * 2 ** (e - 25);
    }
    return t;
  })();

  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

  /* The FP16 bits nearest float x (ties to even); past the largest half: infinity. */
  function toHalf(x) {
    f32[0] = x;
    const b = u32[0], sign = (b >>> 16) & 0x8000, e = (b >>> 23) & 255, m = b & 0x7fffff;
    if (e === 255) return sign | 0x7c00 | (m ? 0x200 : 0);
    const ue = e - 127 + 15;                       /* the exponent of a normal half */
    if (ue >= 31) return sign | 0x7c00;
    if (ue <= 0) {                                  /* a subnormal half, or zero */
      if (ue < -10) return sign;
      const full = m | 0x800000, shift = 14 - ue;  /* x = full * 2^(ue - 38), a half step 2^-24 */
      let h = full >>> shift;
      const rest = full & ((1 << shift) - 1), half = 1 << (shift - 1);
      if (rest > half || (rest === half && (h & 1))) h++;
      return sign | h;
    }
    let h = (ue << 10) | (m >>> 13);
    const rest = m & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;   /* may carry into infinity: right */
    return sign | h;
  }

  function fail(message) {
    throw new Error('capture: ' + message);
  }

  /* Opens a capture (a File): reads and checks its header, then reads the layers' q and k in
   * the background, layer by layer, so that a census can start on the first layers while the
   * rest is read.  Returns {name, file, tokens, T, hasV, layers: [{q, k, v}], ready(L), close()}
   * (v null in a capture without v, and then in every layer); v's bytes are read only when
   * opts.v is true (the census has no use for them): each
   * tensor {name, dtype, H, T, D, offset (its first byte in the file), size (bytes), bytes
   * (a Uint8Array of them, once read)}; ready(L) a promise that layer L's bytes are read;
   * close() stops the reading.  Throws an Error saying what is wrong with the file. */
  async function open(file, opts = {}) {
    if (file.size < 8) fail(`the file has ${file.size} bytes, fewer than the 8 of a safetensors header length`);
    const n = Number(new DataView(await file.slice(0, 8).arrayBuffer()).getBigUint64(0, true));
    if (n > file.size - 8) fail(`the header length is ${n} bytes, past the end of the file: it is truncated or not safetensors`);
    const cap = parseHeader(await file.slice(8, 8 + n).arrayBuffer(), file.size);
    let closed = false, chain = Promise.resolve();
    const ready = cap.layers.map((l) => (chain = chain.then(async () => {
      for (const t of opts.v && l.v ? [l.q, l.k, l.v] : [l.q, l.k]) {
        if (closed) throw new Error('capture: closed');
        t.bytes = new Uint8Array(await file.slice(t.offset, t.offset + t.size).arrayBuffer());
        if (t.bytes.byteLength !== t.size) fail(`tensor "${t.name}" could not be read whole: the file changed`);
      }
    })));
    for (const p of ready) p.catch(() => {});     /* awaited where needed; not unhandled */
    return Object.assign(cap, { name: file.name, file, ready: (L) => ready[L], close: () => { closed = true; } });
  }

  /* Reads a capture's header (textBytes: its JSON, an ArrayBuffer) of a file of fileSize
   * bytes; returns {tokens, T, layers} as open() does, nothing read yet. */
  function parseHeader(textBytes, fileSize) {
    const n = textBytes.byteLength;
    const text = new TextDecoder().decode(textBytes);
    let header;
    try { header = JSON.parse(text); } catch (e) { fail('the header is not JSON (' + e.message + ')'); }
    if (header === null || typeof header !== 'object' || Array.isArray(header)) fail('the header is JSON but not an object');
    checkDuplicates(text);
    const meta = header.__metadata__;
    if (meta !== undefined) {
      if (meta === null || typeof meta !== 'object' || Array.isArray(meta)) fail('"__metadata__" must be an object of strings');
      for (const [key, v] of Object.entries(meta)) if (typeof v !== 'string') fail(`"__metadata__" member "${key}" is not a string`);
    }
    const dataStart = 8 + n, dataLen = fileSize - dataStart;
    const spans = [], layers = [];
    for (const [name, e] of Object.entries(header)) {
      if (name === '__metadata__') continue;
      const t = entry(name, e, dataLen);
      spans.push([t.begin, t.end, name]);
      const m = NAME.exec(name);
      if (!m) continue;                             /* other tensors may travel along */
      if (t.shape.length !== 3) fail(`tensor "${name}" has shape [${t.shape}]; it must be [heads, tokens, head_dim]`);
      if (!(t.dtype in { F32: 1, F16: 1, BF16: 1 })) fail(`tensor "${name}" is ${t.dtype}; q, k and v must be F32, F16 or BF16`);
      const L = Number(m[1]);
      layers[L] = layers[L] || {};
      layers[L][m[2]] = { name, dtype: t.dtype, H: t.shape[0], T: t.shape[1], D: t.shape[2],
        offset: dataStart + t.begin, size: t.end - t.begin, bytes: null };
    }
    spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    let reach = 0, last = null;
    for (const [b, e, name] of spans) {
      if (b === e) continue;
      if (last !== null && b < reach) fail(`the data of tensors "${last}" and "${name}" overlap`);
      reach = e; last = name;
    }
    if (!layers.length) fail('it has no tensor "layer.0.q": a capture holds layer.L.q and layer.L.k for each layer L');
    for (let L = 0; L < layers.length; L++) {
      const l = layers[L];
      if (!l || !l.q || !l.k) fail(`it has no tensor "layer.${L}.${l && l.q ? 'k' : 'q'}"` + (L + 1 < layers.length ? ', but has a layer after it' : ''));
      if (l.q.T !== layers[0].q.T || l.k.T !== l.q.T) fail(`layer ${L}'s q and k must have the ${layers[0].q.T} tokens of layer 0's q`);
      if (l.q.D !== l.k.D) fail(`layer ${L}: q has head_dim ${l.q.D} and k ${l.k.D}`);
      if (l.k.H < 1 || l.q.H % l.k.H) fail(`layer ${L}: q has ${l.q.H} heads, not a multiple of k's ${l.k.H}`);
      if (l.q.D < 1 || l.q.T < 1) fail(`layer ${L} has no tokens or no head dimensions`);
      if (!l.v !== !layers[0].v) fail(`layer ${L} ${l.v ? 'has' : 'has no'} tensor "layer.${L}.v" and layer 0 ${l.v ? 'has not' : 'has'}: v is in every layer or in none`);
      if (l.v && (l.v.T !== l.q.T || l.v.H !== l.k.H || l.v.D < 1))
        fail(`layer ${L}: v has shape [${l.v.H}, ${l.v.T}, ${l.v.D}]; it must be [${l.k.H} (k's heads), ${l.q.T}, head_dim]`);
      l.v = l.v || null;
    }
    let tokens = null;
    if (meta && meta.tokens !== undefined) {
      try { tokens = JSON.parse(meta.tokens); } catch (e) { tokens = null; }
      if (!Array.isArray(tokens) || tokens.some((s) => typeof s !== 'string'))
        fail('"__metadata__" "tokens" must be a JSON array of strings, written as a string');
      if (tokens.length !== layers[0].q.T) fail(`"tokens" has ${tokens.length} strings for ${layers[0].q.T} tokens`);
    }
    return { tokens, T: layers[0].q.T, hasV: !!layers[0].v, layers };
  }

  /* Fails on a key written twice in one object of the header (JSON.parse keeps the last).
   * Every string is matched whole, keys and values alike, so that the scan goes once over the
   * text: a pattern for keys alone would start again at each quote inside a long value (the
   * tokens, with a \" per token), over the rest of it each time. */
  function checkDuplicates(text) {
    const stack = [];
    const re = /("(?:[^"\\]|\\.)*")(\s*:)?|[{}]/g;
    for (let m; (m = re.exec(text));) {
      if (m[0] === '{') stack.push(new Set());
      else if (m[0] === '}') stack.pop();
      else if (m[2] !== undefined) {
        const key = JSON.parse(m[1]), top = stack[stack.length - 1];
        if (top.has(key)) fail(`the header names "${key}" twice`);
        top.add(key);
      }
    }
  }

  /* One tensor entry of the header, checked against the data's length. */
  function entry(name, e, dataLen) {
    if (e === null || typeof e !== 'object') fail(`tensor "${name}" is not an object in the header`);
    if (typeof e.dtype !== 'string') fail(`tensor "${name}" has no "dtype" string`);
    const size = SIZES[e.dtype];
    if (!size) fail(`tensor "${name}" has dtype "${e.dtype}"; this page reads F32, F16 or BF16`);
    const whole = (v) => Number.isSafeInteger(v) && v >= 0;
    if (!Array.isArray(e.shape) || !e.shape.every(whole)) fail(`tensor "${name}" needs a "shape" of whole numbers >= 0`);
    const o = e.data_offsets;
    if (!Array.isArray(o) || o.length !== 2 || !whole(o[0]) || !whole(o[1]) || o[0] > o[1])
      fail(`tensor "${name}" needs "data_offsets" [begin, end] with 0 <= begin <= end`);
    if (o[1] > dataLen) fail(`tensor "${name}" ends at byte ${o[1]} of the data, which has only ${dataLen}: the file is truncated`);
    const bytes = e.shape.reduce((a, b) => a * b, 1) * size;
    if (bytes !== o[1] - o[0]) fail(`tensor "${name}": its shape and dtype make ${bytes} bytes but its data_offsets span ${o[1] - o[0]}`);
    return { dtype: e.dtype, shape: e.shape, begin: o[0], end: o[1] };
  }

  /* The FP16 bits (Uint16Array of T x D) of head h of tensor t (read), little-endian as the file. */
  function headHalf(t, h) {
    const n = t.T * t.D, size = t.dtype === 'F32' ? 4 : 2;
    const start = t.bytes.byteOffset + h * n * size;
    if (t.dtype === 'F16') {
      if (start % 2 === 0) return new Uint16Array(t.bytes.buffer, start, n);
      return new Uint16Array(t.bytes.buffer.slice(start, start + n * 2));
    }
    const dv = new DataView(t.bytes.buffer, start, n * size), out = new Uint16Array(n);
    if (t.dtype === 'F32') for (let i = 0; i < n; i++) out[i] = toHalf(dv.getFloat32(i * 4, true));
    else for (let i = 0; i < n; i++) { u32[0] = dv.getUint16(i * 2, true) << 16; out[i] = toHalf(f32[0]); }
    return out;
  }

  window.vizCapture = { open, headHalf, toHalf, HALF };
})();
