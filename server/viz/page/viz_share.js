/*
 * viz_share.js - a request carried in the page's URL, for links that reproduce a view.
 *
 * The view's state is already in the fragment (viz.js, readHash/writeHash); a request typed
 * into the editor joins it as `req=`: its JSON text compressed with the browser's own
 * CompressionStream ("deflate-raw"), then base64url (RFC 4648 section 5, no padding), so
 * that the link needs nothing but this server to open.  A link is kept to SHARE_MAX_CHARS
 * characters of fragment: past that, browsers, chat programs and servers' logs start to cut
 * URLs, and a request that large is better stored as a weight set (the message says so).
 *
 * Loaded before viz.js, which uses window.vizShare.
 */
'use strict';

(function () {
  const SHARE_MAX_CHARS = 32768;

  function toBase64Url(bytes) {
    let bin = '';
    for (let i = 0; i < bytes.length; i += 0x8000)
      bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  function fromBase64Url(text) {
    if (!/^[A-Za-z0-9_-]*$/.test(text)) throw new Error('the link\'s request is not base64url');
    const b64 = text.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((text.length + 3) % 4);
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  /* Pipes bytes through a CompressionStream or DecompressionStream and collects the result. */
  async function through(stream, bytes) {
    const out = new Response(new Blob([bytes]).stream().pipeThrough(stream));
    return new Uint8Array(await out.arrayBuffer());
  }

  /* The request text, compressed and base64url-encoded. */
  async function encodeRequest(text) {
    const packed = await through(new CompressionStream('deflate-raw'), new TextEncoder().encode(text));
    return toBase64Url(packed);
  }

  /* The request text a `req=` value carries; throws with a readable message when the value
   * was cut or altered on its way. */
  async function decodeRequest(value) {
    let bytes;
    try {
      bytes = await through(new DecompressionStream('deflate-raw'), fromBase64Url(value));
    } catch (e) {
      throw new Error('the request in this link is damaged (cut short when it was copied?): ' + e.message);
    }
    return new TextDecoder().decode(bytes);
  }

  /* The link for hash parameters p (a URLSearchParams, without `req`) and, when it is not
   * null, the request text.  Returns {url} or, when the link would pass SHARE_MAX_CHARS,
   * {tooLong: characters it would take}. */
  async function buildLink(p, requestText) {
    const params = new URLSearchParams(p);
    if (requestText != null) params.set('req', await encodeRequest(requestText));
    const hash = params.toString();
    if (hash.length > SHARE_MAX_CHARS) return { tooLong: hash.length };
    return { url: location.origin + location.pathname + '#' + hash };
  }

  window.vizShare = { encodeRequest, decodeRequest, buildLink, SHARE_MAX_CHARS };
})();
