"""make_checkpoint.py - the weight set of bench_checkpoint.sh, as a safetensors file and as JSON,
and the check that the server stored it bit for bit.

Usage:
  python3 make_checkpoint.py write DIR E HEADS
      DIR/mha.safetensors  an nn.MultiheadAttention(E, HEADS) state dict in float32, as torch
                           saves it: in_proj_weight (3E x E), in_proj_bias (3E), out_proj.weight
                           (E x E), out_proj.bias (E); E = 2560 gives 100 MiB of numbers
      DIR/mha.json         the same numbers as the JSON body of PUT /v1/weight-sets/{name}:
                           wq wk wv wo in the (in, out) layout the safetensors upload is stored in,
                           bq bk bv bo, heads; each float32 widened to a double and printed with
                           repr, the shortest text that reads back to that double
  python3 make_checkpoint.py check DIR ANSWER.safetensors
      ANSWER is GET /v1/weight-sets/{name}?format=safetensors (in_out): every number of
      every part must be the float32 of DIR/mha.safetensors, bit for bit: as F32 for the
      float32 set a safetensors upload makes, widened to double as F64 for the float64 set
      of a JSON upload.
      Prints one line; exit status 1 on the first difference.
Numbers are uniform in [-0.05, 0.05) (the scale of an initialised layer) from a fixed seed.
"""

import json
import struct
import sys

import numpy as np


def safetensors_bytes(tensors, metadata=None):
    """tensors: {name: ndarray}; the file as the format says (the few lines of
    tests/checkpoints/checkpoint_test.py, for NumPy arrays instead of torch tensors)."""
    dtypes = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return [struct.pack("<Q", len(text)) + text] + blobs


def parse_safetensors(data):
    """The tensors of a file as {name: ndarray} (views into data)."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"F64": "<f8", "F32": "<f4"}
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dtype = np.dtype(kinds[h["dtype"]])
        out[name] = np.frombuffer(data, dtype=dtype, count=(e - b) // dtype.itemsize,
                                  offset=8 + n + b).reshape(h["shape"])
    return out


def source(e):
    rng = np.random.default_rng(20)
    u = lambda *shape: rng.uniform(-0.05, 0.05, shape).astype("<f4")
    return {"in_proj_weight": u(3 * e, e), "in_proj_bias": u(3 * e),
            "out_proj.weight": u(e, e), "out_proj.bias": u(e)}


def parts(t):
    """The eight parts of the stored set, (in, out), from the float32 tensors (still float32)."""
    w, b = t["in_proj_weight"], t["in_proj_bias"]
    e = w.shape[1]
    return {"wq": w[:e].T, "wk": w[e:2 * e].T, "wv": w[2 * e:].T, "wo": t["out_proj.weight"].T,
            "bq": b[:e], "bk": b[e:2 * e], "bv": b[2 * e:], "bo": t["out_proj.bias"]}


def write_json(path, p, heads):
    """The JSON body, written row by row: the whole text would be ~0.5 GB in memory at once."""
    with open(path, "w") as f:
        f.write('{"weights_layout":"in_out","heads":%d' % heads)
        for name, a in p.items():
            f.write(',"%s":' % name)
            if a.ndim == 1:
                f.write("[" + ",".join(map(repr, a.astype(np.float64).tolist())) + "]")
                continue
            f.write("[")
            for i, row in enumerate(a.astype(np.float64)):
                f.write(("," if i else "") + "[" + ",".join(map(repr, row.tolist())) + "]")
            f.write("]")
        f.write("}\n")


def write(out, e, heads):
    t = source(e)
    with open(out + "/mha.safetensors", "wb") as f:
        for chunk in safetensors_bytes(t):
            f.write(chunk)
    write_json(out + "/mha.json", parts(t), heads)
    print("%d numbers of float32 (E = %d, %d heads)" % (sum(a.size for a in t.values()), e, heads))


def check(out, answer_path):
    with open(out + "/mha.safetensors", "rb") as f:
        t = parse_safetensors(f.read())
    with open(answer_path, "rb") as f:
        got = parse_safetensors(f.read())
    want = parts(t)
    if sorted(got) != sorted(want):
        print("check: the answer holds %s, not %s" % (sorted(got), sorted(want)))
        return 1
    n = 0
    for name, a in want.items():
        g = got[name]
        w = a.astype(g.dtype) if g.dtype in (np.float32, np.float64) else a
        if g.dtype not in (np.float32, np.float64) or g.shape != w.shape:
            print("check: %s is %s %s, not float32 or float64 %s" % (name, g.dtype, g.shape,
                                                                     w.shape))
            return 1
        # Bit for bit: the same numbers, not merely equal ones (0.0 vs -0.0 differ here).
        bits = np.uint32 if g.dtype == np.float32 else np.uint64
        bad = np.flatnonzero(g.view(bits) != w.view(bits))
        if bad.size:
            i = np.unravel_index(bad[0], w.shape)
            print("check: %s%s is %r, not %r (%d numbers differ)"
                  % (name, list(i), float(g[i]), float(w[i]), bad.size))
            return 1
        n += w.size
    print("%d numbers bit for bit" % n)
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        return check(sys.argv[2], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
