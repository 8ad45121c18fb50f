#!/usr/bin/python3
"""Scores that overflow, from outside: the same request answers the same way whatever it asks
for and however it comes (docs/numbers.md, "Overflow and masks").

q = [[B]], k = [[-B], [-2B]], v = [[1], [2]] with B = 1e20 in float32 (1e160 in float64):
both scores are past the range (-1e40, -2e40), and the true output is 1, so every way of asking
is a 400 not_finite with the matrix path's words: the output alone (v1 return_attention false,
v2 outputs [output], the fused kernel), with the matrix, the reductions alone and with the
output, the pooled weights; over v1, v2 JSON, v2 binary and gRPC; on a server started with each
--kernel path this CPU has.  And the two neighbours that must still be 200: a row where one
score overflows beside a finite one (k = [[-B], [1/B]]: the output is exactly 2, key 0 weighs
0) and a row the mask hides whole (zeros).

Usage: overflow_test.py --server PATH [--filter SUBSTR].
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "grpc"))
sys.path.insert(0, os.path.join(HERE, "..", "reductions"))
import harness  # noqa: E402
from harness import check, named  # noqa: E402
import grpc  # noqa: E402  (Debian's python3-grpcio)
from grpc_test import GrpcServer, http_infer, infer_request  # noqa: E402
from reductions_test import kernel_paths  # noqa: E402

BIG = {"float32": 1e20, "float64": 1e160}
DATATYPE = {"float32": "FP32", "float64": "FP64"}

# What a request asks for: v1 body members, and the v2 outputs and parameters of the same.
ASKS = {
    "output": ({"return_attention": False}, ["output"], {}),
    "matrix": ({"return_attention": True}, ["output", "attention"], {}),
    "reductions": ({"return_attention": False, "reductions": {"max": True, "entropy": True,
                                                             "received": True}},
                   ["max_weight", "argmax", "entropy", "received"],
                   {"max": True, "entropy": True, "received": True}),
    "output and reductions": ({"return_attention": False, "reductions": {"max": True}},
                              ["output", "max_weight", "argmax"], {"max": True}),
    "pooled": ({"attention_pool": {"rows": 1, "cols": 1}}, ["attention"],
               {"attention_pool_rows": 1, "attention_pool_cols": 1}),
}


def v1(srv, dtype, q, k, v, members, mask=None):
    body = dict(members, q=q, k=k, v=v, dtype=dtype)
    if mask is not None:
        body["mask"] = mask
    status, raw, _ = srv.request("POST", "/v1/attention", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return status, json.loads(raw)


def v2_json(srv, dtype, q, k, v, outputs, params):
    dt = DATATYPE[dtype]
    head = {"inputs": [{"name": n, "datatype": dt, "shape": [len(a), 1],
                        "data": [x[0] for x in a]} for n, a in (("q", q), ("k", k), ("v", v))],
            "outputs": [{"name": o} for o in outputs], "parameters": params}
    status, raw, _ = srv.request("POST", "/v2/models/attention/infer", json.dumps(head).encode(),
                                 {"Content-Type": "application/json"})
    return status, json.loads(raw)


def tensors(dtype, q, k, v):
    """The inputs as grpc_test's (name, datatype, shape, bytes)."""
    fmt = "<%d" + ("f" if dtype == "float32" else "d")
    return [(n, DATATYPE[dtype], [len(a), 1], struct.pack(fmt % len(a), *[x[0] for x in a]))
            for n, a in (("q", q), ("k", k), ("v", v))]


def error_words(status, answer):
    """(code, message) of a v1 error answer, or (status, None) of a success."""
    if status == 200:
        return status, None
    return answer["error"]["code"], answer["error"]["message"]


def check_overflow(srv, path, dtype):
    b = BIG[dtype]
    q, k, v = [[b]], [[-b], [-2 * b]], [[1.0], [2.0]]
    # the matrix path's words, which every other way must repeat
    status, answer = v1(srv, dtype, q, k, v, ASKS["matrix"][0])
    code, words = error_words(status, answer)
    check("%s/%s/v1/matrix: 400 not_finite" % (path, dtype),
          status == 400 and code == "not_finite", (status, answer))
    for ask, (members, outputs, params) in ASKS.items():
        tag = "%s/%s/%s" % (path, dtype, ask)
        status, answer = v1(srv, dtype, q, k, v, members)
        check(tag + "/v1", status == 400 and error_words(status, answer) == (code, words),
              (status, answer))
        # v2's error is its message alone (the Open Inference Protocol's {"error": "..."})
        status, answer = v2_json(srv, dtype, q, k, v, outputs, params)
        check(tag + "/v2 json", status == 400 and answer == {"error": words}, (status, answer))
        status, answer = http_infer(srv, "attention", tensors(dtype, q, k, v), outputs, params)
        check(tag + "/v2 binary", status == 400 and answer == words, (status, answer))
        try:
            srv.stub().ModelInfer(infer_request("attention", tensors(dtype, q, k, v), outputs,
                                                params))
            check(tag + "/grpc", False, "answered OK")
        except grpc.RpcError as e:
            check(tag + "/grpc", e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                  words in e.details(), (e.code(), e.details(), words))


def check_neighbours(srv, path, dtype):
    b = BIG[dtype]
    for ask in ("output", "matrix", "output and reductions"):
        tag = "%s/%s/%s" % (path, dtype, ask)
        status, answer = v1(srv, dtype, [[b]], [[-b], [1 / b]], [[1.0], [2.0]], ASKS[ask][0])
        check(tag + "/one score overflows: output exactly 2",
              status == 200 and answer["output"] == [[2]], (status, answer))
        status, answer = v1(srv, dtype, [[b], [1.0]], [[-b], [-2 * b]], [[1.0], [2.0]],
                            ASKS[ask][0], mask=[[0, 0], [1, 1]])
        check(tag + "/the overflowing row masked whole: zeros",
              status == 200 and answer["output"] == [[0], [1]], (status, answer))


def checks(path):
    return [named("check_%s_%s" % (what.__name__[6:], path),
                  lambda srv, what=what: [what(srv, path, dtype) for dtype in BIG])
            for what in (check_overflow, check_neighbours)]


def main():
    args = harness.arguments(__doc__)
    for path in kernel_paths():
        harness.run(args.server, checks(path), "--kernel", path, server_class=GrpcServer)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
