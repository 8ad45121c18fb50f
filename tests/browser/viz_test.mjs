// viz_test.mjs - the attention visualizer (GET /viz) tested in a real browser against the real
// server: Debian's chromium, headless, driven over the DevTools protocol by puppeteer-core
// (pinned in package-lock.json).
//
//   node tests/browser/viz_test.mjs --server build/attention-server --fixtures tests/fixtures
//
// Starts the server on a free loopback port with an empty data directory, runs every test in a
// fresh page, prints "ok NAME" or "FAIL NAME: why" for each and "N passed, N failed" last, and
// stops the server by its PID.  Every test checks that the page asked nothing of any origin but
// the server's and met no Content-Security-Policy violation and no script error.
//
// The page fetches weights as JSON from POST /v1/attention unless GET /v2 lists the binary
// tensor extension and the request is large.  Every test uses the real server; the one named
// "large request" goes through its binary v2 path, the others through the JSON path.

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const SERVER = args.server || 'build/attention-server';
const FIXTURES = args.fixtures || 'tests/fixtures';
const CHROMIUM = args.chromium || ['/usr/lib/chromium/chromium', '/usr/bin/chromium']
  .find((p) => fs.existsSync(p));
const ONLY = args.only || '';
const TEST_TIMEOUT_MS = 30000;

// viridis at t = 0, 1/8, ..., 1 and the masked hatching: the colour scale docs/visualizer.md
// describes, written out here independently of the page.
const STOPS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
const MASK_SHADES = [150, 225];

function viridis(w, log = false) {
  let t = log ? (Math.log10(Math.max(w, 1e-6)) + 6) / 6 : w;
  t = Math.round(Math.min(1, Math.max(0, t)) * 255) / 255 * (STOPS.length - 1);
  const s = Math.min(Math.floor(t), STOPS.length - 2), f = t - s;
  return STOPS[s].map((c, k) => Math.round(c + (STOPS[s + 1][k] - c) * f));
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'viz-test-'));
let server = null, browser = null, base = '';
const fixtures = fs.readdirSync(FIXTURES).filter((f) => f.endsWith('.json')).sort()
  .map((f) => JSON.parse(fs.readFileSync(path.join(FIXTURES, f), 'utf8')));
const fixture = (name) => fixtures.find((f) => f.name === name);

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

function close(a, b, tol, what) {
  assert(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${what}: ${a} is not ${b} (tolerance ${tol})`);
}

// Starts the server on port 0 and reads the port it printed.
function startServer() {
  const dataDir = path.join(tmp, 'data');
  fs.mkdirSync(dataDir, { recursive: true });
  server = spawn(SERVER, ['--port', '0', '--grpc-port', '0', '--host', '127.0.0.1', '--data-dir', dataDir, '--quiet'],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('the server did not say where it listens in 10 s')), 10000);
    server.on('exit', (code) => reject(new Error('the server exited with status ' + code)));
    server.stdout.on('data', (chunk) => {
      out += chunk;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
}

// A fresh page that records every request it makes, CSP violations and script errors.
async function newPage() {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.setDefaultTimeout(15000);
  const record = { requests: [], errors: [] };
  page.on('request', (r) => record.requests.push(r.url()));
  page.on('pageerror', (e) => record.errors.push('script error: ' + e.message));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of 4\d\d/.test(m.text())) record.errors.push('console: ' + m.text());
  });
  await page.evaluateOnNewDocument(() => {
    window.__csp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
  });
  await page.setViewport({ width: 1280, height: 1000 });
  page.record = record;
  page.context_ = context;
  return page;
}

// Fails when the page asked another origin for anything, broke its CSP or threw.
async function checkClean(page) {
  const foreign = page.record.requests.filter((u) => !u.startsWith(base + '/') && !u.startsWith('blob:') && !u.startsWith('data:'));
  assert(foreign.length === 0, 'requests to other origins: ' + foreign.join(' '));
  const csp = await page.evaluate(() => window.__csp || []);
  assert(csp.length === 0, 'CSP violations: ' + csp.join('; '));
  assert(page.record.errors.length === 0, page.record.errors.join('; '));
}

async function openView(page, hash) {
  await page.goto(base + '/viz#' + hash);
  // without an example the page waits for input ("idle"); with one it computes it first
  const want = hash.includes('example=') ? 'ready' : 'idle';
  await page.waitForSelector(`body[data-status="${want}"], body[data-status="error"]`);
  const status = await page.$eval('body', (b) => b.dataset.status);
  assert(status === want, 'the page did not get ' + want + ': ' + await page.$eval('#error', (e) => e.textContent));
}

// The RGB at canvas point (x, y) of canvas #id.
async function pixel(page, id, x, y) {
  return page.evaluate((id, x, y) => Array.from(document.getElementById(id).getContext('2d')
    .getImageData(Math.floor(x), Math.floor(y), 1, 1).data.slice(0, 3)), id, x, y);
}

async function cellPixel(page, i, j) {
  const c = await page.evaluate((i, j) => window.viz.cellCenter(i, j), i, j);
  return pixel(page, 'heatmap', c.x, c.y);
}

function sameColour(got, want, what) {
  assert(got.every((v, k) => Math.abs(v - want[k]) <= 2), `${what}: drawn rgb(${got}) but the scale gives rgb(${want})`);
}

async function postJson(url, body) {
  const r = await fetch(base + url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

async function setRequest(page, req) {
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(req));
  await page.click('#run');
  await page.waitForSelector('body[data-status="ready"], body[data-status="error"]');
}

// Clicks `click`, lets the browser download the file it offers into dir and returns the file's
// path once the browser reports the download complete.  A file's appearing in dir is no such
// signal: chromium creates the file under its final name before it has written it, so a test
// that read it as soon as it appeared met an empty file when the machine was busy.  The browser
// names the file by the download's id ('allowAndName'); the name the page suggested must end in ext.
async function downloadTo(page, dir, click, ext) {
  fs.mkdirSync(dir, { recursive: true });
  const cdp = await page.browser().target().createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allowAndName', downloadPath: dir,
    browserContextId: page.browserContext().id, eventsEnabled: true });
  let suggested = '';
  const finished = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no download finished in 10 s')), 10000);
    cdp.on('Browser.downloadWillBegin', (e) => { suggested = e.suggestedFilename; });
    cdp.on('Browser.downloadProgress', (e) => {
      if (e.state === 'completed') { clearTimeout(timer); resolve(path.join(dir, e.guid)); }
      if (e.state === 'canceled') { clearTimeout(timer); reject(new Error('the download was canceled')); }
    });
  });
  try {
    await page.click(click);
    const file = await finished;
    assert(suggested.endsWith(ext), `the page offered ${suggested}, not a ${ext} file`);
    return file;
  } finally {
    await cdp.detach();
  }
}

function randomMatrix(rows, cols, seed) {
  let s = seed >>> 0;
  const next = () => { s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0; return s / 4294967296 * 2 - 1; };
  return Array.from({ length: rows }, () => Array.from({ length: cols }, next));
}

// ---------------------------------------------------------------- the tests

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('serves the page under a strict CSP, / redirects to it', async () => {
  const r = await fetch(base + '/', { redirect: 'manual' });
  assert(r.status === 302 && r.headers.get('location') === '/viz', 'GET / answered ' + r.status);
  const p = await fetch(base + '/viz');
  const csp = p.headers.get('content-security-policy') || '';
  assert(p.status === 200 && /^text\/html/.test(p.headers.get('content-type')), 'GET /viz answered ' + p.status);
  assert(/default-src 'self'/.test(csp) && !/unsafe-inline|unsafe-eval/.test(csp), 'CSP: ' + csp);
  const html = await p.text();
  assert(!/<script>|<script [^>]*>[^<]|\son\w+=|style=/.test(html), 'the page has inline script or style');
  const list = await (await fetch(base + '/viz/examples/')).json();
  assert(list.examples.map((e) => e.name).join() === fixtures.map((f) => f.name).join(), 'examples listed: ' + JSON.stringify(list));
});

test('first screen: /viz with no link draws an example and says how to start, with no interaction', async (page) => {
  await page.goto(base + '/viz');
  await page.waitForSelector('body[data-status="ready"], body[data-status="error"]');
  const status = await page.$eval('body', (b) => b.dataset.status);
  assert(status === 'ready', 'the first screen is ' + status + ': ' + await page.$eval('#error', (e) => e.textContent));
  // drawn: the heatmap holds many colours, not one blank fill
  const colours = await page.evaluate(() => {
    const c = document.getElementById('heatmap');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let i = 0; i < d.length; i += 4 * 7) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    return seen.size;
  });
  assert(colours >= 8, `the heatmap canvas holds ${colours} colours: nothing is drawn`);
  // the how-to-start text is on screen, in the first viewport, and names what to do
  const how = await page.$eval('#how-to-start', (e) => {
    const r = e.getBoundingClientRect(), st = getComputedStyle(e);
    return { text: e.textContent, top: r.top, bottom: r.bottom, height: r.height, width: r.width,
      shown: st.display !== 'none' && st.visibility !== 'hidden' && Number(st.opacity) > 0, vh: innerHeight };
  });
  assert(how.shown && how.height > 0 && how.width > 0, 'the how-to-start text is not shown');
  assert(how.top >= 0 && how.bottom <= how.vh, `the how-to-start text is off the first screen (${how.top}..${how.bottom})`);
  assert(/Compute/.test(how.text) && /example/.test(how.text), 'the how-to-start text says: ' + how.text);
  const shown = await page.$eval('#example', (s) => s.value);
  assert(how.text.includes(shown) && shown, `the text does not name the example shown (${shown})`);
});

for (const fx of fixtures)
  test(`${fx.name}: loads by URL, the values view shows the fixture's numbers`, async (page) => {
    await openView(page, `example=${fx.name}&view=values`);
    const cells = await page.$$eval('#attention-table td', (tds) => tds.map((td) => [+td.dataset.i, +td.dataset.j, td.dataset.v]));
    const att = fx.expect.attention;
    assert(cells.length === att.length * att[0].length, `${cells.length} attention cells shown for ${att.length}x${att[0].length}`);
    for (const [i, j, text] of cells) close(Number(text), att[i][j], fx.expect.tolerance, `attention[${i}][${j}]`);
    let out = fx.expect.output;
    if (fx.request.layout === 'columns') out = out[0].map((_, n) => out.map((row) => row[n]));
    const outCells = await page.$$eval('#output-table td', (tds) => tds.map((td) => [+td.dataset.i, +td.dataset.j, td.dataset.v]));
    assert(outCells.length === out.length * out[0].length, `${outCells.length} output cells shown for ${out.length}x${out[0].length}`);
    for (const [i, f, text] of outCells) close(Number(text), out[i][f], fx.expect.tolerance, `output[${i}][${f}]`);
  });

