// screenshots.mjs - the pictures of docs/visualizer.md, taken from the real page.
//
//   node tests/browser/screenshots.mjs --server build/attention-server --out docs/img
//
// Starts the server on a free loopback port, shows each view in headless chromium and saves
// viz-heatmap.png, viz-lines.png, viz-grid.png, viz-values.png and viz-error.png; stops the
// server by its PID.  `make viz-screenshots` runs it.

import { spawn } from 'node:child_process';
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
const server = spawn(SERVER, ['--port', '0', '--host', '127.0.0.1', '--data-dir', path.join(tmp, 'data'), '--quiet'],
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
  await page.click('#views button[data-view="heatmap"]');
  await page.$eval('#request', (ta) => { ta.value = ta.value.replace('"heads":4', '"heads":3'); });
  await page.click('#run');
  await page.waitForSelector('body[data-status="error"]');
  await page.screenshot({ path: path.join(OUT, 'viz-error.png') });
  console.log('screenshots in ' + OUT);
} finally {
  if (browser) await browser.close();
  server.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
