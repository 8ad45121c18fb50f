"""compare.py - do two answers of POST /v1/attention agree?  A benchmark of a wrong answer fails.

Usage:
  python3 compare.py CASE OURS.json PEER.json [EXPECT.json]
      ours against the peer's answer (and against a fixture's expected answer, within the
      fixture's tolerance);
  python3 compare.py --rows N CASE OURS.json REQUEST.json
      ours against NumPy computed here (float64, npattn) for the first N query rows only, for
      requests too large for the peer (x with inline weights, no heads, no mask);
  python3 compare.py --v2 CASE OURS.bin OURS.headers PEER.json
      ours answering POST /v2/models/attention/infer with binary outputs (the body, and
      the response headers as curl -D writes them) against the peer's v1 answer.
"output" and "attention" must have the same shape and agree within a relative tolerance: the
largest |difference| divided by the largest |value|, at most 1e-6 for float64 and 1e-4 for
float32 (the answer's meta.dtype, or the request's dtype). Prints one line per check, in the
format of the results' checks*.tsv, and exits 1 when any disagrees.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npattn  # noqa: E402

TOLERANCE = {"float64": 1e-6, "float32": 1e-4}


def load(path):
    with open(path) as f:
        return json.load(f)


def rel_diff(a, b):
    """Relative difference of two arrays, inf when their shapes differ or one is missing."""
    if (a is None) != (b is None):
        return float("inf")
    if a is None:
        return 0.0
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(y))), 1e-300) if y.size else 1.0
    return float(np.max(np.abs(x - y))) / scale if y.size else 0.0


def report(case, what, dtype, diff, tol):
    ok = diff <= tol
    print(f"http: {what}\t{case}\t{dtype}\t{diff:.1e}\t{tol:.0e}\t{'ok' if ok else 'FAILED'}")
    return ok


def load_v2_binary(body_path, headers_path):
    """A binary v2 answer as {"output": array, "attention": array, "meta": {"dtype": ...}}."""
    length = None
    with open(headers_path) as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.strip().lower() == "inference-header-content-length":
                length = int(value.strip())
    with open(body_path, "rb") as f:
        body = f.read()
    if length is None:
        return json.loads(body)
    header = json.loads(body[:length])
    answer, at = {}, length
    kinds = {"FP32": ("<f4", 4, "float32"), "FP64": ("<f8", 8, "float64")}
    for out in header["outputs"]:
        fmt, size, dtype = kinds[out["datatype"]]
        n = out["parameters"]["binary_data_size"]
        answer[out["name"]] = np.frombuffer(body[at:at + n], dtype=fmt).reshape(out["shape"])
        answer["meta"] = {"dtype": dtype}
        at += n
    if at != len(body):
        answer["output"] = None  # sizes that do not add up fail the comparison
    return answer


def main():
    args = sys.argv[1:]
    if args and args[0] == "--v2":
        case, ours, peer = args[1], load_v2_binary(args[2], args[3]), load(args[4])
        dtype = ours.get("meta", {}).get("dtype", "float64")
        ok = report(case, "ours (v2 binary) vs peer", dtype,
                    max(rel_diff(ours.get("output"), peer.get("output")),
                        rel_diff(ours.get("attention"), peer.get("attention"))), TOLERANCE[dtype])
        return 0 if ok else 1
    if args and args[0] == "--rows":
        rows, case, ours_path, request_path = int(args[1]), args[2], args[3], args[4]
        ours, req = load(ours_path), load(request_path)
        dtype = req.get("dtype", "float64")
        w = req["weights"]
        x = np.asarray(req["x"], dtype=np.float64)
        k = npattn.project(x, w["wk"])
        v = npattn.project(x, w["wv"])
        q = npattn.project(x[:rows], w["wq"])
        out, _ = npattn.sdpa(q, k, v, causal=False, scale=req.get("scale"))
        got = ours.get("output")
        got = None if got is None else np.asarray(got)[:rows]
        ok = report(case, f"ours vs NumPy here, first {rows} rows", dtype,
                    rel_diff(got, out), TOLERANCE[dtype])
        ok &= report(case, "ours: output rows", dtype,
                     0.0 if len(ours.get("output", [])) == len(req["x"]) else float("inf"), 0)
        return 0 if ok else 1
    case, ours_path, peer_path = args[:3]
    ours, peer = load(ours_path), load(peer_path)
    dtype = ours.get("meta", {}).get("dtype", "float64")
    ok = report(case, "ours vs peer", dtype,
                max(rel_diff(ours.get("output"), peer.get("output")),
                    rel_diff(ours.get("attention"), peer.get("attention"))), TOLERANCE[dtype])
    if len(args) > 3:
        expect = load(args[3])
        tol = expect.get("tolerance", 1e-9)
        diff = max(float(np.max(np.abs(np.asarray(ours[key]) - np.asarray(expect[key]))))
                   for key in ("output", "attention") if key in expect)
        ok &= report(case, f"ours vs fixture {expect.get('fixture', '')} (absolute)", dtype, diff,
                     tol)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
