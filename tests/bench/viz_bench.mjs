// viz_bench.mjs - the visualizer from request to painted heatmap, in headless chromium.
//
//   node tests/bench/viz_bench.mjs --server build/attention-server --out build/bench/results [--quick]
//                                  [--only SUBSTR]   (the cases whose name has it: "L=2048", "census")
//
// For L = 512, 2048 and 4096 (one head, float32, q/k/v of width 64, attention returned) it
// clicks Compute on the page and waits for the heatmap to be painted (two animation frames
// after the render), and reports the median total with the page's own split: transfer (the
// request sent until the whole answer is in), decoding (answer to typed array) and drawing.
// The page takes the binary v2 form when the server offers it and JSON otherwise; the row
// says which.  Each answer is checked (every row of the matrix sums to 1) before it counts.
// Then the long sequences: L = 16384 and 32768, float32, causal, given to the page
// as an object (window.viz.computeRequest: too large for the editor), which asks the server
// for the attention pooled to the heatmap's pixels; timed to the painted heatmap, each grid
// checked (no cell above 1, the causally masked corner hatched).
// At 2048 tokens it runs again with the answer in FP16 (*Large answers in*), half the bytes.
// Last, the heads census of a 12 x 12-head capture of 8192 tokens (random q and k written here),
// from choosing the file to the last cell painted; and the Generation view's policy census of a
// 12 x 12-head capture of 4096 tokens under h2o (budget 512, recent 256), every layer replayed
// token by token, from choosing the file to the last cell (reported, no target asserted).
// Writes table-viz.tsv (rows of tests/bench/run.sh's table) into --out; targets: 2048 tokens
// under 1 s, 4096 under 3 s, 16384 under 3 s, 32768 under 6 s, the census under 10 s.  Exit status 1 when a run
// failed or a check disagreed.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

// puppeteer-core is installed (pinned) with the browser tests, in tests/browser/.
const require = createRequire(new URL('../browser/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

const argv = process.argv.slice(2);
const opt = (name, dflt) => { const i = argv.indexOf('--' + name); return i >= 0 ? argv[i + 1] : dflt; };
const QUICK = argv.includes('--quick');
const ONLY = opt('only', '');
const SERVER = opt('server', 'build/attention-server');
const OUT = opt('out', 'build/bench/results');
const CHROMIUM = ['/usr/lib/chromium/chromium', '/usr/bin/chromium'].find((p) => fs.existsSync(p));
const CASES = [{ L: 512, reps: QUICK ? 1 : 5, target: null }, { L: 2048, reps: QUICK ? 1 : 3, target: 1000 },
  { L: 2048, reps: QUICK ? 1 : 3, target: null, transfer: 'fp16' }, { L: 4096, reps: QUICK ? 1 : 2, target: 3000 }];
// The heads census: a capture of 12 layers x 12 heads of 8192 tokens (head_dim 64), painted
// within 10 s on two cores is the target.
const CENSUS = { layers: 12, heads: 12, tokens: QUICK ? 2048 : 8192, dim: 64, target: 10000 };
// The policy census: 12 x 12 heads of 4096 tokens, one policy, token by token.
const POLICY_CENSUS = { layers: 12, heads: 12, tokens: QUICK ? 512 : 4096, dim: 64,
  policy: { policy: 'h2o', budget: 512, recent: 256 } };
const CASE_TIMEOUT_MS = 300000;
const LONG_CASES = [{ L: 16384, reps: QUICK ? 1 : 3, target: 3000 }, { L: 32768, reps: QUICK ? 1 : 2, target: 6000 }];

function matrix(rows, cols, seed) {
  let s = seed >>> 0;
  const out = new Array(rows);
  for (let r = 0; r < rows; r++) {
    const row = new Array(cols);
    for (let c = 0; c < cols; c++) { s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0; row[c] = Math.round((s / 4294967296 * 2 - 1) * 1e4) / 1e4; }
    out[r] = row;
  }
  return out;
}

// A capture (docs/visualizer.md) of random q and k, each x = k/1024 for a whole k in
// [-2048, 2048] (exact in FP16), with heads of different sharpness, as FP16 bits.
function writeCapture(file, { layers, heads, tokens, dim }) {
  const half = (k) => {
    if (k === 0) return 0;
    const a = Math.abs(k), e = Math.floor(Math.log2(a));
    return (k < 0 ? 0x8000 : 0) | ((e + 5) << 10) | ((a - 2 ** e) * 2 ** (10 - e));
  };
  const n = heads * tokens * dim, header = { __metadata__: { tokens: JSON.stringify(Array.from({ length: tokens }, (_, i) => 't' + i)) } };
  const blobs = [];
  let s = 99, off = 0;
  for (let L = 0; L < layers; L++)
    for (const name of ['q', 'k']) {
      const b = new Uint16Array(n);
      for (let i = 0; i < n; i++) {
        s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0;
        const h = Math.floor(i / (tokens * dim)), width = name === 'q' ? 256 + 256 * ((L + h) % 8) : 1024;
        b[i] = half(Math.round((s / 4294967296 * 2 - 1) * width));
      }
      header[`layer.${L}.${name}`] = { dtype: 'F16', shape: [heads, tokens, dim], data_offsets: [off, off + b.byteLength] };
      off += b.byteLength;
      blobs.push(Buffer.from(b.buffer));
    }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - text.length % 8) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(text), ...blobs]));
}

