/*
 * viz_neuron.js - the neuron view (BertViz's, computed by the server): for one query token i
 * of one head, its query vector q_i and each key's k_j as colour strips, their elementwise
 * product, the dot product q_i . k_j, the scaled score and the weight.
 *
 * q and k come from the server itself (`return_qk`: after the projections and their
 * biases, before the scale), so the view needs no model code of its own: viz.js asks for
 * them once per request and hands them here with the attention weights.  The strips share
 * one diverging scale per column (blue below zero, white at zero, red above) so that a
 * product strip shows which dimensions carry the score.  Every number is on hover (the
 * strip's title) and in the table under it.
 *
 * Loaded before viz.js, which calls window.vizNeuron.draw.
 */
'use strict';

(function () {
  const STRIP_W = 192, STRIP_H = 14, MAX_KEYS = 64;
  const NEG = [33, 102, 172], MID = [247, 247, 247], POS = [178, 24, 43];

  function colour(v, range) {
    const t = range > 0 ? Math.max(-1, Math.min(1, v / range)) : 0;
    const end = t < 0 ? NEG : POS, f = Math.abs(t);
    return MID.map((c, k) => Math.round(c + (end[k] - c) * f));
  }

  /* A canvas strip of values (one cell per dimension) on [-range, range], with the numbers
   * as its title. */
  function strip(values, range, label) {
    const cv = document.createElement('canvas');
    cv.width = STRIP_W;
    cv.height = STRIP_H;
    cv.className = 'strip';
    const ctx = cv.getContext('2d'), w = STRIP_W / values.length;
    values.forEach((v, t) => {
      const c = colour(v, range);
      ctx.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
      ctx.fillRect(Math.floor(t * w), 0, Math.ceil(w), STRIP_H);
    });
    cv.title = label + ': ' + Array.from(values, (v) => String(v)).join(', ');
    cv.dataset.values = Array.from(values, (v) => String(v)).join(',');
    return cv;
  }

  /* A cell of tr: a node, a text, or a number (rounded, exact on hover: viz_num.js). */
  function cell(tr, content, cls) {
    const td = tr.insertCell();
    if (content instanceof Node) td.append(content);
    else if (typeof content === 'number') window.vizNum.cell(td, content);
    else td.textContent = content;
    if (cls) td.className = cls;
    return td;
  }

  /* Draws into box the view of query i of head h: q (dh numbers), keys[j] (dh each, for
   * the keys shown), scale, weights[j] and masked[j], labels.q(i) / labels.k(j). */
  function draw(box, v) {
    box.textContent = '';
    const dh = v.q.length, n = Math.min(v.keys.length, MAX_KEYS);
    const products = [], dots = [];
    let rq = 0, rk = 0, rp = 0;
    for (const x of v.q) rq = Math.max(rq, Math.abs(x));
    for (let j = 0; j < n; j++) {
      const p = new Float64Array(dh);
      let dot = 0;
      for (let t = 0; t < dh; t++) {
        p[t] = v.q[t] * v.keys[j][t];
        dot += p[t];
        rk = Math.max(rk, Math.abs(v.keys[j][t]));
        rp = Math.max(rp, Math.abs(p[t]));
      }
      products.push(p);
      dots.push(dot);
    }
    const head = document.createElement('p');
    head.id = 'neuron-query';
    head.append(`query ${v.i} "${v.labels.q(v.i)}", head ${v.h}: q `, strip(v.q, rq, 'q'),
      ` (${dh} dimensions; scale ${v.scale})`);
    const t = document.createElement('table');
    t.id = 'neuron-table';
    const hr = t.insertRow();
    for (const h of ['key', 'k', 'q × k', 'q · k', 'scaled', 'weight']) {
      const th = document.createElement('th');
      th.textContent = h;
      hr.append(th);
    }
    for (let j = 0; j < n; j++) {
      const tr = t.insertRow();
      tr.dataset.j = j;
      cell(tr, `${j} "${v.labels.k(j)}"`);
      cell(tr, strip(v.keys[j], rk, 'k'));
      cell(tr, strip(products[j], rp, 'q × k'));
      if (v.masked[j]) {
        cell(tr, dots[j], 'num dot');
        cell(tr, 'masked', 'num scaled');
        cell(tr, v.weights[j], 'num weight');
        tr.className = 'masked';
      } else {
        cell(tr, dots[j], 'num dot');
        cell(tr, dots[j] * v.scale, 'num scaled');
        cell(tr, v.weights[j], 'num weight');
      }
    }
    const note = document.createElement('p');
    note.className = 'note';
    note.textContent = 'Each strip is one number per dimension on its own diverging scale; hover a ' +
      'strip for its numbers.' + (v.keys.length > n ? ` The first ${n} of ${v.keys.length} keys.` : '');
    const values = document.createElement('table');
    values.id = 'neuron-values';
    const qv = values.insertRow();
    cell(qv, 'q');
    for (const x of v.q) cell(qv, x, 'num');
    box.append(head, t, note, values);
  }

  window.vizNeuron = { draw, MAX_KEYS };
})();
