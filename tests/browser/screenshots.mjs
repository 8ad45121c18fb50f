// screenshots.mjs - the pictures of docs/visualizer.md, taken from the real page.
//
//   node tests/browser/screenshots.mjs --server build/attention-server --out docs/img
//
// Starts the server on a free loopback port, shows each view in headless chromium and saves
// viz-heatmap.png, viz-lines.png, viz-grid.png, viz-values.png, viz-error.png, and the views
// past BertViz: viz-selection.png, viz-compare.png, viz-neuron.png, viz-model.png and
// viz-share.png, viz-long.png (16384 tokens pooled by the server), and viz-census.png (the
// heads census of a capture tests/browser/capture.py writes from a small random model) and
// viz-generation.png (that capture's Generation view and policy census); stops
// the server by its PID.  `make viz-screenshots` runs it.

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
const OUT = args.out || 'docs/img';
const CHROMIUM = ['/usr/lib/chromium/chromium', '/usr/bin/chromium'].find((p) => fs.existsSync(p));

// A causal request with 4 heads over a 12-token sentence, deterministic.
function matrix(rows, cols, seed) {
  let s = seed >>> 0;
  const next = () => { s ^= s << 13; s >>>= 0; s ^= s >> 17; s ^= s << 5; s >>>= 0; return s / 4294967296 * 2 - 1; };
  return Array.from({ length: rows }, () => Array.from({ length: cols }, () => Math.round(next() * 1000) / 1000));
}
const TOKENS = 'the cat that the dog chased ran up the oak tree .';
const REQUEST = { q: matrix(12, 16, 1), k: matrix(12, 16, 2), v: matrix(12, 8, 3), heads: 4, causal: true, scale: 1 };

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'viz-shots-'));
const server = spawn(SERVER, ['--port', '0', '--grpc-port', '0', '--host', '127.0.0.1', '--data-dir', path.join(tmp, 'data'), '--quiet'],
  { stdio: ['ignore', 'pipe', 'ignore'] });