test('tables round numbers for reading, with the exact number on hover and in the CSV', async (page) => {
  // the toy request's values are written so that the float64 results carry float noise
  // (-0.09129899999999999): each cell shows 4 significant digits and keeps every digit in its title
  await openView(page, 'example=seed004_toy&view=values');
  const cells = await page.$$eval('#attention-table td, #output-table td', (tds) => tds.map((td) =>
    ({ text: td.textContent, title: td.title, v: td.dataset.v })));
  assert(cells.length > 0, 'no cells');
  let noisy = 0;
  for (const c of cells) {
    const exact = Number(c.v);
    assert(c.title.endsWith(c.v), `the title "${c.title}" does not give the exact ${c.v}`);
    const want = Number.isInteger(exact) ? String(exact) : String(Number(exact.toPrecision(4)));
    assert(c.text === want, `cell ${c.v} shows "${c.text}", not "${want}"`);
    assert(c.text.replace(/^-?0\.0*|e.*$|[-.]/g, '').length <= 4, `"${c.text}" has more than 4 significant digits`);
    if (c.v.replace(/^-?0\.0*|e.*$|[-.]/g, '').length > 4) noisy++;
  }
  assert(noisy > 0, 'no cell of the example needs rounding, so this test checks nothing');
  const csv = fs.readFileSync(await downloadTo(page, path.join(tmp, 'csv-round'), '#export-csv', '.csv'), 'utf8');
  const exactWeights = await page.$$eval('#attention-table td', (tds) => tds.map((td) => td.dataset.v));
  for (const v of exactWeights.filter((x) => x !== '0')) assert(csv.includes(v), `the CSV lacks the exact ${v}`);
});

// A capture written by the lines of docs/visualizer.md (tests/browser/capture.py runs them on a
// small random model) and its census computed by that script in float64 NumPy from the file's
// FP16 q and k: {path, ref}.
function makeCapture(name, opts) {
  const dir = path.join(tmp, name);
  const flags = Object.entries(opts).flatMap(([k, v]) => ['--' + k, String(v)]);
  execFileSync('/usr/bin/python3', [path.join(path.dirname(new URL(import.meta.url).pathname), 'capture.py'),
    '--write', dir, ...flags], { stdio: ['ignore', 'ignore', 'inherit'] });
  return { path: path.join(dir, 'capture.safetensors'), ref: JSON.parse(fs.readFileSync(path.join(dir, 'reference.json'), 'utf8')) };
}

// The capture at src with every F16 tensor widened to F32 (exactly), written to dst: the
// page then rounds each number back to the same FP16 before sending it.
function widenCapture(src, dst) {
  const b = fs.readFileSync(src), n = Number(b.readBigUInt64LE(0)), header = JSON.parse(b.subarray(8, 8 + n).toString());
  const half = (h) => { const e = (h >> 10) & 31, m = h & 1023, s = h & 0x8000 ? -1 : 1;
    return e === 0 ? s * m * 2 ** -24 : s * (1024 + m) * 2 ** (e - 25); };
  const blobs = [];
  let off = 0;
  for (const [name, e] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const data = b.subarray(8 + n + e.data_offsets[0], 8 + n + e.data_offsets[1]), out = Buffer.alloc(data.length * 2);
    assert(e.dtype === 'F16', `${name} is ${e.dtype}`);
    for (let i = 0; i < data.length / 2; i++) out.writeFloatLE(half(data.readUInt16LE(2 * i)), 4 * i);
    Object.assign(e, { dtype: 'F32', data_offsets: [off, off + out.length] });
    blobs.push(out);
    off += out.length;
  }
  const text = Buffer.from(JSON.stringify(header)), len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  fs.writeFileSync(dst, Buffer.concat([len, text, ...blobs]));
  return dst;
}

async function openCapture(page, file) {
  await openView(page, 'view=census');
  await (await page.$('#census-file')).uploadFile(file);
  await page.waitForSelector('body[data-census="ready"], body[data-census="error"]', { timeout: 25000 });
  return page.$eval('body', (b) => b.dataset.census);
}

// The server computes the reductions in float32 from the FP16 values widened exactly; its
// contract for every float32 statistic is 1e-5 relative to the float64 reference (docs/contract.md),
// and a mean over the queries of numbers each within that stays within it.  The previous-token
// share is the page's own, from max_weight (float32) and float64 dot products of the same FP16
// numbers: within the same bound.
const CENSUS_TOL = 1e-5;

test('census: a capture of a random model, every head\'s statistics equal the float64 NumPy reference', async (page) => {
  const cap = makeCapture('census', { layers: 3, heads: 4, 'kv-heads': 2, dim: 32, tokens: 40, sink: 4, local: 3 });
  await openView(page, 'view=census');
  await page.$eval('#census-local', (e) => { e.value = '3'; });
  assert(await openCapture(page, cap.path) === 'ready', await page.$eval('#census-note', (e) => e.textContent));
  for (const stat of ['entropy', 'sink', 'local', 'prev', 'max']) {
    await page.select('#census-stat', stat);
    const cells = await page.$$eval('#census-table td', (tds) => tds.map((td) => ({ L: +td.dataset.layer, h: +td.dataset.head,
      v: Number(td.dataset.v), text: td.textContent, title: td.title })));
    assert(cells.length === 12, `${cells.length} cells for 3 layers x 4 heads`);
    for (const c of cells) {
      close(c.v, cap.ref.layers[c.L][c.h][stat], CENSUS_TOL, `${stat} of layer ${c.L} head ${c.h}`);
      assert(c.title.endsWith(' ' + c.v) && c.text === String(Number(c.v.toPrecision(4))), `cell ${c.L}/${c.h}: "${c.text}", title "${c.title}"`);
    }
    // the heads differ, so the colours must too (a grid of one colour would pass the rest)
    const colours = await page.$$eval('#census-table td', (tds) => new Set(tds.map((td) => getComputedStyle(td).backgroundColor)).size);
    assert(colours > 3, `${stat}: only ${colours} colours over 12 heads`);
  }
  // ordered by the statistic: each layer's heads, largest first, each head once
  await page.select('#census-stat', 'entropy');
  await page.select('#census-order', 'stat');
  const rows = await page.$$eval('#census-table tr', (trs) => trs.slice(1).map((tr) =>
    [...tr.querySelectorAll('td')].map((td) => ({ h: +td.dataset.head, v: Number(td.dataset.v), text: td.textContent }))));
  rows.forEach((row, L) => {
    assert(row.map((c) => c.h).sort().join() === '0,1,2,3', `layer ${L}: heads ${row.map((c) => c.h)}`);
    for (let i = 1; i < row.length; i++) assert(row[i - 1].v >= row[i].v, `layer ${L} not sorted: ${row.map((c) => c.v)}`);
    for (const c of row) assert(c.text.startsWith(`h${c.h} `), `a sorted cell names its head: "${c.text}"`);
  });
  // a click: the keys' received attention along the sequence, and the pooled heatmap
  await page.click('#census-table td[data-layer="1"][data-head="2"]');
  await page.waitForSelector('body[data-census-heatmap="ready"], body[data-census-heatmap="error"]');
  assert(await page.$eval('body', (b) => b.dataset.censusHeatmap) === 'ready', await page.$eval('#census-heatmap-note', (e) => e.textContent));
  const strip = await page.evaluate(() => window.vizCensus.strip());
  const received = cap.ref.layers[1][2].received;
  assert(strip.length === 40, `${strip.length} strip pixels for 40 keys`);
  for (const [k0, k1, v] of strip) {
    assert(k1 === k0 + 1, `a pixel covers keys ${k0}-${k1} of 40`);
    close(v, received[k0], CENSUS_TOL, `received by key ${k0}`);
  }
  const pooledNote = await page.$eval('#census-heatmap-note', (e) => e.textContent);
  assert(/40 × 40 cells of 1 × 1 tokens/.test(pooledNote), 'pooled: ' + pooledNote);
  // above the diagonal the heatmap is hatched (causal), below it coloured
  const cv = await page.$eval('#census-heatmap', (c) => [c.width, c.height]);
  const above = await pixel(page, 'census-heatmap', cv[0] * 0.9, cv[1] * 0.1), below = await pixel(page, 'census-heatmap', cv[0] * 0.1, cv[1] * 0.9);
  assert(above[0] === above[1] && above[1] === above[2] && MASK_SHADES.includes(above[0]), `above the diagonal rgb(${above})`);
  assert(!(below[0] === below[1] && below[1] === below[2]), `below the diagonal rgb(${below}) is grey`);
  // the same capture in F32: the page rounds it to the same FP16 and sends that
  await (await page.$('#census-file')).uploadFile(widenCapture(cap.path, path.join(tmp, 'census', 'f32.safetensors')));
  await page.waitForFunction(() => document.body.dataset.census === 'error' ||
    (document.body.dataset.census === 'ready' && document.getElementById('census-note').textContent.startsWith('f32.safetensors')));
  assert(await page.$eval('body', (b) => b.dataset.census) === 'ready', await page.$eval('#census-note', (e) => e.textContent));
  await page.select('#census-stat', 'prev');
  const f32 = await page.$$eval('#census-table td', (tds) => tds.map((td) => ({ L: +td.dataset.layer, h: +td.dataset.head, v: Number(td.dataset.v) })));
  assert(f32.length === 12, `F32: ${f32.length} cells`);
  for (const c of f32) close(c.v, cap.ref.layers[c.L][c.h].prev, CENSUS_TOL, `F32 capture: prev of layer ${c.L} head ${c.h}`);
});

test('census: past one key a pixel the strip shows the max or the mean of each pixel\'s keys', async (page) => {
  const cap = makeCapture('census-long', { layers: 1, heads: 2, dim: 16, tokens: 1500 });
  assert(await openCapture(page, cap.path) === 'ready', await page.$eval('#census-note', (e) => e.textContent));
  for (const c of await page.$$eval('#census-table td', (tds) => tds.map((td) => ({ h: +td.dataset.head, v: Number(td.dataset.v) }))))
    close(c.v, cap.ref.layers[0][c.h].entropy, CENSUS_TOL, `entropy of head ${c.h}`);
  await page.click('#census-table td[data-layer="0"][data-head="1"]');
  await page.waitForSelector('body[data-census-heatmap="ready"], body[data-census-heatmap="error"]');
  const received = cap.ref.layers[0][1].received;
  for (const how of ['max', 'mean']) {
    await page.select('#census-strip-how', how);
    const strip = await page.evaluate(() => window.vizCensus.strip());
    const width = await page.$eval('#census-strip', (c) => c.width);
    assert(strip.length === width, `${strip.length} pixels for a strip ${width} wide`);
    let next = 0;
    for (const [k0, k1, v] of strip) {
      assert(k0 === next && k1 > k0, `pixels cover keys ${k0}-${k1} after ${next}`);
      next = k1;
      const keys = received.slice(k0, k1);
      const want = how === 'max' ? Math.max(...keys) : keys.reduce((a, b) => a + b, 0) / keys.length;
      close(v, want, CENSUS_TOL, `${how} of keys ${k0}-${k1}`);
    }
    assert(next === 1500, `the strip covers ${next} of 1500 keys`);
  }
  const title = await page.$eval('#census-strip-title', (e) => e.textContent);
  assert(title.includes('from all 1500 queries') && title.includes('mean of 2.1 keys a pixel'), 'strip title: ' + title);
});

// The census's statistics of one head, by their definitions, from its weights w [Lq][Lk]
// (written out here independently of the page): each a mean over the queries.
function censusOfWeights(w, sink, local) {
  const Lq = w.length, Lk = w[0].length, sum = (a) => a.reduce((x, y) => x + y, 0);
  const mean = (f) => sum(w.map(f)) / Lq;
  return {
    entropy: mean((row) => -sum(row.map((x) => (x > 0 ? x * Math.log(x) : 0)))),
    sink: mean((row) => sum(row.slice(0, sink))),
    local: mean((row, i) => sum(row.filter((_, j) => Math.abs(i - j) <= local))),
    max: mean((row) => Math.max(...row)),
    prev: sum(w.slice(1).map((row, i) => (i < Lk ? row[i] : 0))) / (Lq - 1),
  };
}

