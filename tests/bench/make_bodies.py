"""make_bodies.py - writes the request bodies of the HTTP benchmarks into a directory.

Usage: python3 make_bodies.py DIR [NAME...]   (no NAME: all of them)

  seed.json          the request of the smallest golden fixture (tests/fixtures, by file
                     size: seed004_toy), and seed.expect.json its expected answer
  attn512.json       q, k, v of 512 x 64, float64, attention returned
  attn512.v2         the same numbers as a binary v2 request (FP64 little-endian bytes after
                     the JSON header, outputs asked in binary), and attn512.v2.hlen the
                     header's length for Inference-Header-Content-Length
  proj4096.json      x of 4096 x 8 with inline wq/wk/wv of 8 x 64, float64, no attention
  mem32k.json        x of 32768 x 8 with inline wq/wk/wv of 8 x 64, float32, no attention
  conc1024.json      x of 1024 x 64, wq/wk/wv 64 x 512, wo 512 x 64, 8 heads, float64, no
                     attention: about 2.3 GFLOP of compute in a 1.8 MB body
  slow2048.json      x of 2048 x 8, wq/wk/wv 8 x 512, wo 512 x 8, 8 heads, float64, no attention:
                     about 9 GFLOP in a small body, the slow request of bench_mhd.sh
Inputs are uniform in [-1, 1) from a fixed seed, so every run sends the same bytes.
"""

import glob
import json
import os
import sys

import numpy as np


def rnd(rng, *shape):
    return rng.uniform(-1, 1, shape).round(6).tolist()


def projected(rng, n, d_in, d, heads=None, wo=False, **extra):
    body = {"x": rnd(rng, n, d_in),
            "weights": {"wq": rnd(rng, d_in, d), "wk": rnd(rng, d_in, d), "wv": rnd(rng, d_in, d)}}
    if wo:
        body["weights"]["wo"] = rnd(rng, d, d_in)
    if heads:
        body["heads"] = heads
    body.update(extra)
    return body


def write_v2_binary(path, body, datatype="FP64", outputs=("output", "attention")):
    """Writes body's q, k, v as a binary v2 request (FP64 or FP32 bytes) asking for the named
    outputs in binary."""
    arrays = [np.asarray(body[n], dtype="<f8" if datatype == "FP64" else "<f4")
              for n in ("q", "k", "v")]
    header = json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": datatype,
                    "parameters": {"binary_data_size": a.nbytes}}
                   for n, a in zip(("q", "k", "v"), arrays)],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
    }, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(header)
        for a in arrays:
            f.write(a.tobytes())
    with open(path + ".hlen", "w") as f:
        f.write(str(len(header)))


def main():
    out = sys.argv[1]
    names = sys.argv[2:]
    fixtures = os.environ.get("FIXTURES", "tests/fixtures")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(4)
    smallest = min(glob.glob(os.path.join(fixtures, "*.json")), key=os.path.getsize)
    with open(smallest) as f:
        fixture = json.load(f)
    bodies = {
        "seed": lambda: fixture["request"],
        "attn512": lambda: {"q": rnd(rng, 512, 64), "k": rnd(rng, 512, 64),
                            "v": rnd(rng, 512, 64)},
        "proj4096": lambda: projected(rng, 4096, 8, 64, return_attention=False),
        "mem32k": lambda: projected(rng, 32768, 8, 64, dtype="float32", return_attention=False),
        "conc1024": lambda: projected(rng, 1024, 64, 512, heads=8, wo=True,
                                      return_attention=False),
        "slow2048": lambda: projected(rng, 2048, 8, 512, heads=8, wo=True,
                                      return_attention=False),
    }
    for name in names or bodies:
        body = bodies[name]()
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(body, f, separators=(",", ":"))
        if name == "attn512":
            write_v2_binary(os.path.join(out, name + ".v2"), body)
        if name == "seed":
            expect = dict(fixture["expect"], fixture=os.path.basename(smallest))
            with open(os.path.join(out, "seed.expect.json"), "w") as f:
                json.dump(expect, f)


if __name__ == "__main__":
    main()