// A census that ended in an error: the row says why (the note at selector `note`).
async function censusFailed(page, name, note, what) {
  failed = true;
  const why = await page.$eval(note, (e) => e.textContent);
  console.log(`${name}: FAILED: ${why}`);
  rows.push(['viz', what, '', '', 'ms', '', '', '', '', 'failed: ' + why.slice(0, 200)]);
}

// The census of CENSUS from the file's choice to the last cell painted (the page's own
// measure: viz_census.js times compute to the frame after the last cell).
async function benchCensus(page, base) {
  const c = CENSUS, file = path.join(tmp, 'capture.safetensors');
  writeCapture(file, c);
  await page.goto(base + '/viz#view=census');
  await page.waitForSelector('body[data-census="idle"]');
  const t0 = Date.now();
  await (await page.$('#census-file')).uploadFile(file);
  await page.waitForSelector('body[data-census="ready"], body[data-census="error"]');
  const wall = Date.now() - t0;
  const state = await page.$eval('body', (b) => b.dataset.census);
  const what = `visualizer census ${c.layers} x ${c.heads} heads of ${c.tokens} tokens (head_dim ${c.dim}), capture chosen to painted`;
  if (state !== 'ready') { await censusFailed(page, 'census', '#census-note', what); return; }
  const ms = await page.evaluate(() => window.vizCensus.census.ms);
  const cells = await page.$$eval('#census-table td[data-v]', (tds) => tds.length);
  if (cells !== c.layers * c.heads) { failed = true; console.log(`census: FAILED: ${cells} cells painted`); return; }
  console.log(`census ${c.layers} x ${c.heads} of ${c.tokens} tokens: ${wall} ms from choosing the file, ${ms.toFixed(0)} ms computing and painting`);
  rows.push(['viz', what, String(wall), '', 'ms', '', '', '', '',
    `requests and painting ${ms.toFixed(0)} ms; target < ${c.target / 1000} s: ${wall < c.target ? 'ok' : 'MISSED'}`]);
}