// Opens the census view, takes the layers the page holds with sink s and window w, and
// checks every cell of every statistic against ref(L, h) (censusOfWeights).
async function checkLayersCensus(page, s, w, ref, layers, heads) {
  await page.click('#views button[data-view="census"]');
  await page.$eval('#census-sink', (e, v) => { e.value = v; }, String(s));
  await page.$eval('#census-local', (e, v) => { e.value = v; }, String(w));
  assert(!await page.$eval('#census-layers', (b) => b.disabled), 'the census does not offer the layers held');
  await page.click('#census-layers');
  await page.waitForSelector('body[data-census="ready"], body[data-census="error"]');
  assert(await page.$eval('body', (b) => b.dataset.census) === 'ready', await page.$eval('#census-note', (e) => e.textContent));
  assert(await page.$eval('#census-causal', (b) => b.disabled), 'causal is offered, though the weights carry their own mask');
  for (const stat of ['entropy', 'sink', 'local', 'prev', 'max']) {
    await page.select('#census-stat', stat);
    const cells = await page.$$eval('#census-table td', (tds) => tds.map((td) => ({ L: +td.dataset.layer, h: +td.dataset.head,
      v: Number(td.dataset.v) })));
    assert(cells.length === layers * heads, `${cells.length} cells for ${layers} layers x ${heads} heads`);
    for (const c of cells) close(c.v, ref(c.L, c.h)[stat], 1e-12, `${stat} of layer ${c.L} head ${c.h}`);
  }
}

test('census of the layers held: a BertViz export (batch 1, zero rows) and stored sets, every head by its definitions', async (page) => {
  // 3 layers, batch 2, 2 heads, 7 tokens; head 1 is causal (zeros above the diagonal), and
  // layer 2's row 3 is all zeros (a fully masked row)
  const T = 7, layers = [0, 1, 2].map((l) => [0, 1].map((b) => [0, 1].map((h) => {
    const m = randomMatrix(T, T, 100 + l * 10 + b * 3 + h).map((r, i) => r.map((v, j) => (h === 1 && j > i ? 0 : Math.exp(2 * v))));
    return m.map((r, i) => { const z = r.reduce((a, x) => a + x, 0); return r.map((v) => (l === 2 && i === 3 ? 0 : v / z)); });
  })));
  // stored sets PREFIX.0, PREFIX.1 run on one x, causal, and the server's weights of each layer;
  // stored first, so that the page lists them when it opens
  const w0 = fixture('seed004_toy').request.weights, w1 = JSON.parse(JSON.stringify(w0));
  w1.wk = w1.wk.map((r) => r.map((v) => 3 * v));
  for (const [name, ws] of [['cen.0', w0], ['cen.1', w1]]) {
    const put = await fetch(base + '/v1/weight-sets/' + name, { method: 'PUT', body: JSON.stringify(ws) });
    assert(put.status === 201 || put.status === 200, `PUT ${name} answered ${put.status}`);
  }
  const req = { x: randomMatrix(6, 3, 77), causal: true };
  const api = [];
  for (const name of ['cen.0', 'cen.1']) api.push((await postJson('/v1/attention', { ...req, weights: name })).json.attention);
  const H = api[0].length === req.x.length ? 1 : api[0].length, headOf = (a, h) => (H === 1 ? a : a[h]);
  const file = path.join(tmp, 'bertviz-census.json');
  fs.writeFileSync(file, JSON.stringify({ attention: layers, tokens: ['a', 'b', 'c', 'd', 'e', 'f', 'g'] }));
  await openView(page, 'view=heatmap');
  assert(await page.$eval('#census-layers', (b) => b.disabled), 'the census offers layers before any are held');
  await (await page.$('#open-file')).uploadFile(file);
  await page.waitForSelector('body[data-status="ready"]');
  await page.select('#batch', '1');
  await checkLayersCensus(page, 3, 1, (L, h) => censusOfWeights(layers[L][1][h], 3, 1), 3, 2);
  // the detail of a head: the strip is each key's column sum, the heatmap its weights
  await page.click('#census-table td[data-layer="2"][data-head="1"]');
  await page.waitForSelector('body[data-census-heatmap="ready"]');
  const w = layers[2][1][1], strip = await page.evaluate(() => window.vizCensus.strip());
  assert(strip.length === T, `${strip.length} strip pixels for ${T} keys`);
  for (const [k0, k1, v] of strip) {
    assert(k1 === k0 + 1, `a pixel covers keys ${k0}-${k1}`);
    close(v, w.reduce((a, row) => a + row[k0], 0), 1e-12, `received by key ${k0}`);
  }
  assert((await page.$eval('#census-strip-title', (e) => e.textContent)).includes(`from all ${T} queries`), 'strip title');
  const cv = await page.$eval('#census-heatmap', (c) => [c.width, c.height]);
  for (const [i, j] of [[5, 2], [6, 6], [0, 0]])
    sameColour(await pixel(page, 'census-heatmap', (j + 0.5) * cv[0] / T, (i + 0.5) * cv[1] / T), viridis(w[i][j]), `heatmap cell [${i}][${j}]`);

  // then the stored sets, in the same page
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(req));
  await page.select('#model-prefix', 'cen');
  await page.waitForSelector('#model figure');
  await checkLayersCensus(page, 2, 0, (L, h) => censusOfWeights(headOf(api[L], h), 2, 0), 2, H);
  // above the diagonal the heatmap is hatched: the request was causal
  await page.click('#census-table td[data-layer="1"][data-head="0"]');
  await page.waitForSelector('body[data-census-heatmap="ready"]');
  const above = await pixel(page, 'census-heatmap', cv[0] * 0.9, cv[1] * 0.1);
  assert(above[0] === above[1] && above[1] === above[2] && MASK_SHADES.includes(above[0]), `above the diagonal rgb(${above})`);
});

test('census: the capture reader rounds F32 and BF16 to FP16 as the server would, and refuses a bad file naming why', async (page) => {
  await openView(page, 'view=census');
  const got = await page.evaluate(async () => {
    const C = window.vizCapture, file = (b) => new File([b], 'capture.safetensors');
    const f = [1, 3.140625, 65519, 65520, -65520, 2 ** -24, 2 ** -25, 3 * 2 ** -25, 2 ** -14 * (1 - 2 ** -11), -0, 1 + 2 ** -11, 1 + 3 * 2 ** -11]
      .map((x) => C.toHalf(x));
    // a one-layer capture of F32 q and BF16 k, [1 head, 2 tokens, 2 dims], written here
    const header = JSON.stringify({ __metadata__: { tokens: '["a","b"]' },
      'layer.0.q': { dtype: 'F32', shape: [1, 2, 2], data_offsets: [0, 16] },
      'layer.0.k': { dtype: 'BF16', shape: [1, 2, 2], data_offsets: [16, 24] } });
    const buf = new ArrayBuffer(8 + header.length + 24), dv = new DataView(buf);
    dv.setBigUint64(0, BigInt(header.length), true);
    new Uint8Array(buf, 8).set(new TextEncoder().encode(header));
    const d = 8 + header.length;
    [1.5, -2, 0.1, 70000].forEach((x, i) => dv.setFloat32(d + 4 * i, x, true));
    [0x3f80, 0xc049, 0x0000, 0x8000].forEach((x, i) => dv.setUint16(d + 16 + 2 * i, x, true));
    const cap = await C.open(file(buf));
    await cap.ready(0);
    const bad = [];
    for (const h of [header.replace('[16,24]', '[16,26]'), header.replace('"F32"', '"I8"'),
      header.replace('"[\\"a\\",\\"b\\"]"', '"[\\"a\\"]"'), header.replace('layer.0.k', 'layer.0.kk')]) {
      const b2 = new ArrayBuffer(8 + h.length + 24), v2 = new DataView(b2);
      v2.setBigUint64(0, BigInt(h.length), true);
      new Uint8Array(b2, 8).set(new TextEncoder().encode(h));
      try { await C.open(file(b2)); bad.push('accepted'); } catch (e) { bad.push(e.message); }
    }
    return { f, q: Array.from(C.headHalf(cap.layers[0].q, 0)), k: Array.from(C.headHalf(cap.layers[0].k, 0)), tokens: cap.tokens, bad };
  });
  // half bits worked by hand: 1, 3.140625, the largest finite, the tie past it to +-Inf, the
  // smallest subnormal, a tie to even (0), 1.5 subnormals (up to 2), the largest subnormal
  // rounded up to the smallest normal, -0, ties to even at 1
  const want = [0x3c00, 0x4248, 0x7bff, 0x7c00, 0xfc00, 0x0001, 0x0000, 0x0002, 0x0400, 0x8000, 0x3c00, 0x3c02];
  got.f.forEach((b, i) => assert(b === want[i], `toHalf case ${i}: 0x${b.toString(16)}, not 0x${want[i].toString(16)}`));
  assert(got.q.join() === [0x3e00, 0xc000, 0x2e66, 0x7c00].join(), 'F32 q as halves: ' + got.q.map((b) => b.toString(16)));
  assert(got.k.join() === [0x3c00, 0xc248, 0x0000, 0x8000].join(), 'BF16 k as halves: ' + got.k.map((b) => b.toString(16)));
  assert(got.tokens.join() === 'a,b', 'tokens: ' + got.tokens);
  const why = ['ends at byte 26', 'dtype "I8"', '1 strings for 2 tokens', 'no tensor "layer.0.k"'];
  got.bad.forEach((m, i) => assert(m.includes(why[i]), `bad file ${i}: "${m}", not about ${why[i]}`));
  // a truncated file opened in the page: the census says why and computes nothing
  const trunc = path.join(tmp, 'truncated.safetensors');
  fs.writeFileSync(trunc, Buffer.from([200, 0, 0, 0, 0, 0, 0, 0, 123]));
  assert(await openCapture(page, trunc) === 'error', 'a truncated file was accepted');
  const note = await page.$eval('#census-note', (e) => e.textContent);
  assert(note.includes('header length is 200 bytes, past the end of the file'), 'note: ' + note);
});

// ---------------------------------------------------------------- the Generation view

// Every v2 answer the page receives, decoded here from its bytes independently of the page,
// by the id the page gave its request: {id: {name: number[]}}.
function recordAnswers(page) {
  const answers = {};
  page.on('response', async (r) => {
    if (!r.url().endsWith('/v2/models/attention/infer') || r.request().method() !== 'POST') return;
    const buf = await r.buffer().catch(() => null);
    if (!buf) return;
    const hlen = Number(r.headers()['inference-header-content-length'] || buf.length);
    const header = JSON.parse(buf.subarray(0, hlen).toString());
    if (!header.id) return;
    const out = {};
    let off = hlen;
    for (const o of header.outputs || []) {
      const size = o.parameters.binary_data_size, b = buf.subarray(off, off + size);
      out[o.name] = o.datatype === 'INT64' ? Array.from({ length: size / 8 }, (_, i) => Number(b.readBigInt64LE(8 * i)))
        : Array.from({ length: size / 4 }, (_, i) => b.readFloatLE(4 * i));
      off += size;
    }
    answers[header.id] = out;
  });
  return answers;
}

// Sets the Generation view's controls: {policy, sink, window, budget, recent, pool, prompt}.
async function genControls(page, c) {
  await page.select('#gen-policy', c.policy);
  for (const k of ['sink', 'window', 'budget', 'recent', 'pool', 'prompt'])
    if (c[k] != null) await page.$eval('#gen-' + k, (e, v) => { e.value = v; }, String(c[k]));
}

