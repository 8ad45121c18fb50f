/*
 * viz_keep.js - two generations of one stored weight set in the compare view.
 *
 * The server keeps only the current generation of a set (PUT /v1/weight-sets/NAME replaces
 * it).  For a request that uses a set by name (x with "weights": "NAME"), "Keep this
 * generation to compare with" GETs the set now and turns it into B: the same request with
 * the set's weights given inline (and its weights_layout and heads), as a "req:..." compare
 * spec (viz_share.js encodes it), labelled "set NAME, generation G (kept)"; the link names
 * the set and generation in `kept=NAME@G`.  When the link would pass
 * vizShare.SHARE_MAX_CHARS, B stays in the page instead: compare spec "kept:NAME@G", its
 * request in sessionStorage under "viz-kept:NAME@G", and the page says that this comparison
 * cannot travel in a link.  After the set is replaced, viz.js asks the server for the current
 * generation (currentGeneration) and computes A again with it pinned (weights_generation).
 *
 * Loaded before viz.js, which uses window.vizKeep.
 */
'use strict';

(function () {
  const PARTS = ['wq', 'wk', 'wv', 'bq', 'bk', 'bv', 'wo', 'bo'];
  const STORAGE_PREFIX = 'viz-kept:';
  const labels = new Map();     /* "req:..." spec -> {name, generation} */
  const memory = new Map();     /* "kept:..." spec -> B's request text, when sessionStorage refuses it */

  /* The name of the stored set request req uses, or null. */
  function setOf(req) {
    return req && req.x != null && typeof req.weights === 'string' ? req.weights : null;
  }

  /* "NAME@G" -> {name, generation}, or null (names have no "@"; generations are digits). */
  function parse(text) {
    const m = /^([A-Za-z0-9._-]{1,64})@([1-9][0-9]{0,15})$/.exec(text || '');
    return m ? { name: m[1], generation: Number(m[2]) } : null;
  }

  /* What spec keeps, {name, generation}, or null when it is not a kept generation. */
  function info(spec) {
    if (spec.startsWith('kept:')) return parse(spec.slice(5));
    return labels.get(spec) || null;
  }

  /* A link's `kept` parameter for compare spec (both come from the link). */
  function remember(spec, param) {
    const k = parse(param);
    if (k && spec.startsWith('req:')) labels.set(spec, k);
  }

  /* The `kept` parameter a link needs for spec, or null. */
  function param(spec) {
    const k = spec.startsWith('req:') ? labels.get(spec) : null;
    return k ? k.name + '@' + k.generation : null;
  }

  function label(k) {
    return `set ${k.name}, generation ${k.generation} (kept)`;
  }

  /* The request B of a "kept:" spec, kept in this tab. */
  function request(spec) {
    let text = memory.get(spec);
    try { if (text == null) text = sessionStorage.getItem(STORAGE_PREFIX + spec.slice(5)); } catch (e) { /* none */ }
    if (text == null) {
      throw new Error(`${label(info(spec) || { name: '?', generation: '?' })} was kept in the page that kept it ` +
        '(too large for a link) and is not in this one');
    }
    return JSON.parse(text);
  }

  /* The current generation of set name, from the ETag of HEAD, never from a cache. */
  async function currentGeneration(name) {
    const r = await fetch('/v1/weight-sets/' + encodeURIComponent(name), { method: 'HEAD', cache: 'no-store' });
    if (r.status === 404) throw new Error(`the set "${name}" is no longer stored`);
    if (!r.ok) throw new Error(`HEAD /v1/weight-sets/${name} answered ${r.status}`);
    const g = Number((r.headers.get('ETag') || '').replace(/"/g, ''));
    if (!Number.isSafeInteger(g) || g < 1) throw new Error(`HEAD /v1/weight-sets/${name} gave no generation`);
    return g;
  }

  /* Keeps the current generation of the set req uses as B.  linkParams(spec) gives the
   * link's parameters with that compare spec; req travels with them as `req`.  Returns
   * {spec, name, generation} and, when B stays in the page, tooLong (the link's length). */
  async function keep(req, linkParams) {
    const name = setOf(req);
    const r = await fetch('/v1/weight-sets/' + encodeURIComponent(name), { cache: 'no-store' });
    const set = await r.json();
    if (!r.ok) throw new Error(set.error ? `${set.error.code}: ${set.error.message}` : `GET answered ${r.status}`);
    const weights = {};
    for (const m of PARTS) if (set[m] != null) weights[m] = set[m];
    const b = Object.assign({}, req, { weights, weights_layout: set.weights_layout });
    if (set.heads != null && req.heads == null) b.heads = set.heads;
    delete b.weights_generation;
    const text = JSON.stringify(b), k = { name, generation: set.generation };
    const spec = 'req:' + await window.vizShare.encodeRequest(text);
    const p = linkParams(spec);
    p.set('kept', name + '@' + k.generation);
    const link = await window.vizShare.buildLink(p, JSON.stringify(req));
    if (!link.tooLong) {
      labels.set(spec, k);
      return { spec, name, generation: k.generation };
    }
    const kept = 'kept:' + name + '@' + k.generation;
    memory.set(kept, text);
    try { sessionStorage.setItem(STORAGE_PREFIX + name + '@' + k.generation, text); } catch (e) { /* memory holds it */ }
    return { spec: kept, name, generation: k.generation, tooLong: link.tooLong };
  }

  function advice(name) {
    return `To share it, store that generation under another name (PUT /v1/weight-sets/OTHER with the ` +
      `body GET /v1/weight-sets/${name} answers, before the set is replaced) and compare with set:OTHER.`;
  }

  /* What the page says after keep() returned k. */
  function keptNote(k) {
    const said = `Kept generation ${k.generation} of set ${k.name} as B of the compare view; once a PUT ` +
      'replaces the set, A is its current generation.';
    if (!k.tooLong) return said;
    return said + `  This comparison cannot travel in a link: with that generation the link takes ${k.tooLong} ` +
      `characters even compressed, and a link carries up to ${window.vizShare.SHARE_MAX_CHARS}.  It is kept ` +
      'in this tab only (sessionStorage).  ' + advice(k.name);
  }

  /* What the page says when a link is asked for while B is a "kept:" spec. */
  function shareNote(spec) {
    const k = info(spec);
    return `This link leaves out the comparison with ${label(k)}: that generation is too large for a ` +
      'link and is kept in this tab only.  ' + advice(k.name);
  }

  window.vizKeep = { setOf, info, remember, param, label, request, currentGeneration, keep, keptNote, shareNote };
})();
