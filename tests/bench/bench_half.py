#!/usr/bin/python3
"""FP16 against FP32 on the wire: the visualizer's request at L tokens (q, k and v of
L x 64, one head, binary v2, the outputs `output` and `attention`, the whole matrix), sent
in FP32 and in FP16 with output_datatype FP16.  Prints the bytes each way and the median
and spread of the request time (sent until the whole answer is read) over `--rounds`
interleaved rounds, against a server it starts on loopback and stops.

Usage: bench_half.py --server PATH [--tokens 2048] [--rounds 15]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
import numpy as np  # noqa: E402


def body(qkv, dtype):
    head = {"inputs": [], "parameters": {"binary_data_output": True},
            "outputs": [{"name": "output"}, {"name": "attention"}]}
    if dtype != "FP32":
        head["parameters"]["output_datatype"] = dtype
    blobs = [a.astype("<f2" if dtype == "FP16" else "<f4").tobytes() for a in qkv]
    for name, a, b in zip("qkv", qkv, blobs):
        head["inputs"].append({"name": name, "datatype": dtype, "shape": list(a.shape),
                               "parameters": {"binary_data_size": len(b)}})
    text = json.dumps(head).encode()
    return text + b"".join(blobs), len(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    qkv = [rng.standard_normal((args.tokens, 64)).astype(np.float32) for _ in range(3)]
    bodies = {d: body(qkv, d) for d in ("FP32", "FP16")}
    srv = harness.Server(args.server)
    try:
        times = {d: [] for d in bodies}
        sizes = {}
        for r in range(args.rounds + 1):          # the first round warms up, not counted
            for d, (b, hl) in bodies.items():
                t0 = time.perf_counter()
                status, answer, _ = srv.request("POST", "/v2/models/attention/infer", b,
                                                {"Inference-Header-Content-Length": str(hl),
                                                 "Content-Type": "application/octet-stream"})
                ms = (time.perf_counter() - t0) * 1000
                if status != 200:
                    raise RuntimeError("%s: %d %s" % (d, status, answer[:200]))
                sizes[d] = (len(b), len(answer))
                if r:
                    times[d].append(ms)
        print("L=%d, q/k/v %d x 64, outputs output and attention (binary), %d rounds"
              % (args.tokens, args.tokens, args.rounds))
        for d in bodies:
            t = sorted(times[d])
            print("%s: request %d bytes, answer %d bytes; median %.1f ms (min %.1f, max %.1f)"
                  % (d, sizes[d][0], sizes[d][1], statistics.median(t), t[0], t[-1]))
        print("FP32/FP16: bytes %.2fx, time %.2fx" % (
            sum(sizes["FP32"]) / sum(sizes["FP16"]),
            statistics.median(times["FP32"]) / statistics.median(times["FP16"])))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