async function genWait(page, key, note) {
  await page.waitForFunction((k) => ['ready', 'error'].includes(document.body.dataset[k]), { timeout: 25000 }, key);
  assert(await page.$eval('body', (b, k) => b.dataset[k], key) === 'ready', await page.$eval('#' + note, (e) => e.textContent));
}

// The page's answers of the replay of run `run` (ids gen:RUN:L:h:s), in step order.
function replayAnswers(answers, run, L, h, steps) {
  return Array.from({ length: steps }, (_, s) => {
    const a = answers[`gen:${run}:${L}:${h}:${s}`];
    assert(a, `no answer recorded for step ${s} of layer ${L} head ${h}`);
    return a;
  });
}

const GEN_TOL = 1e-5;   // the server's float32 contract, against float64 (docs/contract.md)

// Replays head h of layer L under the capture's policy and checks, step by step, the page's
// plotted values against the answers received, and those against the NumPy reference.
async function checkReplay(page, answers, cap, L, h) {
  await page.select('#gen-layer', String(L));
  await page.select('#gen-head', String(h));
  await page.click('#gen-replay');
  await page.waitForFunction((L, h) => { const r = window.vizGeneration.replay; return r && r.L === L && r.h === h; }, {}, L, h);
  await genWait(page, 'generation', 'gen-note');
  const ref = cap.ref.generation, want = ref.layers[L][h].steps, T = cap.ref.tokens.length, P = ref.prompt;
  const got = await page.evaluate(() => {
    const r = window.vizGeneration.replay;
    return { run: r.run, steps: r.steps, kept: r.kept.map((k) => Array.from(k)), lost: Array.from(r.lost), error: Array.from(r.error),
      rows: r.rows.map((x) => Array.from(x)), received: Array.from(r.received), lostMax: Number(document.getElementById('gen-lost').dataset.max) };
  });
  assert(got.steps === want.length, `${got.steps} steps, the reference has ${want.length}`);
  const ans = replayAnswers(answers, got.run, L, h, got.steps);
  let prev = [];
  for (let s = 0; s < got.steps; s++) {
    const a = ans[s], from = s === 0 ? 0 : P + s - 1, to = s === 0 ? P : from + 1;
    const kept = a.kept_positions;
    assert(JSON.stringify(kept) === JSON.stringify(want[s].kept), `step ${s}: kept ${kept}, NumPy keeps ${want[s].kept}`);
    assert(JSON.stringify(got.kept[s]) === JSON.stringify(kept), `step ${s}: the page drew kept ${got.kept[s]}, the answer says ${kept}`);
    const seen = [...prev, ...Array.from({ length: to - from }, (_, i) => from + i)];
    for (let i = from; i < to; i++) {
      assert(got.lost[i] === a.lost_mass[i - from] && got.error[i] === a.output_error[i - from],
        `token ${i}: plotted lost_mass ${got.lost[i]} and output_error ${got.error[i]}, answered ${a.lost_mass[i - from]} ${a.output_error[i - from]}`);
      close(a.lost_mass[i - from], want[s].lost_mass[i - from], GEN_TOL, `token ${i}: lost_mass against NumPy`);
      close(a.output_error[i - from], want[s].output_error[i - from], GEN_TOL, `token ${i}: output_error against NumPy`);
      const row = a.attention.slice((i - from) * seen.length, (i - from + 1) * seen.length);
      assert(JSON.stringify(got.rows[i]) === JSON.stringify(row), `token ${i}: the triangle's row is not the answer's`);
    }
    prev = kept;
  }
  assert(JSON.stringify(got.received) === JSON.stringify(ans[got.steps - 1].received_total), 'the strip is not the last received_total');
  assert(got.lostMax === Math.max(...got.lost), `the lost_mass plot spans to ${got.lostMax}`);
  // pixels: T tokens on 360 pixels, the centre of each cell
  const cell = (cv, i, j, rows) => pixel(page, cv, (j + 0.5) * 360 / T, (i + 0.5) * 360 / rows);
  for (const s of [got.steps - 1, Math.floor(got.steps / 2)]) {
    const keptSet = new Set(got.kept[s]), appended = s === 0 ? P : P + s;
    for (const p of [0, 3, appended - 1, Math.floor(appended / 2)])
      sameColour(await cell('gen-kept', s, p, got.steps), keptSet.has(p) ? [38, 50, 56] : [236, 239, 241], `kept map step ${s} position ${p}`);
  }
  const i = T - 1, seenLast = [...got.kept[got.steps - 2], T - 1];
  for (const p of [0, 5, T - 1, Math.floor(T / 2)]) {
    const at = seenLast.indexOf(p);
    sameColour(await cell('gen-triangle', i, p, T), at >= 0 ? viridis(got.rows[i][at]) : [200, 200, 200], `triangle token ${i} position ${p}`);
  }
  return got;
}

// The policy census against the mean lost_mass of the answers received and the reference.
// The page replays runs of layers as one sequence each (census.groups): layer L's head h is
// head at[i] + h of its group's answers (ids gen-census:RUN:GROUP:STEP).  Returns the groups.
async function checkPolicyCensus(page, answers, cap) {
  await page.click('#gen-census');
  await genWait(page, 'genCensus', 'gen-census-note');
  const { run, groups } = await page.evaluate(() => { const c = window.vizGeneration.census; return { run: c.run, groups: c.groups }; });
  const ref = cap.ref.generation, T = cap.ref.tokens.length, steps = 1 + T - ref.prompt;
  const cells = await page.$$eval('#gen-census-table td', (tds) => tds.map((td) => ({ L: +td.dataset.layer, h: +td.dataset.head, v: Number(td.dataset.v) })));
  assert(cells.length === ref.layers.length * ref.layers[0].length, `${cells.length} cells`);
  assert(JSON.stringify(groups.flatMap((g) => g.layers)) === JSON.stringify(ref.layers.map((_, L) => L)),
    `the groups ${JSON.stringify(groups)} are not every layer once, in order`);
  for (const c of cells) {
    const n = groups.findIndex((g) => g.layers.includes(c.L)), g = groups[n], at = g.at[g.layers.indexOf(c.L)] + c.h;
    let sum = 0;
    for (let s = 1; s < steps; s++) {
      const a = answers[`gen-census:${run}:${n}:${s}`];
      assert(a, `no answer recorded for step ${s} of the sequence of layers ${g.layers}`);
      assert(a.lost_mass.length === g.H, `step ${s} of layers ${g.layers}: ${a.lost_mass.length} heads answered, ${g.H} sent`);
      sum += a.lost_mass[at];
    }
    close(c.v, sum / (steps - 1), 1e-12, `layer ${c.L} head ${c.h}: the cell against the answers' mean`);
    close(c.v, ref.layers[c.L][c.h].mean_lost_mass, GEN_TOL, `layer ${c.L} head ${c.h}: mean lost_mass against NumPy`);
  }
  return groups;
}

for (const [policy, opts, controls] of [
  ['h2o', { 'cache-budget': 16, 'cache-recent': 8 }, { budget: 16, recent: 8, prompt: 1 }],
  ['window', { 'cache-sink': 4, 'cache-window': 12 }, { sink: 4, window: 12, prompt: 1 }],
  ['snapkv', { 'cache-budget': 16, 'cache-window': 8, 'cache-pool': 7, prompt: 32 }, { budget: 16, window: 8, pool: 7, prompt: 32 }],
]) {
  test(`generation: ${policy} replayed token by token, plotted as answered, kept positions, lost_mass and output_error as NumPy's; the policy census`, async (page) => {
    const cap = makeCapture('gen-' + policy, { layers: 4, heads: 4, 'kv-heads': 2, dim: 32, tokens: 64, 'cache-policy': policy, ...opts });
    const answers = recordAnswers(page);
    await openView(page, 'view=generation');
    await genControls(page, { policy, ...controls });
    await (await page.$('#gen-file')).uploadFile(cap.path);
    await genWait(page, 'generation', 'gen-note');
    await page.$eval('#gen-prompt', (e, v) => { e.value = v; }, String(controls.prompt));   // the policy's default was set on opening
    const got = await checkReplay(page, answers, cap, 1, 3);
    assert(got.kept.some((k, s) => k.length < (s === 0 ? controls.prompt : controls.prompt + s)), 'the policy never evicted: a weak test');
    const groups = await checkPolicyCensus(page, answers, cap);
    assert(groups.length === 2 && groups.every((g) => g.layers.length === 2), `4 layers in ${JSON.stringify(groups)}: expected two sequences of two`);
  });
}

// The capture at src without its layer.L.v tensors (their bytes stay, unnamed), written to dst.
function dropV(src, dst) {
  const b = fs.readFileSync(src), n = Number(b.readBigUInt64LE(0)), header = JSON.parse(b.subarray(8, 8 + n).toString());
  for (const name of Object.keys(header)) if (/\.v$/.test(name)) delete header[name];
  const text = Buffer.from(JSON.stringify(header)), len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  fs.writeFileSync(dst, Buffer.concat([len, text, b.subarray(8 + n)]));
  return dst;
}

test('generation: a capture without v says the replay needs it, and its policy census is computed all the same', async (page) => {
  const cap = makeCapture('gen-no-v', { layers: 2, heads: 2, dim: 16, tokens: 40, 'cache-policy': 'h2o', 'cache-budget': 8, 'cache-recent': 4 });
  await openView(page, 'view=generation');
  await genControls(page, { policy: 'h2o', budget: 8, recent: 4 });
  await (await page.$('#gen-file')).uploadFile(dropV(cap.path, path.join(tmp, 'gen-no-v', 'no-v.safetensors')));
  await page.waitForFunction(() => ['ready', 'error'].includes(document.body.dataset.generation));
  const note = await page.$eval('#gen-note', (e) => e.textContent);
  assert(note.includes('has no layer.L.v') && note.includes('policy census'), 'note: ' + note);
  await page.click('#gen-census');
  await genWait(page, 'genCensus', 'gen-census-note');
  for (const c of await page.$$eval('#gen-census-table td', (tds) => tds.map((td) => ({ L: +td.dataset.layer, h: +td.dataset.head, v: Number(td.dataset.v) }))))
    close(c.v, cap.ref.generation.layers[c.L][c.h].mean_lost_mass, GEN_TOL, `layer ${c.L} head ${c.h}: mean lost_mass against NumPy`);
});

test('timings: the server\'s phases of the last request beside the page\'s own', async (page) => {
  await openView(page, 'example=seed004_toy&view=values');
  const phases = (await page.$eval('body', (b) => b.dataset.serverPhases || '')).split(',');
  for (const want of ['read', 'parse', 'compute', 'encode'])
    assert(phases.includes(want), `Server-Timing phase ${want} not read by the page: ${phases}`);
  const text = await page.$eval('#timings', (e) => (e.hidden ? '' : e.textContent));
  assert(/^page: request [0-9.]+ ms, decode [0-9.]+ ms, draw [0-9.]+ ms · server: read [0-9.]+ ms, parse [0-9.]+ ms/.test(text) &&
    /compute [0-9.]+ ms/.test(text), 'timings shown: ' + text);
});