let browser = null;
try {
  const base = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('the server did not start in 10 s')), 10000);
    server.stdout.on('data', (c) => {
      out += c;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true, userDataDir: path.join(tmp, 'profile'),
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1300, height: 860 });
  fs.mkdirSync(OUT, { recursive: true });
  await page.goto(base + '/viz#view=heatmap');
  await page.waitForSelector('body[data-status="idle"]');
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(REQUEST));
  await page.type('#q-tokens', TOKENS);
  await page.click('#run');
  await page.waitForSelector('body[data-status="ready"]');
  await page.select('#head', '1');
  const box = await (await page.$('#heatmap')).boundingBox();
  const c = await page.evaluate(() => window.viz.cellCenter(6, 4));
  await page.mouse.move(box.x + c.x, box.y + c.y);
  await page.screenshot({ path: path.join(OUT, 'viz-heatmap.png') });
  await page.mouse.move(0, 0);
  for (const view of ['lines', 'grid', 'values']) {
    await page.click(`#views button[data-view="${view}"]`);
    if (view === 'lines') {
      const lb = await (await page.$('#lines')).boundingBox();
      const rowH = await page.$eval('#lines', (cv) => Number(cv.dataset.rowHeight));
      await page.mouse.move(lb.x + 100, lb.y + 10 + rowH * 6.5);
    }
    await page.screenshot({ path: path.join(OUT, `viz-${view}.png`) });
    await page.mouse.move(0, 0);
  }
  // several queries at once: "ran" and "tree", summed
  await page.click('#views button[data-view="heatmap"]');
  await page.$eval('#select', (e) => { e.value = '6,10'; e.dispatchEvent(new Event('change')); });
  await page.select('#head', '1');
  await page.screenshot({ path: path.join(OUT, 'viz-selection.png'), fullPage: true });
  await page.$eval('#select', (e) => { e.value = ''; e.dispatchEvent(new Event('change')); });
  // the same request with causal off, and the difference
  await page.select('#compare', 'causal');
  await page.click('#views button[data-view="compare"]');
  await page.waitForSelector('body[data-compare="ready"]');
  const db = await (await page.$('#compare-diff')).boundingBox();
  await page.mouse.move(db.x + 140, db.y + 60);
  await page.screenshot({ path: path.join(OUT, 'viz-compare.png') });
  await page.mouse.move(0, 0);
  await page.select('#compare', '');
  // the neuron view of "ran" in head 1
  await page.click('#views button[data-view="neuron"]');
  await page.$eval('#neuron-index', (e) => { e.value = '6'; e.dispatchEvent(new Event('change')); });
  await page.waitForSelector('body[data-neuron="ready"]');
  await page.screenshot({ path: path.join(OUT, 'viz-neuron.png') });
  // the link of this view
  await page.click('#views button[data-view="heatmap"]');
  await page.click('#share');
  await page.waitForSelector('#share-link:not([hidden])');
  await page.screenshot({ path: path.join(OUT, 'viz-share.png') });
  // layers from stored sets: three sets toy.0, toy.1, toy.2 applied to the same x
  const X = matrix(12, 8, 5);
  for (let l = 0; l < 3; l++) {
    const w = { wq: matrix(8, 8, 10 + l), wk: matrix(8, 8, 20 + l), wv: matrix(8, 8, 30 + l), heads: 2 };
    const r = await fetch(base + '/v1/weight-sets/toy.' + l, { method: 'PUT', body: JSON.stringify(w) });
    if (!r.ok) throw new Error('PUT toy.' + l + ' answered ' + r.status);
  }
  await page.goto(base + '/viz#view=model');
  await page.reload();
  await page.waitForSelector('body[data-status="idle"]');
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify({ x: X, causal: true }));
  await page.type('#q-tokens', TOKENS);
  await page.select('#model-prefix', 'toy');
  await page.waitForSelector('#rollout');
  await page.screenshot({ path: path.join(OUT, 'viz-model.png'), fullPage: true });
  await page.goto(base + '/viz#view=heatmap');
  await page.reload();
  await page.waitForSelector('body[data-status="idle"]');
  await page.$eval('#request', (ta, text) => { ta.value = text; }, JSON.stringify(REQUEST));
  await page.click('#run');
  await page.waitForSelector('body[data-status="ready"]');
  await page.$eval('#request', (ta) => { ta.value = ta.value.replace('"heads":4', '"heads":3'); });
  await page.click('#run');
  await page.waitForSelector('body[data-status="error"]');
  await page.screenshot({ path: path.join(OUT, 'viz-error.png') });
  // a long sequence: 16384 tokens, causal, pooled by the server to the heatmap's pixels; q
  // and k are sinusoidal position codes (scaled), so that attention falls near the diagonal
  // and on the periods the codes repeat with
  await page.evaluate(async (n) => {
    const pe = Array.from({ length: n }, (_, i) => Array.from({ length: 64 }, (_, j) => {
      const f = Math.pow(10000, -(j - (j % 2)) / 64);
      return 2 * (j % 2 ? Math.cos(i * f) : Math.sin(i * f));
    }));
    await window.viz.computeRequest({ q: pe, k: pe, v: pe, dtype: 'float32', causal: true });
  }, 16384);
  await page.waitForSelector('body[data-status="ready"]');
  await page.select('#scale', 'log');
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: path.join(OUT, 'viz-long.png') });
  // the heads census: 4 layers x 4 heads of a random model's 256 tokens, head 2 of layer 1 clicked
  const capDir = path.join(tmp, 'capture');
  execFileSync('/usr/bin/python3', [path.join(path.dirname(new URL(import.meta.url).pathname), 'capture.py'), '--write', capDir,
    '--layers', '4', '--heads', '4', '--dim', '64', '--tokens', '256', '--no-reference'], { stdio: ['ignore', 'ignore', 'inherit'] });
  await page.goto(base + '/viz#view=census');
  await page.reload();
  await page.waitForSelector('body[data-census="idle"]');
  await (await page.$('#census-file')).uploadFile(path.join(capDir, 'capture.safetensors'));
  await page.waitForSelector('body[data-census="ready"]');
  await page.click('#census-table td[data-layer="1"][data-head="2"]');
  await page.waitForSelector('body[data-census-heatmap="ready"]');
  await page.screenshot({ path: path.join(OUT, 'viz-census.png'), fullPage: true });
  // the Generation view: head 1 of layer 1 of the same capture under h2o, budget 64, and the
  // policy census of its 4 x 4 heads
  await page.goto(base + '/viz#view=generation');
  await page.reload();
  await page.waitForSelector('body[data-generation="idle"]');
  await page.select('#gen-policy', 'h2o');
  await page.$eval('#gen-budget', (e) => { e.value = '64'; });
  await page.$eval('#gen-recent', (e) => { e.value = '32'; });
  await (await page.$('#gen-file')).uploadFile(path.join(capDir, 'capture.safetensors'));
  await page.waitForSelector('body[data-generation="ready"]');
  await page.click('#gen-census');
  await page.waitForSelector('body[data-gen-census="ready"]');
  await page.click('#gen-census-table td[data-layer="1"][data-head="1"]');
  await page.waitForFunction(() => window.vizGeneration.replay.L === 1 && document.body.dataset.generation === 'ready');
  await page.screenshot({ path: path.join(OUT, 'viz-generation.png'), fullPage: true });
  console.log('screenshots in ' + OUT);
} finally {
  if (browser) await browser.close();
  server.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
