/*
 * viz_pooled.js - attention too large to hold whole, asked of the server as a pooled grid.
 *
 * Past POOLED_MIN_WEIGHTS weights (4096 x 4096 of one head, 64 MiB in float32) the page does
 * not fetch the matrix: it asks POST /v2/models/attention/infer for the attention pooled
 * into about as many cells as the heatmap has pixels (parameters attention_pool_rows and
 * _cols, max by default or mean), with q, k and v sent as raw little-endian bytes after the
 * JSON header (a 32k-token request is 25 MB of float32, where its JSON would be four times
 * that and slow to write and parse).  The answer is a grid of blocks of br x bc tokens;
 * zooming asks again for the visible window only (attention_pool_query_start ... key_end),
 * and once a window has no more tokens than the heatmap has pixels, each cell is one weight,
 * exact.  The server never forms the full matrix either.
 *
 * Loaded before viz.js, which calls window.vizPooled.fetchGrid and .windowOf, and .body for
 * every binary v2 request (the whole matrix too).
 */
'use strict';

(function () {
  const POOLED_MIN_WEIGHTS = 4096 * 4096;

  /* Shapes of a q/k/v request: {B, H, Lq, Lk} (H from heads). */
  function shapeOf(req, depth) {
    const batched = depth(req.q) === 3;
    return {
      B: batched ? req.q.length : 1, H: req.heads || 1, batched,
      Lq: batched ? req.q[0].length : req.q.length, Lk: batched ? req.k[0].length : req.k.length,
    };
  }

  /* The v2 body: {parts: the JSON header and the inputs' bytes, headerLength, header}.  The
   * inputs are req's q, k and v (nested arrays, float32 or float64 as req.dtype says), or
   * req.inputs as they are ([{name, shape, datatype, values: a typed array}]: the heads
   * census sends FP16 bits).  outputs: the names asked for as binary, or null for the
   * server's default outputs (with parameters.binary_data_output). */
  function body(req, params, flatten, outputs) {
    let arrays = req.inputs;
    if (!arrays) {
      const f32 = req.dtype === 'float32', T = f32 ? Float32Array : Float64Array;
      arrays = ['q', 'k', 'v'].map((name) => {
        const shape = [];
        for (let x = req[name]; Array.isArray(x); x = x[0]) shape.push(x.length);
        return { name, shape, datatype: f32 ? 'FP32' : 'FP64', values: flatten(req[name], T) };
      });
    }
    const header = {
      inputs: arrays.map((a) => ({ name: a.name, shape: a.shape, datatype: a.datatype,
        parameters: { binary_data_size: a.values.byteLength } })),
      parameters: params,
    };
    if (outputs) header.outputs = outputs.map((name) => ({ name, parameters: { binary_data: true } }));
    const text = new TextEncoder().encode(JSON.stringify(header));
    return { parts: [text].concat(arrays.map((a) => new Uint8Array(a.values.buffer, a.values.byteOffset, a.values.byteLength))),
      headerLength: text.length, header };
  }

  /* Asks the server for the pooled grid of req over the window w ({q0, q1, k0, k1}, tokens,
   * ends excluded) in about rows x cols cells (req.params: more v2 parameters).  Returns {grid: {B, H, gr, gc, br, bc,
   * values}, ms} or {error}. */
  /* POSTs b (a binary v2 body, as body() makes) to /v2/models/attention/infer; returns the
   * response r, its bytes buf, when they had all come (received, performance.now()), the
   * JSON header's length hlen (Inference-Header-Content-Length) and that header parsed.
   * Parts that are all typed arrays go as one array: a Blob costs Chromium a round of its
   * blob registry per request, some milliseconds, which a sequence's thousands of small
   * steps would pay each (a part that is a slice of a file still goes as a Blob, sent from
   * the file). */
  async function postBinary(b) {
    let body;
    if (b.parts.every((p) => ArrayBuffer.isView(p))) {
      body = new Uint8Array(b.parts.reduce((n, p) => n + p.byteLength, 0));
      let at = 0;
      for (const p of b.parts) { body.set(new Uint8Array(p.buffer, p.byteOffset, p.byteLength), at); at += p.byteLength; }
    } else body = new Blob(b.parts);
    const r = await fetch('/v2/models/attention/infer', {
      method: 'POST', body,
      headers: { 'Content-Type': 'application/octet-stream', 'Inference-Header-Content-Length': String(b.headerLength) },
    });
    const buf = await r.arrayBuffer();
    const received = performance.now();
    const hlen = Number(r.headers.get('Inference-Header-Content-Length') || buf.byteLength);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 0, hlen)));
    return { r, buf, received, hlen, header };
  }

  async function fetchGrid(req, w, rows, cols, reduce, flatten) {
    const params = {
      attention_pool_rows: Math.min(rows, w.q1 - w.q0), attention_pool_cols: Math.min(cols, w.k1 - w.k0),
      attention_pool_reduce: reduce, attention_pool_query_start: w.q0, attention_pool_query_end: w.q1,
      attention_pool_key_start: w.k0, attention_pool_key_end: w.k1,
    };
    if (req.causal) params.causal = true;
    if (req.heads) params.heads = req.heads;
    if (req.scale != null) params.scale = req.scale;
    Object.assign(params, req.params);
    const { r, buf, hlen, header } = await postBinary(body(req, params, flatten, ['attention']));
    if (!r.ok) return { error: typeof header.error === 'string' ? header.error : JSON.stringify(header) };
    const out = header.outputs[0], s = out.shape;
    const T = out.datatype === 'FP32' ? Float32Array : Float64Array;
    return {
      grid: {
        gr: s[s.length - 2], gc: s[s.length - 1], br: header.parameters.attention_pool_block_rows,
        bc: header.parameters.attention_pool_block_cols, values: new T(buf.slice(hlen, hlen + out.parameters.binary_data_size)),
      },
    };
  }

  /* The token window a zoom ({q0, sq, k0, sk}: fractions of the grid) shows of window w. */
  function windowOf(w, zoom) {
    const nq = w.q1 - w.q0, nk = w.k1 - w.k0;
    const q0 = w.q0 + Math.floor(zoom.q0 * nq), k0 = w.k0 + Math.floor(zoom.k0 * nk);
    return { q0, q1: Math.min(w.q1, Math.max(q0 + 1, w.q0 + Math.ceil((zoom.q0 + zoom.sq) * nq))),
      k0, k1: Math.min(w.k1, Math.max(k0 + 1, w.k0 + Math.ceil((zoom.k0 + zoom.sk) * nk))) };
  }

  /* Labels of a grid's cells: the tokens each covers ("24-31", or "24" for one). */
  function cellLabels(start, end, block, names) {
    const out = [];
    for (let a = start; a < end; a += block) {
      const b = Math.min(end, a + block) - 1;
      const name = (i) => (names && i < names.length ? names[i] : String(i));
      out.push(a === b ? name(a) : `${a}–${b}`);
    }
    return out;
  }

  /* The causal mask of a grid: a cell is masked when every key of it is after every query. */
  function causalGridMask(g, w, B) {
    const m = new Uint8Array(B * g.gr * g.gc);
    for (let i = 0; i < g.gr; i++) {
      const lastQ = Math.min(w.q1, w.q0 + (i + 1) * g.br) - 1;
      for (let j = 0; j < g.gc; j++)
        if (w.k0 + j * g.bc > lastQ) for (let b = 0; b < B; b++) m[(b * g.gr + i) * g.gc + j] = 1;
    }
    return m;
  }

  window.vizPooled = { POOLED_MIN_WEIGHTS, shapeOf, body, postBinary, fetchGrid, windowOf, cellLabels, causalGridMask };
})();