test('heatmap: pixels follow the colour scale; causally masked cells are hatched', async (page) => {
  const fx = fixture('seed001_causal');
  await openView(page, 'example=seed001_causal&view=heatmap');
  const att = fx.expect.attention;
  let masked = 0;
  for (let i = 0; i < att.length; i++)
    for (let j = 0; j < att[0].length; j++) {
      if (j > i) {
        const c = await page.evaluate((i, j) => window.viz.cellCenter(i, j), i, j);
        const shades = new Set();
        for (let dy = -4; dy <= 4; dy++)
          for (let dx = -4; dx <= 4; dx++) {
            const p = await pixel(page, 'heatmap', c.x + dx, c.y + dy);
            assert(p[0] === p[1] && p[1] === p[2] && MASK_SHADES.includes(p[0]), `masked cell [${i}][${j}] has rgb(${p})`);
            shades.add(p[0]);
          }
        assert(shades.size === 2, `masked cell [${i}][${j}] is not hatched`);
        masked++;
      } else {
        sameColour(await cellPixel(page, i, j), viridis(att[i][j]), `cell [${i}][${j}] weight ${att[i][j]}`);
      }
    }
  assert(masked === 6, 'masked cells: ' + masked);
  // the log scale maps the same weights to other colours
  await page.select('#scale', 'log');
  sameColour(await cellPixel(page, 3, 1), viridis(att[3][1], true), 'log scale cell [3][1]');
  assert((await page.evaluate(() => location.hash)).includes('scale=log'), 'the scale is not in the URL hash');
});

test('hover shows query, key and the exact weight', async (page) => {
  const fx = fixture('seed004_toy');
  await openView(page, 'example=seed004_toy&view=heatmap');
  const api = await postJson('/v1/attention', fx.request);
  const box = await (await page.$('#heatmap')).boundingBox();
  for (const [i, j] of [[0, 0], [1, 2], [2, 1]]) {
    const c = await page.evaluate((i, j) => window.viz.cellCenter(i, j), i, j);
    await page.mouse.move(box.x + c.x, box.y + c.y);
    const tip = await page.$eval('#tooltip', (t) => (t.hidden ? '' : t.textContent));
    const want = String(api.json.attention[i][j]);
    assert(tip.includes(`query ${i}`) && tip.includes(`key   ${j}`), 'tooltip: ' + tip);
    assert(tip.includes('weight ' + want + '\n') || tip.endsWith('weight ' + want), `tooltip "${tip}" does not give ${want}`);
  }
});

const HEADS_REQ = { q: [randomMatrix(5, 8, 1), randomMatrix(5, 8, 2)], k: [randomMatrix(6, 8, 3), randomMatrix(6, 8, 4)],
  v: [randomMatrix(6, 4, 5), randomMatrix(6, 4, 6)], heads: 4 };

test('heads grid: one thumbnail per (batch, head) and the means; a click selects the head', async (page) => {
  await openView(page, 'view=grid');
  await setRequest(page, HEADS_REQ);
  const figs = await page.$$eval('#grid figure', (fs) => fs.map((f) => f.dataset.batch + '/' + f.dataset.head));
  const want = [];
  for (let b = 0; b < 2; b++) { for (let h = 0; h < 4; h++) want.push(b + '/' + h); want.push(b + '/mean'); }
  assert(figs.join() === want.join(), 'thumbnails: ' + figs.join());
  const api = (await postJson('/v1/attention', HEADS_REQ)).json;
  await page.click('#grid figure[data-batch="1"][data-head="2"]');
  await page.waitForSelector('#heatmap-view:not([hidden])');
  const hash = await page.evaluate(() => location.hash);
  assert(hash.includes('batch=1') && hash.includes('head=2') && hash.includes('view=heatmap'), 'hash: ' + hash);
  for (const [i, j] of [[0, 0], [2, 3], [4, 5]])
    sameColour(await cellPixel(page, i, j), viridis(api.attention[1][2][i][j]), `batch 1 head 2 cell [${i}][${j}]`);
  const image = () => page.evaluate(() => {
    const c = document.getElementById('heatmap');
    return Array.from(c.getContext('2d').getImageData(110, 90, 600, 620).data.filter((_, k) => k % 97 === 0)).join();
  });
  const before = await image();
  await page.select('#head', '0');
  for (const [i, j] of [[0, 0], [2, 3], [4, 5]])
    sameColour(await cellPixel(page, i, j), viridis(api.attention[1][0][i][j]), `batch 1 head 0 cell [${i}][${j}]`);
  assert(before !== await image(), 'selecting another head did not change the drawing');
});

test('an invalid request shows the API error and highlights its field', async (page) => {
  await openView(page, 'example=seed004_toy');
  const bad = { q: [[1, 0], [0, 1]], k: [[1, 0], [0, 1]], v: [[1, 2]] };
  const api = await postJson('/v1/attention', bad);
  assert(api.status === 400 && api.json.error.field === 'v', 'the API answered ' + JSON.stringify(api.json));
  await setRequest(page, bad);
  const err = await page.$eval('#error', (e) => ({ hidden: e.hidden, text: e.textContent, field: e.dataset.field, code: e.dataset.code }));
  assert(!err.hidden && err.code === api.json.error.code && err.text.includes(api.json.error.message), 'error shown: ' + JSON.stringify(err));
  assert(err.field === 'v', 'field: ' + err.field);
  const sel = await page.$eval('#request', (ta) => ({ text: ta.value.slice(ta.selectionStart, ta.selectionEnd), cls: ta.className }));
  assert(sel.text === '"v"' && sel.cls.includes('field-error'), 'highlight: ' + JSON.stringify(sel));
});

test('PNG export gives a PNG of the heatmap', async (page) => {
  await openView(page, 'example=seed000_decoder&view=heatmap');
  const file = await downloadTo(page, path.join(tmp, 'png'), '#export-png', '.png');
  const png = fs.readFileSync(file);
  assert(png.subarray(0, 8).equals(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10])), 'not a PNG signature');
  const w = png.readUInt32BE(16), h = png.readUInt32BE(20);
  const size = await page.evaluate(() => [document.getElementById('heatmap').width + document.getElementById('legend').width,
    document.getElementById('heatmap').height]);
  assert(w === size[0] && h === size[1], `PNG is ${w}x${h}, the view ${size}`);
});

test('CSV and JSON export give the numbers of the view', async (page) => {
  const fx = fixture('seed000_encoder');
  await openView(page, 'example=seed000_encoder&view=heatmap');
  const csv = fs.readFileSync(await downloadTo(page, path.join(tmp, 'csv'), '#export-csv', '.csv'), 'utf8').trim().split('\n');
  assert(csv.length === 5 && csv[0] === 'query\\key,0,1,2,3', 'CSV header: ' + csv[0]);
  csv.slice(1).forEach((line, i) => line.split(',').slice(1).forEach((v, j) =>
    close(Number(v), fx.expect.attention[i][j], fx.expect.tolerance, `CSV [${i}][${j}]`)));
  const json = JSON.parse(fs.readFileSync(await downloadTo(page, path.join(tmp, 'json'), '#export-json', '.json'), 'utf8'));
  close(json.output[2][5], fx.expect.output[2][5], fx.expect.tolerance, 'JSON output[2][5]');
});

test('copy as curl gives a command that reproduces the answer', async (page) => {
  const fx = fixture('seed003_projections');
  await openView(page, 'example=seed003_projections');
  await page.click('#copy-curl');
  const cmd = await page.$eval('#curl', (t) => t.value);
  assert(cmd.startsWith('curl -s ' + base + '/v1/attention'), 'command: ' + cmd.slice(0, 80));
  const out = JSON.parse(execFileSync('bash', ['-c', cmd], { encoding: 'utf8', timeout: 10000 }));
  close(out.attention[4][1], fx.expect.attention[4][1], fx.expect.tolerance, 'curl attention[4][1]');
});

test('lines view: lines by weight, hovering a token isolates its lines', async (page) => {
  await openView(page, 'example=seed003_projections&view=lines');
  const ink = () => page.evaluate(() => {
    const d = document.getElementById('lines').getContext('2d').getImageData(150, 0, 420, 720).data;
    let n = 0;
    for (let k = 0; k < d.length; k += 4) if (d[k] !== 255 || d[k + 1] !== 255 || d[k + 2] !== 255) n++;
    return n;
  });
  const all = await ink();
  assert(all > 1000, 'few lines drawn: ' + all);
  const box = await (await page.$('#lines')).boundingBox();
  const rowH = await page.$eval('#lines', (c) => Number(c.dataset.rowHeight));
  await page.mouse.move(box.x + 100, box.y + 10 + rowH * 2.5);
  const one = await ink();
  assert(one > 0 && one < all * 0.5, `hovering query 2 left ${one} of ${all} line pixels`);
});

test('sparsity: threshold and top-k hide weights, masked stays hatched', async (page) => {
  const fx = fixture('seed000_decoder');
  const att = fx.expect.attention;
  await openView(page, 'example=seed000_decoder&view=heatmap&threshold=0.3');
  for (let i = 0; i < 4; i++)
    for (let j = 0; j <= i; j++) {
      const p = await cellPixel(page, i, j);
      if (att[i][j] < 0.3) assert(p.join() === '255,255,255', `cell [${i}][${j}] ${att[i][j]} under the threshold is rgb(${p})`);
      else sameColour(p, viridis(att[i][j]), `cell [${i}][${j}]`);
    }
  await openView(page, 'example=seed000_decoder&view=values&topk=1');
  const shown = await page.$$eval('#attention-table td', (tds) => tds.filter((t) => !t.className).map((t) => [+t.dataset.i, +t.dataset.j]));
  assert(shown.length === 4, 'top-1 left ' + shown.length + ' weights');
  for (const [i, j] of shown) assert(att[i][j] === Math.max(...att[i].slice(0, i + 1)), `top-1 of row ${i} is not ${j}`);
  const masked = await page.$$eval('#attention-table td.masked', (tds) => tds.length);
  assert(masked === 6, 'masked cells in the table: ' + masked);
});

test('heatmap past one cell per pixel: each pixel is the maximum of its block; zoom keeps cells right', async (page) => {
  const Lk = 2000;
  const req = { q: randomMatrix(6, 4, 7), k: randomMatrix(Lk, 4, 8), v: randomMatrix(Lk, 2, 9), scale: 4 };
  await openView(page, 'view=heatmap');
  await setRequest(page, req);
  const att = (await postJson('/v1/attention', req)).json.attention;
  const plot = { x: 110, y: 90, w: 600 };
  for (const col of [0, 77, 311, 599]) {
    const j0 = Math.floor(Lk * col / plot.w), j1 = Math.max(j0 + 1, Math.floor(Lk * (col + 1) / plot.w));
    const c = await page.evaluate(() => window.viz.cellCenter(3, 0));
    const got = await pixel(page, 'heatmap', plot.x + col, c.y);
    sameColour(got, viridis(Math.max(...att[3].slice(j0, j1))), `pixel column ${col} (keys ${j0}..${j1 - 1})`);
  }
  // zoom in at the middle with the wheel: cells get wider and still show their own weight
  const box = await (await page.$('#heatmap')).boundingBox();
  await page.mouse.move(box.x + plot.x + 300, box.y + 300);
  for (let k = 0; k < 12; k++) await page.mouse.wheel({ deltaY: -100 });
  const c0 = await page.evaluate(() => window.viz.cellCenter(2, 1000)), c1 = await page.evaluate(() => window.viz.cellCenter(2, 1001));
  assert(c1.x - c0.x > 3, 'zooming did not widen the cells: ' + JSON.stringify([c0, c1]));
  sameColour(await pixel(page, 'heatmap', c0.x, c0.y), viridis(att[2][1000]), 'zoomed cell [2][1000] at ' + JSON.stringify(c0));
});