// The policy census of POLICY_CENSUS: the policy set, the file chosen and the census asked at
// once, timed to the last cell painted (the page's own measure is from the census's start).
async function benchPolicyCensus(page, base) {
  const c = POLICY_CENSUS, file = path.join(tmp, 'policy-capture.safetensors');
  writeCapture(file, c);
  await page.goto(base + '/viz#view=generation');
  await page.waitForSelector('body[data-generation="idle"]');
  await page.select('#gen-policy', c.policy.policy);
  await page.$eval('#gen-budget', (e, v) => { e.value = v; }, String(c.policy.budget));
  await page.$eval('#gen-recent', (e, v) => { e.value = v; }, String(c.policy.recent));
  const t0 = Date.now();
  await (await page.$('#gen-file')).uploadFile(file);
  // a capture without v: the view says so at once and offers the census, which is started
  await page.waitForSelector('body[data-generation="error"]');
  await page.click('#gen-census');
  // thousands of steps: on a shared two-core machine this may pass CASE_TIMEOUT_MS, which also
  // bounds one DevTools call (protocolTimeout), so the wait is a minute at a time
  const done = 'body[data-gen-census="ready"], body[data-gen-census="error"]';
  while (!await page.$(done) && Date.now() - t0 < 3 * CASE_TIMEOUT_MS)
    await page.waitForSelector(done, { timeout: 60000 }).catch(() => {});
  const wall = Date.now() - t0;
  const what = `visualizer policy census ${c.layers} x ${c.heads} heads of ${c.tokens} tokens (head_dim ${c.dim}), ` +
    `h2o budget ${c.policy.budget}, token by token, capture chosen to last cell`;
  const state = await page.$eval('body', (b) => b.dataset.genCensus);
  if (state !== 'ready') { await censusFailed(page, 'policy census', '#gen-census-note', what); return; }
  const cells = await page.$$eval('#gen-census-table td[data-v]', (tds) => tds.length);
  if (cells !== c.layers * c.heads) { failed = true; console.log(`policy census: FAILED: ${cells} cells painted`); return; }
  // a sequence per run of layers (viz_generation.js, censusGroups), a step per token each
  const groups = await page.evaluate(() => window.vizGeneration.census.groups.map((g) => g.layers.length));
  const requests = groups.length * c.tokens;
  console.log(`policy census ${c.layers} x ${c.heads} of ${c.tokens} tokens: ${wall} ms from choosing the file (${groups.length} ` +
    `sequences of ${groups.join(', ')} layers, ${requests} steps, ${(wall / requests).toFixed(2)} ms a step)`);
  rows.push(['viz', what, String(wall), '', 'ms', '', '', '', '', `${groups.length} sequences of ${groups.join(', ')} layers, ` +
    `${requests} sequence steps; report only (the issue's target: < 30 s)`]);
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor((s.length - 1) / 2)]; };

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'viz-bench-'));
// 4096 x 4096 weights are 16.7 million numbers: above the default --max-elements.
const server = spawn(SERVER, ['--port', '0', '--grpc-port', '0', '--host', '127.0.0.1', '--data-dir', path.join(tmp, 'data'), '--quiet',
  '--max-elements', '64M', '--max-body', '256M', '--max-request-memory', '4G'], { stdio: ['ignore', 'pipe', 'inherit'] });
