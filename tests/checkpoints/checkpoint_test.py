#!/usr/bin/python3
"""Weight sets from safetensors checkpoints, end to end.

PyTorch builds nn.MultiheadAttention modules, their state_dict is written as
a safetensors file (the format is written here, by hand, so the test does
not depend on the safetensors package), the file is PUT to a server this
test starts on a free loopback port, and the server's output and per-head
attention for the same x must equal torch's forward (need_weights=True,
average_attn_weights=False) within 1e-9 in float64.  BERT- and GPT-2-named
files of random tensors are checked against a NumPy reference; layer=all,
the safetensors answer of GET, and every bad file (400 naming the fault,
nothing stored, the server still serving) are tried too.  A file of F32, F16
or BF16 tensors becomes a float32 set (its numbers the file's, exactly; GET
answers them as F32 tensors), one with an F64 tensor a float64 set.

Usage: checkpoint_test.py --server PATH [--filter SUBSTR] (only the check
functions whose name contains SUBSTR).  Prints "ok NAME" or "FAIL NAME"
per check and "N passed, N failed" last.  Run with Debian's /usr/bin/python3,
which has python3-torch and python3-numpy.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

TOLERANCE = 1e-9


# ---------------------------------------------------------------- the format

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16"}


def safetensors_bytes(tensors, metadata=None):
    """tensors: {name: torch tensor}; the file as bytes, as the format says."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def parse_safetensors(data):
    """The F64 or F32 tensors of a file as {name: ndarray of that type}, and its
    metadata."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        assert h["dtype"] in ("F64", "F32")
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e],
                                  dtype="<f8" if h["dtype"] == "F64" else "<f4").reshape(h["shape"])
    return out, meta


# ---------------------------------------------------------------- the server

class Server(harness.Server):
    def json_request(self, method, path, body=None, content_type="application/json"):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else {}
        status, answer, headers = super().request(method, path, data, headers)
        return status, answer, dict(headers)

    def put_file(self, name, query, data):
        status, body, _ = self.json_request("PUT", "/v1/weight-sets/%s?format=safetensors&%s"
                                            % (name, query), data, "application/octet-stream")
        return status, json.loads(body) if body else None

    def attention(self, name, x, heads, context=None, dtype=None):
        req = {"x": x.tolist(), "weights": name, "heads": heads}
        if dtype is not None:
            req["dtype"] = dtype
        if context is not None:
            req["context"] = context.tolist()
        status, body, _ = self.json_request("POST", "/v1/attention", req)
        answer = json.loads(body)
        if status != 200:
            raise RuntimeError("attention answered %d: %s" % (status, answer))
        return np.array(answer["output"]), np.array(answer["attention"])

    def exists(self, name):
        return self.json_request("GET", "/v1/weight-sets/" + name)[0] == 200


# ---------------------------------------------------------------- references

def reference(x, ctx, wq, wk, wv, wo, bq, bk, bv, bo, heads):
    """Multi-head attention in float64 with (in, out) matrices."""
    q, k, v = x @ wq + bq, ctx @ wk + bk, ctx @ wv + bv
    dh = q.shape[1] // heads
    outs, atts = [], []
    for h in range(heads):
        s = q[:, h * dh:(h + 1) * dh] @ k[:, h * dh:(h + 1) * dh].T / np.sqrt(dh)
        a = np.exp(s - s.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        atts.append(a)
        outs.append(a @ v[:, h * (v.shape[1] // heads):(h + 1) * (v.shape[1] // heads)])
    return np.concatenate(outs, axis=1) @ wo + bo, np.array(atts)


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# ---------------------------------------------------------------- the checks

def check_torch_mha(srv, name, e, heads, kdim=None, bias=True, dtype=torch.float64):
    torch.manual_seed(len(name))
    mha = torch.nn.MultiheadAttention(e, heads, bias=bias, kdim=kdim, vdim=kdim,
                                      dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():  # biases are zero at first: make them count
            p.uniform_(-0.5, 0.5)
            p.copy_(p.to(dtype).to(torch.float64))
    sd = {k: v.to(dtype) for k, v in mha.state_dict().items()}
    status, answer = srv.put_file(name, "preset=torch_mha&heads=%d" % heads,
                                  safetensors_bytes(sd))
    if status not in (200, 201):
        return check(name, False, answer)
    want = "float64" if dtype == torch.float64 else "float32"
    check(name + " is a %s set" % want, answer.get("dtype") == want, answer)
    x = torch.randn(5, e, dtype=torch.float64)
    ctx = torch.randn(7, kdim, dtype=torch.float64) if kdim else x
    with torch.no_grad():
        out, att = mha(x, ctx, ctx, need_weights=True, average_attn_weights=False)
    got_out, got_att = srv.attention(name, x.numpy(), heads, ctx.numpy() if kdim else None)
    d = max(max_diff(got_out, out.numpy()), max_diff(got_att, att.numpy()))
    check(name + " equals torch forward", d <= TOLERANCE, "max difference %g" % d)


def bert_file(layers, e, prefix="bert."):
    g = torch.Generator().manual_seed(7)
    t = {}
    for n in range(layers):
        base = "%sencoder.layer.%d.attention." % (prefix, n)
        for part in ("self.query", "self.key", "self.value", "output.dense"):
            t[base + part + ".weight"] = torch.rand(e, e, generator=g, dtype=torch.float64) - 0.5
            t[base + part + ".bias"] = torch.rand(e, generator=g, dtype=torch.float64) - 0.5
        t[base + "output.LayerNorm.weight"] = torch.ones(e, dtype=torch.float64)
    t[prefix + "embeddings.word_embeddings.weight"] = torch.zeros(11, e, dtype=torch.float64)
    return t


def bert_reference(t, n, x, heads, prefix="bert."):
    base = "%sencoder.layer.%d.attention." % (prefix, n)
    w = {p: t[base + p + ".weight"].numpy().T for p in
         ("self.query", "self.key", "self.value", "output.dense")}
    b = {p: t[base + p + ".bias"].numpy() for p in
         ("self.query", "self.key", "self.value", "output.dense")}
    return reference(x, x, w["self.query"], w["self.key"], w["self.value"], w["output.dense"],
                     b["self.query"], b["self.key"], b["self.value"], b["output.dense"], heads)


def gpt2_file(layers, e):
    g = torch.Generator().manual_seed(11)
    t = {"transformer.wte.weight": torch.zeros(13, e, dtype=torch.float64)}
    for n in range(layers):
        base = "transformer.h.%d.attn." % n
        t[base + "c_attn.weight"] = torch.rand(e, 3 * e, generator=g, dtype=torch.float64) - 0.5
        t[base + "c_attn.bias"] = torch.rand(3 * e, generator=g, dtype=torch.float64) - 0.5
        t[base + "c_proj.weight"] = torch.rand(e, e, generator=g, dtype=torch.float64) - 0.5
        t[base + "c_proj.bias"] = torch.rand(e, generator=g, dtype=torch.float64) - 0.5
    return t


def gpt2_reference(t, n, x, heads):
    base = "transformer.h.%d.attn." % n
    w, b = t[base + "c_attn.weight"].numpy(), t[base + "c_attn.bias"].numpy()
    e = w.shape[0]
    return reference(x, x, w[:, :e], w[:, e:2 * e], w[:, 2 * e:], t[base + "c_proj.weight"].numpy(),
                     b[:e], b[e:2 * e], b[2 * e:], t[base + "c_proj.bias"].numpy(), heads)


def check_bert_and_gpt2(srv):
    e, heads = 8, 2
    x = np.random.default_rng(3).uniform(-1, 1, (4, e))
    bert = bert_file(2, e)
    status, answer = srv.put_file("bert1", "preset=hf_bert&heads=2&layer=1",
                                  safetensors_bytes(bert))
    check("hf_bert layer 1 stored", status == 201, answer)
    if status == 201:
        out, att = srv.attention("bert1", x, heads)
        ref_out, ref_att = bert_reference(bert, 1, x, heads)
        d = max(max_diff(out, ref_out), max_diff(att, ref_att))
        check("hf_bert layer 1 equals NumPy", d <= TOLERANCE, d)
    gpt2 = gpt2_file(3, e)
    status, answer = srv.put_file("g", "preset=gpt2&heads=2&layer=all", safetensors_bytes(gpt2))
    names = [s["name"] for s in answer.get("weight_sets", [])] if answer else []
    check("gpt2 layer=all stores g.0 g.1 g.2", status == 201 and names == ["g.0", "g.1", "g.2"],
          answer)
    for n in range(3 if status == 201 else 0):
        out, att = srv.attention("g.%d" % n, x, heads)
        ref_out, ref_att = gpt2_reference(gpt2, n, x, heads)
        d = max(max_diff(out, ref_out), max_diff(att, ref_att))
        check("gpt2 layer %d equals NumPy" % n, d <= TOLERANCE, d)
    # GET as safetensors: (in, out) arrays bit for bit, heads in the metadata.
    status, body, headers = srv.json_request("GET", "/v1/weight-sets/g.1?format=safetensors")
    tensors, meta = parse_safetensors(body) if status == 200 else ({}, {})
    w = gpt2["transformer.h.1.attn.c_attn.weight"].numpy()
    same = status == 200 and meta.get("heads") == "2" and \
        np.array_equal(tensors.get("wk"), w[:, e:2 * e]) and \
        sorted(tensors) == sorted(["wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"]) and \
        headers.get("Content-Type") == "application/octet-stream" and "ETag" in headers
    check("GET format=safetensors answers the set", same, (status, meta, headers))
    # What GET answers can be PUT back with preset=names.
    status, answer = srv.put_file("g1copy", "preset=names&layout=in_out&wq=wq&wk=wk&wv=wv&bq=bq"
                                  "&bk=bk&bv=bv&wo=wo&bo=bo&heads=2", body)
    same = status == 201 and np.array_equal(srv.attention("g1copy", x, heads)[0],
                                            srv.attention("g.1", x, heads)[0])
    check("preset=names takes back a GET answer", same, answer)


def check_large_tensors_read_once(srv):
    """Tensors of many pages, whose body pages the server gives back as it reads them
    (checkpoint.c, mem_release): every stored number must still be the file's, where one
    part reads a tensor alone (torch_mha's in_proj rows, float32), where parts share its
    rows (gpt2's c_attn split along its columns) and where one tensor is named for two
    parts (preset=names)."""
    e = 192
    rng = np.random.default_rng(5)
    mha = {"in_proj_weight": torch.from_numpy(rng.uniform(-1, 1, (3 * e, e)).astype(np.float32)),
           "out_proj.weight": torch.from_numpy(rng.uniform(-1, 1, (e, e)).astype(np.float32))}
    gpt2 = gpt2_file(1, e)
    shared = {"w": torch.from_numpy(rng.uniform(-1, 1, (e, e)))}
    cases = [("big.mha", "preset=torch_mha&heads=4", mha,
              lambda t: {"wq": t["in_proj_weight"][:e].T, "wk": t["in_proj_weight"][e:2 * e].T,
                         "wv": t["in_proj_weight"][2 * e:].T, "wo": t["out_proj.weight"].T}),
             ("big.gpt2", "preset=gpt2&heads=4", gpt2,
              lambda t: {"wq": t["transformer.h.0.attn.c_attn.weight"][:, :e],
                         "wv": t["transformer.h.0.attn.c_attn.weight"][:, 2 * e:],
                         "wo": t["transformer.h.0.attn.c_proj.weight"]}),
             ("big.shared", "preset=names&wq=w&wk=w&wv=w", shared,
              lambda t: {"wq": t["w"].T, "wk": t["w"].T, "wv": t["w"].T})]
    for name, query, tensors, want in cases:
        status, answer = srv.put_file(name, query, safetensors_bytes(tensors))
        got = {}
        if status == 201:
            status, body, _ = srv.json_request("GET", "/v1/weight-sets/%s?format=safetensors" % name)
            got = parse_safetensors(body)[0] if status == 200 else {}
        expected = {k: v.to(torch.float64).numpy() for k, v in want(tensors).items()}
        same = all(k in got and np.array_equal(got[k], v) for k, v in expected.items())
        check(name + ": every stored number is the file's", same, answer)


def check_half_precision(srv):
    """F16 and BF16 widen exactly: the stored numbers equal torch's .double()."""
    for dtype, tag in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        torch.manual_seed(5)
        mha = torch.nn.MultiheadAttention(4, 2, dtype=torch.float64)
        sd = {k: (v + 0.1).to(dtype) for k, v in mha.state_dict().items()}
        status, answer = srv.put_file(tag, "preset=torch_mha", safetensors_bytes(sd))
        if status != 201:
            check(tag + " stored", False, answer)
            continue
        _, body, _ = srv.json_request("GET", "/v1/weight-sets/%s?format=safetensors" % tag)
        tensors, _ = parse_safetensors(body)
        want = sd["in_proj_weight"].double().numpy()[4:8].T
        check(tag + " widens exactly", tensors["wk"].dtype == np.float32 and
              np.array_equal(tensors["wk"], want))


def rel_diff(got, ref):
    return max_diff(got, ref) / max(float(np.max(np.abs(ref))), 1e-300)


def check_float32_sets(srv):
    """A torch_mha file of F32, F16 or BF16 tensors is a float32 set: its description says
    so, its numbers are the file's exactly (JSON and safetensors GET alike, the latter F32
    tensors bit for bit), and attention by name matches a NumPy reference of the same
    float32 weights: within 1e-12 relative for a float64 request, 1e-5 for a float32 one.
    F32 matrices with an F64 bias make a float64 set."""
    e, heads = 8, 2
    rng = np.random.default_rng(17)
    x = rng.uniform(-1, 1, (5, e))
    for dtype, tag in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")):
        name = "fl." + tag
        sd = {"in_proj_weight": torch.from_numpy(rng.uniform(-1, 1, (3 * e, e))).to(dtype),
              "in_proj_bias": torch.from_numpy(rng.uniform(-1, 1, 3 * e)).to(dtype),
              "out_proj.weight": torch.from_numpy(rng.uniform(-1, 1, (e, e))).to(dtype),
              "out_proj.bias": torch.from_numpy(rng.uniform(-1, 1, e)).to(dtype)}
        if dtype == torch.float32:  # the awkward floats: subnormals, -0
            sd["in_proj_weight"][0, :3] = torch.tensor([1e-45, -1.5e-40, -0.0])
        status, answer = srv.put_file(name, "preset=torch_mha&heads=%d" % heads,
                                      safetensors_bytes(sd))
        if status != 201:
            check(name + " stored", False, answer)
            continue
        check(name + ": PUT answers dtype float32", answer.get("dtype") == "float32", answer)
        _, body, _ = srv.json_request("GET", "/v1/weight-sets")
        listed = [s for s in json.loads(body)["weight_sets"] if s["name"] == name]
        check(name + ": the listing says float32", listed and listed[0].get("dtype") == "float32",
              listed)
        # (in, out) matrices as the server holds them, from the file's numbers widened
        w = {k: v.to(torch.float64).numpy() for k, v in sd.items()}
        want = {"wq": w["in_proj_weight"][:e].T, "wk": w["in_proj_weight"][e:2 * e].T,
                "wv": w["in_proj_weight"][2 * e:].T, "wo": w["out_proj.weight"].T,
                "bq": w["in_proj_bias"][:e], "bk": w["in_proj_bias"][e:2 * e],
                "bv": w["in_proj_bias"][2 * e:], "bo": w["out_proj.bias"]}
        status, body, _ = srv.json_request("GET", "/v1/weight-sets/" + name)
        got = json.loads(body)
        same = status == 200 and got.get("dtype") == "float32" and all(
            np.array_equal(np.array(got[k], dtype=np.float64), v) and
            np.array_equal(np.array(got[k], dtype=np.float32).astype(np.float64), v)
            for k, v in want.items())
        check(name + ": GET as JSON gives the file's numbers exactly", same, body[:300])
        status, body, _ = srv.json_request("GET", "/v1/weight-sets/%s?format=safetensors" % name)
        tensors = parse_safetensors(body)[0] if status == 200 else {}
        f32 = {k: v.astype(np.float32) for k, v in want.items()}
        same = sorted(tensors) == sorted(want) and all(
            tensors[k].dtype == np.float32 and tensors[k].tobytes() == f32[k].tobytes()
            for k in want)
        check(name + ": GET as safetensors gives F32 tensors bit for bit", same, status)
        ref_out, ref_att = reference(x, x, want["wq"], want["wk"], want["wv"], want["wo"],
                                     want["bq"], want["bk"], want["bv"], want["bo"], heads)
        out, att = srv.attention(name, x, heads)
        d = max(rel_diff(out, ref_out), rel_diff(att, ref_att))
        check(name + ": float64 attention equals NumPy within 1e-12", d <= 1e-12, d)
        out, att = srv.attention(name, x, heads, dtype="float32")
        d = max(rel_diff(out, ref_out), rel_diff(att, ref_att))
        check(name + ": float32 attention equals NumPy within 1e-5", d <= 1e-5, d)
    mixed = {"in_proj_weight": torch.from_numpy(rng.uniform(-1, 1, (3 * e, e))).float(),
             "in_proj_bias": torch.from_numpy(rng.uniform(-1, 1, 3 * e)),
             "out_proj.weight": torch.from_numpy(rng.uniform(-1, 1, (e, e))).float()}
    status, answer = srv.put_file("fl.mixed", "preset=torch_mha&heads=2",
                                  safetensors_bytes(mixed))
    check("F32 matrices with an F64 bias make a float64 set",
          status == 201 and answer.get("dtype") == "float64", answer)
    status, body, _ = srv.json_request("GET", "/v1/weight-sets/fl.mixed?format=safetensors")
    tensors = parse_safetensors(body)[0] if status == 200 else {}
    check("GET as safetensors of a float64 set gives F64 tensors",
          tensors and all(t.dtype == np.float64 for t in tensors.values()) and
          np.array_equal(tensors["wq"], mixed["in_proj_weight"][:e].double().numpy().T), status)


def check_layer_all_atomic(srv):
    """A layer=all upload where one layer lacks a tensor stores nothing."""
    t = gpt2_file(3, 4)
    del t["transformer.h.2.attn.c_proj.weight"]
    status, answer = srv.put_file("atomic", "preset=gpt2&layer=all", safetensors_bytes(t))
    stored = [n for n in ("atomic.0", "atomic.1", "atomic.2") if srv.exists(n)]
    check("layer=all with a missing tensor stores none", status == 400 and not stored and
          "transformer.h.2.attn.c_proj.weight" in answer["error"]["message"], (answer, stored))


def check_layer_all_rolls_back(srv):
    """When the store refuses a later layer (--max-store-bytes), the sets the
    earlier layers replaced are put back, with their generations, and those they
    created are gone."""
    old = {"wq": [[1.0]], "wk": [[1.0]], "wv": [[1.0]]}
    srv.json_request("PUT", "/v1/weight-sets/r.0", old)
    _, _, before = srv.json_request("GET", "/v1/weight-sets/r.0")
    status, answer = srv.put_file("r", "preset=gpt2&layer=all", safetensors_bytes(gpt2_file(3, 4)))
    _, body, after = srv.json_request("GET", "/v1/weight-sets/r.0")
    kept = json.loads(body).get("wq") == [[1.0]]
    check("layer=all refused by the store leaves the old sets", status == 413 and kept and
          not srv.exists("r.1") and not srv.exists("r.2"), (status, answer, body[:200]))
    # A client pinned to the generation it read must still be served: nothing changed.
    check("layer=all put back keeps the old generation",
          before.get("ETag") is not None and before.get("ETag") == after.get("ETag"),
          (before.get("ETag"), after.get("ETag")))


def bad_files():
    """(name, file bytes, query, code expected, text the message or field holds)."""
    good = safetensors_bytes(gpt2_file(2, 4))
    n = struct.unpack("<Q", good[:8])[0]

    def with_header(header_obj, data=b"\0" * 64):
        text = json.dumps(header_obj).encode()
        return struct.pack("<Q", len(text)) + text + data

    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    return [
        ("truncated", good[:len(good) - 5], "preset=gpt2&layer=0", "invalid_safetensors",
         "truncated"),
        ("tiny", good[:5], "preset=gpt2", "invalid_safetensors", "fewer than the 8"),
        ("header past body", struct.pack("<Q", 10 ** 9) + good[8:], "preset=gpt2",
         "invalid_safetensors", "past the end of the body"),
        ("not JSON", good[:8] + b"x" * n + good[8 + n:], "preset=gpt2", "invalid_safetensors",
         "not JSON"),
        ("not an object", with_header([1, 2]), "preset=gpt2", "invalid_safetensors",
         "not an object"),
        ("outside", with_header({"a": dict(entry, data_offsets=[56, 72])}), "preset=gpt2",
         "invalid_safetensors", "only 64 bytes"),
        ("overlap", with_header({"a": entry, "b": dict(entry, data_offsets=[8, 24])}),
         "preset=gpt2", "invalid_safetensors", "overlap"),
        ("size mismatch", with_header({"a": dict(entry, shape=[3, 2])}), "preset=gpt2",
         "invalid_safetensors", "make 24 bytes"),
        ("unknown dtype", with_header({"a": dict(entry, dtype="Q9")}), "preset=gpt2",
         "unsupported_dtype", "Q9"),
        ("missing tensor", safetensors_bytes({"in_proj_weight": torch.zeros(6, 2)}),
         "preset=torch_mha", "missing_tensor", "out_proj.weight"),
        ("ambiguous prefix", safetensors_bytes({**gpt2_file(1, 4), **{
            "other." + k[len("transformer."):]: v for k, v in gpt2_file(1, 4).items()}}),
         "preset=gpt2", "ambiguous_prefix", "\"other.\""),
        ("layer absent", good, "preset=gpt2&layer=9", "invalid_value", "layer"),
        ("layer missing", good, "preset=gpt2", "missing_field", "layer"),
        ("bad preset", good, "preset=llama", "invalid_value", "preset"),
        ("heads", good, "preset=gpt2&layer=0&heads=3", "shape_mismatch", "heads"),
    ]


def check_bad_files(srv):
    for name, data, query, code, text in bad_files():
        status, answer = srv.put_file("bad", query, data)
        err = (answer or {}).get("error", {})
        ok = status == 400 and err.get("code") == code and \
            (text in err.get("message", "") or text == err.get("field"))
        alive = srv.json_request("GET", "/healthz")[0] == 200
        check("bad file: " + name, ok and alive and not srv.exists("bad"), answer)


def main():
    args = harness.arguments(__doc__)
    torch.set_num_threads(1)
    named = harness.named
    checks = [named("check_torch_mha/mha", lambda srv: check_torch_mha(srv, "mha", 8, 2)),
              named("check_torch_mha/mha.nobias",
                    lambda srv: check_torch_mha(srv, "mha.nobias", 8, 4, bias=False)),
              named("check_torch_mha/mha.kdim",
                    lambda srv: check_torch_mha(srv, "mha.kdim", 8, 2, kdim=5)),
              named("check_torch_mha/mha.f32",
                    lambda srv: check_torch_mha(srv, "mha.f32", 6, 3, dtype=torch.float32)),
              check_bert_and_gpt2, check_large_tensors_read_once, check_half_precision,
              check_float32_sets, check_layer_all_atomic, check_bad_files]
    harness.run(args.server, checks, server_class=Server)
    # Each set of the roll-back check takes 744 bytes: the third does not fit.
    harness.run(args.server, [check_layer_all_rolls_back], "--max-store-bytes", "1800",
                server_class=Server)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