test('stored weight set, cross-attention, own mask and token labels for each side', async (page) => {
  const weights = fixture('seed004_toy').request.weights;
  const put = await fetch(base + '/v1/weight-sets/toy', { method: 'PUT', body: JSON.stringify(weights) });
  assert(put.status === 201 || put.status === 200, 'PUT answered ' + put.status);
  await openView(page, 'view=heatmap');
  const sets = await page.$$eval('#weight-set option', (os) => os.map((o) => o.value));
  assert(sets.includes('toy'), 'weight sets offered: ' + sets.join());
  const req = { x: [[0.3, 0.8, -0.3], [-0.9, -0.1, 0.0]], context: [[1, -0.2, 0.3], [0.5, 0.5, 0.5], [-1, 0, 2]],
    mask: [[1, 0, 1], [1, 1, 0]] };
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(req));
  await page.select('#weight-set', 'toy');
  assert(JSON.parse(await page.$eval('#request', (ta) => ta.value)).weights === 'toy', 'the request does not name the set');
  await page.type('#q-tokens', 'snow falls');
  await page.type('#k-tokens', '["on", "the hills", "tonight"]');
  await page.click('#run');
  await page.waitForSelector('body[data-status="ready"]');
  const api = (await postJson('/v1/attention', { ...req, weights: 'toy' })).json;
  const box = await (await page.$('#heatmap')).boundingBox();
  const hover = async (i, j) => {
    const c = await page.evaluate((i, j) => window.viz.cellCenter(i, j), i, j);
    await page.mouse.move(box.x + c.x, box.y + c.y);
    return page.$eval('#tooltip', (t) => t.textContent);
  };
  let tip = await hover(1, 1);
  assert(tip.includes('"falls"') && tip.includes('"the hills"') && tip.endsWith('weight ' + String(api.attention[1][1])), 'tooltip: ' + tip);
  tip = await hover(0, 1);
  assert(tip.includes('"snow"') && tip.endsWith('masked (mask)'), 'tooltip of a masked cell: ' + tip);
  const p = await cellPixel(page, 1, 2);
  assert(p[0] === p[1] && p[1] === p[2] && MASK_SHADES.includes(p[0]), 'masked cell [1][2] drawn rgb(' + p + ')');
  sameColour(await cellPixel(page, 0, 2), viridis(api.attention[0][2]), 'cell [0][2]');
});

// The binary v2 form both ways: q, k and v as raw float32 after the request's JSON header,
// the weights as raw bytes after the answer's, compared with the weights of /v1.
test('large request: weights read from the binary v2 form into a Float32Array', async (page) => {
  const L = 256;
  const req = { q: randomMatrix(L, 8, 21), k: randomMatrix(L, 8, 22), v: randomMatrix(L, 4, 23), dtype: 'float32', causal: true };
  const v1 = (await postJson('/v1/attention', req)).json;
  await openView(page, 'view=heatmap');
  await setRequest(page, req);
  // the JSON header of the binary request the page sent (its bytes follow it)
  const asked = await page.evaluate(() => window.viz.data.asked);
  assert(asked, 'the page did not call POST /v2/models/attention/infer');
  assert(asked.parameters.binary_data_output === true && asked.parameters.causal === true, 'parameters: ' + JSON.stringify(asked.parameters));
  assert(asked.inputs.map((i) => i.name + ':' + i.datatype + ':' + i.shape).join() === `q:FP32:${L},8,k:FP32:${L},8,v:FP32:${L},4`,
    'inputs: ' + asked.inputs.map((i) => i.name + ':' + i.datatype + ':' + i.shape).join());
  const kind = await page.evaluate(() => window.viz.data.attn.constructor.name + ' ' + window.viz.data.attn.length);
  assert(kind === `Float32Array ${L * L}`, 'weights held as ' + kind);
  const box = await (await page.$('#heatmap')).boundingBox();
  await page.mouse.move(box.x + 110 + 600 * 10.5 / L, box.y + 90 + 620 * 200.5 / L);
  const tip = await page.$eval('#tooltip', (t) => t.textContent);
  assert(tip.includes('query 200') && tip.includes('key   10') &&
    tip.endsWith('weight ' + String(Math.fround(v1.attention[200][10]))), 'tooltip: ' + tip);
  const c = await page.evaluate(() => window.viz.cellCenter(3, 200));
  const p = await pixel(page, 'heatmap', c.x, c.y);
  assert(p[0] === p[1] && p[1] === p[2], 'causally masked cell [3][200] drawn rgb(' + p + ')');
});

test('large request with FP16 answers: half the bytes, each weight the float32 weight rounded to FP16', async (page) => {
  const L = 256;
  const req = { q: randomMatrix(L, 8, 31), k: randomMatrix(L, 8, 32), v: randomMatrix(L, 4, 33), dtype: 'float32', causal: true };
  const v1 = (await postJson('/v1/attention', req)).json;
  await openView(page, 'view=heatmap&transfer=fp16');
  assert(await page.$eval('#transfer', (e) => e.value) === 'fp16', 'the link did not choose FP16');
  await setRequest(page, req);
  const asked = await page.evaluate(() => window.viz.data.asked);
  assert(asked && asked.parameters.output_datatype === 'FP16', 'parameters: ' + JSON.stringify(asked && asked.parameters));
  const got = await page.evaluate(() => ({ kind: window.viz.data.attn.constructor.name, attn: Array.from(window.viz.data.attn),
    header: window.viz.data.header.outputs.map((o) => o.name + ':' + o.datatype + ':' + o.parameters.binary_data_size) }));
  assert(got.kind === 'Float32Array' && got.attn.length === L * L, `weights held as ${got.kind} of ${got.attn.length}`);
  assert(got.header.includes(`attention:FP16:${L * L * 2}`), 'outputs: ' + got.header.join(' '));
  // the rounding is the page's reader's (viz_capture.js toHalf, checked by hand in the census
  // test) applied to the float32 weights of /v1: nearest even, so every weight must agree exactly
  const want = await page.evaluate((w) => w.map((x) => window.vizCapture.HALF[window.vizCapture.toHalf(x)]), v1.attention.flat());
  let differ = 0;
  got.attn.forEach((x, i) => { if (x !== want[i]) differ++; });
  assert(differ === 0, `${differ} of ${L * L} weights are not the FP16 rounding of the float32 weight`);
  assert(got.attn.some((x, i) => x !== Math.fround(v1.attention.flat()[i])), 'no weight was rounded: the answer was not FP16');
});

test('a BertViz export opens offline, without the server', async (page) => {
  await openView(page, 'view=heatmap');
  const layers = [0, 1].map((l) => [Array.from({ length: 3 }, (_, h) => {
    const m = randomMatrix(5, 5, 10 + l * 3 + h).map((r) => r.map(Math.exp));
    return m.map((r) => { const s = r.reduce((a, b) => a + b, 0); return r.map((v) => v / s); });
  })]);
  const file = path.join(tmp, 'bertviz.json');
  fs.writeFileSync(file, JSON.stringify({ attention: layers, tokens: ['The', 'cat', 'sat', 'down', '.'] }));
  await page.setOfflineMode(true);
  await page.$eval('body', (b) => { b.dataset.status = 'offline'; });
  const before = page.record.requests.length;
  await (await page.$('#open-file')).uploadFile(file);
  await page.waitForSelector('body[data-status="ready"]');
  assert(page.record.requests.slice(before).every((u) => u.startsWith('blob:') || u.startsWith('data:')),
    'requests while offline: ' + page.record.requests.slice(before).join(' '));
  const heads = await page.$$eval('#head option', (os) => os.map((o) => o.value));
  assert(heads.join() === '0,1,2,mean', 'heads offered: ' + heads.join());
  sameColour(await cellPixel(page, 1, 3), viridis(layers[0][0][0][1][3]), 'layer 0 head 0 cell [1][3]');
  await page.select('#layer', '1');
  await page.select('#head', '2');
  sameColour(await cellPixel(page, 4, 0), viridis(layers[1][0][2][4][0]), 'layer 1 head 2 cell [4][0]');
  const box = await (await page.$('#heatmap')).boundingBox();
  const c = await page.evaluate(() => window.viz.cellCenter(2, 1));
  await page.mouse.move(box.x + c.x, box.y + c.y);
  const tip = await page.$eval('#tooltip', (t) => t.textContent);
  assert(tip.includes('"sat"') && tip.includes('"cat"') && tip.includes(String(layers[1][0][2][2][1])), 'tooltip: ' + tip);
  await page.setOfflineMode(false);
});

// A float64 reference of softmax(q kᵀ / sqrt(dk)) for the tests below, written out here
// independently of the server and the page.
function refAttention(q, k, causal) {
  const scale = 1 / Math.sqrt(q[0].length);
  return q.map((qi, i) => {
    const s = k.map((kj, j) => (causal && j > i) ? -Infinity : qi.reduce((a, x, t) => a + x * kj[t], 0) * scale);
    const m = Math.max(...s), e = s.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  });
}

// The numbers of a table's cells: the exact number every numeric cell keeps beside the
// rounded one it shows.
async function tableNumbers(page, selector) {
  return page.$$eval(selector + ' td', (tds) => tds.map((td) => ({ i: Number(td.dataset.i), j: Number(td.dataset.j),
    v: Number(td.dataset.v) })));
}

test('selection: several queries summed or averaged under the heatmap and in the lines view', async (page) => {
  const fx = fixture('seed000_encoder'), A = fx.expect.attention;
  await openView(page, 'example=seed000_encoder&view=heatmap&select=0,2');
  let cells = await tableNumbers(page, '#selection-table');
  assert(cells.length === A[0].length, `${cells.length} combined weights shown for ${A[0].length} keys`);
  for (const c of cells) close(c.v, A[0][c.j] + A[2][c.j], fx.expect.tolerance, `sum for key ${c.j}`);
  await page.select('#agg', 'mean');
  cells = await tableNumbers(page, '#selection-table');
  for (const c of cells) close(c.v, (A[0][c.j] + A[2][c.j]) / 2, fx.expect.tolerance, `mean for key ${c.j}`);
  assert((await page.$eval('#selection-title', (e) => e.textContent)).startsWith('Mean of the attention of 2 selected queries'),
    'the choice is not shown: ' + await page.$eval('#selection-title', (e) => e.textContent));
  // the strip is coloured by the combined weight of each key
  const strip = await page.$eval('#selection-strip', (cv) => ({ w: cv.width }));
  const j = 1, x = (j + 0.5) / A[0].length * strip.w;
  sameColour(await pixel(page, 'selection-strip', x, 10), viridis((A[0][j] + A[2][j]) / 2), 'strip at key 1');
  // shift-click adds a row; the link keeps the selection and the choice
  const box = await (await page.$('#heatmap')).boundingBox();
  const c = await page.evaluate(() => window.viz.cellCenter(3, 0));
  await page.keyboard.down('Shift');
  await page.mouse.click(box.x + c.x, box.y + c.y);
  await page.keyboard.up('Shift');
  const hash = await page.evaluate(() => location.hash);
  assert(/select=0%2C2%2C3|select=0,2,3/.test(hash) && hash.includes('agg=mean'), 'hash: ' + hash);
  cells = await tableNumbers(page, '#selection-table');
  close(cells[0].v, (A[0][0] + A[2][0] + A[3][0]) / 3, fx.expect.tolerance, 'mean of 3 for key 0');
  await page.click('#views button[data-view="lines"]');
  const note = await page.$eval('#lines-note', (e) => e.textContent);
  assert(note.startsWith('Lines of the 3 selected queries'), 'lines note: ' + note);
});

