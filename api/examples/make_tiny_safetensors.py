#!/usr/bin/python3
"""Writes api/examples/tiny.safetensors, the small checkpoint the README's examples upload.

One file serves every preset of PUT /v1/weight-sets/{name}?format=safetensors (see
docs/weight-sets.md): embedding size 4, F32 tensors of fixed small numbers, under the names
of a torch.nn.MultiheadAttention (in_proj_weight ...), of a two-layer BERT
(encoder.layer.{0,1}.attention...), of a two-layer GPT-2 (h.{0,1}.attn...), and of three
plain matrices (attn.{q,k,v}.weight) for preset=names.  Standard library only:

    /usr/bin/python3 api/examples/make_tiny_safetensors.py    # from the repository root
"""
import json
import os
import struct

E = 4


def numbers(count, seed):
    """count small numbers, different for each seed, exact in float32 (multiples of 1/8)."""
    return [((i * 7 + seed * 5) % 11 - 5) / 8 for i in range(count)]


def tensors():
    out, seed = {}, 0

    def add(name, shape):
        nonlocal seed
        seed += 1
        size = 1
        for d in shape:
            size *= d
        out[name] = (shape, numbers(size, seed))

    add("in_proj_weight", [3 * E, E])          # torch: (out, in), q k v stacked by rows
    add("in_proj_bias", [3 * E])
    add("out_proj.weight", [E, E])
    add("out_proj.bias", [E])
    for n in range(2):                        # BERT: (out, in)
        for part in ("query", "key", "value"):
            add("encoder.layer.%d.attention.self.%s.weight" % (n, part), [E, E])
            add("encoder.layer.%d.attention.self.%s.bias" % (n, part), [E])
        add("encoder.layer.%d.attention.output.dense.weight" % n, [E, E])
        add("encoder.layer.%d.attention.output.dense.bias" % n, [E])
    for n in range(2):                        # GPT-2: (in, out), q k v side by side
        add("h.%d.attn.c_attn.weight" % n, [E, 3 * E])
        add("h.%d.attn.c_attn.bias" % n, [3 * E])
        add("h.%d.attn.c_proj.weight" % n, [E, E])
        add("h.%d.attn.c_proj.bias" % n, [E])
    for part in ("q", "k", "v"):              # plain names, (out, in)
        add("attn.%s.weight" % part, [E, E])
    return out


def safetensors_bytes(ts):
    header, blobs, offset = {"__metadata__": {"about": "README example"}}, [], 0
    for name, (shape, values) in ts.items():
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny.safetensors")
    with open(path, "wb") as f:
        f.write(safetensors_bytes(tensors()))
    print(path)
