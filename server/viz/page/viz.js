/*
 * viz.js - the attention visualizer (GET /viz), plain JavaScript, no framework.
 *
 * One state object (the parts a link must reproduce live in the URL hash) and one data
 * object: the attention weights of every (batch, head) as one flat Float64Array or
 * Float32Array [batch][head][query][key], the mask the request implies (causal or `mask`),
 * the output and the token labels.  Every view draws from these:
 *   heatmap  one canvas, each pixel the maximum over the block of cells it covers, so 4096 x
 *            4096 draws as fast as 64 x 64; masked cells hatched grey, never a colour;
 *   lines    BertViz's head view: a line per weight above the threshold, opacity by weight;
 *   grid     a thumbnail per (batch, head) and the mean over heads;
 *   values   the exact numbers, paged;
 *   compare  two results side by side and their difference (drawn by viz_compare.js); B is
 *            the request with causal turned over, an example, the same x with another stored
 *            set, a request carried in the link, or an earlier generation of the set the
 *            request uses (viz_keep.js: "Keep this generation to compare with");
 *   model    a layer x head grid of thumbnails and the attention rollout across layers, for
 *            sources with layers (BertViz exports, stored sets named PREFIX.0 ... PREFIX.N);
 *   neuron   q_i and each k_j of one query and head, their product, dot, score and weight
 *            (drawn by viz_neuron.js from the q and k the server returns with return_qk);
 *   census   a layer x head grid of statistics of a model's heads, from q and k captured
 *            from the model, or from the layers held here (viz_census.js; it keeps its own
 *            data, not this one);
 *   generation  a capture replayed token by token through a sequence under a cache policy,
 *            and the policy census of its heads (viz_generation.js, with its own data too).
 * Several query tokens can be selected (`select=`): the heatmap and lines views then show
 * their attention combined, summed or averaged.  A request typed into the editor travels in
 * the link as `req=` (viz_share.js), so a link reproduces any view.
 * Weights come from POST /v1/attention as JSON, or, for large requests when the server
 * offers the binary tensor extension of the v2 inference protocol (GET /v2), as raw
 * little-endian floats read straight into a typed array.
 */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const VIEWS = ['heatmap', 'lines', 'grid', 'values', 'compare', 'model', 'neuron', 'census', 'generation'];
  const SELECTION_TABLE_KEYS = 64;    /* keys listed with numbers under the heatmap */
  /* Requests whose attention has at least this many weights use the binary v2 form when
   * the server offers it: below it JSON is as fast and keeps the response readable. */
  const BINARY_MIN_WEIGHTS = 65536;
  const LOG_FLOOR = 1e-6;             /* the log scale spans [1e-6, 1] */
  const PAGE_ROWS = 40, PAGE_COLS = 16, OUTPUT_COLS = 32;
  const LINES_MAX_TOKENS = 512;
  /* viridis, at t = 0, 1/8, ..., 1 */
  const STOPS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  const MASK_DARK = [150, 150, 150], MASK_LIGHT = [225, 225, 225], HIDDEN = [255, 255, 255];

  const state = {
    example: '', view: 'heatmap', batch: 0, head: 0, layer: 0, scale: 'linear',
    threshold: 0, topk: 0, select: [], agg: 'sum', compare: '', req: '', model: '', query: 0,
    pool: 'max', transfer: 'exact',
  };
  let data = null;            /* see setData */
  /* The visible window: from fraction k0 (q0) of the keys (queries), a fraction sk (sq) of them. */
  let zoom = { k0: 0, q0: 0, sk: 1, sq: 1 };
  let renderCount = 0;
  let v2Binary = null;        /* null: not asked yet; true/false: GET /v2 said so */
  let currentRequest = null;  /* the request the data answers, when it came from one */
  let compareData = null;     /* {key, data} or {key, error}: the B side of the compare view */
  let weightSetNames = [];

  /* ---------- colour ---------- */

  const LUT = (function () {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const t = i / 255 * (STOPS.length - 1), s = Math.min(Math.floor(t), STOPS.length - 2);
      const f = t - s;
      for (let c = 0; c < 3; c++)
        lut[i * 3 + c] = Math.round(STOPS[s][c] + (STOPS[s + 1][c] - STOPS[s][c]) * f);
    }
    return lut;
  })();

  /* The LUT index of weight w under the current scale. */
  function colorIndex(w) {
    let t;
    if (state.scale === 'log')
      t = (Math.log10(Math.max(w, LOG_FLOOR)) - Math.log10(LOG_FLOOR)) / -Math.log10(LOG_FLOOR);
    else
      t = w;
    return Math.round(Math.min(1, Math.max(0, t)) * 255);
  }

  function colorFor(w) {
    const i = colorIndex(w) * 3;
    return [LUT[i], LUT[i + 1], LUT[i + 2]];
  }

  /* ---------- state in the URL hash ---------- */

  function readHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ''));
    const num = (name, dflt) => {
      const v = Number(p.get(name));
      return p.has(name) && Number.isFinite(v) && v >= 0 ? v : dflt;
    };
    if (p.get('kept')) window.vizKeep.remember(p.get('compare') || '', p.get('kept'));
    return {
      example: p.get('example') || '',
      view: VIEWS.includes(p.get('view')) ? p.get('view') : 'heatmap',
      batch: Math.floor(num('batch', 0)),
      head: p.get('head') === 'mean' ? 'mean' : Math.floor(num('head', 0)),
      layer: Math.floor(num('layer', 0)),
      scale: p.get('scale') === 'log' ? 'log' : 'linear',
      threshold: Math.min(1, num('threshold', 0)),
      topk: Math.floor(num('topk', 0)),
      select: parseSelection(p.get('select') || ''),
      agg: p.get('agg') === 'mean' ? 'mean' : 'sum',
      compare: p.get('compare') || '',
      req: p.get('req') || '',
      model: p.get('model') || '',
      query: Math.floor(num('query', 0)),
      pool: p.get('pool') === 'mean' ? 'mean' : 'max',
      transfer: p.get('transfer') === 'fp16' ? 'fp16' : 'exact',
    };
  }

  /* "0,3,5" -> [0, 3, 5]: distinct non-negative integers in the order given. */
  function parseSelection(text) {
    const out = [];
    for (const part of String(text).split(/[\s,]+/)) {
      const n = Number(part);
      if (part !== '' && Number.isInteger(n) && n >= 0 && !out.includes(n)) out.push(n);
    }
    return out;
  }

  function writeHash() {
    const p = hashParams();
    if (state.req && !state.example) p.set('req', state.req);
    const hash = '#' + p.toString();
    if (hash !== location.hash) history.replaceState(null, '', hash);
  }

  /* The view's state as link parameters, without the request (`req`). */
  function hashParams() {
    const p = new URLSearchParams();
    if (state.example) p.set('example', state.example);
    p.set('view', state.view);
    p.set('batch', state.batch);
    p.set('head', state.head);
    if (state.layer) p.set('layer', state.layer);
    if (state.scale !== 'linear') p.set('scale', state.scale);
    if (state.threshold) p.set('threshold', state.threshold);
    if (state.topk) p.set('topk', state.topk);
    if (state.select.length) p.set('select', state.select.join(','));
    if (state.select.length && state.agg !== 'sum') p.set('agg', state.agg);
    if (state.compare) p.set('compare', state.compare);
    if (window.vizKeep.param(state.compare)) p.set('kept', window.vizKeep.param(state.compare));
    if (state.model) p.set('model', state.model);
    if (state.view === 'neuron') p.set('query', state.query);
    if (state.pool !== 'max') p.set('pool', state.pool);
    if (state.transfer !== 'exact') p.set('transfer', state.transfer);
    return p;
  }

  /* ---------- status and errors ---------- */

  function setStatus(text, status) {
    $('status').textContent = text;
    document.body.dataset.status = status;
  }

  /* The phases of the server's Server-Timing header on answer r ("read;dur=0.05, parse;dur=0.1"):
   * [{name, ms}], in the server's order; [] without the header. */
  function serverTiming(r) {
    return (r.headers.get('Server-Timing') || '').split(',').map((part) => {
      const [name, ...params] = part.split(';').map((x) => x.trim());
      const dur = params.find((x) => x.startsWith('dur='));
      return { name, ms: dur ? Number(dur.slice(4)) : 0 };
    }).filter((p) => p.name);
  }

  /* Shows where the last request's time went: the page's own steps beside the server's phases. */
  function showTimings(t) {
    const el = $('timings');
    const server = t.server || [];
    el.textContent = `page: request ${t.transferMs.toFixed(1)} ms, decode ${t.decodeMs.toFixed(1)} ms, ` +
      `draw ${(t.drawMs || 0).toFixed(1)} ms` +
      (server.length ? ' · server: ' + server.map((p) => `${p.name} ${p.ms.toFixed(2)} ms`).join(', ') : '');
    el.hidden = false;
    document.body.dataset.serverPhases = server.map((p) => p.name).join(',');
  }

  function clearError() {
    $('error').hidden = true;
    $('error').textContent = '';
    $('request').classList.remove('field-error');
  }

  /* Shows an error; when it names a field of the request, selects that member in the
   * request text and outlines the editor. */
  function showError(code, message, field) {
    const box = $('error');
    box.textContent = '';
    const strong = document.createElement('strong');
    strong.textContent = code;
    box.append(strong, ': ' + message);
    if (field) {
      const span = document.createElement('span');
      span.className = 'field';
      span.textContent = field;
      box.append('\nfield: ', span);
      const key = String(field).split(/[.[]/)[0];
      const ta = $('request');
      const m = new RegExp('"' + key.replace(/[^\w-]/g, '\\$&') + '"\\s*:').exec(ta.value);
      ta.classList.add('field-error');
      if (m) {
        const line = ta.value.slice(0, m.index).split('\n').length;
        box.append(' (line ' + line + ' of the request)');
        ta.focus();
        ta.setSelectionRange(m.index, m.index + key.length + 2);
      }
      box.dataset.field = field;
    } else {
      delete box.dataset.field;
    }
    box.dataset.code = code;
    box.hidden = false;
    setStatus('error', 'error');
  }

  /* ---------- shapes ---------- */

  function depth(a) {
    let d = 0;
    while (Array.isArray(a)) { d++; a = a[0]; }
    return d;
  }

  /* Flattens nested arrays of numbers, row-major, into a new typed array of type T; throws
   * when the arrays are ragged. */
  function flatten(a, T) {
    const shape = [];
    for (let x = a; Array.isArray(x); x = x[0]) shape.push(x.length);
    const n = shape.reduce((p, v) => p * v, 1), last = shape.length - 1;
    const out = new T(n);
    let k = 0;
    (function walk(x, d) {
      if (!Array.isArray(x) || (d <= last && x.length !== shape[d])) throw new Error('the arrays are ragged');
      if (d === last) { for (let i = 0; i < x.length; i++) out[k++] = x[i]; return; }
      for (const y of x) walk(y, d + 1);
    })(a, 0);
    return out;
  }

  /* The mask a request implies, [batch][query][key] (1: causal, 2: mask), or null. */
  function requestMask(req, B, Lq, Lk) {
    if (!req || (!req.causal && req.mask == null)) return null;
    const m = new Uint8Array(B * Lq * Lk);
    const userMask = req.mask != null ? req.mask : null;
    const batched = userMask && depth(userMask) === 3;
    for (let b = 0; b < B; b++)
      for (let i = 0; i < Lq; i++)
        for (let j = 0; j < Lk; j++) {
          let v = 0;
          if (req.causal && j > i) v = 1;
          else if (userMask) {
            const row = (batched ? userMask[b] : userMask)[i];
            const e = row ? row[j] : 1;
            if (e === false || e === 0) v = 2;
          }
          m[(b * Lq + i) * Lk + j] = v;
        }
    return m;
  }

  function parseTokens(text) {
    text = text.trim();
    if (!text) return null;
    if (text.startsWith('[')) {
      try { const a = JSON.parse(text); if (Array.isArray(a)) return a.map(String); } catch (e) { /* words */ }
    }
    return text.split(/\s+/);
  }

  /* Makes d the data every view draws from:
   *   {B, H, Lq, Lk, attn (typed, [B][H][Lq][Lk]), mask (Uint8Array [B][Lq][Lk] or null),
   *    output ({D, values (typed, [B][Lq][D])} or null), qTokens, kTokens, layers (for
   *    BertViz files: the attention of every layer), raw (the response text), source}. */
  function setData(d) {
    data = d;
    zoom = { k0: 0, q0: 0, sk: 1, sq: 1 };
    fillSelect($('layer'), d.layers ? d.layers.length : 1, (i) => 'layer ' + i, false);
    fillSelect($('batch'), d.B, (i) => 'batch ' + i, false);
    fillSelect($('head'), d.H, (i) => 'head ' + i, d.H > 1);
    state.batch = Math.min(state.batch, d.B - 1);
    if (state.head !== 'mean') state.head = Math.min(state.head, d.H - 1);
    if (state.head === 'mean' && d.H === 1) state.head = 0;
    $('source').textContent = d.source + ': batch ' + d.B + ', ' + d.H + ' head(s), ' + d.Lq +
      ' queries x ' + d.Lk + ' keys' + (d.mask ? ', masked cells hatched' : '');
    syncControls();
    render();
  }

  function fillSelect(sel, n, label, withMean) {
    sel.textContent = '';
    for (let i = 0; i < n; i++) sel.add(new Option(label(i), String(i)));
    if (withMean) sel.add(new Option('mean over heads', 'mean'));
    sel.disabled = n < 2;
  }

  function syncControls() {
    $('layer').value = String(state.layer);
    $('batch').value = String(state.batch);
    $('head').value = String(state.head);
    $('scale').value = state.scale;
    $('threshold').value = String(state.threshold);
    $('topk').value = String(state.topk);
    $('select').value = state.select.join(',');
    $('neuron-index').value = String(state.query);
    $('pool').value = state.pool;
    $('transfer').value = state.transfer;
    $('agg').value = state.agg;
    if (state.compare && ![...$('compare').options].some((o) => o.value === state.compare))
      $('compare').add(new Option(compareLabel(state.compare), state.compare));
    $('compare').value = state.compare;
    for (const b of document.querySelectorAll('#views button'))
      b.classList.toggle('active', b.dataset.view === state.view);
    for (const v of VIEWS) $(v + '-view').hidden = v !== state.view;
  }

  /* Data from a response of POST /v1/attention (its parsed JSON), with the request that
   * asked for it (for the mask and the shapes), or null when it is not one. */
  function fromResponse(resp, req, raw, source) {
    if (!resp || resp.attention == null) return null;
    const meta = resp.meta || {};
    const f32 = meta.dtype === 'float32';
    const T = f32 ? Float32Array : Float64Array;
    const attn = flatten(resp.attention, T);
    const dep = depth(resp.attention);
    const shape = [];
    let a = resp.attention;
    for (let i = 0; i < dep; i++) { shape.push(a.length); a = a[0]; }
    let B = 1, H = 1;
    const Lq = shape[dep - 2], Lk = shape[dep - 1];
    if (meta.batch != null || meta.heads != null) {
      B = meta.batch != null ? meta.batch : 1;
      H = meta.heads != null ? meta.heads : 1;
    } else if (dep === 4) { B = shape[0]; H = shape[1]; }
    else if (dep === 3) H = shape[0];
    if (B * H * Lq * Lk !== attn.length) return null;
    let output = null;
    if (Array.isArray(resp.output)) {
      let o = flatten(resp.output, T);
      const od = depth(resp.output);
      let rows = od >= 2 ? (od === 3 ? resp.output[0].length : resp.output.length) : 1;
      let D = o.length / (B * rows);
      if (meta.layout === 'columns') {       /* features x tokens: show tokens as rows */
        const t = new T(o.length);
        const F = rows, N = D;
        for (let b = 0; b < B; b++)
          for (let f = 0; f < F; f++)
            for (let n = 0; n < N; n++) t[(b * N + n) * F + f] = o[(b * F + f) * N + n];
        o = t; rows = N; D = F;
      }
      output = { D: D, values: o };
    }
    return {
      B, H, Lq, Lk, attn, output, raw, source,
      mask: requestMask(req, B, Lq, Lk),
      qTokens: parseTokens($('q-tokens').value),
      kTokens: parseTokens($('k-tokens').value) || parseTokens($('q-tokens').value),
    };
  }

  /* Data from a BertViz-style export: {"attention": [layer][batch][head][L][L] (or without
   * the batch axis), "tokens": [...]} or {"all": {"attn": [layer][head][L][L],
   * "left_text": [...], "right_text": [...]}}. */
  function fromBertViz(obj, raw, source) {
    let layers, qTok, kTok;
    if (obj.all && Array.isArray(obj.all.attn)) {
      layers = obj.all.attn.map((l) => [l]);
      qTok = obj.all.left_text; kTok = obj.all.right_text;
    } else if (Array.isArray(obj.attention) && !obj.meta) {
      const d = depth(obj.attention);
      if (d === 5) layers = obj.attention;
      else if (d === 4) layers = obj.attention.map((l) => [l]);
      else if (d === 3) layers = [[obj.attention]];
      else return null;
      qTok = obj.tokens || obj.left_text; kTok = obj.tokens || obj.right_text;
    } else {
      return null;
    }
    const l0 = layers[0];
    const B = l0.length, H = l0[0].length, Lq = l0[0][0].length, Lk = l0[0][0][0].length;
    const flat = layers.map((l) => flatten(l, Float64Array));
    if (flat.some((f) => f.length !== B * H * Lq * Lk)) return null;
    state.layer = Math.min(state.layer, layers.length - 1);
    return {
      B, H, Lq, Lk, attn: flat[state.layer], layers: flat, output: null, mask: null, raw, source,
      qTokens: qTok ? qTok.map(String) : null, kTokens: kTok ? kTok.map(String) : null,
    };
  }

  /* ---------- the matrix shown ---------- */

  /* The weights of (batch, head) as an array [Lq][Lk] (a view, or the mean over heads). */
  function headMatrix(b, h) {
    return headMatrixOf(data, data.attn, b, h);
  }

  /* The same for the weights attn ([B][H][Lq][Lk]) of data d: one layer's, or another
   * result's in the compare view. */
  function headMatrixOf(d, attn, b, h) {
    const n = d.Lq * d.Lk;
    if (h !== 'mean') return attn.subarray((b * d.H + h) * n, (b * d.H + h + 1) * n);
    const m = new Float64Array(n);
    for (let k = 0; k < d.H; k++) {
      const s = attn.subarray((b * d.H + k) * n, (b * d.H + k + 1) * n);
      for (let i = 0; i < n; i++) m[i] += s[i];
    }
    for (let i = 0; i < n; i++) m[i] /= d.H;
    return m;
  }

  /* The weights of (b, h) of d with its masked cells -2, as drawPooled wants them. */
  function maskedMatrixOf(d, attn, b, h) {
    const w = headMatrixOf(d, attn, b, h);
    if (!d.mask) return w;
    const n = d.Lq * d.Lk, m = d.mask.subarray(b * n, (b + 1) * n), s = new Float32Array(n);
    for (let k = 0; k < n; k++) s[k] = m[k] ? -2 : w[k];
    return s;
  }

  /* Draws (b, h) of d whole into canvas cv. */
  function drawThumb(cv, d, attn, b, h) {
    const ctx = cv.getContext('2d'), img = ctx.createImageData(cv.width, cv.height);
    drawPooled(img, maskedMatrixOf(d, attn, b, h), d.Lq, d.Lk, 0, 0, cv.width, cv.height, 0, d.Lq, 0, d.Lk);
    ctx.putImageData(img, 0, 0);
  }

  /* The matrix drawn for (batch, head): the weights, -2 where masked, -1 where the
   * threshold or top-k hides a weight. */
  function shownMatrix(b, h) {
    const w = headMatrix(b, h);
    const { Lq, Lk } = data;
    const mask = data.mask ? data.mask.subarray(b * Lq * Lk, (b + 1) * Lq * Lk) : null;
    if (!mask && !state.threshold && !state.topk) return w;
    const s = new Float32Array(w.length);
    for (let i = 0; i < Lq; i++) {
      let cut = -Infinity;
      if (state.topk > 0 && state.topk < Lk) {
        const row = [];
        for (let j = 0; j < Lk; j++) if (!mask || !mask[i * Lk + j]) row.push(w[i * Lk + j]);
        row.sort((x, y) => y - x);
        if (row.length > state.topk) cut = row[state.topk - 1];
      }
      for (let j = 0; j < Lk; j++) {
        const k = i * Lk + j, v = w[k];
        s[k] = mask && mask[k] ? -2 : (v < state.threshold || v < cut ? -1 : v);
      }
    }
    return s;
  }

  function tokenLabel(tokens, i) {
    return tokens && i < tokens.length ? tokens[i] : String(i);
  }

  /* ---------- heatmap ---------- */

  const PLOT = { x: 110, y: 90, w: 600, h: 620 };

  /* Draws matrix m [rows][cols] into the rectangle (x, y, w, h) of image img, pooling each
   * pixel's block of cells by their maximum; the visible window is rows [q0, q0 + qs) and
   * cols [k0, k0 + ks) (in cells, fractional). */
  function drawPooled(img, m, rows, cols, x, y, w, h, q0, qs, k0, ks) {
    const px = img.data, iw = img.width;
    const j0 = new Int32Array(w), j1 = new Int32Array(w);
    for (let c = 0; c < w; c++) {
      const a = Math.floor(k0 + ks * c / w);
      j0[c] = Math.min(a, cols - 1);
      j1[c] = Math.max(j0[c] + 1, Math.min(cols, Math.floor(k0 + ks * (c + 1) / w)));
    }
    const best = new Float32Array(w);
    for (let r = 0; r < h; r++) {
      const i0 = Math.min(Math.floor(q0 + qs * r / h), rows - 1);
      const i1 = Math.max(i0 + 1, Math.min(rows, Math.floor(q0 + qs * (r + 1) / h)));
      best.fill(-3);
      for (let i = i0; i < i1; i++) {
        const base = i * cols;
        for (let c = 0; c < w; c++) {
          let mx = best[c];
          for (let j = j0[c], e = j1[c]; j < e; j++) { const v = m[base + j]; if (v > mx) mx = v; }
          best[c] = mx;
        }
      }
      let o = ((y + r) * iw + x) * 4;
      for (let c = 0; c < w; c++, o += 4) {
        const v = best[c];
        let col;
        if (v === -2) col = ((x + c + y + r) % 8) < 3 ? MASK_DARK : MASK_LIGHT;
        else if (v === -1) col = HIDDEN;
        else { const li = colorIndex(v) * 3; px[o] = LUT[li]; px[o + 1] = LUT[li + 1]; px[o + 2] = LUT[li + 2]; px[o + 3] = 255; continue; }
        px[o] = col[0]; px[o + 1] = col[1]; px[o + 2] = col[2]; px[o + 3] = 255;
      }
    }
  }

  function drawHeatmap() {
    const cv = $('heatmap'), ctx = cv.getContext('2d');
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, cv.width, cv.height);
    if (!data) return;
    const { Lq, Lk } = data;
    const m = shownMatrix(state.batch, state.head);
    const qs = Lq * zoom.sq, ks = Lk * zoom.sk, q0 = Lq * zoom.q0, k0 = Lk * zoom.k0;
    const img = ctx.getImageData(PLOT.x, PLOT.y, PLOT.w, PLOT.h);
    drawPooled(img, m, Lq, Lk, 0, 0, PLOT.w, PLOT.h, q0, qs, k0, ks);
    ctx.putImageData(img, PLOT.x, PLOT.y);
    /* token labels where a cell is tall (wide) enough for text */
    ctx.fillStyle = '#222';
    ctx.font = '11px sans-serif';
    const ch = PLOT.h / qs, cw = PLOT.w / ks;
    if (ch >= 10) {
      ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
      for (let i = Math.floor(q0); i < Math.min(Lq, q0 + qs); i++)
        ctx.fillText(tokenLabel(data.qTokens, i).slice(0, 14), PLOT.x - 4, PLOT.y + (i - q0 + 0.5) * ch);
    }
    if (cw >= 10) {
      ctx.textAlign = 'left'; ctx.textBaseline = 'middle';
      for (let j = Math.floor(k0); j < Math.min(Lk, k0 + ks); j++) {
        ctx.save();
        ctx.translate(PLOT.x + (j - k0 + 0.5) * cw, PLOT.y - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.fillText(tokenLabel(data.kTokens, j).slice(0, 14), 0, 0);
        ctx.restore();
      }
    }
    ctx.textAlign = 'left'; ctx.textBaseline = 'alphabetic';
    ctx.fillText('rows: queries ↓   columns: keys →', 4, 30);
    ctx.fillText(`batch ${state.batch}, head ${state.head}` +
      (data.layers ? `, layer ${state.layer}` : ''), 4, 14);
    /* a yellow mark left of each selected query row that is in view */
    ctx.fillStyle = '#f9a825';
    for (const i of selectedQueries()) {
      if (i < q0 || i >= q0 + qs) continue;
      ctx.fillRect(PLOT.x - 3, PLOT.y + (i - q0) * ch, 3, Math.max(1, ch));
    }
    drawLegend();
    drawSelection();
  }

  function drawLegend() {
    const cv = $('legend'), ctx = cv.getContext('2d');
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, cv.width, cv.height);
    const top = PLOT.y, h = 400, x = 8, w = 20;
    for (let r = 0; r < h; r++) {
      const i = Math.round((1 - r / (h - 1)) * 255) * 3;
      ctx.fillStyle = `rgb(${LUT[i]},${LUT[i + 1]},${LUT[i + 2]})`;
      ctx.fillRect(x, top + r, w, 1);
    }
    ctx.fillStyle = '#222';
    ctx.font = '11px sans-serif';
    ctx.textBaseline = 'middle';
    const ticks = state.scale === 'log' ? [1, 1e-2, 1e-4, 1e-6] : [1, 0.75, 0.5, 0.25, 0];
    for (const t of ticks) {
      const f = state.scale === 'log' ? (Math.log10(t) - Math.log10(LOG_FLOOR)) / -Math.log10(LOG_FLOOR) : t;
      ctx.fillText(state.scale === 'log' ? t.toExponential(0) : String(t), x + w + 4, top + (1 - f) * (h - 1));
    }
    ctx.fillText(state.scale, x, top - 12);
    const img = ctx.getImageData(x, top + h + 20, w, 20);
    for (let r = 0; r < 20; r++)
      for (let c = 0; c < w; c++) {
        const col = ((x + c + top + h + 20 + r) % 8) < 3 ? MASK_DARK : MASK_LIGHT, o = (r * w + c) * 4;
        img.data[o] = col[0]; img.data[o + 1] = col[1]; img.data[o + 2] = col[2]; img.data[o + 3] = 255;
      }
    ctx.putImageData(img, x, top + h + 20);
    ctx.fillText('masked', x + w + 4, top + h + 30);
    ctx.strokeStyle = '#999';
    ctx.strokeRect(x + 0.5, top + h + 50.5, w, 20);
    ctx.fillText('hidden', x + w + 4, top + h + 60);
  }

  /* The cell under canvas point (x, y), or null. */
  function cellAt(x, y) {
    if (!data || x < PLOT.x || y < PLOT.y || x >= PLOT.x + PLOT.w || y >= PLOT.y + PLOT.h) return null;
    const i = Math.floor(data.Lq * (zoom.q0 + zoom.sq * (y - PLOT.y) / PLOT.h));
    const j = Math.floor(data.Lk * (zoom.k0 + zoom.sk * (x - PLOT.x) / PLOT.w));
    return i < data.Lq && j < data.Lk ? { i, j } : null;
  }

  /* The canvas point at the centre of cell (i, j) at the current zoom (for tests and tools). */
  function cellCenter(i, j) {
    return {
      x: PLOT.x + ((j + 0.5) / data.Lk - zoom.k0) / zoom.sk * PLOT.w,
      y: PLOT.y + ((i + 0.5) / data.Lq - zoom.q0) / zoom.sq * PLOT.h,
    };
  }

  function weightText(b, h, i, j) {
    const n = data.Lq * data.Lk;
    if (h === 'mean') return String(headMatrix(b, 'mean')[i * data.Lk + j]);
    return String(data.attn[(b * data.H + h) * n + i * data.Lk + j]);
  }

  function hoverHeatmap(ev) {
    const tip = $('tooltip'), cv = $('heatmap');
    const r = cv.getBoundingClientRect();
    const c = cellAt(ev.clientX - r.left, ev.clientY - r.top);
    if (!c) { tip.hidden = true; return; }
    const { i, j } = c, b = state.batch;
    const mk = data.mask ? data.mask[(b * data.Lq + i) * data.Lk + j] : 0;
    tip.textContent = `query ${i} "${tokenLabel(data.qTokens, i)}"\nkey   ${j} "${tokenLabel(data.kTokens, j)}"\n` +
      (mk ? `masked (${mk === 1 ? 'causal' : 'mask'})` : `weight ${weightText(b, state.head, i, j)}`);
    tip.dataset.i = i; tip.dataset.j = j;
    tip.hidden = false;
    tip.style.left = (cv.offsetLeft + ev.clientX - r.left + 14) + 'px';
    tip.style.top = (cv.offsetTop + ev.clientY - r.top + 14) + 'px';
  }

  function setupHeatmapInteraction() {
    const cv = $('heatmap');
    let drag = null;
    cv.addEventListener('mousemove', (ev) => {
      if (drag && data) {
        zoom.k0 = clampOrigin(drag.k0 - (ev.clientX - drag.x) / PLOT.w * zoom.sk, zoom.sk);
        zoom.q0 = clampOrigin(drag.q0 - (ev.clientY - drag.y) / PLOT.h * zoom.sq, zoom.sq);
        drawHeatmap();
      }
      if (data) hoverHeatmap(ev);
    });
    cv.addEventListener('mouseleave', () => { $('tooltip').hidden = true; drag = null; });
    cv.addEventListener('mousedown', (ev) => {
      if (ev.shiftKey && data) {
        const r = cv.getBoundingClientRect(), c = cellAt(ev.clientX - r.left, ev.clientY - r.top);
        if (c) toggleSelected(c.i);
        return;
      }
      drag = { x: ev.clientX, y: ev.clientY, k0: zoom.k0, q0: zoom.q0 };
    });
    window.addEventListener('mouseup', () => { if (drag) schedulePooledZoom(false); drag = null; });
    cv.addEventListener('dblclick', () => {
      zoom = { k0: 0, q0: 0, sk: 1, sq: 1 };
      drawHeatmap();
      schedulePooledZoom(true);
    });
    cv.addEventListener('wheel', (ev) => {
      if (!data) return;
      ev.preventDefault();
      const r = cv.getBoundingClientRect();
      const fx = (ev.clientX - r.left - PLOT.x) / PLOT.w, fy = (ev.clientY - r.top - PLOT.y) / PLOT.h;
      if (fx < 0 || fy < 0 || fx > 1 || fy > 1) return;
      /* each axis zooms down to 8 cells across, so a short axis stays whole */
      const ak = zoom.k0 + fx * zoom.sk, aq = zoom.q0 + fy * zoom.sq, f = ev.deltaY > 0 ? 1.25 : 0.8;
      zoom.sk = Math.min(1, Math.max(Math.min(1, 8 / data.Lk), zoom.sk * f));
      zoom.sq = Math.min(1, Math.max(Math.min(1, 8 / data.Lq), zoom.sq * f));
      zoom.k0 = clampOrigin(ak - fx * zoom.sk, zoom.sk);
      zoom.q0 = clampOrigin(aq - fy * zoom.sq, zoom.sq);
      drawHeatmap();
      schedulePooledZoom(false);
    }, { passive: false });
  }

  function clampOrigin(v, span) {
    return Math.min(1 - span, Math.max(0, v));
  }

  /* ---------- selection: several queries at once ---------- */

  /* The selected queries this data has (a link may name more than a request has). */
  function selectedQueries() {
    return data ? state.select.filter((i) => i < data.Lq) : [];
  }

  /* The combined attention of the selected queries over the keys for (batch, head): the sum
   * or the mean of their rows (a masked weight is 0 in every row, so it adds nothing). */
  function selectionRow(b, h) {
    const rows = selectedQueries(), Lk = data.Lk, w = headMatrix(b, h);
    const out = new Float64Array(Lk);
    for (const i of rows)
      for (let j = 0; j < Lk; j++) out[j] += w[i * Lk + j];
    if (state.agg === 'mean' && rows.length)
      for (let j = 0; j < Lk; j++) out[j] /= rows.length;
    return out;
  }

  /* Under the heatmap: the combined row as a colour strip over the keys in view and its
   * numbers for the first keys. */
  function drawSelection() {
    const rows = selectedQueries(), box = $('selection');
    box.hidden = rows.length === 0;
    if (!rows.length) return;
    const row = selectionRow(state.batch, state.head);
    /* a sum of n rows spans [0, n]: its colour is that of the mean, so both read alike */
    const per = state.agg === 'sum' ? rows.length : 1;
    $('selection-title').textContent = `${state.agg === 'sum' ? 'Sum' : 'Mean'} of the attention of ` +
      `${rows.length} selected quer${rows.length === 1 ? 'y' : 'ies'} (` +
      rows.map((i) => `${i} "${tokenLabel(data.qTokens, i)}"`).join(', ') + ') over the keys' +
      (state.agg === 'sum' ? '; coloured by the mean' : '');
    const cv = $('selection-strip'), ctx = cv.getContext('2d');
    const img = ctx.createImageData(cv.width, cv.height);
    const k0 = data.Lk * zoom.k0, ks = data.Lk * zoom.sk;
    for (let c = 0; c < cv.width; c++) {
      const j = Math.min(data.Lk - 1, Math.floor(k0 + ks * c / cv.width));
      const li = colorIndex(row[j] / per) * 3;
      for (let r = 0; r < cv.height; r++) {
        const o = (r * cv.width + c) * 4;
        img.data[o] = LUT[li]; img.data[o + 1] = LUT[li + 1]; img.data[o + 2] = LUT[li + 2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    const t = document.createElement('table');
    t.id = 'selection-table';
    const n = Math.min(data.Lk, SELECTION_TABLE_KEYS);
    const head = t.insertRow(), vals = t.insertRow();
    head.append(document.createElement('th'));
    const th = document.createElement('th');
    th.textContent = state.agg;
    vals.append(th);
    for (let j = 0; j < n; j++) {
      const k = document.createElement('th');
      k.textContent = tokenLabel(data.kTokens, j);
      head.append(k);
      const td = vals.insertCell();
      window.vizNum.cell(td, row[j]);
      td.dataset.j = j;
    }
    $('selection-values').textContent = '';
    $('selection-values').append(t);
    if (n < data.Lk) {
      const note = document.createElement('p');
      note.className = 'note';
      note.textContent = `The first ${n} of ${data.Lk} keys; the strip shows those in view.`;
      $('selection-values').append(note);
    }
  }

  function toggleSelected(i) {
    const k = state.select.indexOf(i);
    if (k >= 0) state.select.splice(k, 1);
    else state.select.push(i);
    syncControls();
    render();
  }

  /* ---------- lines ---------- */

  let linesHover = null;      /* {side: 'q' | 'k', index} */

  function drawLines() {
    const cv = $('lines'), ctx = cv.getContext('2d');
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, cv.width, cv.height);
    if (!data) return;
    const nq = Math.min(data.Lq, LINES_MAX_TOKENS), nk = Math.min(data.Lk, LINES_MAX_TOKENS);
    $('lines-note').textContent = (nq < data.Lq || nk < data.Lk)
      ? `The first ${LINES_MAX_TOKENS} tokens of each side; the heatmap shows them all.` :
      'Hover a token to isolate its lines.';
    const rowH = Math.max(1.2, Math.min(20, (cv.height - 20) / Math.max(nq, nk)));
    const xl = 150, xr = cv.width - 150, top = 10;
    const m = shownMatrix(state.batch, state.head);
    const buckets = Array.from({ length: 20 }, () => []);
    const sel = selectedQueries();
    for (let i = 0; i < nq; i++) {
      if (sel.length && !sel.includes(i)) continue;
      if (linesHover && linesHover.side === 'q' && linesHover.index !== i) continue;
      for (let j = 0; j < nk; j++) {
        if (linesHover && linesHover.side === 'k' && linesHover.index !== j) continue;
        const w = m[i * data.Lk + j];
        if (w <= 0 || w < Math.max(state.threshold, 1e-3)) continue;
        buckets[Math.min(19, Math.floor(w * 20))].push(i, j);
      }
    }
    ctx.lineWidth = Math.max(0.5, Math.min(2, rowH / 6));
    buckets.forEach((pairs, k) => {
      if (!pairs.length) return;
      ctx.strokeStyle = `rgba(21, 101, 192, ${(k + 0.5) / 20})`;
      ctx.beginPath();
      for (let p = 0; p < pairs.length; p += 2) {
        ctx.moveTo(xl, top + (pairs[p] + 0.5) * rowH);
        ctx.lineTo(xr, top + (pairs[p + 1] + 0.5) * rowH);
      }
      ctx.stroke();
    });
    if (rowH >= 8) {
      ctx.font = Math.min(12, rowH - 1) + 'px sans-serif';
      ctx.textBaseline = 'middle';
      ctx.fillStyle = '#222';
      ctx.textAlign = 'right';
      for (let i = 0; i < nq; i++) ctx.fillText(tokenLabel(data.qTokens, i).slice(0, 18), xl - 6, top + (i + 0.5) * rowH);
      ctx.textAlign = 'left';
      for (let j = 0; j < nk; j++) ctx.fillText(tokenLabel(data.kTokens, j).slice(0, 18), xr + 6, top + (j + 0.5) * rowH);
    }
    if (sel.length) {
      /* the combined weight of the selected queries for each key: a bar right of its label,
       * 40 px for a weight of 1 (per query, for a sum) */
      const row = selectionRow(state.batch, state.head), per = state.agg === 'sum' ? sel.length : 1;
      ctx.fillStyle = '#f9a825';
      for (let j = 0; j < nk; j++)
        ctx.fillRect(cv.width - 44, top + j * rowH + rowH * 0.15, 40 * Math.min(1, row[j] / per), Math.max(1, rowH * 0.7));
      ctx.fillStyle = '#222';
      for (const i of sel) if (i < nq) ctx.fillRect(xl - 3, top + i * rowH, 3, Math.max(1, rowH));
      $('lines-note').textContent = `Lines of the ${sel.length} selected quer${sel.length === 1 ? 'y' : 'ies'}; ` +
        `bars: their ${state.agg} for each key.`;
    }
    cv.dataset.rowHeight = rowH;
  }

  function setupLinesInteraction() {
    const cv = $('lines');
    cv.addEventListener('mousemove', (ev) => {
      if (!data) return;
      const r = cv.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
      const rowH = Number(cv.dataset.rowHeight) || 1, idx = Math.floor((y - 10) / rowH);
      let h = null;
      if (x < 150 && idx >= 0 && idx < Math.min(data.Lq, LINES_MAX_TOKENS)) h = { side: 'q', index: idx };
      else if (x > cv.width - 150 && idx >= 0 && idx < Math.min(data.Lk, LINES_MAX_TOKENS)) h = { side: 'k', index: idx };
      if (JSON.stringify(h) !== JSON.stringify(linesHover)) { linesHover = h; drawLines(); }
    });
    cv.addEventListener('mouseleave', () => { linesHover = null; drawLines(); });
  }

  /* ---------- heads grid ---------- */

  function drawGrid() {
    const grid = $('grid');
    grid.textContent = '';
    if (!data) return;
    const size = 120;
    const heads = [];
    for (let h = 0; h < data.H; h++) heads.push(h);
    if (data.H > 1) heads.push('mean');
    for (let b = 0; b < data.B; b++)
      for (const h of heads) {
        const fig = document.createElement('figure');
        fig.dataset.batch = b; fig.dataset.head = h;
        if (b === state.batch && String(h) === String(state.head)) fig.classList.add('selected');
        const cv = document.createElement('canvas');
        cv.width = size; cv.height = size;
        const ctx = cv.getContext('2d');
        const img = ctx.createImageData(size, size);
        drawPooled(img, shownMatrix(b, h), data.Lq, data.Lk, 0, 0, size, size, 0, data.Lq, 0, data.Lk);
        ctx.putImageData(img, 0, 0);
        const cap = document.createElement('figcaption');
        cap.textContent = (data.B > 1 ? `batch ${b}, ` : '') + (h === 'mean' ? 'mean' : `head ${h}`);
        fig.append(cv, cap);
        fig.addEventListener('click', () => {
          state.batch = b; state.head = h; state.view = 'heatmap';
          syncControls(); render();
        });
        grid.append(fig);
      }
  }

  /* ---------- values ---------- */

  let valuePage = { row: 0, col: 0 };

  function pager(label, page, pages, onChange) {
    const div = document.createElement('div');
    div.className = 'pager';
    const prev = document.createElement('button'), next = document.createElement('button');
    prev.textContent = '‹'; next.textContent = '›';
    prev.disabled = page <= 0; next.disabled = page >= pages - 1;
    prev.addEventListener('click', () => onChange(page - 1));
    next.addEventListener('click', () => onChange(page + 1));
    div.append(label + ` ${page + 1} of ${pages}`, prev, next);
    return div;
  }

  function drawValues() {
    const box = $('values');
    box.textContent = '';
    if (!data) return;
    const { Lq, Lk } = data, b = state.batch;
    const rowPages = Math.ceil(Lq / PAGE_ROWS), colPages = Math.ceil(Lk / PAGE_COLS);
    valuePage.row = Math.min(valuePage.row, rowPages - 1);
    valuePage.col = Math.min(valuePage.col, colPages - 1);
    const r0 = valuePage.row * PAGE_ROWS, r1 = Math.min(Lq, r0 + PAGE_ROWS);
    const c0 = valuePage.col * PAGE_COLS, c1 = Math.min(Lk, c0 + PAGE_COLS);
    const h2 = document.createElement('h3');
    h2.textContent = `Attention, batch ${b}, head ${state.head} (query rows, key columns)`;
    box.append(h2);
    if (rowPages > 1) box.append(pager('rows', valuePage.row, rowPages, (p) => { valuePage.row = p; drawValues(); }));
    if (colPages > 1) box.append(pager('columns', valuePage.col, colPages, (p) => { valuePage.col = p; drawValues(); }));
    const w = headMatrix(b, state.head), s = shownMatrix(b, state.head);
    const t = document.createElement('table');
    t.id = 'attention-table';
    const head = t.insertRow();
    head.append(document.createElement('th'));
    for (let j = c0; j < c1; j++) {
      const th = document.createElement('th');
      th.textContent = tokenLabel(data.kTokens, j);
      head.append(th);
    }
    for (let i = r0; i < r1; i++) {
      const tr = t.insertRow();
      const th = document.createElement('th');
      th.textContent = tokenLabel(data.qTokens, i);
      tr.append(th);
      for (let j = c0; j < c1; j++) {
        const td = tr.insertCell();
        window.vizNum.cell(td, w[i * Lk + j]);
        td.dataset.i = i; td.dataset.j = j;
        if (s[i * Lk + j] === -2) { td.className = 'masked'; td.title = 'masked: ' + td.title; }
        else if (s[i * Lk + j] === -1) { td.className = 'hidden'; td.title = 'below the threshold or top-k: ' + td.title; }
      }
    }
    box.append(t);
    if (!data.output) return;
    const D = data.output.D, oc1 = Math.min(D, OUTPUT_COLS);
    const h3 = document.createElement('h3');
    h3.textContent = `Output, batch ${b} (token rows, feature columns${D > OUTPUT_COLS ? `; the first ${OUTPUT_COLS} of ${D}` : ''})`;
    const o = document.createElement('table');
    o.id = 'output-table';
    const oh = o.insertRow();
    oh.append(document.createElement('th'));
    for (let f = 0; f < oc1; f++) { const th = document.createElement('th'); th.textContent = f; oh.append(th); }
    for (let i = r0; i < r1; i++) {
      const tr = o.insertRow();
      const th = document.createElement('th');
      th.textContent = tokenLabel(data.qTokens, i);
      tr.append(th);
      for (let f = 0; f < oc1; f++) {
        const td = tr.insertCell();
        window.vizNum.cell(td, data.output.values[(b * Lq + i) * D + f]);
        td.dataset.i = i; td.dataset.j = f;
      }
    }
    box.append(h3, o);
  }

  /* ---------- compare ---------- */

  function compareLabel(spec) {
    const kept = window.vizKeep.info(spec);
    if (kept) return window.vizKeep.label(kept);
    if (spec === 'causal') return 'the same request, causal turned over';
    if (spec.startsWith('example:')) return 'example ' + spec.slice(8);
    if (spec.startsWith('set:')) return 'the same x with stored set ' + spec.slice(4);
    if (spec.startsWith('req:')) return 'the request in the link';
    return spec;
  }

  /* The request B of the compare view for spec, given request A; throws when spec cannot be
   * applied to A. */
  async function compareRequest(spec, a) {
    if (spec === 'causal') return Object.assign({}, a, { causal: !a.causal });
    if (spec.startsWith('example:')) {
      const name = spec.slice(8);
      const r = await fetch('/viz/examples/' + encodeURIComponent(name) + '.json');
      if (!r.ok) throw new Error(`there is no example "${name}"`);
      return (await r.json()).request;
    }
    if (spec.startsWith('set:')) {
      if (a.x == null) throw new Error('a stored set applies to x: request A has q, k and v, not x');
      return Object.assign({}, a, { weights: spec.slice(4) });
    }
    if (spec.startsWith('req:')) return JSON.parse(await window.vizShare.decodeRequest(spec.slice(4)));
    if (spec.startsWith('kept:')) return window.vizKeep.request(spec);
    throw new Error(`"${spec}" is not something to compare with (causal, example:NAME, set:NAME, req:..., kept:NAME@G)`);
  }

  /* Fetches the B side when the view or what it compares has changed, then draws. */
  async function ensureCompare() {
    const note = $('compare-title');
    if (!state.compare || !currentRequest) {
      note.textContent = !state.compare ? 'Choose what to compare with under "Compare with".'
        : 'The compare view needs a request: this view came from a file.';
      document.body.dataset.compare = 'none';
      return;
    }
    const kept = window.vizKeep.info(state.compare), asked = currentRequest;
    if (kept && window.vizKeep.setOf(asked) === kept.name) {
      if (checkingA) return;
      checkingA = true;
      document.body.dataset.compare = 'pending';
      let fresh;
      try { fresh = await currentA(kept.name); } catch (e) { fresh = e; } finally { checkingA = false; }
      if (asked !== currentRequest || state.view !== 'compare') return;
      if (fresh instanceof Error) { compareError('A: ' + fresh.message); return; }
      if (fresh) { setData(fresh); return; }    /* renders, and so comes back here */
    }
    const key = state.compare + '\n' + JSON.stringify(currentRequest);
    if (!compareData || compareData.key !== key) {
      compareData = { key, pending: true };
      document.body.dataset.compare = 'pending';
      note.textContent = 'computing B…';
      try {
        const req = await compareRequest(state.compare, currentRequest);
        const got = await postAttention(req, 'B: ' + compareLabel(state.compare));
        if (got.error) throw new Error(`${got.error.code}: ${got.error.message}`);
        const b = got.data;
        if (b.B !== data.B || b.H !== data.H || b.Lq !== data.Lq || b.Lk !== data.Lk)
          throw new Error(`the two results differ in shape: A is ${data.B}x${data.H}x${data.Lq}x${data.Lk}, ` +
            `B is ${b.B}x${b.H}x${b.Lq}x${b.Lk} (batch x heads x queries x keys)`);
        if (compareData.key === key) compareData = { key, data: b };
      } catch (e) {
        if (compareData.key === key) compareData = { key, error: e.message };
      }
      if (state.view === 'compare') render();
      return;
    }
    if (compareData.pending) return;
    drawCompare();
  }

  /* With an earlier generation of set name as B, A is the set's current generation: when a
   * PUT has replaced the generation data shows, returns A asked for again with the current
   * one pinned (weights_generation), else null. */
  let checkingA = false;
  async function currentA(name) {
    const g = await window.vizKeep.currentGeneration(name);
    if (data.generation === g) return null;
    const got = await postAttention(Object.assign({}, currentRequest, { weights_generation: g }),
      `POST /v1/attention with set ${name}, generation ${g} (current)`);
    if (got.error) throw new Error(`${got.error.code}: ${got.error.message}`);
    got.data.generation = g;
    return got.data;
  }

  function compareError(message) {
    $('compare-title').textContent = 'No comparison: ' + message;
    document.body.dataset.compare = 'error';
    for (const id of ['compare-a', 'compare-b', 'compare-diff']) {
      const cv = $(id);
      cv.getContext('2d').clearRect(0, 0, cv.width, cv.height);
    }
    $('compare-values').textContent = '';
  }

  function drawCompare() {
    const note = $('compare-title');
    if (compareData.error) { compareError(compareData.error); return; }
    document.body.dataset.compare = 'ready';
    const b = compareData.data, bi = state.batch, h = state.head, kept = window.vizKeep.info(state.compare);
    note.textContent = `A: ${data.source}; B: ${compareLabel(state.compare)}; batch ${bi}, head ${h}`;
    $('compare-a-label').textContent = kept && data.generation ? `A: set ${kept.name}, generation ${data.generation} (current)` : 'A';
    $('compare-b-label').textContent = 'B: ' + compareLabel(state.compare);
    const shown = window.vizCompare.draw(headMatrix(bi, h), headMatrixOf(b, b.attn, bi, h), data.Lq, data.Lk,
      (cv) => drawThumb(cv, data, data.attn, bi, h), (cv) => drawThumb(cv, b, b.attn, bi, h),
      { q: (i) => tokenLabel(data.qTokens, i), k: (j) => tokenLabel(data.kTokens, j) });
    compareData.diff = shown.diff;
  }

  function hoverCompare(ev) {
    if (!data || !compareData || !compareData.diff) return;
    const r = ev.target.getBoundingClientRect();
    const c = window.vizCompare.cellAt(ev.clientX - r.left, ev.clientY - r.top, data.Lq, data.Lk);
    if (!c) return;
    const k = c.i * data.Lk + c.j, b = compareData.data;
    const a = headMatrix(state.batch, state.head)[k], bv = headMatrixOf(b, b.attn, state.batch, state.head)[k];
    $('compare-tip').textContent = `query ${c.i} "${tokenLabel(data.qTokens, c.i)}", key ${c.j} "${tokenLabel(data.kTokens, c.j)}"\n` +
      `A ${a}\nB ${bv}\nA − B ${compareData.diff[k]}`;
  }

  /* ---------- neuron ---------- */

  /* q or k of a return_qk answer as [B][L][DK] numbers, whatever the layout. */
  function tokensOf(member, B, L, columns) {
    const a = flatten(member, Float64Array), DK = a.length / (B * L);
    if (!columns) return { values: a, DK };
    const t = new Float64Array(a.length);
    for (let b = 0; b < B; b++)
      for (let f = 0; f < DK; f++)
        for (let n = 0; n < L; n++) t[(b * L + n) * DK + f] = a[(b * DK + f) * L + n];
    return { values: t, DK };
  }

  /* Asks the server for q and k of the request shown (once per request), then draws. */
  async function ensureNeuron() {
    const note = $('neuron-note');
    if (!currentRequest) {
      note.textContent = 'The neuron view needs a request: this view came from a file.';
      document.body.dataset.neuron = 'none';
      return;
    }
    const key = JSON.stringify(currentRequest);
    if (!data.qk || data.qk.key !== key) {
      if (data.qk && data.qk.pending === key) return;
      data.qk = { pending: key };
      document.body.dataset.neuron = 'pending';
      note.textContent = 'asking the server for q and k…';
      const d = data;
      try {
        const r = await fetch('/v1/attention', { method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify(Object.assign({}, currentRequest, { return_qk: true, return_attention: false })) });
        const resp = await r.json();
        if (!r.ok) throw new Error(resp.error ? resp.error.code + ': ' + resp.error.message : String(r.status));
        const columns = resp.meta.layout === 'columns';
        d.qk = { key, q: tokensOf(resp.q, d.B, d.Lq, columns), k: tokensOf(resp.k, d.B, d.Lk, columns),
          scale: resp.meta.scale };
      } catch (e) {
        d.qk = { key, error: e.message };
      }
      if (d === data && state.view === 'neuron') render();
      return;
    }
    if (data.qk.error) {
      note.textContent = 'No q and k: ' + data.qk.error;
      document.body.dataset.neuron = 'error';
      return;
    }
    const b = state.batch, h = state.head === 'mean' ? 0 : state.head;
    const i = Math.min(state.query, data.Lq - 1), { q, k } = data.qk, dh = q.DK / data.H;
    note.textContent = state.head === 'mean' ? 'q and k belong to one head: head 0 is shown.' : '';
    const keys = [], masked = [], weights = [];
    const w = headMatrix(b, h), m = data.mask;
    for (let j = 0; j < Math.min(data.Lk, window.vizNeuron.MAX_KEYS); j++) {
      keys.push(k.values.subarray((b * data.Lk + j) * k.DK + h * dh, (b * data.Lk + j) * k.DK + (h + 1) * dh));
      weights.push(w[i * data.Lk + j]);
      masked.push(m ? m[(b * data.Lq + i) * data.Lk + j] !== 0 : false);
    }
    window.vizNeuron.draw($('neuron'), {
      i, h, scale: data.qk.scale, keys, weights, masked,
      q: q.values.subarray((b * data.Lq + i) * q.DK + h * dh, (b * data.Lq + i) * q.DK + (h + 1) * dh),
      labels: { q: (x) => tokenLabel(data.qTokens, x), k: (x) => tokenLabel(data.kTokens, x) },
    });
    document.body.dataset.neuron = 'ready';
  }

  /* ---------- model: layers x heads, and rollout ---------- */

  /* Attention rollout (Abnar & Zuidema, 2020) for batch b: each layer's mean over heads, half
   * of it plus half the identity (the residual connection), rows renormalised, multiplied
   * from the first layer up: R = A'_L ... A'_1.  Only for self-attention (Lq = Lk). */
  function rollout(b) {
    const L = data.Lq, n = L * L;
    let r = null;
    for (const attn of data.layers) {
      const a = headMatrixOf(data, attn, b, 'mean'), m = new Float64Array(n);
      for (let i = 0; i < L; i++) {
        let sum = 0;
        for (let j = 0; j < L; j++) { m[i * L + j] = 0.5 * a[i * L + j] + (i === j ? 0.5 : 0); sum += m[i * L + j]; }
        if (sum > 0) for (let j = 0; j < L; j++) m[i * L + j] /= sum;
      }
      if (!r) { r = m; continue; }
      const next = new Float64Array(n);
      for (let i = 0; i < L; i++)
        for (let k = 0; k < L; k++) {
          const f = m[i * L + k];
          if (f !== 0) for (let j = 0; j < L; j++) next[i * L + j] += f * r[k * L + j];
        }
      r = next;
    }
    return r;
  }

  function drawModel() {
    const box = $('model');
    box.textContent = '';
    if (!data.layers) {
      $('model-note').textContent = 'The model view needs layers: open a BertViz export, or choose stored sets ' +
        'named PREFIX.0 … PREFIX.N under "Layers from stored sets" for a request with x.';
      return;
    }
    const heads = [];
    for (let h = 0; h < data.H; h++) heads.push(h);
    if (data.H > 1) heads.push('mean');
    $('model-note').textContent = `${data.layers.length} layers x ${data.H} head(s), batch ${state.batch}: ` +
      'click a thumbnail to open it.';
    box.style.gridTemplateColumns = `auto repeat(${heads.length}, auto)`;
    box.append(document.createElement('span'));
    for (const h of heads) {
      const s = document.createElement('span');
      s.className = 'row-label';
      s.textContent = h === 'mean' ? 'mean' : 'head ' + h;
      box.append(s);
    }
    data.layers.forEach((attn, l) => {
      const s = document.createElement('span');
      s.className = 'row-label';
      s.textContent = 'layer ' + l;
      box.append(s);
      for (const h of heads) {
        const fig = document.createElement('figure');
        fig.dataset.layer = l; fig.dataset.head = h;
        const cv = document.createElement('canvas');
        cv.width = 72; cv.height = 72;
        drawThumb(cv, data, attn, state.batch, h);
        fig.append(cv);
        fig.addEventListener('click', () => {
          state.layer = l; state.head = h; state.view = 'heatmap';
          data.attn = data.layers[l];
          syncControls(); render();
        });
        box.append(fig);
      }
    });
    drawRollout();
  }

  function drawRollout() {
    if (data.Lq !== data.Lk) {
      const p = document.createElement('p');
      p.className = 'note';
      p.textContent = 'Rollout needs self-attention (as many queries as keys).';
      $('model').after(p);
      return;
    }
    const r = rollout(state.batch), L = data.Lq;
    const wrap = document.createElement('div');
    wrap.id = 'rollout';
    const h = document.createElement('h3');
    h.textContent = `Attention rollout across the ${data.layers.length} layers (Abnar & Zuidema, 2020), batch ${state.batch}`;
    const cv = document.createElement('canvas');
    cv.width = 240; cv.height = 240;
    const ctx = cv.getContext('2d'), img = ctx.createImageData(240, 240);
    drawPooled(img, r, L, L, 0, 0, 240, 240, 0, L, 0, L);
    ctx.putImageData(img, 0, 0);
    const t = document.createElement('table');
    t.id = 'rollout-table';
    const n = Math.min(L, PAGE_COLS);
    for (let i = 0; i < n; i++) {
      const tr = t.insertRow();
      for (let j = 0; j < n; j++) {
        const td = tr.insertCell();
        window.vizNum.cell(td, r[i * L + j]);
        td.dataset.i = i; td.dataset.j = j;
      }
    }
    wrap.append(h, cv, t);
    const old = $('rollout');
    if (old) old.remove();
    $('model').after(wrap);
  }

  /* The layers held, for the census (viz_census.js), or null: bound to this data and batch,
   * so that a census keeps its weights when the page opens something else. */
  function censusLayers() {
    if (!data || !data.layers) return null;
    const d = data, b = state.batch;
    return {
      source: d.source, layers: d.layers.length, H: d.H, Lq: d.Lq, Lk: d.Lk, batch: b, tokens: d.kTokens,
      weights: (l, h) => headMatrixOf(d, d.layers[l], b, h), masked: (l, h) => maskedMatrixOf(d, d.layers[l], b, h),
    };
  }

  /* Stored sets named PREFIX.0 ... PREFIX.N (N >= 1, none missing): the prefixes. */
  function layerPrefixes(names) {
    const found = new Map();
    for (const name of names) {
      const m = /^(.+)\.(\d+)$/.exec(name);
      if (!m) continue;
      if (!found.has(m[1])) found.set(m[1], new Set());
      found.get(m[1]).add(Number(m[2]));
    }
    const out = [];
    for (const [prefix, set] of found) {
      let n = 0;
      while (set.has(n)) n++;
      if (n >= 2) out.push({ prefix, layers: n });
    }
    return out;
  }

  /* Applies stored sets PREFIX.0 ... to the x of the request in the editor, one request per
   * layer, and shows them as one source with layers. */
  async function runLayers(prefix) {
    clearError();
    const found = layerPrefixes(weightSetNames).find((p) => p.prefix === prefix);
    if (!found) { showError('unknown_layers', `There are no stored sets ${prefix}.0, ${prefix}.1, …`, null); return; }
    const req = readRequest();
    if (!req) return;
    if (req.x == null) { showError('missing_x', 'Layers from stored sets apply to x: the request has no x.', 'x'); return; }
    setStatus(`computing ${found.layers} layers…`, 'loading');
    const layers = [];
    let first = null;
    for (let l = 0; l < found.layers; l++) {
      const r = Object.assign({}, req, { weights: `${prefix}.${l}` });
      const got = await postAttention(r, `stored sets ${prefix}.0 … ${prefix}.${found.layers - 1} on the same x`);
      if (got.error) { showError(got.error.code, `layer ${l}: ${got.error.message}`, got.error.field); return; }
      if (first && (got.data.H !== first.H || got.data.Lq !== first.Lq || got.data.Lk !== first.Lk)) {
        showError('layers_differ', `layer ${l} has another shape than layer 0`, null);
        return;
      }
      if (!first) first = got.data;
      layers.push(got.data.attn);
    }
    currentRequest = null;
    first.layers = layers;
    state.layer = Math.min(state.layer, layers.length - 1);
    first.attn = layers[state.layer];
    setData(first);
  }

  /* ---------- render ---------- */

  function render() {
    writeHash();
    $('keep').hidden = !window.vizKeep.setOf(currentRequest);
    if (data) {
      if (state.view === 'heatmap') drawHeatmap();
      else if (state.view === 'lines') drawLines();
      else if (state.view === 'grid') drawGrid();
      else if (state.view === 'values') drawValues();
      else if (state.view === 'compare') ensureCompare();
      else if (state.view === 'neuron') ensureNeuron();
      else if (state.view === 'model') drawModel();
      else if (state.view === 'census') window.vizCensus.offer();
    }
    renderCount++;
    document.body.dataset.render = renderCount;
    if (data) setStatus(data.source, 'ready');
  }

  /* ---------- requests ---------- */

  function formatRequest(req) {
    const keys = Object.keys(req);
    return '{\n' + keys.map((k) => ' ' + JSON.stringify(k) + ': ' + JSON.stringify(req[k])).join(',\n') + '\n}';
  }

  function readRequest() {
    try {
      return JSON.parse($('request').value);
    } catch (e) {
      showError('invalid_json', 'The request is not JSON: ' + e.message, null);
      $('request').classList.add('field-error');
      return null;
    }
  }

  async function hasBinaryV2() {
    if (v2Binary === null) {
      try {
        const r = await fetch('/v2');
        const j = r.ok ? await r.json() : {};
        v2Binary = Array.isArray(j.extensions) && j.extensions.includes('binary_tensor_data');
      } catch (e) {
        v2Binary = false;
      }
    }
    return v2Binary;
  }

  /* The number of attention weights req asks for, or 0 when it cannot say cheaply. */
  function attentionSize(req) {
    if (!Array.isArray(req.q) || !Array.isArray(req.k)) return 0;
    const d = depth(req.q);
    const B = d === 3 ? req.q.length : 1;
    const Lq = d === 3 ? req.q[0].length : req.q.length;
    const Lk = d === 3 ? req.k[0].length : req.k.length;
    return B * (req.heads || 1) * Lq * Lk;
  }

  /* POST /v2/models/attention/infer with binary outputs: the JSON header, whose length is
   * the Inference-Header-Content-Length response header, then each output's raw
   * little-endian bytes in order (parameters.binary_data_size each).  With *Large answers
   * in* FP16 (state.transfer) the outputs come as FP16 (output_datatype), half of float32's
   * bytes, and are widened here to a Float32Array.  Returns data, or null when the server
   * answers this request with an error (shown). */
  async function computeBinary(req) {
    const f32 = req.dtype === 'float32';
    const T = f32 ? Float32Array : Float64Array;
    const params = { binary_data_output: true };
    if (state.transfer === 'fp16') params.output_datatype = 'FP16';
    if (req.causal) params.causal = true;
    if (req.heads) params.heads = req.heads;
    if (req.scale != null) params.scale = req.scale;
    const t0 = performance.now();
    /* q, k and v as raw bytes after the JSON header, in the request's precision (exact) */
    const body = window.vizPooled.body(req, params, flatten, null);
    const { r, buf, received: t1, hlen, header } = await window.vizPooled.postBinary(body);
    if (!r.ok) {
      const e = header.error;
      showError(r.status + '', typeof e === 'string' ? e : JSON.stringify(header), null);
      return null;
    }
    let off = hlen;
    const out = {};
    for (const o of header.outputs || []) {
      const size = o.parameters && o.parameters.binary_data_size;
      if (size != null && o.datatype === 'FP16') {
        out[o.name] = { shape: o.shape, values: widenHalf(new Uint16Array(buf.slice(off, off + size))) };
        off += size;
      } else if (size != null) {
        out[o.name] = { shape: o.shape, values: new T(buf.slice(off, off + size)) };
        off += size;
      } else {
        out[o.name] = { shape: o.shape, values: T.from(o.data) };
      }
    }
    const a = out.attention;
    if (!a) throw new Error('the v2 answer has no "attention" output');
    const s = a.shape, Lq = s[s.length - 2], Lk = s[s.length - 1];
    const batched = depth(req.q) === 3;
    const B = batched ? s[0] : 1, H = a.values.length / (B * Lq * Lk);
    const o = out.output;
    const d = {
      B, H, Lq, Lk, attn: a.values, raw: null, source: 'POST /v2/models/attention/infer (binary)',
      output: o ? { D: o.values.length / (B * Lq), values: o.values } : null,
      mask: requestMask(req, B, Lq, Lk),
      qTokens: parseTokens($('q-tokens').value),
      kTokens: parseTokens($('k-tokens').value) || parseTokens($('q-tokens').value),
      header, asked: body.header,
      timing: { transferMs: t1 - t0, decodeMs: performance.now() - t1, server: serverTiming(r) },
    };
    return d;
  }

  /* FP16 bits to a Float32Array (exact: every half is a float). */
  function widenHalf(bits) {
    const out = new Float32Array(bits.length), H = window.vizCapture.HALF;
    for (let i = 0; i < bits.length; i++) out[i] = H[bits[i]];
    return out;
  }

  /* POST /v1/attention with req: {data} (see setData; source names it), or {error: the
   * API's error object}. */
  async function postAttention(req, source) {
    const t0 = performance.now();
    const r = await fetch('/v1/attention', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(req),
    });
    const text = await r.text();
    const t1 = performance.now();
    let resp;
    try { resp = JSON.parse(text); } catch (e) { resp = null; }
    if (!r.ok) return { error: resp && resp.error ? resp.error : { code: String(r.status), message: text } };
    const d = fromResponse(resp, req, text, source);
    if (!d) {
      return { error: { code: 'no_attention', field: 'return_attention',
        message: 'The answer has no attention matrix (is "return_attention" false?).' } };
    }
    d.timing = { transferMs: t1 - t0, decodeMs: performance.now() - t1, server: serverTiming(r) };
    return { data: d };
  }

  /* Asks for the pooled grid of req over window w (viz_pooled.js) and returns data for it,
   * or null when the server answered an error (shown). */
  async function computePooled(req, w) {
    const P = window.vizPooled, sh = P.shapeOf(req, depth);
    const t0 = performance.now();
    const got = await P.fetchGrid(req, w, PLOT.h, PLOT.w, state.pool, flatten);
    if (got.error) { showError('failed', got.error, null); return null; }
    const g = got.grid, t1 = performance.now();
    const names = parseTokens($('q-tokens').value), knames = parseTokens($('k-tokens').value) || names;
    document.body.dataset.pooled = [w.q0, w.q1, w.k0, w.k1, g.br, g.bc].join(',');
    return {
      B: sh.B, H: sh.H, Lq: g.gr, Lk: g.gc, attn: g.values, output: null, raw: null,
      mask: req.causal ? P.causalGridMask(g, w, sh.B) : null,
      qTokens: P.cellLabels(w.q0, w.q1, g.br, names), kTokens: P.cellLabels(w.k0, w.k1, g.bc, knames),
      source: `POST /v2/models/attention/infer, pooled: ${sh.Lq} x ${sh.Lk} tokens, ` +
        (g.br === 1 && g.bc === 1 ? 'every weight' : `blocks of ${g.br} x ${g.bc} (${state.pool})`) +
        (w.q0 || w.k0 || w.q1 < sh.Lq || w.k1 < sh.Lk ? `, queries ${w.q0}–${w.q1 - 1}, keys ${w.k0}–${w.k1 - 1}` : ''),
      pooled: { req, w, Lq: sh.Lq, Lk: sh.Lk, br: g.br, bc: g.bc },
      timing: { transferMs: t1 - t0, decodeMs: 0 },
    };
  }

  /* After a zoom or pan of a pooled heatmap settles, asks for the window it shows. */
  let pooledTimer = null;
  function schedulePooledZoom(reset) {
    if (!data || !data.pooled) return;
    clearTimeout(pooledTimer);
    pooledTimer = setTimeout(async () => {
      const p = data.pooled;
      const w = reset ? { q0: 0, q1: p.Lq, k0: 0, k1: p.Lk } : window.vizPooled.windowOf(p.w, zoom);
      if (w.q0 === p.w.q0 && w.q1 === p.w.q1 && w.k0 === p.w.k0 && w.k1 === p.w.k1 && !reset) return;
      setStatus('pooling the window…', 'loading');
      const d = await computePooled(p.req, w);
      if (d) setData(d);
    }, 250);
  }

  /* Sends the request in the editor (or req, given by a script) and shows its answer. */
  async function compute(given) {
    clearError();
    const req = given || readRequest();
    if (!req) return;
    setStatus('computing…', 'loading');
    const t0 = performance.now();
    try {
      let d = null;
      const qkv = req.q && !req.x && req.mask == null && req.layout !== 'columns';
      const binary = qkv && attentionSize(req) >= BINARY_MIN_WEIGHTS && await hasBinaryV2();
      if (binary && attentionSize(req) > window.vizPooled.POOLED_MIN_WEIGHTS) {
        const sh = window.vizPooled.shapeOf(req, depth);
        d = await computePooled(req, { q0: 0, q1: sh.Lq, k0: 0, k1: sh.Lk });
        if (!d) return;
      } else if (binary) {
        d = await computeBinary(req);
        if (!d) return;
      } else {
        const got = await postAttention(req, 'POST /v1/attention (JSON)');
        if (got.error) { showError(got.error.code, got.error.message, got.error.field); return; }
        d = got.data;
      }
      const t2 = performance.now();
      currentRequest = req;
      setData(d);
      d.timing.drawMs = performance.now() - t2;
      showTimings(d.timing);
    } catch (e) {
      showError('failed', 'No answer could be shown: ' + e.message, null);
    }
  }

  async function loadExample(name) {
    clearError();
    setStatus('loading ' + name + '…', 'loading');
    const r = await fetch('/viz/examples/' + encodeURIComponent(name) + '.json');
    if (!r.ok) { showError('unknown_example', `There is no example "${name}".`, null); return; }
    const ex = await r.json();
    $('request').value = formatRequest(ex.request);
    $('example').value = name;
    await compute();
  }

  /* The example a visit without a link (no #...) opens on, so that the first screen shows
   * what the page draws; #how-to-start (index.html) names it. */
  const FIRST_EXAMPLE = 'seed001_causal';

  async function loadExampleList() {
    try {
      const r = await fetch('/viz/examples/');
      const j = await r.json();
      for (const e of j.examples) {
        $('example').add(new Option(e.name, e.name));
        $('compare').add(new Option('example ' + e.name, 'example:' + e.name));
      }
      if (state.example) $('example').value = state.example;
    } catch (e) { /* offline: the file and request inputs still work */ }
  }

  async function loadWeightSets() {
    try {
      const r = await fetch('/v1/weight-sets');
      const j = await r.json();
      weightSetNames = (j.weight_sets || []).map((s) => s.name);
      for (const name of weightSetNames) {
        $('weight-set').add(new Option(name, name));
        $('compare').add(new Option('stored set ' + name + ' (same x)', 'set:' + name));
      }
      for (const p of layerPrefixes(weightSetNames))
        $('model-prefix').add(new Option(`${p.prefix}.0 … ${p.prefix}.${p.layers - 1}`, p.prefix));
    } catch (e) { /* offline */ }
  }

  function useWeightSet(name) {
    const req = readRequest();
    if (!req) return;
    if (name) req.weights = name;
    $('request').value = formatRequest(req);
  }

  /* ---------- files ---------- */

  async function openFile(file) {
    clearError();
    const text = await file.text();
    let obj;
    try { obj = JSON.parse(text); } catch (e) { showError('invalid_json', file.name + ' is not JSON: ' + e.message, null); return; }
    state.example = '';
    $('example').value = '';
    let d = null;
    try {
      if (obj.expect && obj.request) d = fromResponse(obj.expect, obj.request, JSON.stringify(obj.expect), file.name);
      else if (obj.meta && obj.attention) d = fromResponse(obj, null, text, file.name);
      else d = fromBertViz(obj, text, file.name);
    } catch (e) {
      d = null;
    }
    if (!d) {
      showError('unknown_file', file.name + ' is neither a response of POST /v1/attention nor a BertViz export ' +
        '({"attention": [layer][batch][head][query][key], "tokens": [...]}).', null);
      return;
    }
    if (obj.tokens && !d.qTokens) { d.qTokens = obj.tokens.map(String); d.kTokens = d.qTokens; }
    currentRequest = null;
    state.req = '';
    setData(d);
  }

  /* ---------- export ---------- */

  function download(blob, name) {
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  function baseName() {
    return (state.example || 'attention') + `-b${state.batch}-h${state.head}`;
  }

  /* The canvas of the current view (the grid and values views are drawn into one). */
  function viewCanvas() {
    if (state.view === 'heatmap') {
      const h = $('heatmap'), l = $('legend');
      const c = document.createElement('canvas');
      c.width = h.width + l.width; c.height = h.height;
      const ctx = c.getContext('2d');
      ctx.drawImage(h, 0, 0); ctx.drawImage(l, h.width, 0);
      return c;
    }
    if (state.view === 'lines') return $('lines');
    if (state.view === 'grid') {
      const figs = [...document.querySelectorAll('#grid figure')];
      const per = Math.max(1, Math.min(figs.length, 6)), cell = 136;
      const c = document.createElement('canvas');
      c.width = per * cell; c.height = Math.ceil(figs.length / per) * (cell + 16);
      const ctx = c.getContext('2d');
      ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, c.width, c.height);
      ctx.fillStyle = '#222'; ctx.font = '11px sans-serif';
      figs.forEach((f, k) => {
        const x = (k % per) * cell, y = Math.floor(k / per) * (cell + 16);
        ctx.drawImage(f.querySelector('canvas'), x + 8, y + 8);
        ctx.fillText(f.querySelector('figcaption').textContent, x + 8, y + cell + 6);
      });
      return c;
    }
    const rows = [...document.querySelectorAll('#attention-table tr')];
    const c = document.createElement('canvas');
    const cols = rows.length ? rows[0].cells.length : 1;
    c.width = Math.max(200, cols * 150); c.height = Math.max(40, rows.length * 18 + 10);
    const ctx = c.getContext('2d');
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, c.width, c.height);
    ctx.fillStyle = '#222'; ctx.font = '12px monospace';
    rows.forEach((tr, r) => [...tr.cells].forEach((td, k) => ctx.fillText(td.textContent, k * 150 + 4, r * 18 + 16)));
    return c;
  }

  function exportPng() {
    if (!data) return;
    viewCanvas().toBlob((blob) => download(blob, baseName() + '-' + state.view + '.png'), 'image/png');
  }

  function csvField(s) {
    return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  /* CSV of the matrix shown: query labels down, key labels across; a weight the mask
   * hides or the threshold / top-k drops is an empty field. */
  function exportCsv() {
    if (!data) return;
    const w = headMatrix(state.batch, state.head), s = shownMatrix(state.batch, state.head);
    const lines = [['query\\key'].concat(Array.from({ length: data.Lk }, (_, j) => tokenLabel(data.kTokens, j))).map(csvField).join(',')];
    for (let i = 0; i < data.Lq; i++) {
      const row = [csvField(tokenLabel(data.qTokens, i))];
      for (let j = 0; j < data.Lk; j++) row.push(s[i * data.Lk + j] < 0 ? '' : String(w[i * data.Lk + j]));
      lines.push(row.join(','));
    }
    download(new Blob([lines.join('\n') + '\n'], { type: 'text/csv' }), baseName() + '.csv');
  }

  function exportJson() {
    if (!data) return;
    const text = data.raw != null ? data.raw : JSON.stringify(data.header || {});
    download(new Blob([text], { type: 'application/json' }), (state.example || 'attention') + '.response.json');
  }

  /* The request in the editor as a curl command line for this server. */
  function curlCommand() {
    const req = readRequest();
    if (!req) return null;
    const body = JSON.stringify(req).replace(/'/g, "'\\''");
    return `curl -s ${location.origin}/v1/attention -H 'Content-Type: application/json' -d '${body}'`;
  }

  async function copyCurl() {
    const cmd = curlCommand();
    if (cmd == null) return;
    const ta = $('curl');
    ta.value = cmd;
    ta.hidden = false;
    ta.select();
    try {
      await navigator.clipboard.writeText(cmd);
      setStatus('curl command copied', document.body.dataset.status);
    } catch (e) {
      setStatus('curl command selected below: copy it with Ctrl+C', document.body.dataset.status);
    }
  }

  /* ---------- share ---------- */

  /* Puts a link to this view, with the request when it is not an example's, into the
   * page (and the clipboard when the browser lets us). */
  async function share() {
    const note = $('share-note'), box = $('share-link');
    note.hidden = true;
    box.hidden = true;
    let text = null;
    if (!state.example && currentRequest) text = JSON.stringify(currentRequest);
    const p = hashParams(), keptHere = state.compare.startsWith('kept:');
    if (keptHere) p.delete('compare');
    const link = await window.vizShare.buildLink(p, text);
    if (link.tooLong) {
      note.textContent = `This request takes ${link.tooLong} characters in a link even compressed; a link ` +
        `carries up to ${window.vizShare.SHARE_MAX_CHARS}.  Store its weights as a set ` +
        '(PUT /v1/weight-sets/NAME) and send x with "weights": "NAME": the link then stays short.';
      note.hidden = false;
      return;
    }
    if (!state.example && !currentRequest && data) {
      note.textContent = 'This view came from a file, which a link cannot carry: the link holds the view\'s settings only.';
      note.hidden = false;
    } else if (keptHere) {
      note.textContent = window.vizKeep.shareNote(state.compare);
      note.hidden = false;
    }
    const hash = new URL(link.url).hash;
    state.req = new URLSearchParams(hash.slice(1)).get('req') || '';
    writeHash();
    box.value = link.url;
    box.hidden = false;
    box.select();
    try { await navigator.clipboard.writeText(link.url); setStatus('link copied', document.body.dataset.status); }
    catch (e) { setStatus('link selected below: copy it with Ctrl+C', document.body.dataset.status); }
  }

  /* "Keep this generation to compare with": the set the request uses, as it is now, becomes
   * B of the compare view (viz_keep.js), and stays B when the set is replaced. */
  async function keepGeneration() {
    const note = $('keep-note');
    note.hidden = true;
    let k;
    try {
      k = await window.vizKeep.keep(currentRequest, (spec) => { const p = hashParams(); p.set('compare', spec); return p; });
    } catch (e) { showError('keep_failed', 'The set could not be kept: ' + e.message, null); return; }
    if (![...$('compare').options].some((o) => o.value === k.spec)) $('compare').add(new Option(compareLabel(k.spec), k.spec));
    state.compare = k.spec;
    note.textContent = window.vizKeep.keptNote(k);
    note.hidden = false;
    syncControls();
    render();
  }

  /* Opens the request a link carries (`req=`) in the editor and computes it. */
  async function openLinkedRequest() {
    let text;
    try { text = await window.vizShare.decodeRequest(state.req); }
    catch (e) { showError('bad_link', e.message, null); return; }
    $('request').value = text;
    await compute();
  }

  /* ---------- wiring ---------- */

  function onControl() {
    state.batch = Number($('batch').value) || 0;
    state.head = $('head').value === 'mean' ? 'mean' : Number($('head').value) || 0;
    state.scale = $('scale').value;
    state.threshold = Math.min(1, Math.max(0, Number($('threshold').value) || 0));
    state.topk = Math.max(0, Math.floor(Number($('topk').value) || 0));
    state.select = parseSelection($('select').value);
    state.agg = $('agg').value === 'mean' ? 'mean' : 'sum';
    state.compare = $('compare').value;
    state.transfer = $('transfer').value === 'fp16' ? 'fp16' : 'exact';
    const pool = $('pool').value === 'mean' ? 'mean' : 'max';
    if (pool !== state.pool) {
      state.pool = pool;
      if (data && data.pooled) {
        const p = data.pooled;
        computePooled(p.req, p.w).then((d) => { if (d) setData(d); });
      }
    }
    const layer = Number($('layer').value) || 0;
    if (data && data.layers && layer !== state.layer) { state.layer = layer; data.attn = data.layers[layer]; }
    render();
  }

  async function applyHash() {
    const h = readHash();
    const exampleChanged = h.example && h.example !== state.example;
    const requestChanged = !h.example && h.req && h.req !== state.req;
    Object.assign(state, h);
    syncControls();
    if (exampleChanged) await loadExample(state.example);
    else if (requestChanged) await openLinkedRequest();
    else if (data) { if (data.layers) data.attn = data.layers[Math.min(state.layer, data.layers.length - 1)]; render(); }
  }

  function init() {
    for (const b of document.querySelectorAll('#views button'))
      b.addEventListener('click', () => { state.view = b.dataset.view; syncControls(); render(); });
    for (const id of ['layer', 'batch', 'head', 'scale', 'threshold', 'topk', 'select', 'agg', 'compare', 'pool', 'transfer'])
      $(id).addEventListener('change', onControl);
    $('run').addEventListener('click', () => {
      state.example = ''; state.req = ''; $('example').value = ''; compute();
    });
    $('share').addEventListener('click', share);
    $('keep').addEventListener('click', keepGeneration);
    /* back from replacing a set elsewhere: the compare view checks its generation again */
    window.addEventListener('focus', () => { if (state.view === 'compare' && window.vizKeep.info(state.compare)) render(); });
    $('model-prefix').addEventListener('change', () => {
      state.model = $('model-prefix').value;
      if (state.model) { state.view = 'model'; syncControls(); runLayers(state.model); }
      else writeHash();
    });
    for (const id of ['compare-a', 'compare-b', 'compare-diff']) $(id).addEventListener('mousemove', hoverCompare);
    $('neuron-index').addEventListener('change', () => {
      state.query = Math.max(0, Math.floor(Number($('neuron-index').value) || 0));
      render();
    });
    $('example').addEventListener('change', () => {
      state.example = $('example').value;
      writeHash();
      if (state.example) loadExample(state.example);
    });
    $('weight-set').addEventListener('change', () => useWeightSet($('weight-set').value));
    $('open-file').addEventListener('change', () => { const f = $('open-file').files[0]; if (f) openFile(f); });
    $('export-png').addEventListener('click', exportPng);
    $('export-csv').addEventListener('click', exportCsv);
    $('export-json').addEventListener('click', exportJson);
    $('copy-curl').addEventListener('click', copyCurl);
    for (const id of ['q-tokens', 'k-tokens'])
      $(id).addEventListener('change', () => {
        if (!data) return;
        data.qTokens = parseTokens($('q-tokens').value);
        data.kTokens = parseTokens($('k-tokens').value) || data.qTokens;
        render();
      });
    setupHeatmapInteraction();
    setupLinesInteraction();
    window.vizCensus.init({ lut: LUT, drawPooled, pool: () => state.pool, layers: censusLayers });
    window.vizGeneration.init({ lut: LUT });
    window.addEventListener('hashchange', applyHash);
    $('compare').add(new Option('(nothing)', ''));
    $('compare').add(new Option(compareLabel('causal'), 'causal'));
    Object.assign(state, readHash());
    syncControls();
    Promise.all([loadWeightSets(), loadExampleList()]).then(() => {
      syncControls();
      if (state.example) loadExample(state.example);
      else if (state.req) openLinkedRequest().then(() => { if (state.model) { $('model-prefix').value = state.model; runLayers(state.model); } });
      else if (!location.hash.slice(1) && Array.from($('example').options).some((o) => o.value === FIRST_EXAMPLE)) {
        state.example = FIRST_EXAMPLE;
        writeHash();
        loadExample(FIRST_EXAMPLE);
      } else { setStatus('pick an example, edit a request or open a file', 'idle'); writeHash(); }
    });
  }

  /* For tests and for anyone scripting the page from the console. */
  window.viz = {
    state, colorFor, cellCenter, curlCommand, selectionRow, rollout,
    /* computes a request given as an object (for requests too large for the editor) */
    computeRequest: (req) => { state.example = ''; state.req = ''; return compute(req); },
    get data() { return data; },
    stops: STOPS, logFloor: LOG_FLOOR, maskColors: [MASK_DARK, MASK_LIGHT],
  };

  init();
})();