test('share: a typed request travels in the link and reopens the same view', async (page) => {
  const req = { q: randomMatrix(5, 4, 31), k: randomMatrix(6, 4, 32), v: randomMatrix(6, 3, 33), causal: true };
  const ref = refAttention(req.q, req.k, true);
  await openView(page, 'view=values&select=1');
  await setRequest(page, req);
  await page.click('#share');
  await page.waitForSelector('#share-link:not([hidden])');
  const url = await page.$eval('#share-link', (e) => e.value);
  assert(url.startsWith(base + '/viz#') && url.includes('req=') && url.includes('view=values') && url.includes('select=1'), 'link: ' + url);
  const other = await newPage();
  try {
    await other.goto(url);
    await other.waitForSelector('body[data-status="ready"], body[data-status="error"]');
    assert(await other.$eval('body', (b) => b.dataset.status) === 'ready', 'the link did not open: ' + await other.$eval('#error', (e) => e.textContent));
    assert(JSON.stringify(JSON.parse(await other.$eval('#request', (t) => t.value))) === JSON.stringify(req), 'the request came back changed');
    const cells = await tableNumbers(other, '#attention-table');
    assert(cells.length === 30, `${cells.length} weights in the values view`);
    for (const c of cells) close(c.v, ref[c.i][c.j], 1e-12, `weight [${c.i}][${c.j}]`);
    assert(await other.evaluate(() => window.viz.state.view + ' ' + window.viz.state.select.join()) === 'values 1', 'the view came back otherwise');
    await checkClean(other);
  } finally {
    await other.context_.close().catch(() => {});
  }
  // a request too large for a link says why and what to do instead
  await setRequest(page, { q: randomMatrix(300, 64, 41), k: randomMatrix(300, 64, 42), v: randomMatrix(300, 64, 43) });
  await page.click('#share');
  await page.waitForSelector('#share-note:not([hidden])');
  const why = await page.$eval('#share-note', (e) => e.textContent);
  assert(/carries up to 32768/.test(why) && why.includes('PUT /v1/weight-sets/NAME'), 'note: ' + why);
  assert(await page.$eval('#share-link', (e) => e.hidden), 'a link was offered for a request too large');
  // a damaged link is an error, not a blank page
  await page.goto(base + '/viz#view=heatmap&req=AAA$');
  await page.waitForSelector('body[data-status="error"]');
  assert((await page.$eval('#error', (e) => e.textContent)).startsWith('bad_link'), 'error: ' + await page.$eval('#error', (e) => e.textContent));
});

test('compare: causal against full attention side by side, A − B equals the fixtures\' difference', async (page) => {
  const a = fixture('seed001_causal'), b = fixture('seed001_full');
  await openView(page, 'example=seed001_causal&view=compare&compare=example:seed001_full');
  await page.waitForSelector('body[data-compare="ready"], body[data-compare="error"]');
  assert(await page.$eval('body', (e) => e.dataset.compare) === 'ready', await page.$eval('#compare-title', (e) => e.textContent));
  const A = a.expect.attention, B = b.expect.attention, tol = a.expect.tolerance + b.expect.tolerance;
  const cells = await tableNumbers(page, '#compare-table');
  assert(cells.length === A.length * A[0].length, `${cells.length} differences shown`);
  let range = 0;
  for (const c of cells) {
    close(c.v, A[c.i][c.j] - B[c.i][c.j], tol, `A − B [${c.i}][${c.j}]`);
    range = Math.max(range, Math.abs(A[c.i][c.j] - B[c.i][c.j]));
  }
  // the difference panel: white at zero, red above, blue below, on [-range, range]
  const diverging = (d) => {
    const t = Math.max(-1, Math.min(1, d / range)), end = t < 0 ? [33, 102, 172] : [178, 24, 43];
    return [247, 247, 247].map((m, k) => Math.round(m + (end[k] - m) * Math.abs(t)));
  };
  const L = A.length, at = (i, j) => [(j + 0.5) / L * 300, (i + 0.5) / L * 300];
  for (const [i, j] of [[0, 0], [1, 3], [3, 1]])
    sameColour(await pixel(page, 'compare-diff', ...at(i, j)), diverging(A[i][j] - B[i][j]), `difference [${i}][${j}]`);
  sameColour(await pixel(page, 'compare-b', ...at(1, 3)), viridis(B[1][3]), 'B [1][3]');
  // hovering shows A, B and the difference of the cell
  const box = await (await page.$('#compare-diff')).boundingBox();
  const [x, y] = at(2, 1);
  await page.mouse.move(box.x + x, box.y + y);
  const tip = await page.$eval('#compare-tip', (e) => e.textContent);
  assert(tip.includes('query 2') && tip.includes('key 1') && tip.includes('A − B'), 'tip: ' + tip);
  // "causal" compares the same request with causal turned over: full − causal here
  await openView(page, 'example=seed001_full&view=compare&compare=causal');
  await page.waitForSelector('body[data-compare="ready"], body[data-compare="error"]');
  const back = await tableNumbers(page, '#compare-table');
  for (const c of back) close(c.v, B[c.i][c.j] - A[c.i][c.j], tol, `full − causal [${c.i}][${c.j}]`);
  // results of different shapes are refused with the reason
  await openView(page, 'example=seed001_full&view=compare&compare=example:seed004_toy');
  await page.waitForSelector('body[data-compare="ready"], body[data-compare="error"]');
  assert((await page.$eval('#compare-title', (e) => e.textContent)).includes('differ in shape'), 'shape mismatch not said');
});

// Two generations of one stored set: the page keeps the current one (GET now), a PUT replaces
// the set, and the compare view shows A, the set's current generation computed again, against
// B, the kept one given inline.  The reference is float64 softmax(x wq (x wk)ᵀ / sqrt(dk)).
test('compare: a kept generation of a stored set against the set after a PUT replaced it; the link carries both', async (page) => {
  const put = async (name, w) => {
    const r = await fetch(base + '/v1/weight-sets/' + name, { method: 'PUT', body: JSON.stringify(w) });
    assert(r.status === 200 || r.status === 201, `PUT ${name} answered ${r.status}`);
    return (await r.json()).generation;
  };
  const mul = (a, w) => a.map((r) => w[0].map((_, c) => r.reduce((s, v, t) => s + v * w[t][c], 0)));
  const ref = (x, w) => refAttention(mul(x, w.wq), mul(x, w.wk), false);
  const x = randomMatrix(5, 3, 71);
  const w1 = { wq: randomMatrix(3, 4, 72), wk: randomMatrix(3, 4, 73), wv: randomMatrix(3, 2, 74) };
  const w2 = { wq: randomMatrix(3, 4, 75), wk: randomMatrix(3, 4, 76), wv: w1.wv };
  const R1 = ref(x, w1), R2 = ref(x, w2);
  const g1 = await put('gen', w1);
  await openView(page, 'view=heatmap');
  await setRequest(page, { x, weights: 'gen' });
  await page.waitForSelector('#keep:not([hidden])');
  await page.click('#keep');
  await page.waitForSelector('#keep-note:not([hidden])');
  assert((await page.evaluate(() => window.viz.state.compare)).startsWith('req:'), 'B is not a request carried in the link');
  assert((await page.$eval('#keep-note', (e) => e.textContent)).includes(`generation ${g1} of set gen`), 'keep note');
  const g2 = await put('gen', w2);
  assert(g2 > g1, `the PUT answered generation ${g2} after ${g1}`);
  // A is the new generation, B the kept one; the numbers of the table and of the hover
  const check = async (p, what) => {
    await p.waitForSelector('body[data-compare="ready"], body[data-compare="error"]');
    assert(await p.$eval('body', (e) => e.dataset.compare) === 'ready', what + ': ' + await p.$eval('#compare-title', (e) => e.textContent));
    const la = await p.$eval('#compare-a-label', (e) => e.textContent), lb = await p.$eval('#compare-b-label', (e) => e.textContent);
    assert(la === `A: set gen, generation ${g2} (current)` && lb === `B: set gen, generation ${g1} (kept)`, `${what}: labels "${la}", "${lb}"`);
    const cells = await tableNumbers(p, '#compare-table');
    assert(cells.length === 25, `${what}: ${cells.length} differences shown`);
    let largest = 0;
    for (const c of cells) {
      close(c.v, R2[c.i][c.j] - R1[c.i][c.j], 1e-12, `${what}: A − B [${c.i}][${c.j}]`);
      largest = Math.max(largest, Math.abs(c.v));
    }
    assert(largest > 1e-3, `${what}: A − B is ${largest} at most: B is the new generation too`);
    const box = await (await p.$('#compare-diff')).boundingBox();
    for (const [i, j] of [[0, 0], [2, 3], [4, 1]]) {
      await p.mouse.move(box.x + (j + 0.5) * 60, box.y + (i + 0.5) * 60);
      const tip = await p.$eval('#compare-tip', (e) => e.textContent);
      const m = /^query (\d+) .*, key (\d+) .*\nA (\S+)\nB (\S+)\nA − B (\S+)$/.exec(tip);
      assert(m && +m[1] === i && +m[2] === j, `${what}: tip "${tip}" for [${i}][${j}]`);
      close(Number(m[3]), R2[i][j], 1e-12, `${what}: A [${i}][${j}]`);
      close(Number(m[4]), R1[i][j], 1e-12, `${what}: B [${i}][${j}]`);
      close(Number(m[5]), R2[i][j] - R1[i][j], 1e-12, `${what}: A − B [${i}][${j}] in the tip`);
    }
  };
  await page.click('#views button[data-view="compare"]');
  await check(page, 'after the PUT');
  // a link copied now carries both and reopens the same comparison
  await page.click('#share');
  await page.waitForSelector('#share-link:not([hidden])');
  const url = await page.$eval('#share-link', (e) => e.value);
  assert(url.includes('compare=req%3A') && url.includes(`kept=gen%40${g1}`) && url.includes('view=compare'), 'link: ' + url.slice(0, 200));
  const other = await newPage();
  try {
    await other.goto(url);
    await check(other, 'the link');
    await checkClean(other);
  } finally {
    await other.context_.close().catch(() => {});
  }
  // a generation too large for a link stays in the page, which says so and why
  const W = 64, big = { wq: randomMatrix(W, W, 81), wk: randomMatrix(W, W, 82), wv: randomMatrix(W, W, 83) };
  const xb = randomMatrix(3, W, 84), big2 = { ...big, wq: randomMatrix(W, W, 85) };
  const gb = await put('big', big);
  await page.click('#views button[data-view="heatmap"]');
  await setRequest(page, { x: xb, weights: 'big' });
  await page.click('#keep');
  await page.waitForFunction(() => window.viz.state.compare.startsWith('kept:'));
  const note = await page.$eval('#keep-note', (e) => e.textContent);
  assert(/cannot travel in a link/.test(note) && /carries up to 32768/.test(note) && note.includes('set:OTHER'), 'note: ' + note);
  assert(await page.evaluate((k) => sessionStorage.getItem(k) !== null, `viz-kept:big@${gb}`), 'B is not in sessionStorage');
  await put('big', big2);
  await page.click('#views button[data-view="compare"]');
  await page.waitForSelector('body[data-compare="ready"], body[data-compare="error"]');
  const Rb1 = ref(xb, big), Rb2 = ref(xb, big2);
  for (const c of await tableNumbers(page, '#compare-table')) close(c.v, Rb2[c.i][c.j] - Rb1[c.i][c.j], 1e-12, `big: A − B [${c.i}][${c.j}]`);
  await page.click('#share');
  await page.waitForSelector('#share-note:not([hidden])');
  assert((await page.$eval('#share-note', (e) => e.textContent)).includes('leaves out the comparison'), 'share note');
});

