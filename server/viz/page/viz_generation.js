/*
 * viz_generation.js - the Generation view: a capture (viz_capture.js, with v) replayed token by
 * token through the server's sequences, under a cache policy beside the full cache, and the
 * policy census of every head of the capture.
 *
 * A replay is one sequence for the chosen layer and head: that head's q, k and v (k and v of
 * its key head, under grouped-query attention) as binary v2 steps with FP16 inputs, the first
 * `prompt` tokens as the sequence's first step and then one token a step, each step waiting for
 * the one before (a sequence's steps are ordered), so one request is in flight.  A head alone,
 * not its layer with `heads`: the view shows one head, and a layer's other heads would cost
 * the server their attention rows and the page their bytes at every step for nothing.  The
 * policy and its parameters go in the sequence's start with compare_full, so every step also
 * answers lost_mass and output_error against a full cache the server keeps beside.  Drawn as
 * the answers come:
 *   triangle   row i: the attention of token i over the keys it saw, placed at their
 *              positions (the previous step's kept_positions, then the step's own keys);
 *              evicted positions grey, positions after i white.  Past one token a pixel each
 *              pixel is the largest weight it covers;
 *   kept map   step x position: dark where the key is in the cache after the step's trim,
 *              light where it was evicted (the share kept, past one cell a pixel);
 *   strip      received_total of the cached keys after the last step, by position;
 *   plots      lost_mass and output_error of each step's newest query over the steps.
 *
 * The policy census is one sequence per run of layers with all their heads side by side
 * (parameter heads; k repeated for grouped-query heads; censusGroups says which layers),
 * asking lost_mass only, and v of width 1 a head in zeros: lost_mass is a weight of the full
 * attention and needs no v, and the answer is then 4 bytes a head a step.  Two sequences are
 * replayed at a time.  A cell is the mean lost_mass of that head over the queries of every
 * step after the first: the first step's queries see all its keys, since the policy trims
 * after a step, so they lose nothing by the rule.
 *
 * Window and H2O trim after every step, so a prompt sent as one step is trimmed once, at its
 * end, which is not what a model generating token by token would have done: the prompt is 1
 * token by default, the faithful replay.  SnapKV's rule is about its prompt (the first
 * request): with snapkv the prompt defaults to half the capture.
 *
 * Loaded after viz_census.js (whose outputValues it uses) and before viz.js, which calls
 * window.vizGeneration.init with its colour scale.
 */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const SEQUENCES_IN_FLIGHT = 2;  /* census sequences at a time: two cores serve them */
  /* The most bytes of keys one census sequence keeps on the server (censusGroups; a capture
   * of 12 layers of 12 heads of 64 over 4,096 tokens holds 151 MB); the page holds the
   * sequence's q and k side by side as well, in FP16, half as much each. */
  const CENSUS_GROUP_BYTES = 256 * 1024 * 1024;
  /* each policy's parameters: [input id, v2 parameter, default] */
  const PARAMS = {
    full: [],
    window: [['gen-sink', 'cache_sink', 4], ['gen-window', 'cache_window', 32]],
    h2o: [['gen-budget', 'cache_budget', 64], ['gen-recent', 'cache_recent', 32]],
    snapkv: [['gen-window', 'cache_window', 32], ['gen-budget', 'cache_budget', 64], ['gen-pool', 'cache_pool', 7]],
  };
  const GREY = [200, 200, 200], WHITE = [255, 255, 255], KEPT = [38, 50, 56], EVICTED = [236, 239, 241];

  let deps = null;                /* from viz.js: lut */
  let cap = null;                 /* the capture open */
  let runs = 0;                   /* a replay or a census of an older run stops */
  let replay = null;              /* see startReplay */
  let census = null;              /* see startCensus */

  function setState(key, s, note, noteId) {
    document.body.dataset[key] = s;
    if (note != null) $(noteId).textContent = note;
  }

  /* The policy and its parameters as the controls say: {cache_policy, cache_...}. */
  function policy() {
    const name = $('gen-policy').value, p = { cache_policy: name };
    for (const [id, key] of PARAMS[name]) p[key] = Math.floor(Number($(id).value));
    return p;
  }

  function promptTokens(T) {
    const v = Math.floor(Number($('gen-prompt').value));
    return Math.min(T, Math.max(1, Number.isFinite(v) ? v : 1));
  }

  /* Shows the inputs of the chosen policy only, with a prompt that suits it. */
  function showParams() {
    const name = $('gen-policy').value, used = new Set(PARAMS[name].map((p) => p[0]));
    for (const id of ['gen-sink', 'gen-window', 'gen-budget', 'gen-recent', 'gen-pool']) $(id).parentElement.hidden = !used.has(id);
    if (cap) $('gen-prompt').value = name === 'snapkv' ? Math.max(1, Math.floor(cap.T / 2)) : 1;
  }

  async function open(file) {
    runs++;
    if (cap) cap.close();
    cap = null;
    try {
      cap = await window.vizCapture.open(file, { v: true });
    } catch (e) {
      setState('generation', 'error', e.message, 'gen-note');
      return;
    }
    $('gen-layer').textContent = '';
    cap.layers.forEach((l, L) => $('gen-layer').add(new Option(`${L}`, L)));
    fillHeads();
    showParams();
    if (!cap.hasV) {
      setState('generation', 'error', `${cap.name} has no layer.L.v: the Generation view replays q, k and v, and a capture ` +
        'without v (written before the capture lines hooked v_proj) serves the policy census only', 'gen-note');
      return;
    }
    startReplay();
  }

  function fillHeads() {
    $('gen-head').textContent = '';
    const l = cap.layers[Number($('gen-layer').value) || 0];
    for (let h = 0; h < l.q.H; h++) $('gen-head').add(new Option(`${h}`, h));
  }

  /* ---------- requests ---------- */

  /* A v2 sequence step: {parts, headerLength}; inputs [name, rows, width, Uint16Array]. */
  function stepRequest(id, params, inputs, outputs) {
    const header = {
      id, parameters: { output_datatype: 'FP32', binary_data_output: true, ...params },
      inputs: inputs.map(([name, rows, width]) => ({ name, shape: [rows, width], datatype: 'FP16',
        parameters: { binary_data_size: rows * width * 2 } })),
      outputs: outputs.map((name) => ({ name, parameters: { binary_data: true } })),
    };
    const text = new TextEncoder().encode(JSON.stringify(header));
    return { parts: [text, ...inputs.map((i) => i[3])], headerLength: text.length };
  }

  /* Sends a step; returns {name: values} or throws with the server's error. */
  async function step(what, id, params, inputs, outputs) {
    const { r, buf, hlen, header } = await window.vizPooled.postBinary(stepRequest(id, params, inputs, outputs));
    if (!r.ok) throw new Error(`${what}: ${r.status} ` + (typeof header.error === 'string' ? header.error : JSON.stringify(header)));
    const out = {};
    let off = hlen;
    for (const o of header.outputs || []) {
      out[o.name] = window.vizCensus.outputValues(o, buf, off);
      off += (o.parameters && o.parameters.binary_data_size) || 0;
    }
    return out;
  }

  /* The parameters of step s of a sequence: its start carries the policy. */
  function stepParams(seq, s, last, pol, extra) {
    const p = { sequence_id: seq, ...extra };
    if (s === 0) Object.assign(p, { sequence_start: true }, pol, pol.cache_policy === 'full' ? {} : { compare_full: true });
    if (last) p.sequence_end = true;
    return p;
  }

  /* ---------- one head replayed ---------- */

  /* Replays the chosen layer and head under the chosen policy, drawing as it goes. */
  async function startReplay() {
    if (!cap || !cap.hasV) return;
    const run = ++runs, L = Number($('gen-layer').value) || 0, h = Number($('gen-head').value) || 0;
    const l = cap.layers[L], kh = Math.floor(h / (l.q.H / l.k.H)), T = cap.T, D = l.q.D, Dv = l.v.D;
    const pol = policy(), P = promptTokens(T), evicts = pol.cache_policy !== 'full';
    const seq = `viz-gen-${Date.now()}-${run}`, t0 = performance.now();
    const steps = 1 + T - P;
    replay = { run, L, h, T, P, policy: pol, evicts, steps, done: 0, rows: new Array(T), kept: [],
      lost: new Float64Array(T), error: new Float64Array(T), received: null, receivedAt: null, ms: null,
      tri: grid(T, T, $('gen-triangle')), map: grid(steps, T, $('gen-kept')) };
    replay.tri.v = new Float32Array(replay.tri.gr * replay.tri.gc).fill(EMPTY_CELL);
    replay.map.appended = new Float64Array(replay.map.gr * replay.map.gc);
    replay.map.kept = new Float64Array(replay.map.gr * replay.map.gc);
    setState('generation', 'computing', `Layer ${L}, head ${h}: replaying ${T} tokens (${describe(pol, P)})…`, 'gen-note');
    let halves;
    try {
      await cap.ready(L);
      halves = ['q', 'k', 'v'].map((n) => window.vizCapture.headHalf(l[n], n === 'q' ? h : kh));
    } catch (e) { if (run === runs) setState('generation', 'error', e.message, 'gen-note'); return; }
    const outputs = ['attention', 'received_total', 'length'].concat(evicts ? ['kept_positions', 'lost_mass', 'output_error'] : []);
    let prev = [];                /* the positions cached before the step */
    for (let s = 0; s < steps; s++) {
      const from = s === 0 ? 0 : P + s - 1, to = s === 0 ? P : from + 1, last = s === steps - 1;
      if (run !== runs) {         /* stopped: end the sequence rather than leave it to expire */
        if (s > 0) step('ending', `gen:${run}:end`, { sequence_id: seq, sequence_end: true },
          [['q', 1, D, halves[0].subarray(from * D, to * D)], ['k', 1, D, halves[1].subarray(from * D, to * D)],
            ['v', 1, Dv, halves[2].subarray(from * Dv, to * Dv)]], ['length']).catch(() => {});
        return;
      }
      let out;
      try {
        out = await step(`layer ${L}, head ${h}, step ${s}`, `gen:${run}:${L}:${h}:${s}`,
          stepParams(seq, s, last, pol, { heads: 1, scale: 1 / Math.sqrt(D), received_total: true }),
          [['q', to - from, D, halves[0].subarray(from * D, to * D)], ['k', to - from, D, halves[1].subarray(from * D, to * D)],
            ['v', to - from, Dv, halves[2].subarray(from * Dv, to * Dv)]], outputs);
      } catch (e) { if (run === runs) setState('generation', 'error', e.message, 'gen-note'); return; }
      if (run !== runs) return;
      prev = takeStep(replay, s, from, to, prev, out);
      scheduleDraw();
    }
    await new Promise((resolve) => requestAnimationFrame(() => resolve()));
    replay.ms = performance.now() - t0;
    draw();
    setState('generation', 'ready', `Layer ${L}, head ${h}: ${T} tokens replayed in ${steps} steps (${describe(pol, P)}) ` +
      `in ${(replay.ms / 1000).toFixed(2)} s`, 'gen-note');
  }

  function describe(pol, P) {
    const params = Object.entries(pol).filter(([k]) => k !== 'cache_policy').map(([k, v]) => `${k.slice(6)} ${v}`);
    return `${pol.cache_policy}${params.length ? ' ' + params.join(', ') : ''}; prompt ${P} token${P > 1 ? 's' : ''} as the first step`;
  }

  /* A pooled grid of rows x cols cells onto canvas cv: {gr, gc, rows, cols, cv}. */
  function grid(rows, cols, cv) {
    const gr = Math.min(rows, cv.height), gc = Math.min(cols, cv.width);
    return { gr, gc, rows, cols, cv };
  }

  /* The triangle's cells: the largest weight, or EVICTED_CELL where every key it covers that
   * a query saw the past of was evicted, or EMPTY_CELL (nothing yet; max() ranks them so). */
  const EMPTY_CELL = -2, EVICTED_CELL = -1;

  /* Tokens appended after `done` steps of a replay whose first step holds P tokens. */
  const appendedAfter = (done, P) => (done ? P + done - 1 : 0);

  /* Records step s's answer (tokens from..to-1; prev: the positions cached before it) into r
   * and its grids; returns the positions cached after it. */
  function takeStep(r, s, from, to, prev, out) {
    const seen = Int32Array.from([...prev, ...Array.from({ length: to - from }, (_, i) => from + i)]);
    const n = seen.length, a = out.attention, kept = r.evicts ? Int32Array.from(out.kept_positions) : seen;
    for (let i = from; i < to; i++) {
      const row = a.slice((i - from) * n, (i - from + 1) * n);
      r.rows[i] = row;
      /* the triangle: the cells of row i's past, each its largest weight seen, or evicted */
      const t = r.tri, rowAt = Math.floor(i * t.gr / t.rows) * t.gc;
      let j = 0;
      for (let c = 0; c < t.gc; c++) {
        const p0 = Math.floor(c * t.cols / t.gc), p1 = Math.floor((c + 1) * t.cols / t.gc);
        if (p0 > i) break;
        let m = EVICTED_CELL;
        for (; j < n && seen[j] < p1; j++) if (seen[j] <= i) m = Math.max(m, row[j]);
        t.v[rowAt + c] = Math.max(t.v[rowAt + c], m);
      }
      if (r.evicts) { r.lost[i] = out.lost_mass[i - from]; r.error[i] = out.output_error[i - from]; }
    }
    /* the kept map: per cell the keys appended so far and those kept, summed over its steps */
    const g = r.map, rowAt = Math.floor(s * g.gr / g.rows) * g.gc;
    let j = 0;
    for (let c = 0; c < g.gc; c++) {
      const p0 = Math.floor(c * g.cols / g.gc), p1 = Math.floor((c + 1) * g.cols / g.gc);
      let k = 0;
      for (; j < kept.length && kept[j] < p1; j++) k++;
      g.appended[rowAt + c] += Math.max(0, Math.min(p1, to) - p0);
      g.kept[rowAt + c] += k;
    }
    r.kept.push(kept);
    r.received = Float32Array.from(out.received_total);
    r.receivedAt = kept;
    r.done = s + 1;
    if (Number(out.length[0]) !== kept.length) throw new Error(`step ${s}: length ${out.length[0]} for ${kept.length} kept keys`);
    return Array.from(kept);
  }

  let drawPending = false;
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }

  function paint(cv, g, colour) {
    const ctx = cv.getContext('2d'), img = ctx.createImageData(cv.width, cv.height), d = img.data;
    for (let y = 0; y < cv.height; y++) {
      const gy = Math.floor(y * g.gr / cv.height);
      for (let x = 0; x < cv.width; x++) {
        const c = colour(gy * g.gc + Math.floor(x * g.gc / cv.width)), o = (y * cv.width + x) * 4;
        d[o] = c[0]; d[o + 1] = c[1]; d[o + 2] = c[2]; d[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  const viridis = (t) => { const li = Math.round(Math.min(1, Math.max(0, t)) * 255) * 3; return [deps.lut[li], deps.lut[li + 1], deps.lut[li + 2]]; };

  function draw() {
    const r = replay;
    if (!r) return;
    paint($('gen-triangle'), r.tri, (k) => (r.tri.v[k] === EMPTY_CELL ? WHITE : r.tri.v[k] === EVICTED_CELL ? GREY : viridis(r.tri.v[k])));
    const g = r.map;
    paint($('gen-kept'), g, (k) => {
      if (!g.appended[k]) return WHITE;
      const t = g.kept[k] / g.appended[k];
      return KEPT.map((c, i) => Math.round(EVICTED[i] + (c - EVICTED[i]) * t));
    });
    drawStrip(r);
    const upto = appendedAfter(r.done, r.P);
    plot($('gen-lost'), r.lost, upto, 'lost_mass');
    plot($('gen-error'), r.error, upto, 'output_error');
    $('gen-caption').textContent = `Layer ${r.L}, head ${r.h}, ${describe(r.policy, r.P)}; ${r.done} of ${r.steps} steps. ` +
      'Left: token i\'s attention over the keys it saw (grey: evicted; white: not yet appended). Right: the cache after each ' +
      'step (dark: kept, light: evicted).' + (r.evicts ? '' : ' The full cache evicts nothing: lost_mass and output_error are 0.');
  }

  /* received_total of the cached keys by position, each pixel the largest it covers. */
  function drawStrip(r) {
    const cv = $('gen-received'), ctx = cv.getContext('2d'), w = Math.min(cv.width, r.T);
    const px = new Float64Array(w).fill(-1), upto = appendedAfter(r.done, r.P);
    if (r.received) r.receivedAt.forEach((p, j) => { const c = Math.floor(p * w / r.T); px[c] = Math.max(px[c], r.received[j]); });
    let hi = 0;
    for (const v of px) hi = Math.max(hi, v);
    ctx.clearRect(0, 0, cv.width, cv.height);
    px.forEach((v, c) => {
      const col = v >= 0 ? viridis(hi > 0 ? v / hi : 0) : Math.floor(c * r.T / w) < upto ? GREY : WHITE;
      ctx.fillStyle = `rgb(${col[0]},${col[1]},${col[2]})`;
      ctx.fillRect(Math.floor(c * cv.width / w), 0, Math.ceil(cv.width / w), cv.height);
    });
    cv.dataset.max = String(hi);
    $('gen-received-note').textContent = `received_total of the keys cached after step ${r.done - 1}, by position ` +
      `(colour from 0 to ${window.vizNum.text(hi)}; grey: evicted)`;
  }

  /* values[0..upto) over the tokens as a line, each pixel column from the lowest to the highest
   * value it covers; the y axis from 0 to the largest value. */
  function plot(cv, values, upto, name) {
    const ctx = cv.getContext('2d'), T = values.length;
    let hi = 0;
    for (let i = 0; i < upto; i++) hi = Math.max(hi, values[i]);
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, cv.width, cv.height);
    ctx.fillStyle = '#1565c0';
    const y = (v) => (cv.height - 1) - Math.round((hi > 0 ? v / hi : 0) * (cv.height - 1));
    const cols = Math.min(cv.width, T);
    for (let c = 0; c < cols; c++) {
      const i0 = Math.floor(c * T / cols), i1 = Math.min(upto, Math.max(i0 + 1, Math.floor((c + 1) * T / cols)));
      if (i0 >= upto) break;
      let lo = Infinity, top = -Infinity;
      for (let i = i0; i < i1; i++) { lo = Math.min(lo, values[i]); top = Math.max(top, values[i]); }
      const x0 = Math.floor(c * cv.width / cols), x1 = Math.floor((c + 1) * cv.width / cols);
      ctx.fillRect(x0, y(top), Math.max(1, x1 - x0), y(lo) - y(top) + 1);
    }
    cv.dataset.max = String(hi);
    $(cv.id + '-note').textContent = `${name} of each token's query over the ${T} tokens, from 0 to ${window.vizNum.text(hi)}`;
  }

  /* ---------- the policy census ---------- */

  /* Every layer replayed with all its heads under the chosen policy; a cell per head, its
   * mean lost_mass, painted when its layer's replay ends. */
  async function startCensus() {
    if (!cap) return;
    const pol = policy();
    if (pol.cache_policy === 'full') {
      setState('genCensus', 'error', 'The full cache evicts nothing: choose window, h2o or snapkv for a policy census.', 'gen-census-note');
      return;
    }
    const run = ++runs, T = cap.T, P = promptTokens(T), t0 = performance.now();
    census = { run, policy: pol, P, T, cells: cap.layers.map((l) => new Array(l.q.H).fill(null)), ms: null };
    setState('genCensus', 'computing', `${cap.name}: ${cap.layers.length} layers replayed, ${1 + T - P} steps each (${describe(pol, P)})…`, 'gen-census-note');
    drawCensus();
    const groups = censusGroups();
    census.groups = groups;
    let next = 0, failed = null;
    const worker = async () => {
      while (next < groups.length && !failed && run === runs) {
        const n = next++;
        try { await censusGroup(run, groups[n], n, pol, P); } catch (e) { failed = failed || e; }
      }
    };
    await Promise.all(Array.from({ length: SEQUENCES_IN_FLIGHT }, worker));
    if (run !== runs) return;
    if (failed) { setState('genCensus', 'error', failed.message, 'gen-census-note'); return; }
    await new Promise((resolve) => requestAnimationFrame(() => resolve()));
    census.ms = performance.now() - t0;
    setState('genCensus', 'ready', `${cap.name}: ${cap.layers.length} layers × ${census.cells[0].length} heads, ` +
      `${describe(pol, P)}, mean lost_mass over the steps after the first; in ${(census.ms / 1000).toFixed(2)} s`, 'gen-census-note');
  }

  /* Layer l's heads of tensor n ('q' or 'k') side by side into out, FP16 bits, [T, W], from
   * head h0 of each row on; k repeated for the q heads that share it. */
  function sideBySide(l, n, out, W, h0) {
    const t = l[n], heads = l.q.H, rep = heads / t.H;
    for (let h = 0; h < heads; h++) {
      const src = window.vizCapture.headHalf(t, Math.floor(h / rep));
      for (let i = 0; i < cap.T; i++) out.set(src.subarray(i * t.D, (i + 1) * t.D), i * W + (h0 + h) * t.D);
    }
  }

  /* The census's sequences: runs of consecutive layers of one head dim, one layer at least,
   * each at most half the capture's keys (SEQUENCES_IN_FLIGHT, so that two run side by
   * side) and at most CENSUS_GROUP_BYTES of keys on the server (heads x tokens x head dim,
   * float32: the full cache compare_full keeps).  Heads are independent under every policy
   * (each keeps, evicts and loses its own keys), so a layer's heads answer the same in a
   * sequence of several layers as in one of their own, and the census sends a token of
   * several layers in one request.  Each is {layers: [L, ...], at: [the first head of each
   * layer in the sequence], H: its heads, D}. */
  function censusGroups() {
    const bytes = (H, D) => H * cap.T * D * 4;
    const total = cap.layers.reduce((n, l) => n + bytes(l.q.H, l.q.D), 0);
    const most = Math.min(CENSUS_GROUP_BYTES, Math.ceil(total / SEQUENCES_IN_FLIGHT));
    const groups = [];
    cap.layers.forEach((l, L) => {
      const H = l.q.H, D = l.q.D, g = groups[groups.length - 1];
      if (g && g.D === D && bytes(g.H + H, D) <= most) {
        g.layers.push(L);
        g.at.push(g.H);
        g.H += H;
      } else {
        groups.push({ layers: [L], at: [0], H, D });
      }
    });
    return groups;
  }

  /* Replays group g (censusGroups) as one sequence and fills its layers' cells. */
  async function censusGroup(run, g, n, pol, P) {
    for (const L of g.layers) await cap.ready(L);
    const { H, D } = g, T = cap.T, W = H * D, seq = `viz-gen-census-${Date.now()}-${run}-${n}`;
    const q = new Uint16Array(T * W), k = new Uint16Array(T * W), v = new Uint16Array(T * H);
    g.layers.forEach((L, i) => {
      sideBySide(cap.layers[L], 'q', q, W, g.at[i]);
      sideBySide(cap.layers[L], 'k', k, W, g.at[i]);
    });
    const sums = new Float64Array(H);
    const steps = 1 + T - P;
    for (let s = 0; s < steps; s++) {
      const from = s === 0 ? 0 : P + s - 1, to = s === 0 ? P : from + 1, m = to - from;
      const stopped = run !== runs, last = s === steps - 1 || stopped;
      if (stopped && s === 0) return;
      const params = stopped ? { sequence_id: seq, sequence_end: true } : stepParams(seq, s, last, pol, { heads: H, scale: 1 / Math.sqrt(D) });
      const out = await step(`layers ${g.layers.join(', ')}, step ${s}`, `gen-census:${run}:${n}:${s}`, params,
        [['q', m, W, q.subarray(from * W, to * W)], ['k', m, W, k.subarray(from * W, to * W)], ['v', m, H, v.subarray(from * H, to * H)]],
        stopped ? ['length'] : ['lost_mass']);
      if (stopped) return;
      if (s > 0) for (let h = 0; h < H; h++) sums[h] += out.lost_mass[h];   /* [heads, 1] */
    }
    g.layers.forEach((L, i) => {
      for (let h = 0; h < cap.layers[L].q.H; h++) census.cells[L][h] = steps > 1 ? sums[g.at[i] + h] / (steps - 1) : 0;
    });
    drawCensus();
  }

  function drawCensus() {
    const box = $('gen-census-grid');
    box.textContent = '';
    if (!census) return;
    let hi = 0;
    for (const row of census.cells) for (const v of row) if (v != null) hi = Math.max(hi, v);
    const t = document.createElement('table');
    t.id = 'gen-census-table';
    const hr = t.insertRow(), corner = document.createElement('th');
    corner.textContent = 'layer \\ head';
    hr.append(corner);
    for (let h = 0; h < Math.max(...census.cells.map((r) => r.length)); h++) { const th = document.createElement('th'); th.textContent = h; hr.append(th); }
    census.cells.forEach((row, L) => {
      const tr = t.insertRow(), th = document.createElement('th');
      th.textContent = L;
      tr.append(th);
      row.forEach((v, h) => {
        const td = tr.insertCell();
        td.dataset.layer = L; td.dataset.head = h;
        if (v == null) { td.className = 'pending'; td.textContent = '…'; return; }
        td.dataset.v = String(v);
        td.textContent = window.vizNum.text(v);
        td.title = `layer ${L}, head ${h}: mean lost_mass ${v}`;
        const c = viridis(hi > 0 ? v / hi : 0);
        td.style.backgroundColor = `rgb(${c[0]},${c[1]},${c[2]})`;
        td.style.color = c[0] * 0.3 + c[1] * 0.6 + c[2] * 0.1 > 140 ? '#000' : '#fff';
      });
    });
    box.append(t);
    $('gen-census-caption').textContent = `Mean lost_mass under ${describe(census.policy, census.P)}: colour from 0 (dark) ` +
      `to ${window.vizNum.text(hi)} (yellow); a dark head tolerates the policy, a bright one loses attention to it. ` +
      'Click a head to replay it.';
  }

  function init(d) {
    deps = d;
    $('gen-file').addEventListener('change', () => { const f = $('gen-file').files[0]; if (f) open(f); });
    $('gen-policy').addEventListener('change', showParams);
    $('gen-layer').addEventListener('change', fillHeads);
    $('gen-replay').addEventListener('click', startReplay);
    $('gen-census').addEventListener('click', startCensus);
    $('gen-census-grid').addEventListener('click', (ev) => {
      const td = ev.target.closest('td[data-layer]');
      if (!td || !cap) return;
      $('gen-layer').value = td.dataset.layer;
      fillHeads();
      $('gen-head').value = td.dataset.head;
      startReplay();
    });
    showParams();
    setState('generation', 'idle', 'Open a capture of a model\'s q, k and v (docs/visualizer.md says how to write one): ' +
      'its chosen head is replayed token by token through a cache policy beside the full cache.', 'gen-note');
  }

  window.vizGeneration = {
    init,
    /* for tests: what the page holds and plotted */
    get replay() { return replay; },
    get census() { return census; },
  };
})();
