#!/usr/bin/env python3
"""The reductions of the attention weights (server/kernel/attention_reduce.h) against a NumPy
float64 reference that materialises the whole matrix: random cases with masks, fully masked
rows, causal, heads, batch, cross-attention and large logits, on v1 (JSON) and v2 (JSON and
binary data, and one gRPC call when the gRPC tools are here), once per kernel path this CPU
has (a server started with each --kernel); FP16 inputs and output_datatype FP16.  And the
400s a bad reductions field gets.

Tolerances: float64 within 1e-12 relative, float32 within 1e-5 relative, each with an absolute
floor (1e-13 and 1e-7) for values near 0, where a relative bound means nothing (a sink mass of
1e-30, an entropy of a row with one key).  A top-k index may differ from the reference only
where the weight it picks equals the reference's within that tolerance (ties).

Large logits: q and k of whole numbers up to 60 with scale 1, so that every score (up to
57,600) is exact in both and the reference is exact too.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import harness  # noqa: E402
from harness import check, named  # noqa: E402

TOL = {"float64": (1e-12, 1e-13), "float32": (1e-5, 1e-7)}
ALL = {"entropy": True, "max": True, "received": True, "sink": 3, "local": 2, "topk": 4}


def reference(q, k, scale, mask, causal, red):
    """The reductions of q [B,H,lq,d], k [B,H,lk,d] (float64) from the full matrix."""
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    B, H, lq, lk = s.shape
    valid = np.ones((B, 1, lq, lk), bool)
    if mask is not None:
        valid &= mask.reshape(-1, 1, lq, lk).astype(bool)
    if causal:
        valid &= np.tril(np.ones((lq, lk), bool))
    s = np.where(valid, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(m)
    e = np.where(dead, 0.0, np.exp(s - np.where(dead, 0.0, m)))
    l = e.sum(axis=-1, keepdims=True)
    w = np.where(dead, 0.0, e / np.where(l == 0, 1, l))
    out = {}
    if red.get("entropy"):
        out["entropy"] = -np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0).sum(-1)
    if red.get("max"):
        out["max_weight"] = w.max(-1)
        out["argmax"] = np.where(dead[..., 0], -1, np.argmax(np.where(np.isfinite(s), s, -np.inf), -1))
    if red.get("received"):
        out["received"] = w.sum(-2)
    if "sink" in red:
        out["sink"] = w[..., :red["sink"]].sum(-1)
    if "local" in red:
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        out["local"] = np.where(np.abs(i - j) <= red["local"], w, 0).sum(-1)
    if "topk" in red:
        kk = red["topk"]
        order = np.argsort(-s, axis=-1, kind="stable")[..., :kk]
        has = np.take_along_axis(np.isfinite(s), order, -1)
        out["topk_indices"] = np.where(has, order, -1)
        out["topk_weights"] = np.where(has, np.take_along_axis(w, order, -1), 0)
    return out, w


def close(got, want, dtype):
    rel, floor = TOL[dtype]
    got = np.asarray(got, float)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= rel * np.abs(want) + floor))


def compare(name, got, ref, w, red, dtype):
    """Checks each reduction of got (name -> array) against the reference."""
    want, _ = ref
    rel, floor = TOL[dtype]
    for key, val in want.items():
        if key not in got:
            check(name + "/" + key, False, "missing from the answer")
            continue
        g = np.asarray(got[key])
        if key in ("argmax", "topk_indices"):
            g = g.astype(np.int64)
            ok = g.shape == val.shape
            if ok:
                # an index may differ from the reference's only on a tie within tolerance
                wt = want["max_weight"][..., None] if key == "argmax" else want["topk_weights"]
                gi = g[..., None] if key == "argmax" else g
                picked = np.where(gi >= 0, np.take_along_axis(w, np.maximum(gi, 0), -1), 0)
                same = (gi == (val[..., None] if key == "argmax" else val))
                tie = (gi >= 0) & (np.abs(picked - wt) <= rel * np.abs(wt) + floor)
                ok = bool(np.all(same | tie))
            check(name + "/" + key, ok, (g.ravel()[:12], val.ravel()[:12]))
        else:
            ok = close(g, val, dtype)
            check(name + "/" + key, ok,
                  "max error %g" % (np.abs(np.asarray(g, float) - val).max() if g.shape == val.shape
                                    else -1) if not ok else "")


def make_case(rng, B, H, lq, lk, d, masked, large=False):
    """q [B,lq,H*d], k, v, a mask [B,lq,lk] or None (with a fully masked row when masked)."""
    if large:
        q = rng.integers(-60, 61, (B, lq, H * d)).astype(float)
        k = rng.integers(-60, 61, (B, lk, H * d)).astype(float)
    else:
        q = rng.standard_normal((B, lq, H * d))
        k = rng.standard_normal((B, lk, H * d))
    v = rng.standard_normal((B, lk, H * d))
    mask = None
    if masked:
        mask = (rng.random((B, lq, lk)) < 0.7).astype(np.int64)
        mask[:, min(1, lq - 1), :] = 0              # a fully masked row
    return q, k, v, mask


def heads_view(a, H):
    B, L, D = a.shape
    return a.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)


CASES = [
    # name, B, H, lq, lk, d (per head), masked, causal, large logits
    ("self", 1, 1, 37, 37, 8, False, False, False),
    ("causal", 1, 1, 600, 600, 8, False, True, False),
    ("mask-heads", 1, 3, 20, 20, 4, True, False, False),
    ("batch-causal-mask", 2, 2, 70, 70, 4, True, True, False),
    ("cross", 2, 1, 33, 1100, 8, True, False, False),
    ("cross-causal", 1, 2, 50, 21, 4, False, True, False),
    ("large-logits", 1, 2, 40, 530, 16, True, True, True),
]


def v1_body(q, k, v, mask, H, causal, scale, dtype, red):
    B = q.shape[0]
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "heads": H, "causal": causal,
            "dtype": dtype, "reductions": red}
    if scale is not None:
        body["scale"] = scale
    if mask is not None:
        body["mask"] = mask.tolist()
    return json.dumps(body).encode()


def check_v1(srv, path, dtype):
    rng = np.random.default_rng(32)
    for name, B, H, lq, lk, d, masked, causal, large in CASES:
        if large and dtype == "float32":
            continue            # float32 scores of 1e4 carry 1e-3 of rounding: not a 1e-5 case
        q, k, v, mask = make_case(rng, B, H, lq, lk, d, masked, large)
        if dtype == "float32":
            q, k = q.astype(np.float32).astype(float), k.astype(np.float32).astype(float)
        scale = 1.0 if large else None
        red = dict(ALL)
        red["topk"] = min(4, lk)
        status, body, _ = srv.request("POST", "/v1/attention",
                                      v1_body(q, k, v, mask, H, causal, scale, dtype, red),
                                      {"Content-Type": "application/json"})
        tag = "v1/%s/%s/%s" % (path, dtype, name)
        if status != 200:
            check(tag, False, (status, body[:300]))
            continue
        ans = json.loads(body)
        sc = 1.0 if large else 1.0 / np.sqrt(d)
        ref = reference(heads_view(q, H), heads_view(k, H), sc, mask, causal, red)
        compare(tag, ans["reductions"], ref, ref[1], red, dtype)
        check(tag + "/output still there", len(ans["output"]) == B)


OUT_NAMES = {"entropy": ["entropy"], "max": ["max_weight", "argmax"], "received": ["received"],
             "sink": ["sink"], "local": ["local"], "topk": ["topk_indices", "topk_weights"]}
NP_TYPES = {"FP64": np.float64, "FP32": np.float32, "FP16": np.float16, "INT64": np.int64}


def v2_call(srv, q, k, v, mask, H, causal, scale, datatype, red, binary, outputs=True,
            extra=None):
    """A v2 inference (extra: more parameters); returns (status, {name: array} or the
    error)."""
    params = dict(red, heads=H, causal=causal, **(extra or {}))
    if scale is not None:
        params["scale"] = scale
    tensors = [("q", datatype, q), ("k", datatype, k), ("v", datatype, v)]
    if mask is not None:
        tensors.append(("mask", "BOOL", mask.astype(bool)))
    head = {"inputs": [], "parameters": params}
    blobs = []
    for name, dt, a in tensors:
        t = {"name": name, "datatype": dt, "shape": list(a.shape)}
        if binary:
            blob = a.astype(NP_TYPES.get(dt, np.bool_)).tobytes()
            t["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            t["data"] = a.ravel().tolist()
        head["inputs"].append(t)
    if outputs:
        head["outputs"] = [{"name": n, "parameters": {"binary_data": binary}}
                           for key in red for n in OUT_NAMES[key]]
    text = json.dumps(head).encode()
    hdrs = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        hdrs["Inference-Header-Content-Length"] = str(len(text))
    status, body, headers = srv.request("POST", "/v2/models/attention/infer",
                                        text + b"".join(blobs), hdrs)
    if status != 200:
        return status, body
    hl = int(headers.get("Inference-Header-Content-Length") or len(body))
    answer, at, outs = json.loads(body[:hl]), hl, {}
    for o in answer["outputs"]:
        if "data" in o:
            outs[o["name"]] = np.array(o["data"], NP_TYPES[o["datatype"]]).reshape(o["shape"])
        else:
            n = o["parameters"]["binary_data_size"]
            outs[o["name"]] = np.frombuffer(body[at:at + n], NP_TYPES[o["datatype"]]).reshape(
                o["shape"])
            at += n
        outs[o["name"] + ".datatype"] = o["datatype"]
    return status, outs


def check_v2(srv, path, dtype, binary):
    rng = np.random.default_rng(320)
    datatype = "FP64" if dtype == "float64" else "FP32"
    for name, B, H, lq, lk, d, masked, causal, large in CASES:
        if large and dtype == "float32":
            continue
        q, k, v, mask = make_case(rng, B, H, lq, lk, d, masked, large)
        if dtype == "float32":
            q, k = q.astype(np.float32).astype(float), k.astype(np.float32).astype(float)
        scale = 1.0 if large else None
        red = dict(ALL)
        red["topk"] = min(4, lk)
        tag = "v2/%s/%s/%s/%s" % (path, dtype, "binary" if binary else "json", name)
        status, outs = v2_call(srv, q, k, v, mask, H, causal, scale, datatype, red, binary)
        if status != 200:
            check(tag, False, (status, outs[:300]))
            continue
        sc = 1.0 if large else 1.0 / np.sqrt(d)
        ref = reference(heads_view(q, H), heads_view(k, H), sc, mask, causal, red)
        compare(tag, outs, ref, ref[1], red, dtype)
        check(tag + "/types and no output",
              "output" not in outs and outs["argmax.datatype"] == "INT64" and
              outs["topk_indices.datatype"] == "INT64" and outs["entropy.datatype"] == datatype,
              sorted(outs))


def check_half(srv):
    """FP16 inputs (binary) are reduced as the float32 job of their widened values, and
    output_datatype FP16 rounds every float reduction as NumPy rounds the same request's
    FP64 answer (the reduced values exactly); the INT64 outputs stay INT64."""
    rng = np.random.default_rng(321)
    q, k, v, mask = make_case(rng, 2, 2, 9, 12, 8, True)
    q, k, v = (a.astype(np.float16) for a in (q, k, v))
    red = dict(ALL)
    answers = {}
    for dt in ("FP64", "FP16"):
        status, outs = v2_call(srv, q, k, v, mask, 2, False, None, "FP16", red, True,
                               extra={"output_datatype": dt})
        if status != 200:
            check("half/output_datatype %s" % dt, False, (status, outs[:300]))
            return
        answers[dt] = outs
    wide = [a.astype(float) for a in (q, k)]
    ref = reference(heads_view(wide[0], 2), heads_view(wide[1], 2), 1 / np.sqrt(8), mask,
                    False, red)
    compare("half/FP16 inputs as float32", answers["FP64"], ref, ref[1], red, "float32")
    f64, f16 = answers["FP64"], answers["FP16"]
    floats = [n for n in ("entropy", "max_weight", "received", "sink", "local", "topk_weights")]
    check("half/FP16 outputs are the FP64 answer rounded to nearest even",
          all(f16[n + ".datatype"] == "FP16" and
              np.array_equal(f16[n].view(np.uint16), f64[n].astype(np.float16).view(np.uint16))
              for n in floats), [(n, f16[n + ".datatype"]) for n in floats])
    check("half/INT64 outputs stay INT64, equal",
          all(f16[n + ".datatype"] == "INT64" and np.array_equal(f16[n], f64[n])
              for n in ("argmax", "topk_indices")))


def v1_checks(path):
    return [named("check_v1_%s_%s" % (path, dt), lambda srv, dt=dt: check_v1(srv, path, dt))
            for dt in ("float64", "float32")] + \
        [named("check_v2_%s_%s_%s" % (path, dt, "binary" if b else "json"),
               lambda srv, dt=dt, b=b: check_v2(srv, path, dt, b))
         for dt in ("float64", "float32") for b in (False, True)]


def check_errors(srv):
    q = [[1.0, 0.0], [0.0, 1.0]]
    base = {"q": q, "k": q, "v": q}
    cases = [
        ({"entropy": True, "bogus": 1}, "reductions.bogus"),
        ({"entropy": 1}, "reductions.entropy"),
        ({"topk": 0}, "reductions.topk"),
        ({"topk": 3}, "reductions.topk"),
        ({"topk": 1.5}, "reductions.topk"),
        ({"sink": -1}, "reductions.sink"),
        ({"local": "2"}, "reductions.local"),
        ([1], "reductions"),
    ]
    for red, field in cases:
        body = dict(base, reductions=red)
        status, out, _ = srv.request("POST", "/v1/attention", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        err = json.loads(out).get("error", {}) if out.startswith(b"{") else {}
        check("errors/v1 %s -> 400 %s" % (json.dumps(red), field),
              status == 400 and err.get("field") == field, (status, out[:200]))


def check_v2_rules(srv):
    """The outputs with no list, the conflicts between outputs and parameters, the 400s on v2,
    and the model metadata."""
    rng = np.random.default_rng(7)
    q, k, v, _ = make_case(rng, 1, 1, 6, 6, 4, False)
    red = {"entropy": True, "topk": 2}
    status, outs = v2_call(srv, q, k, v, None, 1, False, None, "FP64", red, False, outputs=False)
    check("v2/no outputs listed: output and the reductions asked, no attention",
          status == 200 and sorted(n for n in outs if "." not in n) ==
          ["entropy", "output", "topk_indices", "topk_weights"], sorted(outs) if status == 200
          else outs)

    def error_of(params, outputs):
        head = {"inputs": [{"name": n, "datatype": "FP64", "shape": list(a.shape),
                            "data": a.ravel().tolist()} for n, a in (("q", q), ("k", k), ("v", v))],
                "parameters": params}
        if outputs is not None:
            head["outputs"] = [{"name": o} for o in outputs]
        status, body, _ = srv.request("POST", "/v2/models/attention/infer",
                                      json.dumps(head).encode(), {"Content-Type": "application/json"})
        # v2's error is one sentence, which holds the field (answer.c puts it in front when
        # the words do not name it)
        return status, json.loads(body).get("error", "") if status != 200 else ""
    cases = [
        ({"topk": 0}, None, "parameters.topk"),
        ({"topk": 7}, None, "parameters.topk"),
        ({"topk": "2"}, None, "parameters.topk"),
        ({"sink": -1}, None, "parameters.sink"),
        ({"local": 0.5}, None, "parameters.local"),
        ({"entropy": "yes"}, None, "parameters.entropy"),
        ({}, ["argmax"], "parameters.max"),
        ({"topk": 2}, ["output"], "parameters.topk"),
        ({"received": True}, ["entropy"], "parameters.entropy"),
    ]
    for params, outputs, field in cases:
        status, err = error_of(params, outputs)
        check("errors/v2 %s outputs %s -> 400 %s" % (json.dumps(params), outputs, field),
              status == 400 and field in err, (status, err))
    status, err = error_of({"received": True}, ["entropy", "received"])
    check("errors/v2 entropy named without its parameter", status == 400 and
          "parameters.entropy" in err, err)
    status, body, _ = srv.request("GET", "/v2/models/attention")
    meta = {o["name"]: o["datatype"] for o in json.loads(body)["outputs"]} if status == 200 else {}
    check("v2/metadata lists the reductions", meta.get("argmax") == "INT64" and
          meta.get("topk_indices") == "INT64" and meta.get("entropy") == "FP32" and
          {"received", "sink", "local", "max_weight", "topk_weights"} <= set(meta), meta)
    status, body, _ = srv.request("GET", "/v2/models/attention/config")
    conf = {o["name"]: o["data_type"] for o in json.loads(body)["output"]} if status == 200 else {}
    check("v2/config lists the reductions", conf.get("argmax") == "TYPE_INT64" and
          conf.get("received") == "TYPE_FP32", conf)


def check_projections(srv):
    """With x and weights (projections, biases, heads, causal, cross-attention context) the
    reductions are those of q and k after the projections: the answer's own q and k
    (return_qk) sent as q, k and v give the same numbers within 1e-12, and match the NumPy
    reference of those q and k."""
    rng = np.random.default_rng(11)
    x, ctx = rng.standard_normal((2, 30, 6)), rng.standard_normal((2, 45, 5))
    w = {"wq": rng.standard_normal((6, 8)).tolist(), "wk": rng.standard_normal((5, 8)).tolist(),
         "wv": rng.standard_normal((5, 8)).tolist(), "bq": rng.standard_normal(8).tolist()}
    red = dict(ALL, topk=5)
    body = {"x": x.tolist(), "context": ctx.tolist(), "weights": w, "heads": 2, "causal": True,
            "return_qk": True, "return_attention": False, "reductions": red}
    status, out, _ = srv.request("POST", "/v1/attention", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    if status != 200:
        check("projections: x, context and weights", False, (status, out[:300]))
        return
    a = json.loads(out)
    q, k = np.array(a["q"]), np.array(a["k"])
    ref = reference(heads_view(q, 2), heads_view(k, 2), a["meta"]["scale"], None, True, red)
    compare("projections/reference", a["reductions"], ref, ref[1], red, "float64")
    status, out2, _ = srv.request("POST", "/v1/attention", v1_body(q, k, k, None, 2, True,
                                                                    a["meta"]["scale"],
                                                                    "float64", red),
                                  {"Content-Type": "application/json"})
    b = json.loads(out2)["reductions"] if status == 200 else {}
    check("projections: the same reductions as from the answer's q and k",
          status == 200 and all(np.allclose(np.array(b[n], float), np.array(v, float),
                                            rtol=1e-12, atol=1e-13)
                                for n, v in a["reductions"].items()), status)


def check_memory_estimate(srv):
    """The reductions' arrays count in the estimate checked before anything is allocated: on a
    server with --max-request-memory 1M, the same request passes without top-k and is refused
    with it (300 x 300 top-k weights and indices: 1.4 MB)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((300, 8)).tolist()
    base = {"q": q, "k": q, "v": q, "return_attention": False}
    answers = []
    for red in ({"entropy": True}, {"entropy": True, "topk": 300}):
        status, body, _ = srv.request("POST", "/v1/attention",
                                      json.dumps(dict(base, reductions=red)).encode(),
                                      {"Content-Type": "application/json"})
        answers.append((status, body[:200]))
    check("memory estimate: 200 without the large top-k, 413 with it",
          answers[0][0] == 200 and answers[1][0] == 413, answers)


def kernel_paths(with_bf16=False):
    """The --kernel paths this CPU runs, widest first; with_bf16: avx512_bf16 first where
    the CPU has it (a path that differs from avx512 in compute_precision bfloat16 only)."""
    flags = open("/proc/cpuinfo").read().split()
    paths = ["portable"]
    if "avx2" in flags and "fma" in flags:
        paths.insert(0, "avx2")
    if "avx512f" in flags:
        paths.insert(0, "avx512")
    if with_bf16 and "avx512_bf16" in flags:
        paths.insert(0, "avx512_bf16")
    return paths


def main():
    args = harness.arguments(__doc__)
    for path in kernel_paths():
        harness.run(args.server, v1_checks(path), "--kernel", path)
    harness.run(args.server, [check_errors, check_v2_rules, check_projections, check_half])
    harness.run(args.server, [check_memory_estimate], "--max-request-memory", "1M")
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