test('model view: layers x heads from stored sets PREFIX.N, and the rollout across layers', async (page) => {
  const w0 = fixture('seed004_toy').request.weights;
  const w1 = JSON.parse(JSON.stringify(w0));
  w1.wq = w1.wq.map((r) => r.map((v) => -2 * v));
  for (const [name, w] of [['enc.0', w0], ['enc.1', w1]]) {
    const put = await fetch(base + '/v1/weight-sets/' + name, { method: 'PUT', body: JSON.stringify(w) });
    assert(put.status === 201 || put.status === 200, `PUT ${name} answered ${put.status}`);
  }
  const req = { x: [[0.3, 0.8, -0.3], [-0.9, -0.1, 0.0], [0.5, -0.5, 0.25]] };
  const api = [];
  for (const name of ['enc.0', 'enc.1']) api.push((await postJson('/v1/attention', { ...req, weights: name })).json.attention);
  await openView(page, 'view=heatmap');
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(req));
  await page.select('#model-prefix', 'enc');
  await page.waitForSelector('#model figure');
  const figs = await page.$$eval('#model figure', (fs) => fs.map((f) => f.dataset.layer + ':' + f.dataset.head));
  const H = api[0].length === req.x.length ? 1 : api[0].length;
  assert(figs.length === 2 * (H > 1 ? H + 1 : H), 'thumbnails: ' + figs.join(' '));
  // the rollout against its definition, from the server's own per-layer weights
  const heads = (a) => (H === 1 ? [a] : a);
  const mean = (a) => { const hs = heads(a); return hs[0].map((r, i) => r.map((_, j) => hs.reduce((s, h) => s + h[i][j], 0) / hs.length)); };
  const L = req.x.length;
  let R = null;
  for (const a of api) {
    const m = mean(a).map((r, i) => r.map((v, j) => 0.5 * v + (i === j ? 0.5 : 0)));
    const n = m.map((r) => { const s = r.reduce((x, y) => x + y, 0); return r.map((v) => v / s); });
    R = R ? n.map((r) => R[0].map((_, j) => r.reduce((s, f, k) => s + f * R[k][j], 0))) : n;
  }
  const cells = await tableNumbers(page, '#rollout-table');
  assert(cells.length === L * L, `${cells.length} rollout numbers`);
  for (const c of cells) close(c.v, R[c.i][c.j], 1e-12, `rollout [${c.i}][${c.j}]`);
  assert((await page.evaluate(() => location.hash)).includes('model=enc'), 'the link does not keep the layers');
  // a click opens that layer and head in the heatmap
  await page.click('#model figure[data-layer="1"]');
  assert(await page.evaluate(() => window.viz.state.view + ' ' + window.viz.state.layer) === 'heatmap 1', 'the click did not open layer 1');
  const a1 = heads(api[1])[0];
  sameColour(await cellPixel(page, 2, 1), viridis(a1[2][1]), 'layer 1 cell [2][1]');
});

test('neuron view: q, k, their product, dot, scaled score and weight of one query, from the server', async (page) => {
  const req = { q: randomMatrix(5, 8, 51), k: randomMatrix(6, 8, 52), v: randomMatrix(6, 4, 53), heads: 2, causal: true };
  await openView(page, 'view=heatmap');
  await setRequest(page, req);
  await page.select('#head', '1');
  await page.click('#views button[data-view="neuron"]');
  await page.$eval('#neuron-index', (e) => { e.value = '3'; e.dispatchEvent(new Event('change')); });
  await page.waitForSelector('body[data-neuron="ready"], body[data-neuron="error"]');
  assert(await page.$eval('body', (b) => b.dataset.neuron) === 'ready', await page.$eval('#neuron-note', (e) => e.textContent));
  // head 1 is dimensions 4..7; the reference is computed here from the request itself
  const qi = req.q[3].slice(4), scale = 1 / Math.sqrt(4);
  const dots = req.k.map((kj) => kj.slice(4).reduce((a, x, t) => a + x * qi[t], 0));
  const scores = dots.map((d, j) => (j > 3 ? -Infinity : d * scale));
  const mx = Math.max(...scores), e = scores.map((s) => Math.exp(s - mx)), z = e.reduce((a, b) => a + b, 0);
  const rows = await page.$$eval('#neuron-table tr[data-j]', (trs) => trs.map((tr) => ({
    j: Number(tr.dataset.j), dot: Number(tr.querySelector('.dot').dataset.v),
    scaled: tr.querySelector('.scaled').dataset.v || tr.querySelector('.scaled').textContent,
    weight: Number(tr.querySelector('.weight').dataset.v),
    k: tr.querySelectorAll('canvas')[0].dataset.values.split(',').map(Number),
    p: tr.querySelectorAll('canvas')[1].dataset.values.split(',').map(Number) })));
  assert(rows.length === 6, `${rows.length} keys shown`);
  for (const r of rows) {
    close(r.dot, dots[r.j], 1e-12, `q·k for key ${r.j}`);
    close(r.weight, e[r.j] / z, 1e-12, `weight of key ${r.j}`);
    if (r.j > 3) assert(r.scaled === 'masked', `key ${r.j} is causally masked, shown ${r.scaled}`);
    else close(Number(r.scaled), dots[r.j] * scale, 1e-12, `scaled score of key ${r.j}`);
    r.k.forEach((x, t) => close(x, req.k[r.j][4 + t], 0, `k[${r.j}][${t}]`));
    r.p.forEach((x, t) => close(x, qi[t] * req.k[r.j][4 + t], 1e-15, `q×k[${r.j}][${t}]`));
  }
  const q = (await page.$eval('#neuron-query canvas', (c) => c.dataset.values)).split(',').map(Number);
  q.forEach((x, t) => close(x, qi[t], 0, `q[${t}]`));
  assert((await page.evaluate(() => location.hash)).includes('query=3'), 'the link does not keep the query');
});

test('long sequence: 5000 tokens pooled by the server, zooming asks for the window until every cell is one weight', async (page) => {
  const L = 5000, D = 16;
  const req = { q: randomMatrix(L, D, 61), k: randomMatrix(L, D, 62), v: randomMatrix(L, 4, 63), dtype: 'float32', causal: true };
  // the weights of query i, from the float32-rounded inputs, in float64, as a reference
  const f = (m) => m.map((r) => r.map(Math.fround));
  const Q = f(req.q), K = f(req.k), scale = 1 / Math.sqrt(D);
  const row = (i) => {
    const s = K.map((kj, j) => (j > i ? -Infinity : Q[i].reduce((a, x, t) => a + x * kj[t], 0) * scale));
    const mx = Math.max(...s), e = s.map((x) => Math.exp(x - mx)), z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  };
  let asked = null;
  page.on('request', (r) => { if (r.url().endsWith('/v2/models/attention/infer')) asked = r.headers(); });
  await openView(page, 'view=heatmap');
  await page.evaluate((r) => window.viz.computeRequest(r), req);
  await page.waitForSelector('body[data-status="ready"], body[data-status="error"]');
  assert(await page.$eval('body', (b) => b.dataset.status) === 'ready', await page.$eval('#error', (e) => e.textContent));
  assert(asked && asked['content-type'] === 'application/octet-stream' && asked['inference-header-content-length'],
    'the inputs were not sent as binary tensors');
  let [q0, q1, k0, k1, br, bc] = (await page.$eval('body', (b) => b.dataset.pooled)).split(',').map(Number);
  assert(q0 === 0 && q1 === L && k0 === 0 && k1 === L && br === Math.ceil(L / 620) && bc === Math.ceil(L / 600),
    `window and blocks: ${[q0, q1, k0, k1, br, bc]}`);
  const d = await page.evaluate(() => ({ Lq: window.viz.data.Lq, Lk: window.viz.data.Lk, n: window.viz.data.attn.length }));
  assert(d.Lq === Math.ceil(L / br) && d.Lk === Math.ceil(L / bc), `grid ${d.Lq} x ${d.Lk}`);
  // a few cells against the maximum of their block
  for (const [g, t] of [[0, 0], [100, 50], [300, 299], [555, 2], [d.Lq - 1, d.Lk - 1]]) {
    let mx = 0;
    for (let i = g * br; i < Math.min(L, (g + 1) * br); i++) {
      const w = row(i);
      for (let j = t * bc; j < Math.min(L, (t + 1) * bc); j++) mx = Math.max(mx, w[j]);
    }
    const got = await page.evaluate((k) => window.viz.data.attn[k], g * d.Lk + t);
    close(got, mx, 1e-6, `cell [${g}][${t}] (max of its block)`);
  }
  // zoom in around one point until the window is no larger than the heatmap: then exact
  const box = await (await page.$('#heatmap')).boundingBox();
  for (let step = 0; step < 40 && br > 1; step++) {
    await page.mouse.move(box.x + 110 + 300, box.y + 90 + 400);
    await page.mouse.wheel({ deltaY: -300 });
    await page.waitForFunction((prev) => document.body.dataset.pooled !== prev && document.body.dataset.status === 'ready',
      { timeout: 10000 }, [q0, q1, k0, k1, br, bc].join(',')).catch(() => {});
    [q0, q1, k0, k1, br, bc] = (await page.$eval('body', (b) => b.dataset.pooled)).split(',').map(Number);
  }
  assert(br === 1 && bc === 1, `still blocks of ${br} x ${bc} after zooming (window ${q0}-${q1} x ${k0}-${k1})`);
  const i = q0 + 3, j = k0 + 2;
  const got = await page.evaluate((k) => window.viz.data.attn[k], 3 * (k1 - k0) + 2);
  close(got, row(i)[j], 1e-6, `weight [${i}][${j}] at full resolution`);
  const label = await page.evaluate(() => window.viz.data.qTokens[3]);
  assert(label === String(i), `row 3 of the window is labelled ${label}, not token ${i}`);
});

// ---------------------------------------------------------------- the runner

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([promise, new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what + ' took over ' + ms / 1000 + ' s')), ms); })])
    .finally(() => clearTimeout(timer));
}

async function main() {
  let passed = 0, failed = 0;
  try {
    assert(CHROMIUM, 'chromium is not installed (make test-browser installs it)');
    base = await startServer();
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      userDataDir: path.join(tmp, 'profile'),
      args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
        '--disable-sync', '--no-first-run'],
    });
  } catch (e) {
    console.log('FAIL setup: ' + e.message);
    failed++;
  }
  if (browser)
    for (const t of tests) {
      if (ONLY && !t.name.includes(ONLY)) continue;
      let page = null;
      try {
        page = await newPage();
        await withTimeout(t.fn(page), TEST_TIMEOUT_MS, t.name);
        await checkClean(page);
        console.log('ok ' + t.name);
        passed++;
      } catch (e) {
        console.log('FAIL ' + t.name + ': ' + e.message.split('\n')[0]);
        failed++;
      } finally {
        if (page) await page.context_.close().catch(() => {});
      }
    }
  if (browser) await browser.close().catch(() => {});
  if (server && server.exitCode === null) server.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main();
