"""npattn.py - attention in NumPy, written the way a NumPy user writes it.

This is the competing implementation of the benchmarks: bench_numpy.py times it on the same
shapes as bench_kernel.c, and peer.py serves it over HTTP. The unmasked path is the textbook
q @ k.T * scale, a softmax that subtracts the row maximum, then @ v; masks (causal, or given)
set the excluded scores to -inf first. It follows the contract's semantics (heads split the
feature axis, causal is top-left aligned, a fully masked row gives zeros) so that its answers
can be compared with the C server's number for number.
"""

import numpy as np


def sdpa(q, k, v, heads=None, causal=False, mask=None, scale=None, dtype=np.float64,
         return_attention=True):
    """Scaled dot-product attention.

    q: (..., Lq, dk), k: (..., Lk, dk), v: (..., Lk, dv), any leading batch axes.
    heads: None (no head axis) or the number of heads dk and dv are split into.
    mask: None or a boolean array broadcastable to (..., Lq, Lk); True = may attend.
    Returns (output (..., Lq, dv), attention (..., [heads,] Lq, Lk) or None), computed in dtype.
    """
    q = np.asarray(q, dtype=dtype)
    k = np.asarray(k, dtype=dtype)
    v = np.asarray(v, dtype=dtype)
    lq, lk = q.shape[-2], k.shape[-2]
    if heads is not None:
        # (..., L, H*d) -> (..., H, L, d)
        q = q.reshape(q.shape[:-1] + (heads, -1)).swapaxes(-2, -3)
        k = k.reshape(k.shape[:-1] + (heads, -1)).swapaxes(-2, -3)
        v = v.reshape(v.shape[:-1] + (heads, -1)).swapaxes(-2, -3)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    scores = q @ k.swapaxes(-1, -2) * dtype(scale)
    allowed = None
    if causal:
        allowed = np.tri(lq, lk, dtype=bool)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        if heads is not None and m.ndim == 3:
            m = m[:, None, :, :]  # batch x Lq x Lk -> batch x 1 x Lq x Lk
        allowed = m if allowed is None else allowed & m
    if allowed is None:
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
    else:
        scores = np.where(allowed, scores, -np.inf)
        row_max = scores.max(axis=-1, keepdims=True)
        row_max = np.where(np.isfinite(row_max), row_max, 0)  # fully masked rows
        weights = np.exp(scores - row_max)
        denom = weights.sum(axis=-1, keepdims=True)
        weights = np.divide(weights, denom, out=np.zeros_like(weights), where=denom > 0)
    out = weights @ v
    if heads is not None:
        out = out.swapaxes(-2, -3)
        out = out.reshape(out.shape[:-2] + (-1,))
    return out, (weights if return_attention else None)


def project(x, w, b=None, dtype=np.float64, out_in=False):
    """y = x . w + b; w is (d_in x d_out), or (d_out x d_in) when out_in."""
    w = np.asarray(w, dtype=dtype)
    y = np.asarray(x, dtype=dtype) @ (w.T if out_in else w)
    return y if b is None else y + np.asarray(b, dtype=dtype)
