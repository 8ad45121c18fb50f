/*
 * viz_census.js - the heads census: a grid of layers x heads coloured by one statistic of each
 * head's attention, for one of two sources:
 *   a capture   a model's q and k (viz_capture.js), whose attention the server reduces;
 *   the layers  the page holds (a BertViz export, or stored sets PREFIX.0 ... run by viz.js),
 *               whose weights are all here: the same statistics are summed from them, in
 *               float64, by their definitions (weightStatistics).
 *
 * For a capture, the page sends each (layer, head)'s q and k as a binary v2 request with FP16
 * inputs (half of float32's bytes, and the capture is FP16 already) and v of width 1, and asks
 * for the server's reductions of the attention weights only: entropy, max (max_weight and
 * argmax), sink and local, in FP32 (received, for the strip, when a head is clicked).  The
 * server computes them in its sweep over the keys without forming the matrix, so a head of
 * 8,192 tokens answers 24 bytes a token (argmax is INT64).  A cell is the mean over the
 * queries of its statistic; the previous-token share w[i][i-1] is not a reduction of the
 * server's, and is computed here exactly from two that are:
 *   w[i][i-1] = max_weight[i] * exp(scale * (q_i . k_(i-1) - q_i . k_argmax[i]))
 * (every weight of row i is exp(its score - the row's log-sum-exp)), with the dot products in
 * float64 over the FP16 q and k the page sent.
 *
 * Clicking a cell shows the attention each key receives from all queries (received) as a
 * strip along the whole sequence, each pixel the max or the mean of the keys it covers, and
 * the head's pooled heatmap (for a capture viz_pooled.js's request on the same FP16 inputs;
 * for the layers the weights themselves, drawn as the model view draws them).
 *
 * Loaded before viz.js, which calls window.vizCensus.init with its colour scale and drawing.
 */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const IN_FLIGHT = 2;            /* requests at a time: the server computes two on two cores */
  const STATS = {
    entropy: 'mean entropy (nats)', sink: 'sink share', local: 'local share',
    prev: 'previous-token share', max: 'largest weight',
  };
  /* The census asks for these; `received` (its key axis kept) only for a clicked head: the
   * server needs a second sweep over the keys for it, once each row's sum is known. */
  const OUTPUTS = ['entropy', 'max_weight', 'argmax', 'sink', 'local'];

  /* from viz.js: lut, drawPooled(...), pool(), and layers(): the layers the page holds, or
   * null ({source, layers, H, Lq, Lk, batch, tokens, weights(L, h), masked(L, h)}) */
  let deps = null;
  let cap = null;                 /* the capture open (viz_capture.js open) */
  /* {from: 'capture' or 'layers', T (queries), tokens (the keys'), heads: [[stats]],
   *  causal, sink, local, ms, run, and for the layers their source (deps.layers())} */
  let census = null;
  let selected = null;            /* {L, h} */
  let runs = 0;

  function setState(s, note) {
    document.body.dataset.census = s;
    if (note != null) $('census-note').textContent = note;
  }

  /* Reads a capture file and computes its census. */
  async function open(file) {
    selected = null;
    $('census-detail').hidden = true;
    if (cap) cap.close();
    try {
      cap = await window.vizCapture.open(file);
    } catch (e) {
      cap = null; census = null;
      $('census-grid').textContent = '';
      setState('error', e.message);
      return;
    }
    await compute();
  }

  /* The census of whichever source was opened last, with the options as they are now. */
  function recompute() {
    if (census && census.from === 'layers') computeLayers(census.layers);
    else compute();
  }

  /* Head h of layer L: its q and k tensors and heads, {q: [tensor, head], k: [...], D, T}. */
  function headOf(L, h) {
    const l = cap.layers[L];
    return { q: [l.q, h], k: [l.k, Math.floor(h / (l.q.H / l.k.H))], D: l.q.D, T: cap.T };
  }

  /* The FP16 bits of q and k of head h of layer L, once the layer is read: {qh, kh}. */
  async function headHalves(L, h) {
    await cap.ready(L);
    const b = headOf(L, h);
    return { qh: window.vizCapture.headHalf(...b.q), kh: window.vizCapture.headHalf(...b.k) };
  }

  /* What a request sends of head h of tensor t: for an F16 tensor the slice of the file where
   * its bits lie, which the browser sends from the file itself, whether read here yet or not;
   * for others the bits rounded to FP16 here (after the layer is read).  A buffer given to a
   * Blob is copied by Chromium for every request, which cost more than the census's own
   * arithmetic (docs/performance.md). */
  async function sendable(L, [t, h]) {
    const bytes = cap.T * t.D * 2;
    if (t.dtype === 'F16') return cap.file.slice(t.offset + h * bytes, t.offset + (h + 1) * bytes);
    await cap.ready(L);
    return window.vizCapture.headHalf(t, h);
  }

  /* The v2 request of head h of layer L for the reductions `outputs` (OUTPUTS, or
   * ['received']): {parts, headerLength}. */
  async function headRequest(L, h, opts, outputs) {
    const { q, k, D, T } = headOf(L, h);
    const v = new Uint16Array(T);         /* FP16 zeros: v is required, the output is not asked */
    const input = (name, shape) => ({ name, shape, datatype: 'FP16', parameters: { binary_data_size: shape[0] * shape[1] * 2 } });
    const header = {
      inputs: [input('q', [T, D]), input('k', [T, D]), input('v', [T, 1])],
      outputs: outputs.map((name) => ({ name, parameters: { binary_data: true } })),
      parameters: { causal: opts.causal, scale: 1 / Math.sqrt(D), output_datatype: 'FP32', binary_data_output: true },
    };
    const p = header.parameters;
    if (outputs.includes('entropy')) p.entropy = true;
    if (outputs.includes('max_weight')) p.max = true;
    if (outputs.includes('received')) p.received = true;
    if (outputs.includes('sink')) p.sink = opts.sink;
    if (outputs.includes('local')) p.local = opts.local;
    const text = new TextEncoder().encode(JSON.stringify(header));
    return { parts: [text, await sendable(L, q), await sendable(L, k), v], headerLength: text.length };
  }

  /* The values of output o of a v2 answer (its bytes at buf[off ...], or its JSON data). */
  function outputValues(o, buf, off) {
    const size = o.parameters && o.parameters.binary_data_size;
    if (size == null) return Float64Array.from(o.data.flat(Infinity), Number);
    const bytes = buf.slice(off, off + size);
    switch (o.datatype) {
      case 'FP32': return new Float32Array(bytes);
      case 'FP64': return new Float64Array(bytes);
      case 'INT64': return Float64Array.from(new BigInt64Array(bytes), Number);
      case 'FP16': return Float32Array.from(new Uint16Array(bytes), (b) => window.vizCapture.HALF[b]);
      case 'BF16': return Float32Array.from(new Uint16Array(bytes), (b) => new Float32Array(new Uint32Array([b << 16]).buffer)[0]);
      default: throw new Error(`output "${o.name}" has datatype ${o.datatype}`);
    }
  }

  /* Sends one head's request for `outputs`; returns {out: {name: values}} or throws with the
   * server's error. */
  async function askHead(L, h, opts, outputs) {
    const b = await headRequest(L, h, opts, outputs);
    const { r, buf, hlen, header } = await window.vizPooled.postBinary(b);
    if (!r.ok) {
      const e = header.error;
      throw new Error(`layer ${L}, head ${h}: ${r.status} ` + (typeof e === 'string' ? e : JSON.stringify(header)));
    }
    const out = {};
    let off = hlen;
    for (const o of header.outputs || []) {
      out[o.name] = outputValues(o, buf, off);
      off += (o.parameters && o.parameters.binary_data_size) || 0;
    }
    for (const name of outputs)
      if (!out[name]) throw new Error(`layer ${L}, head ${h}: the answer has no "${name}" output`);
    return { out };
  }

  /* Head h of layer L's numbers from its answer `out`, once the layer's q and k are read (the
   * previous-token share needs them). */
  async function headStatistics(L, h, out) {
    const { qh, kh } = await headHalves(L, h);
    return statistics(out, { qh, kh, D: cap.layers[L].q.D, T: cap.T });
  }

  const mean = (a, from) => { let s = 0; for (let i = from; i < a.length; i++) s += a[i]; return a.length > from ? s / (a.length - from) : 0; };

  /* The census's numbers of one head from the server's reductions (see the top); b: the
   * head's FP16 q and k bits (qh, kh), D and T. */
  function statistics(out, b) {
    const { qh, kh, D, T } = b, H = window.vizCapture.HALF, scale = 1 / Math.sqrt(D);
    let prev = 0;
    for (let i = 1; i < T; i++) {
      const m = out.max_weight[i], a = out.argmax[i];
      if (!(m > 0)) continue;                       /* a fully masked row: no weight at all */
      let d1 = 0, d2 = 0;
      for (let t = 0, qi = i * D, kp = (i - 1) * D, ka = a * D; t < D; t++) {
        const x = H[qh[qi + t]];
        d1 += x * H[kh[kp + t]];
        d2 += x * H[kh[ka + t]];
      }
      prev += m * Math.exp(scale * (d1 - d2));
    }
    return {
      entropy: mean(out.entropy, 0), sink: mean(out.sink, 0), local: mean(out.local, 0),
      prev: T > 1 ? prev / (T - 1) : 0, max: mean(out.max_weight, 0), received: null,
    };
  }

  function options() {
    const whole = (id, dflt) => { const v = Math.floor(Number($(id).value)); return Number.isFinite(v) && v >= 0 ? v : dflt; };
    return { causal: $('census-causal').checked, sink: Math.max(1, whole('census-sink', 4)), local: whole('census-local', 16) };
  }

  /* Computes every head, IN_FLIGHT at a time, painting each cell as its answer comes. */
  async function compute() {
    if (!cap) return;
    const run = ++runs, opts = options(), t0 = performance.now();
    $('census-causal').disabled = false;
    census = { from: 'capture', T: cap.T, tokens: cap.tokens,
      heads: cap.layers.map((l) => new Array(l.q.H).fill(null)), ...opts, ms: null, run };
    const jobs = [];
    cap.layers.forEach((l, L) => { for (let h = 0; h < l.q.H; h++) jobs.push([L, h]); });
    setState('computing', `${cap.name}: ${jobs.length} heads of ${cap.T} tokens, computing…`);
    draw();
    /* The requests go one after another, IN_FLIGHT at a time, whether the file is read that far
     * or not; each head's numbers follow its answer and its layer's reading. */
    let next = 0, failed = null;
    const finishing = [];
    const worker = async () => {
      while (next < jobs.length && !failed && run === runs) {
        const [L, h] = jobs[next++];
        try {
          const { out } = await askHead(L, h, opts, OUTPUTS);
          finishing.push(headStatistics(L, h, out).then((s) => {
            if (run !== runs) return;
            census.heads[L][h] = s;
            paintCell(L, h);
          }).catch((e) => { failed = failed || e; }));
        } catch (e) {
          failed = failed || e;
        }
      }
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
    await Promise.all(finishing);
    if (run !== runs) return;
    if (failed) { setState('error', failed.message); return; }
    await new Promise((resolve) => requestAnimationFrame(() => resolve()));
    census.ms = performance.now() - t0;
    draw();
    setState('ready', `${cap.name}: ${cap.layers.length} layers, ${jobs.length} heads of ${cap.T} tokens` +
      `${opts.causal ? ', causal' : ''}, computed and painted in ${(census.ms / 1000).toFixed(2)} s`);
  }

  /* One head's statistics from its weights w ([Lq][Lk], 0 where masked), by the definitions
   * the server's reductions follow; a fully masked row counts as zeros, as the server's do. */
  function weightStatistics(w, Lq, Lk, sink, local) {
    let entropy = 0, sinkSum = 0, localSum = 0, prev = 0, max = 0;
    for (let i = 0; i < Lq; i++) {
      const row = i * Lk, l0 = Math.max(0, i - local), l1 = Math.min(Lk - 1, i + local);
      let m = 0;
      for (let j = 0; j < Lk; j++) {
        const x = w[row + j];
        if (x > 0) entropy -= x * Math.log(x);
        if (x > m) m = x;
      }
      max += m;
      for (let j = 0; j < Math.min(sink, Lk); j++) sinkSum += w[row + j];
      for (let j = l0; j <= l1; j++) localSum += w[row + j];
      if (i >= 1 && i - 1 < Lk) prev += w[row + i - 1];
    }
    return { entropy: entropy / Lq, sink: sinkSum / Lq, local: localSum / Lq, prev: Lq > 1 ? prev / (Lq - 1) : 0,
      max: max / Lq, received: null };
  }

  /* Σᵢ wᵢⱼ per key of one head's weights. */
  function columnSums(w, Lq, Lk) {
    const r = new Float64Array(Lk);
    for (let i = 0; i < Lq; i++) for (let j = 0; j < Lk; j++) r[j] += w[i * Lk + j];
    return r;
  }

  /* The census of the layers the page holds (src: deps.layers(), kept with the census so that
   * it stays whole when the page opens something else). */
  function computeLayers(src) {
    if (!src) return;
    if (cap) cap.close();
    cap = null;
    selected = null;
    $('census-detail').hidden = true;
    const run = ++runs, t0 = performance.now(), opts = options();
    opts.causal = false;            /* the weights carry their own mask */
    $('census-causal').disabled = true;
    census = { from: 'layers', layers: src, T: src.Lq, tokens: src.tokens,
      heads: [], ...opts, ms: null, run };
    for (let L = 0; L < src.layers; L++) {
      const row = [];
      for (let h = 0; h < src.H; h++) row.push(weightStatistics(src.weights(L, h), src.Lq, src.Lk, opts.sink, opts.local));
      census.heads.push(row);
    }
    census.ms = performance.now() - t0;
    draw();
    setState('ready', `${src.source}, batch ${src.batch}: ${src.layers} layers × ${src.H} heads of ${src.Lq} queries × ` +
      `${src.Lk} keys, from the weights themselves (their own mask), in ${(census.ms / 1000).toFixed(2)} s`);
  }

  /* Offers the layers the page holds, if any (viz.js calls this when the census is shown). */
  function offer() {
    const src = deps.layers(), b = $('census-layers');
    b.disabled = !src;
    b.title = src ? `${src.source}: ${src.layers} layers × ${src.H} heads` :
      'open a BertViz export, or run stored sets PREFIX.0 … PREFIX.N (model view), first';
  }

  function statOf(s) { return s ? s[$('census-stat').value] : null; }

  /* The colour range of the chosen statistic over the heads computed so far. */
  function range() {
    let lo = Infinity, hi = -Infinity;
    for (const row of census.heads) for (const s of row) {
      const v = statOf(s);
      if (v != null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }
    return lo <= hi ? [lo, hi] : [0, 1];
  }

  function colourCell(td, v, lo, hi) {
    const li = Math.round((hi > lo ? (v - lo) / (hi - lo) : 0.5) * 255) * 3, lut = deps.lut;
    td.style.backgroundColor = `rgb(${lut[li]},${lut[li + 1]},${lut[li + 2]})`;
    td.style.color = lut[li] * 0.3 + lut[li + 1] * 0.6 + lut[li + 2] * 0.1 > 140 ? '#000' : '#fff';
  }

  /* The grid: a row per layer, its heads by index or by the statistic (largest first). */
  function draw() {
    const box = $('census-grid');
    box.textContent = '';
    if (!census) return;
    const stat = $('census-stat').value, sorted = $('census-order').value === 'stat';
    const [lo, hi] = range();
    const t = document.createElement('table');
    t.id = 'census-table';
    const hr = t.insertRow();
    const corner = document.createElement('th');
    corner.textContent = sorted ? 'layer \\ rank' : 'layer \\ head';
    hr.append(corner);
    const width = Math.max(...census.heads.map((r) => r.length));
    for (let c = 0; c < width; c++) { const th = document.createElement('th'); th.textContent = c; hr.append(th); }
    census.heads.forEach((row, L) => {
      const tr = t.insertRow();
      const th = document.createElement('th');
      th.textContent = L;
      tr.append(th);
      let order = row.map((_, h) => h);
      if (sorted) order = order.sort((a, b) => (statOf(row[b]) ?? -Infinity) - (statOf(row[a]) ?? -Infinity) || a - b);
      for (const h of order) {
        const td = tr.insertCell();
        td.dataset.layer = L; td.dataset.head = h;
        fillCell(td, row[h], stat, sorted, lo, hi);
      }
    });
    box.append(t);
    const mask = census.from === 'layers' ? '; masked as the weights are' : census.causal ? '' : '; not causal';
    $('census-caption').textContent = `${STATS[stat]}: colour from ${window.vizNum.text(lo)} (dark) to ` +
      `${window.vizNum.text(hi)} (yellow)` + mask +
      `; sink: keys 0–${census.sink - 1}; local: |i − j| ≤ ${census.local}`;
  }

  function fillCell(td, s, stat, sorted, lo, hi) {
    td.className = s ? '' : 'pending';
    if (selected && selected.L === +td.dataset.layer && selected.h === +td.dataset.head) td.classList.add('selected');
    if (!s) { td.textContent = '…'; td.title = 'not computed yet'; return; }
    const v = s[stat];
    td.textContent = (sorted ? `h${td.dataset.head} ` : '') + window.vizNum.text(v);
    td.title = `layer ${td.dataset.layer}, head ${td.dataset.head}: ${STATS[stat]} ${v}`;
    td.dataset.v = String(v);
    colourCell(td, v, lo, hi);
  }

  /* Paints one computed cell (the range may have grown: then the whole grid). */
  function paintCell(L, h) {
    const [lo, hi] = range(), old = census.range;
    census.range = [lo, hi];
    if (!old || old[0] !== lo || old[1] !== hi || $('census-order').value === 'stat') { draw(); return; }
    const td = document.querySelector(`#census-table td[data-layer="${L}"][data-head="${h}"]`);
    if (td) fillCell(td, census.heads[L][h], $('census-stat').value, false, lo, hi);
  }

  /* ---------- one head: the keys' received attention and the pooled heatmap ---------- */

  /* The strip's pixels: keys [k0, k1) of each, and its value (max or mean of received). */
  function stripValues(received, width, how) {
    const n = received.length, px = [];
    for (let c = 0; c < Math.min(width, n); c++) {
      const w = Math.min(width, n);
      const k0 = Math.floor(c * n / w), k1 = Math.max(k0 + 1, Math.floor((c + 1) * n / w));
      let v = how === 'mean' ? 0 : -Infinity;
      for (let j = k0; j < k1; j++) v = how === 'mean' ? v + received[j] : Math.max(v, received[j]);
      px.push({ k0, k1, v: how === 'mean' ? v / (k1 - k0) : v });
    }
    return px;
  }

  function drawStrip() {
    const s = census.heads[selected.L][selected.h], cv = $('census-strip'), ctx = cv.getContext('2d');
    const px = stripValues(s.received, cv.width, $('census-strip-how').value);
    let hi = 0;
    for (const p of px) hi = Math.max(hi, p.v);
    ctx.clearRect(0, 0, cv.width, cv.height);
    const w = cv.width / px.length;
    px.forEach((p, c) => {
      const li = Math.round((hi > 0 ? p.v / hi : 0) * 255) * 3, lut = deps.lut;
      ctx.fillStyle = `rgb(${lut[li]},${lut[li + 1]},${lut[li + 2]})`;
      ctx.fillRect(Math.floor(c * w), 0, Math.ceil(w), cv.height);
    });
    cv.dataset.max = String(hi);
    $('census-strip-title').textContent = `Layer ${selected.L}, head ${selected.h}: the attention each key receives ` +
      `from all ${census.T} queries (Σᵢ wᵢⱼ), ${px.length < s.received.length ? `${$('census-strip-how').value} of ` +
      `${(s.received.length / px.length).toFixed(1)} keys a pixel` : 'one key a pixel or more'}; ` +
      `colour from 0 to ${window.vizNum.text(hi)}`;
    return px;
  }

  function hoverStrip(ev) {
    if (!selected || !census.heads[selected.L][selected.h].received) return;
    const cv = $('census-strip'), r = cv.getBoundingClientRect();
    const s = census.heads[selected.L][selected.h];
    const px = stripValues(s.received, cv.width, $('census-strip-how').value);
    const c = Math.min(px.length - 1, Math.max(0, Math.floor((ev.clientX - r.left) / r.width * px.length)));
    const p = px[c], label = (j) => (census.tokens && j < census.tokens.length ? `${j} "${census.tokens[j]}"` : String(j));
    cv.title = p.k1 - p.k0 === 1 ? `key ${label(p.k0)}: received ${p.v}`
      : `keys ${label(p.k0)} – ${label(p.k1 - 1)}: ${$('census-strip-how').value} received ${p.v}`;
  }

  async function selectHead(L, h) {
    if (!census || !census.heads[L] || !census.heads[L][h]) return;
    selected = { L, h };
    draw();
    document.body.dataset.censusHeatmap = 'computing';
    const cv = $('census-heatmap'), ctx = cv.getContext('2d');
    ctx.clearRect(0, 0, cv.width, cv.height);
    const s = census.heads[L][h], run = census.run;
    if (census.from === 'layers') { showLayerHead(L, h); return; }
    if (!s.received) {
      let got;
      try { got = await askHead(L, h, census, ['received']); } catch (e) {
        $('census-heatmap-note').textContent = e.message;
        document.body.dataset.censusHeatmap = 'error';
        return;
      }
      if (run !== census.run) return;
      s.received = Float32Array.from(got.out.received);
    }
    if (!selected || selected.L !== L || selected.h !== h) return;
    $('census-detail').hidden = false;
    drawStrip();
    let halves;
    try { halves = await headHalves(L, h); } catch (e) {
      $('census-heatmap-note').textContent = e.message;
      document.body.dataset.censusHeatmap = 'error';
      return;
    }
    if (!selected || selected.L !== L || selected.h !== h) return;
    const b = { ...headOf(L, h), ...halves };
    const req = {
      causal: census.causal, scale: 1 / Math.sqrt(b.D), params: { output_datatype: 'FP32' },
      inputs: [{ name: 'q', shape: [b.T, b.D], datatype: 'FP16', values: b.qh },
        { name: 'k', shape: [b.T, b.D], datatype: 'FP16', values: b.kh },
        { name: 'v', shape: [b.T, 1], datatype: 'FP16', values: new Uint16Array(b.T) }],
    };
    const w = { q0: 0, q1: b.T, k0: 0, k1: b.T };
    const got = await window.vizPooled.fetchGrid(req, w, cv.height, cv.width, deps.pool(), null);
    if (!selected || selected.L !== L || selected.h !== h) return;
    if (got.error) {
      $('census-heatmap-note').textContent = got.error;
      document.body.dataset.censusHeatmap = 'error';
      return;
    }
    const g = got.grid, m = Float32Array.from(g.values);
    if (census.causal) {
      const mask = window.vizPooled.causalGridMask(g, w, 1);
      for (let i = 0; i < m.length; i++) if (mask[i]) m[i] = -2;
    }
    const img = ctx.createImageData(cv.width, cv.height);
    deps.drawPooled(img, m, g.gr, g.gc, 0, 0, cv.width, cv.height, 0, g.gr, 0, g.gc);
    ctx.putImageData(img, 0, 0);
    $('census-heatmap-note').textContent = `Its attention pooled by ${deps.pool()} into ${g.gr} × ${g.gc} cells ` +
      `of ${g.br} × ${g.bc} tokens (queries down, keys across)`;
    document.body.dataset.censusHeatmap = 'ready';
  }

  /* The detail of head h of layer L of the layers' census: both from its weights. */
  function showLayerHead(L, h) {
    const src = census.layers, s = census.heads[L][h];
    if (!s.received) s.received = columnSums(src.weights(L, h), src.Lq, src.Lk);
    $('census-detail').hidden = false;
    drawStrip();
    const cv = $('census-heatmap'), ctx = cv.getContext('2d'), img = ctx.createImageData(cv.width, cv.height);
    deps.drawPooled(img, src.masked(L, h), src.Lq, src.Lk, 0, 0, cv.width, cv.height, 0, src.Lq, 0, src.Lk);
    ctx.putImageData(img, 0, 0);
    $('census-heatmap-note').textContent = `Its weights, ${src.Lq} queries down and ${src.Lk} keys across` +
      (src.Lq > cv.height || src.Lk > cv.width ? ', each pixel the largest of the weights it covers' : '') +
      ', masked cells hatched';
    document.body.dataset.censusHeatmap = 'ready';
  }

  function init(d) {
    deps = d;
    for (const [k, label] of Object.entries(STATS)) $('census-stat').add(new Option(label, k));
    $('census-file').addEventListener('change', () => { const f = $('census-file').files[0]; if (f) open(f); });
    for (const id of ['census-stat', 'census-order']) $(id).addEventListener('change', draw);
    for (const id of ['census-causal', 'census-sink', 'census-local'])
      $(id).addEventListener('change', () => { selected = null; $('census-detail').hidden = true; recompute(); });
    $('census-layers').addEventListener('click', () => computeLayers(deps.layers()));
    $('census-strip-how').addEventListener('change', () => { if (selected) drawStrip(); });
    $('census-grid').addEventListener('click', (ev) => {
      const td = ev.target.closest('td[data-layer]');
      if (td) selectHead(Number(td.dataset.layer), Number(td.dataset.head));
    });
    $('census-strip').addEventListener('mousemove', hoverStrip);
    offer();
    setState('idle', 'Open a capture of a model\'s q and k (docs/visualizer.md says how to write one), or take the ' +
      'layers loaded: a BertViz export, or stored sets PREFIX.0 … PREFIX.N run in the model view.');
  }

  window.vizCensus = {
    init, offer, STATS,
    /* the values of a v2 answer's output, for viz_generation.js */
    outputValues,
    /* for tests: the heads' numbers, and the strip's pixels of the selected head */
    get census() { return census; },
    strip: () => (selected && census.heads[selected.L][selected.h].received ? drawStrip().map((p) => [p.k0, p.k1, p.v]) : null),
  };
})();
