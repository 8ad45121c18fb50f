"""peer.py - the competing service: POST /v1/attention as a Flask app over NumPy.

This is what a Python user would reach for instead of the C server: Flask for the routing and
the JSON, NumPy (npattn.sdpa: q @ k.T * scale, stable softmax, @ v) for the math, served by
gunicorn with 2 sync workers (tests/bench/lib.sh, bench_start_peer). It understands the part of
the contract the benchmarks send: q/k/v, or x (and context) with inline weights wq/wk/wv and
optional bq/bk/bv/wo/bo, weights_layout, heads, causal, mask, scale, dtype float32/float64,
return_attention, and answers {"output", "attention"} in the contract's shapes (rows layout).
It is a baseline, not a second server: it does not validate beyond what NumPy itself refuses.

Run: gunicorn --workers 2 --bind 127.0.0.1:PORT --chdir tests/bench peer:app
"""

import os
import sys

import numpy as np
from flask import Flask, jsonify, request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npattn  # noqa: E402

app = Flask(__name__)


def compute(body):
    dtype = np.float32 if body.get("dtype") == "float32" else np.float64
    weights = {}
    if "x" in body:
        weights = body["weights"]
        out_in = body.get("weights_layout") == "out_in"
        x = np.asarray(body["x"], dtype=dtype)
        ctx = np.asarray(body["context"], dtype=dtype) if "context" in body else x
        q = npattn.project(x, weights["wq"], weights.get("bq"), dtype, out_in)
        k = npattn.project(ctx, weights["wk"], weights.get("bk"), dtype, out_in)
        v = npattn.project(ctx, weights["wv"], weights.get("bv"), dtype, out_in)
    else:
        q, k, v = body["q"], body["k"], body["v"]
    want_attention = body.get("return_attention", True)
    out, attn = npattn.sdpa(q, k, v, heads=body.get("heads"), causal=body.get("causal", False),
                            mask=body.get("mask"), scale=body.get("scale"), dtype=dtype,
                            return_attention=want_attention)
    if "wo" in weights:
        out = npattn.project(out, weights["wo"], weights.get("bo"), dtype,
                             body.get("weights_layout") == "out_in")
    answer = {"output": out.tolist()}
    if want_attention:
        answer["attention"] = attn.tolist()
    return answer


@app.post("/v1/attention")
def attention():
    body = request.get_json()
    try:
        return jsonify(compute(body))
    except (ValueError, KeyError, TypeError) as e:
        return jsonify(error={"code": "bad_request", "message": str(e)}), 400
    except MemoryError:
        return jsonify(error={"code": "overloaded", "message": "out of memory"}), 503


@app.get("/healthz")
def healthz():
    return "ok\n"