let browser = null, failed = false;
const rows = [];
try {
  const base = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('the server did not start in 10 s')), 10000);
    server.on('exit', (code) => reject(new Error('the server exited with status ' + code)));
    server.stdout.on('data', (c) => {
      out += c;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  // networkEnabled false: puppeteer otherwise enables DevTools' Network domain, whose events
  // for every request (sent to this process) and copies of every answer load the browser with
  // work a user's browser, with no DevTools attached, does not do; the page's own times and the
  // policy census's thousands of requests measured that too.
  browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true, userDataDir: path.join(tmp, 'profile'), protocolTimeout: CASE_TIMEOUT_MS,
    networkEnabled: false,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
  });
  const page = await browser.newPage();
  page.setDefaultTimeout(CASE_TIMEOUT_MS);
  await page.setViewport({ width: 1300, height: 900 });
  await page.goto(base + '/viz#view=heatmap');
  await page.waitForSelector('body[data-status="idle"]');
  for (const { L, reps, target, transfer } of CASES) {
    if (!`L=${L}${transfer ? ' ' + transfer : ''}`.includes(ONLY)) continue;
    const req = { q: matrix(L, 64, 1), k: matrix(L, 64, 2), v: matrix(L, 64, 3), dtype: 'float32' };
    await page.select('#transfer', transfer === 'fp16' ? 'fp16' : 'exact');
    await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(req));
    const runs = [];
    let error = null;
    for (let r = 0; r < reps && !error; r++) {
      const m = await page.evaluate(() => new Promise((resolve) => {
        const before = Number(document.body.dataset.render || 0);
        const t0 = performance.now();
        document.getElementById('run').click();
        (function poll() {
          const st = document.body.dataset.status;
          if (st === 'error') { resolve({ error: document.getElementById('error').textContent }); return; }
          if (st !== 'ready' || Number(document.body.dataset.render) <= before) { setTimeout(poll, 2); return; }
          requestAnimationFrame(() => requestAnimationFrame(() => {
            const d = window.viz.data, n = d.Lk;
            let worst = 0;
            for (let i = 0; i < d.Lq; i++) {
              let s = 0;
              for (let j = 0; j < n; j++) s += d.attn[i * n + j];
              worst = Math.max(worst, Math.abs(s - 1));
            }
            resolve({ total: performance.now() - t0, ...d.timing, path: d.source, lq: d.Lq, lk: d.Lk, worst });
          }));
        })();
      }));
      if (m.error) error = m.error;
      else if (m.lq !== L || m.lk !== L || !(m.worst < 2e-3)) error = `wrong answer: ${m.lq}x${m.lk}, row sums off by ${m.worst}`;
      else runs.push(m);
    }
    if (error) {
      failed = true;
      console.log(`L=${L}: FAILED: ${error}`);
      rows.push(['viz', `visualizer L=${L} request to painted heatmap, float32`, '', '', 'ms', '', '', '', '', 'failed: ' + error.slice(0, 200)]);
      continue;
    }
    const total = median(runs.map((x) => x.total));
    const split = ['transferMs', 'decodeMs', 'drawMs'].map((k) => median(runs.map((x) => x[k])).toFixed(0));
    const form = (/binary/.test(runs[0].path) ? 'binary v2' : 'JSON v1') + (transfer === 'fp16' ? ', FP16 answer' : '');
    const met = target == null ? '' : `; target < ${target / 1000} s: ${total < target ? 'ok' : 'MISSED'}`;
    console.log(`L=${L} (${form}): ${total.toFixed(0)} ms to paint; transfer ${split[0]} ms, decode ${split[1]} ms, draw ${split[2]} ms (median of ${runs.length})`);
    rows.push(['viz', `visualizer L=${L} request to painted heatmap, float32, ${form}`, total.toFixed(1), '', 'ms', '', '', '', '',
      `transfer ${split[0]} ms, decode ${split[1]} ms, draw ${split[2]} ms${met}`]);
  }
  for (const { L, reps, target } of LONG_CASES) {
    if (!`L=${L}`.includes(ONLY)) continue;
    // the inputs are made in the page, so that only the request itself is timed
    await page.evaluate((n) => {
      let s = 12345;
      const m = (rows) => Array.from({ length: rows }, () => Array.from({ length: 64 }, () => {
        s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0; return s / 4294967296 * 2 - 1;
      }));
      window.__long = { q: m(n), k: m(n), v: m(n), dtype: 'float32', causal: true };
    }, L);
    const runs = [];
    let error = null;
    for (let r = 0; r < reps && !error; r++) {
      const m = await page.evaluate(async () => {
        const t0 = performance.now();
        await window.viz.computeRequest(window.__long);
        if (document.body.dataset.status !== 'ready') return { error: document.getElementById('error').textContent };
        await new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
        const d = window.viz.data;
        let top = 0;
        for (let i = 0; i < d.attn.length; i++) top = Math.max(top, d.attn[i]);
        return { total: performance.now() - t0, transfer: d.timing.transferMs, lq: d.Lq, lk: d.Lk, top,
          masked: d.mask ? d.mask[d.Lk - 1] : 0, source: d.source };
      });
      if (m.error) error = m.error;
      else if (!(m.top <= 1 + 1e-6) || m.masked !== 1) error = `wrong grid: largest cell ${m.top}, corner masked ${m.masked}`;
      else runs.push(m);
    }
    const what = `visualizer L=${L} request to painted heatmap, float32, causal, pooled by the server`;
    if (error) {
      failed = true;
      console.log(`L=${L}: FAILED: ${error}`);
      rows.push(['viz', what, '', '', 'ms', '', '', '', '', 'failed: ' + error.slice(0, 200)]);
      continue;
    }
    const total = median(runs.map((x) => x.total)), transfer = median(runs.map((x) => x.transfer));
    console.log(`L=${L} (pooled ${runs[0].lq} x ${runs[0].lk}): ${total.toFixed(0)} ms to paint; request ${transfer.toFixed(0)} ms (median of ${runs.length})`);
    rows.push(['viz', what, total.toFixed(1), '', 'ms', '', '', '', '',
      `request ${transfer.toFixed(0)} ms, grid ${runs[0].lq} x ${runs[0].lk}; target < ${target / 1000} s: ${total < target ? 'ok' : 'MISSED'}`]);
  }
  if ('census'.includes(ONLY)) await benchCensus(page, base);
  if ('policy census'.includes(ONLY)) await benchPolicyCensus(page, base);
} catch (e) {
  failed = true;
  console.log('viz bench FAILED: ' + e.message);
} finally {
  if (browser) await browser.close().catch(() => {});
  if (server.exitCode === null) server.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
fs.mkdirSync(OUT, { recursive: true });
fs.writeFileSync(path.join(OUT, 'table-viz.tsv'), rows.map((r) => r.join('\t')).join('\n') + (rows.length ? '\n' : ''));
process.exit(failed ? 1 : 0);
