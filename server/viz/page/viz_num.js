/*
 * viz_num.js - numbers in the page's tables: rounded for reading, exact on hover.
 *
 * A weight printed with every digit JavaScript needs to round-trip it (-0.09129899999999999)
 * makes a table of sixteen columns unreadable, and the extra digits are float noise the
 * reader cannot use.  Tables show DIGITS significant digits; the cell's title (hover) and its
 * data-v attribute keep the number exactly as received, and the CSV and JSON exports write
 * the exact numbers, never these.
 *
 * Loaded first: viz.js and the other viz_*.js call window.vizNum.
 */
'use strict';

(function () {
  const DIGITS = 4;

  /* v rounded to DIGITS significant digits, without trailing zeros ("0.0913", "1e-7");
   * integers, NaN and infinities as they are. */
  function text(v) {
    if (!Number.isFinite(v) || Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(DIGITS)));
  }

  /* Writes v into table cell td: rounded as its text, exact as its title and data-v. */
  function cell(td, v) {
    td.textContent = text(v);
    td.title = String(v);
    td.dataset.v = String(v);
    return td;
  }

  window.vizNum = { DIGITS, text, cell };
})();
