/*
 * viz_compare.js - the compare view: two results of the same shape side by side, A and B on
 * the page's viridis scale, and their difference A - B on a diverging scale (blue below zero,
 * white at zero, red above), all three for the same batch and head.
 *
 * What B is comes from the `compare` parameter of the link (viz.js turns it into a second
 * request): "causal" (the same request with causal turned over), "example:NAME", "set:NAME"
 * (the same x with another stored weight set), "req:..." (a request carried in the link,
 * as viz_share.js encodes it; with `kept=NAME@G`, an earlier generation G of the set the
 * request uses, its weights inline, as viz_keep.js keeps it) or "kept:NAME@G" (such a
 * generation too large for a link, held in the tab's sessionStorage).  This file only
 * draws: viz.js hands it both matrices.
 *
 * Loaded before viz.js, which calls window.vizCompare.draw and .cellAt.
 */
'use strict';

(function () {
  const SIZE = 300;                   /* each panel's canvas is SIZE x SIZE */
  const TABLE_ROWS = 40, TABLE_COLS = 16;
  const NEG = [33, 102, 172], MID = [247, 247, 247], POS = [178, 24, 43];

  /* The diverging colour of d on the scale [-range, range]. */
  function diffColour(d, range) {
    const t = range > 0 ? Math.max(-1, Math.min(1, d / range)) : 0;
    const end = t < 0 ? NEG : POS, f = Math.abs(t);
    return MID.map((c, k) => Math.round(c + (end[k] - c) * f));
  }

  /* Draws the difference matrix into canvas cv: each pixel shows the cell of its block whose
   * difference is largest in magnitude, so a single changed weight is never averaged away. */
  function drawDiff(cv, diff, rows, cols, range) {
    const ctx = cv.getContext('2d'), img = ctx.createImageData(SIZE, SIZE), px = img.data;
    for (let r = 0; r < SIZE; r++) {
      const i0 = Math.min(Math.floor(rows * r / SIZE), rows - 1);
      const i1 = Math.max(i0 + 1, Math.min(rows, Math.floor(rows * (r + 1) / SIZE)));
      for (let c = 0; c < SIZE; c++) {
        const j0 = Math.min(Math.floor(cols * c / SIZE), cols - 1);
        const j1 = Math.max(j0 + 1, Math.min(cols, Math.floor(cols * (c + 1) / SIZE)));
        let best = 0;
        for (let i = i0; i < i1; i++)
          for (let j = j0; j < j1; j++) { const v = diff[i * cols + j]; if (Math.abs(v) > Math.abs(best)) best = v; }
        const col = diffColour(best, range), o = (r * SIZE + c) * 4;
        px[o] = col[0]; px[o + 1] = col[1]; px[o + 2] = col[2]; px[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  /* The cell of a rows x cols matrix under point (x, y) of a panel, or null. */
  function cellAt(x, y, rows, cols) {
    if (x < 0 || y < 0 || x >= SIZE || y >= SIZE) return null;
    return { i: Math.floor(rows * y / SIZE), j: Math.floor(cols * x / SIZE) };
  }

  /* The first page of A - B as a table of exact numbers (data-i, data-j on each cell). */
  function diffTable(box, diff, rows, cols, label) {
    box.textContent = '';
    const t = document.createElement('table');
    t.id = 'compare-table';
    const head = t.insertRow();
    head.append(document.createElement('th'));
    const r1 = Math.min(rows, TABLE_ROWS), c1 = Math.min(cols, TABLE_COLS);
    for (let j = 0; j < c1; j++) { const th = document.createElement('th'); th.textContent = label.k(j); head.append(th); }
    for (let i = 0; i < r1; i++) {
      const tr = t.insertRow(), th = document.createElement('th');
      th.textContent = label.q(i);
      tr.append(th);
      for (let j = 0; j < c1; j++) {
        const td = tr.insertCell();
        window.vizNum.cell(td, diff[i * cols + j]);
        td.dataset.i = i; td.dataset.j = j;
      }
    }
    const cap = document.createElement('p');
    cap.className = 'note';
    cap.textContent = 'A − B, exact' + (rows > r1 || cols > c1 ? `: the first ${r1} queries and ${c1} keys` : '');
    box.append(cap, t);
  }

  /* Draws the view: a and b are the [rows][cols] matrices of the chosen batch and head
   * (masked weights are 0 in both), drawA(cv) and drawB(cv) draw them on the page's scale,
   * label.q(i) / label.k(j) name the tokens.  Returns the difference and its range. */
  function draw(a, b, rows, cols, drawA, drawB, label) {
    const diff = new Float64Array(rows * cols);
    let range = 0;
    for (let k = 0; k < diff.length; k++) {
      diff[k] = a[k] - b[k];
      range = Math.max(range, Math.abs(diff[k]));
    }
    drawA(document.getElementById('compare-a'));
    drawB(document.getElementById('compare-b'));
    drawDiff(document.getElementById('compare-diff'), diff, rows, cols, range);
    document.getElementById('compare-diff-label').textContent =
      `A − B (blue < 0 < red; the scale spans ±${range.toPrecision(3)})`;
    diffTable(document.getElementById('compare-values'), diff, rows, cols, label);
    return { diff, range };
  }

  window.vizCompare = { draw, cellAt, diffColour, SIZE };
})();
