#!/usr/bin/python3
"""Sequences: the key/value cache the server holds per sequence (Triton's sequence extension),
from outside, over every wire: v1 JSON (POST /v1/attention with "sequence"), v2 HTTP JSON, v2
HTTP binary tensors, gRPC ModelInfer and gRPC ModelStreamInfer (one stream carrying every step
of a sequence, as tritonclient's start_stream and async_stream_infer send it: sequence_id as
int64_param or string_param, sequence_start and sequence_end as bool_param).

- correct_*: random sequences (FP64 and FP32, no heads and 4 heads, causal by default,
  causal true given and causal false, a prompt of 7 rows, single steps, a step with m == t == 3 and one with
  m < t), every step against a NumPy float64 reference that recomputes the whole prefix from
  scratch: output, attention, every reduction (local at query position n - m + i),
  received_total (the running sum over every step's queries), length.
- more_queries_than_keys, weight_set, weight_set_wo, batch_one, no_sequence: m > n is 400
  invalid_shape; a sequence on a stored weight set (x projected once per step) and a step of
  it on another model refused; a decoder layer's set (2 heads, every bias, wo/bo) in float64
  and float32 over v1, v2 binary, gRPC and a stream, output through wo/bo, received_total; inputs of rank 3 with batch 1; sequence_id 0 and "" (what Triton's clients send when no
  sequence is asked) make an ordinary request; a step with no outputs listed answers output,
  attention, length.
- interleaved, mixed_wires: sequences stepped alternately stay apart (the number 7 and the
  string "7" are two sequences); one sequence stepped over every wire in turn.
- errors_*: each error of the contract with its status, code and field, and after each
  refused step the next step answers as if the refused one had never come; a start on a live
  id starts over; ids out of range or of the wrong type.
- limits_*: --max-sequences 3 (429 too_many_sequences, Retry-After, RESOURCE_EXHAUSTED) and
  --max-sequence-keys 16 (413 sequence_too_long), with their /metrics refusal counters.
- idle, keepalive, many, large: --sequence-idle-timeout (a sequence left alone is dropped and
  counted; one stepped more often than the timeout is kept); 1,000 small sequences opened and
  abandoned, the gauges back to 0 and the resident size back where it was; the cached bytes
  of a 20,000-key sequence returned at its sequence_end.
- metadata: GET /v2 and ServerMetadata list "sequence" and "sequence(string_id)".
- drain: SIGTERM with live sequences: their steps are answered, a start and a request
  outside a sequence are 503 shutting_down, and the process exits once they ended.

A step the server refuses is taken back from its reference, so that one refusal is one
failure and not the start of a run of them; each limits check has a server of its own for
the same reason.

Tolerances: float64 within 1e-9 relative, float32 within 1e-4, with absolute floors of 1e-12
and 1e-6 for values near 0.  The reductions suite holds one request to 1e-12 and 1e-5; a
step here is the same computation over the cache, but received_total is a sum of one rounded
contribution per step, and the server may sum the cache in another blocking than a request of
the whole prefix would: the bounds leave three orders of room in float64 and one in float32,
and are still far below what any real fault moves (a key seen or hidden wrongly changes a
weight by about 1/n, here 1e-1 to 1e-2).

Usage: sequence_test.py --server PATH [--filter SUBSTR] (only the check functions whose name
contains SUBSTR).  Prints "ok NAME" or "FAIL NAME" per check and "N passed, N failed" last.
"""
import json
import os
import queue
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "grpc"))
import harness  # noqa: E402
from harness import check, named  # noqa: E402
import grpc  # noqa: E402  (Debian's python3-grpcio)
import numpy as np  # noqa: E402  (Debian's python3-numpy)
from grpc_test import GrpcServer, infer_request, pb  # noqa: E402

TOL = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-6)}
DATATYPE = {"float64": "FP64", "float32": "FP32"}
NP_TYPES = {"FP64": np.float64, "FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_}
INT_OUTPUTS = ("argmax", "topk_indices", "length")
RED = {"entropy": True, "max": True, "received": True, "sink": 3, "local": 2, "topk": 4}
RED_OUTPUTS = {"entropy": ["entropy"], "max": ["max_weight", "argmax"], "received": ["received"],
               "sink": ["sink"], "local": ["local"], "topk": ["topk_indices", "topk_weights"]}
WIRES = ("v1", "v2json", "v2bin", "grpc", "stream")
CALL_TIMEOUT = 120          # seconds a gRPC call or stream may take before it counts as hung

_next_id = [1000]


def fresh_id():
    """A sequence id no other check of this run uses."""
    _next_id[0] += 1
    return _next_id[0]


def f32(a):
    """a rounded to float32 and back: a value both the client and the server hold exactly."""
    return np.asarray(a, np.float32).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# The reference: the whole prefix recomputed from scratch at every step.

class Reference:
    """What the server should answer for each step of one sequence, in float64.  heads is the
    start's (None: no heads axis in the answers), scale the start's (None: 1/sqrt(dk per
    head))."""

    def __init__(self, heads, dk, scale=None):
        self.heads, self.H = heads, heads or 1
        self.scale = scale if scale is not None else 1.0 / np.sqrt(dk / self.H)
        self.k = self.v = self.total = None

    def step(self, q, k, v, causal=True, red=None, total=False):
        """Appends k and v, returns {output name: expected array} of the step's answer (and
        "_w", the weights, for telling ties apart)."""
        red = RED if red is None else red
        before = (self.k, self.v, self.total)
        self.k = k if self.k is None else np.vstack([self.k, k])
        self.v = v if self.v is None else np.vstack([self.v, v])
        n, m, H = len(self.k), len(q), self.H
        qh = q.reshape(m, H, -1).transpose(1, 0, 2)
        kh = self.k.reshape(n, H, -1).transpose(1, 0, 2)
        vh = self.v.reshape(n, H, -1).transpose(1, 0, 2)
        s = np.einsum("hid,hjd->hij", qh, kh) * self.scale
        pos = n - m + np.arange(m)                   # query i sits at position n - m + i
        keys = np.arange(n)
        valid = keys[None, :] <= pos[:, None] if causal else np.ones((m, n), bool)
        s = np.where(valid[None], s, -np.inf)
        mx = s.max(-1, keepdims=True)
        dead = ~np.isfinite(mx)                      # a row that sees no key: all zeros
        e = np.where(dead, 0.0, np.exp(s - np.where(dead, 0.0, mx)))
        w = e / np.where(dead, 1.0, e.sum(-1, keepdims=True))
        out = np.einsum("hij,hjd->hid", w, vh).transpose(1, 0, 2).reshape(m, -1)
        received = w.sum(-2)
        prev = np.zeros((H, n))
        if self.total is not None:
            prev[:, :self.total.shape[1]] = self.total
        self.total = prev + received
        want = {"attention": w}
        if red.get("entropy"):
            want["entropy"] = -np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0).sum(-1)
        if red.get("max"):
            want["max_weight"] = w.max(-1)
            want["argmax"] = np.where(dead[..., 0], -1, np.argmax(s, -1))
        if red.get("received"):
            want["received"] = received
        if "sink" in red:
            want["sink"] = w[..., :red["sink"]].sum(-1)
        if "local" in red:
            near = np.abs(pos[:, None] - keys[None, :]) <= red["local"]
            want["local"] = np.where(near[None], w, 0.0).sum(-1)
        if "topk" in red:
            order = np.argsort(-s, axis=-1, kind="stable")[..., :red["topk"]]
            has = np.take_along_axis(np.isfinite(s), order, -1)
            want["topk_indices"] = np.where(has, order, -1)
            want["topk_weights"] = np.where(has, np.take_along_axis(w, order, -1), 0.0)
        if total:
            want["received_total"] = self.total.copy()
        want["_w"] = w
        if self.heads is None:                       # no heads axis
            want = {name: a[0] for name, a in want.items()}
        want["output"] = out
        want["length"] = np.array([n])
        want["_undo"] = (self, before)
        return want

    def length(self):
        """The keys cached so far (0 before the first step)."""
        return 0 if self.k is None else len(self.k)

    def undo(self, before):
        """Forgets the step that returned before: the server refused it, so that the next
        steps are compared with the cache the server holds, not with one failure's echo."""
        self.k, self.v, self.total = before


def mismatches(outs, want, dtype):
    """The outputs of want that outs lacks or gets wrong, as short sentences."""
    rel, floor = TOL[dtype]
    bad = []
    w = want["_w"]
    for name, val in want.items():
        if name in ("_w", "_undo"):
            continue
        if name not in outs:
            bad.append(name + " missing")
            continue
        got = np.asarray(outs[name])
        if got.shape != val.shape:
            bad.append("%s shape %s, want %s" % (name, list(got.shape), list(val.shape)))
            continue
        if name == "length":
            if int(got[0]) != int(val[0]):
                bad.append("length %d, want %d" % (int(got[0]), int(val[0])))
        elif name in ("argmax", "topk_indices"):
            g = got.astype(np.int64)
            gi = g[..., None] if name == "argmax" else g
            vi = val[..., None] if name == "argmax" else val
            wt = want["max_weight"][..., None] if name == "argmax" else want["topk_weights"]
            inside = (gi >= -1) & (gi < w.shape[-1])
            picked = np.where(gi >= 0, np.take_along_axis(w, np.clip(gi, 0, w.shape[-1] - 1),
                                                          -1), 0.0)
            # an index may differ from the reference's only on a tie within the tolerance
            tie = (gi >= 0) & (np.abs(picked - wt) <= rel * np.abs(wt) + floor)
            if not bool(np.all(inside & ((gi == vi) | tie))):
                bad.append("%s %s, want %s" % (name, g.ravel()[:8].tolist(),
                                               val.ravel()[:8].tolist()))
        else:
            g = got.astype(np.float64)
            err = np.abs(g - val) - (rel * np.abs(val) + floor)
            if not bool(np.all(err <= 0)):
                i = int(np.argmax(err))
                bad.append("%s off by %.3g at flat index %d (%r, want %r)" % (
                    name, float(np.abs(g - val).ravel()[i]), i, float(g.ravel()[i]),
                    float(val.ravel()[i])))
    return bad


# ---------------------------------------------------------------------------------------------
# One request, over any wire.  A request is a dict:
#   q, k, v        float64 arrays (rounded to float32 already for float32 requests)
#   dtype          "float64" or "float32"
#   heads, causal, scale   None: left out
#   red, total     the reductions asked (dict as RED) and received_total
#   sid, start, end        the sequence (sid None: no sequence parameters at all)
#   outputs        v2: the outputs listed (None: every one the request asks for; []: none)
#   mask, batch    a mask input (bool [m, n]); the inputs repeated as a batch of this size
#   extra          more v2 parameters or v1 members; seq_extra: more v1 "sequence" members

class Answer:
    """ok; status (HTTP status or grpc.StatusCode, "stream" for a stream's error_message);
    outs {name: array} and types {name: datatype} of a success; code, field (v1) and words
    (the error's message on every wire) of a refusal; headers (HTTP)."""

    def __init__(self, ok, status, outs=None, types=None, code=None, field=None, words="",
                 headers=None):
        self.ok, self.status, self.outs, self.types = ok, status, outs or {}, types or {}
        self.code, self.field, self.words, self.headers = code, field, words, headers

    def __repr__(self):
        if self.ok:
            return "200 %s" % sorted(self.outs)
        return "%s %s %s %r" % (self.status, self.code, self.field, self.words[:300])


def output_names(req):
    if req.get("outputs") is not None:
        return req["outputs"]
    names = ["output", "attention"]
    for key in req.get("red") or {}:
        names += RED_OUTPUTS[key]
    if req.get("total"):
        names.append("received_total")
    if req.get("sid") is not None:
        names.append("length")
    return names


def v2_parameters(req):
    params = dict(req.get("red") or {})
    for key in ("heads", "causal", "scale"):
        if req.get(key) is not None:
            params[key] = req[key]
    if req.get("total"):
        params["received_total"] = True
    if req.get("sid") is not None:
        # as tritonclient sends them: the id, and both flags, on every request of a sequence
        params["sequence_id"] = req["sid"]
        params["sequence_start"] = bool(req.get("start"))
        params["sequence_end"] = bool(req.get("end"))
    params.update(req.get("extra") or {})
    return params


def v2_tensors(req):
    """[(name, datatype, shape, little-endian bytes, flat list)] of the request's inputs."""
    dt = req.get("datatype") or DATATYPE[req.get("dtype", "float64")]
    arrays = [("q", dt, req["q"]), ("k", dt, req["k"]), ("v", dt, req["v"])]
    if req.get("mask") is not None:
        arrays.append(("mask", "BOOL", np.asarray(req["mask"], bool)))
    out = []
    for name, t, a in arrays:
        a = np.asarray(a)
        if req.get("batch"):
            a = np.stack([a] * req["batch"])
        typed = a.astype(NP_TYPES[t])
        out.append((name, t, list(a.shape), typed.tobytes(), typed.ravel().tolist()))
    return out


def decode_v2_http(body, headers):
    hl = int(headers.get("Inference-Header-Content-Length") or len(body))
    answer, at, outs, types = json.loads(body[:hl]), hl, {}, {}
    for o in answer.get("outputs", []):
        t = NP_TYPES.get(o["datatype"], np.float64)
        if "data" in o:
            a = np.array(o["data"], t).reshape(o["shape"])
        else:
            n = o["parameters"]["binary_data_size"]
            a = np.frombuffer(body[at:at + n], t).reshape(o["shape"])
            at += n
        outs[o["name"]], types[o["name"]] = a, o["datatype"]
    return outs, types


def send_v2_http(srv, req, binary, model="attention"):
    head = {"inputs": [], "parameters": v2_parameters(req)}
    blobs = []
    for name, t, shape, raw, flat in req.get("tensors") or v2_tensors(req):
        tensor = {"name": name, "datatype": t, "shape": shape}
        if binary:
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            tensor["data"] = flat
        head["inputs"].append(tensor)
    names = output_names(req)
    if names:
        head["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in names]
    text = json.dumps(head).encode()
    hdrs = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        hdrs["Inference-Header-Content-Length"] = str(len(text))
    status, body, headers = srv.request("POST", "/v2/models/%s/infer" % model,
                                        text + b"".join(blobs), hdrs)
    if status != 200:
        try:
            words = json.loads(body).get("error", "")
        except ValueError:
            words = body[:300].decode("utf-8", "replace")
        return Answer(False, status, words=str(words), headers=headers)
    outs, types = decode_v2_http(body, headers)
    return Answer(True, 200, outs, types, headers=headers)


def send_v1(srv, req, body=None):
    if body is None:
        nest = (lambda a: [np.asarray(a).tolist()] * req["batch"]) if req.get("batch") else \
            (lambda a: np.asarray(a).tolist())
        body = {"q": nest(req["q"]), "k": nest(req["k"]), "v": nest(req["v"]),
                "dtype": req.get("dtype", "float64")}
        for key in ("heads", "causal", "scale"):
            if req.get(key) is not None:
                body[key] = req[key]
        red = dict(req.get("red") or {})
        if req.get("total"):
            red["received_total"] = True
        if red:
            body["reductions"] = red
        if req.get("mask") is not None:
            body["mask"] = np.asarray(req["mask"], int).tolist()
        if req.get("outputs") is not None and "attention" not in req["outputs"]:
            body["return_attention"] = False
        if req.get("sid") is not None or req.get("seq_extra"):
            seq = {}
            if req.get("sid") is not None:
                seq["id"] = req["sid"]
            if req.get("start"):
                seq["start"] = True
            if req.get("end"):
                seq["end"] = True
            seq.update(req.get("seq_extra") or {})
            body["sequence"] = seq
        body.update(req.get("extra") or {})
    status, raw, headers = srv.request("POST", "/v1/attention", json.dumps(body).encode(),
                                       {"Content-Type": "application/json"})
    try:
        ans = json.loads(raw)
    except ValueError:
        return Answer(False, status, words=raw[:300].decode("utf-8", "replace"), headers=headers)
    if status != 200:
        err = ans.get("error", {}) if isinstance(ans, dict) else {}
        err = err if isinstance(err, dict) else {"message": str(err)}
        return Answer(False, status, code=err.get("code"), field=err.get("field"),
                      words=str(err.get("message", "")), headers=headers)
    outs = {"output": np.array(ans.get("output"), float)}
    if "attention" in ans:
        outs["attention"] = np.array(ans["attention"], float)
    for name, val in (ans.get("reductions") or {}).items():
        outs[name] = np.array(val, np.int64 if name in INT_OUTPUTS else float)
    seq = ans.get("sequence")
    if isinstance(seq, dict):
        if "length" in seq:
            outs["length"] = np.array([seq["length"]], np.int64)
        for name in ("kept_positions", "lost_mass", "output_error"):    # under a cache policy
            if name in seq:
                outs[name] = np.array(seq[name], np.int64 if name == "kept_positions" else float)
        outs["sequence.id"] = seq.get("id")
    return Answer(True, 200, outs, headers=headers)


def grpc_request(req, model="attention"):
    inputs = [(name, t, shape, raw) for name, t, shape, raw, _ in
              req.get("tensors") or v2_tensors(req)]
    return infer_request(model, inputs, output_names(req), v2_parameters(req))


def decode_grpc(answer):
    outs, types = {}, {}
    raws = list(answer.raw_output_contents)
    for i, o in enumerate(answer.outputs):
        t = NP_TYPES.get(o.datatype, np.float64)
        if i < len(raws):
            a = np.frombuffer(raws[i], t)
        elif o.datatype == "INT64":
            a = np.array(o.contents.int64_contents, t)
        elif o.datatype == "FP32":
            a = np.array(o.contents.fp32_contents, t)
        else:
            a = np.array(o.contents.fp64_contents, t)
        outs[o.name], types[o.name] = a.reshape(list(o.shape)), o.datatype
    return outs, types


def send_grpc(srv, req, model="attention"):
    try:
        answer = srv.stub().ModelInfer(grpc_request(req, model), timeout=CALL_TIMEOUT)
    except grpc.RpcError as e:
        return Answer(False, e.code(), words=e.details() or "",
                      headers=dict((e.trailing_metadata() or ()) + (e.initial_metadata() or ())))
    outs, types = decode_grpc(answer)
    return Answer(True, 200, outs, types)


class Stream:
    """One ModelStreamInfer call that carries request after request, each answered before
    the next is sent (tritonclient's start_stream, async_stream_infer, stop_stream)."""

    def __init__(self, srv):
        self.requests = queue.Queue()
        self.answers = srv.stub().ModelStreamInfer(iter(self.requests.get, None),
                                                   timeout=CALL_TIMEOUT)

    def send(self, req, model="attention"):
        self.requests.put(grpc_request(req, model))
        try:
            r = next(self.answers)
        except (grpc.RpcError, StopIteration) as e:
            code = e.code() if isinstance(e, grpc.RpcError) else "ended"
            return Answer(False, code, words=str(e.details() if isinstance(e, grpc.RpcError)
                                                 else "the stream ended"))
        if r.error_message:
            return Answer(False, "stream", words=r.error_message)
        outs, types = decode_grpc(r.infer_response)
        return Answer(True, 200, outs, types)

    def close(self):
        self.requests.put(None)
        try:
            for _ in self.answers:
                pass
        except grpc.RpcError:
            pass


def send(wire, srv, req, stream=None):
    if wire == "v1":
        return send_v1(srv, req)
    if wire in ("v2json", "v2bin"):
        return send_v2_http(srv, req, wire == "v2bin")
    if wire == "grpc":
        return send_grpc(srv, req)
    return stream.send(req)


def check_step(name, ans, want, req):
    """Counts one check: a step answered 200 with want's numbers (and, on v2, the datatypes of
    the contract: INT64 for indices and length, the inputs' for the rest).  A step refused is
    taken back from its reference (want's "_undo")."""
    if not ans.ok:
        if "_undo" in want:
            ref, before = want["_undo"]
            ref.undo(before)
        check(name, False, ans)
        return False
    bad = mismatches(ans.outs, want, req.get("dtype", "float64"))
    if ans.types:
        dt = DATATYPE[req.get("dtype", "float64")]
        for n, t in ans.types.items():
            if t != ("INT64" if n in INT_OUTPUTS else dt):
                bad.append("%s datatype %s" % (n, t))
    check(name, not bad, "; ".join(bad))
    return not bad


def expect_error(name, wire, ans, status, code, fields, grpc_code, words=()):
    """Counts one check: a refusal with the contract's HTTP status and code (v1) and one of
    fields (v1: the error's field; v2 and gRPC: in the words), gRPC's status code, and each
    of words in the message."""
    fields = (fields,) if isinstance(fields, str) else fields
    if ans.ok:
        check(name, False, "answered 200 %s" % sorted(ans.outs))
        return
    if wire == "v1":
        ok = ans.status == status and ans.code == code and (not fields or ans.field in fields)
    elif wire in ("v2json", "v2bin"):
        ok = ans.status == status and (not fields or any(f in ans.words for f in fields))
    else:
        ok = (ans.status == grpc_code or (wire == "stream" and ans.status == "stream")) and \
            (not fields or any(f in ans.words for f in fields))
    ok = ok and all(str(w) in ans.words for w in words)
    check(name, ok, "%r; want %s %s at %s %s" % (ans, status, code, "|".join(fields),
                                                 grpc_code.name))


# ---------------------------------------------------------------------------------------------
# /metrics and the process

def metrics(srv):
    """{"name{labels}": value} of GET /metrics ({} when it does not answer)."""
    status, body, _ = srv.request("GET", "/metrics")
    out = {}
    if status != 200:
        return out
    for line in body.decode("utf-8", "replace").splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out


LIVE = "attn_sequences_live"
CACHED = "attn_sequence_cached_bytes"
STEPS = "attn_sequence_steps_total"
DROPPED_IDLE = 'attn_sequences_dropped_total{reason="idle_timeout"}'
REFUSED = 'attn_sequence_refusals_total{limit="%s"}'


def poll_metrics(srv, done, limit_s):
    """Reads /metrics every 0.1 s until done(metrics) or limit_s seconds; the last reading."""
    end = time.monotonic() + limit_s
    while True:
        m = metrics(srv)
        if done(m) or time.monotonic() > end:
            return m
        time.sleep(0.1)


def rss_kib(srv):
    with open("/proc/%d/status" % srv.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


# ---------------------------------------------------------------------------------------------
# Correctness

# (m, t) of each step: a prompt of 7 rows, single steps, m == t == 3, m < t; the last ends.
PLAN = [(7, 7), (1, 1), (1, 1), (3, 3), (2, 3), (1, 1)]
CASES = [(dtype, heads, causal) for dtype in ("float64", "float32") for heads in (None, 4)
         for causal in (None, True, False)]


def dims(heads):
    return (16, 8) if heads else (8, 5)


def random_step(rng, m, t, dk, dv, dtype):
    q, k, v = rng.standard_normal((m, dk)), rng.standard_normal((t, dk)), \
        rng.standard_normal((t, dv))
    if dtype == "float32":
        q, k, v = f32(q), f32(k), f32(v)
    return q, k, v


def run_sequence(wire, srv, tag, sid, dtype, heads, causal, plan, rng, stream=None,
                 scale=None):
    """Steps one sequence through plan over wire, each step checked; returns the reference."""
    dk, dv = dims(heads)
    ref = Reference(heads, dk, scale)
    for i, (m, t) in enumerate(plan):
        q, k, v = random_step(rng, m, t, dk, dv, dtype)
        req = {"q": q, "k": k, "v": v, "dtype": dtype, "heads": heads, "causal": causal,
               "scale": scale, "red": RED, "total": True, "sid": sid, "start": i == 0,
               "end": i == len(plan) - 1}
        want = ref.step(q, k, v, causal is not False, RED, True)
        ans = send(wire, srv, req, stream)
        check_step("%s/step %d (m=%d t=%d)" % (tag, i, m, t), ans, want, req)
        if wire == "v1" and ans.ok:
            check("%s/step %d: v1's sequence.id is the id sent" % (tag, i),
                  ans.outs.get("sequence.id") == sid and type(ans.outs.get("sequence.id")) is
                  type(sid), ans.outs.get("sequence.id"))
    return ref


def check_correct(srv, wire):
    rng = np.random.default_rng(51 + WIRES.index(wire))
    stream = Stream(srv) if wire == "stream" else None
    try:
        for dtype, heads, causal in CASES:
            sid = fresh_id()
            if wire == "stream" and causal is False:
                sid = "stream-%d" % sid          # string_param on the stream
            tag = "correct/%s/%s/%s/%s" % (wire, dtype, "h4" if heads else "no heads",
                                           "causal (default)" if causal is None else
                                           "causal true" if causal else "causal false")
            run_sequence(wire, srv, tag, sid, dtype, heads, causal, PLAN, rng, stream)
    finally:
        if stream:
            stream.close()


def check_more_queries_than_keys(srv):
    """More queries than keys (m > n: a start of 4 query rows over 2 keys) is 400
    invalid_shape at q's shape (docs/contract.md; the first draft of the contract answered
    such rows with zeros), and leaves no sequence."""
    rng = np.random.default_rng(9)
    for wire in ("v1", "v2json", "grpc"):
        q, k, v = random_step(rng, 4, 2, 8, 5, "float64")
        sid = fresh_id()
        expect_error("more queries than keys/%s: 400 invalid_shape at q's shape" % wire, wire,
                     send(wire, srv, {"q": q, "k": k, "v": v, "sid": sid, "start": True}), 400,
                     "invalid_shape", "q" if wire == "v1" else "inputs[0].shape",
                     grpc.StatusCode.INVALID_ARGUMENT)
        expect_error("more queries than keys/%s: the refused start left no sequence" % wire,
                     wire, send(wire, srv, {"q": q[:1], "k": k[:1], "v": v[:1], "sid": sid}), 400,
                     "sequence_unknown", "sequence.id" if wire == "v1" else
                     "parameters.sequence_id", grpc.StatusCode.INVALID_ARGUMENT, words=(sid,))


WEIGHTS = {"wq": [[0.5, -1.0, 0.25, 1.0], [1.0, 0.5, -0.5, 0.0], [0.0, 1.5, 1.0, -1.0]],
           "wk": [[1.0, 0.0, 0.5, -0.5], [-0.5, 1.0, 0.0, 1.0], [0.25, 0.5, 1.0, 0.0]],
           "wv": [[1.0, 2.0], [0.0, -1.0], [0.5, 0.5]],
           "bq": [0.1, -0.2, 0.0, 0.3]}


def check_weight_set(srv):
    """A sequence on a stored weight set (input x; v1 x with "weights": NAME): each step's
    tokens projected once (q = x Wq + bq, k = x Wk, v = x Wv), t = m, against the reference
    of the projected q, k and v; a step of it on another model (the built-in attention, v1
    q, k and v) is 400 conflicting_fields at the id and leaves it as it was."""
    status, body, _ = srv.request("PUT", "/v1/weight-sets/seqset", json.dumps(WEIGHTS).encode(),
                                  {"Content-Type": "application/json"})
    check("weight set/stored", status in (200, 201), (status, body[:200]))
    wq, wk, wv = (np.array(WEIGHTS[n]) for n in ("wq", "wk", "wv"))
    bq = np.array(WEIGHTS["bq"])
    rng = np.random.default_rng(12)
    for wire in ("v1", "v2json", "v2bin", "grpc"):
        sid = fresh_id()
        ref = Reference(None, 4)
        for i, m in enumerate((3, 1, 1, 2)):
            x = rng.standard_normal((m, 3))
            want = ref.step(x @ wq + bq, x @ wk, x @ wv, True, {}, False)
            want = {"output": want["output"], "attention": want["attention"],
                    "length": want["length"], "_w": want["_w"], "_undo": want["_undo"]}
            if wire == "v1":
                seq = {"id": sid}
                if i == 0:
                    seq["start"] = True
                if i == 3:
                    seq["end"] = True
                ans = send_v1(srv, None, body={"x": x.tolist(), "weights": "seqset",
                                               "sequence": seq})
            else:
                req = {"tensors": [("x", "FP64", [m, 3], x.tobytes(), x.ravel().tolist())],
                       "outputs": ["output", "attention", "length"], "sid": sid,
                       "start": i == 0, "end": i == 3}
                ans = send_v2_http(srv, req, wire == "v2bin", "seqset") if wire != "grpc" \
                    else send_grpc(srv, req, "seqset")
            check_step("weight set/%s/step %d (m=%d)" % (wire, i, m), ans, want, {})
            if i == 0:
                started = ans.ok
            if i == 1 and not started:
                # v2's words carry no code: against a sequence that does not exist the
                # refusal would be sequence_unknown at the same field, a pass for nothing
                check("weight set/%s/a step on the model attention: 400 conflicting_fields at "
                      "the id" % wire, False, "the sequence on the set did not start")
            elif i == 1:
                q, k, v = random_step(rng, 1, 1, 4, 2, "float64")
                expect_error("weight set/%s/a step on the model attention: 400 "
                             "conflicting_fields at the id" % wire, wire,
                             send(wire, srv, {"q": q, "k": k, "v": v, "sid": sid}), 400,
                             "conflicting_fields", "sequence.id" if wire == "v1" else
                             "parameters.sequence_id", grpc.StatusCode.INVALID_ARGUMENT)


WEIGHTS_WO = {"wq": np.linspace(-1, 1, 5 * 4).reshape(5, 4).tolist(),
              "wk": np.linspace(1, -0.5, 5 * 4).reshape(5, 4).tolist(),
              "wv": np.cos(np.arange(5 * 6)).reshape(5, 6).tolist(),
              "wo": np.sin(np.arange(6 * 3)).reshape(6, 3).tolist(),
              "bq": [0.1, -0.2, 0.0, 0.3], "bk": [0.2, 0.1, -0.1, 0.0],
              "bv": [0.5, -0.5, 0.25, 0.0, 1.0, -1.0], "bo": [1.0, -2.0, 0.5], "heads": 2}


def check_weight_set_wo(srv):
    """A decoder layer's attention with its cache: a stored set with 2 heads, every bias and
    wo/bo, in float64 and float32 (FP32 x), on v1, v2 binary, gRPC and one stream: each
    step's output is concat(heads) . Wo + bo of the reference over the projected prefix,
    its attention per head, its received_total per head."""
    body = {k: v for k, v in WEIGHTS_WO.items()}
    status, text, _ = srv.request("PUT", "/v1/weight-sets/seqwo", json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    check("weight set wo/stored", status in (200, 201), (status, text[:200]))
    w = {n: np.array(v) for n, v in WEIGHTS_WO.items() if n != "heads"}
    rng = np.random.default_rng(14)
    for dtype in ("float64", "float32"):
        stream = Stream(srv)
        try:
            for wire in ("v1", "v2bin", "grpc", "stream"):
                sid = fresh_id()
                ref = Reference(2, 4)
                for i, m in enumerate((4, 1, 2, 1)):
                    x = rng.standard_normal((m, 5))
                    xr = x.astype(np.float32).astype(np.float64) if dtype == "float32" else x
                    want = ref.step(xr @ w["wq"] + w["bq"], xr @ w["wk"] + w["bk"],
                                    xr @ w["wv"] + w["bv"], True, {}, True)
                    want = {"output": want["output"] @ w["wo"] + w["bo"],
                            "attention": want["attention"], "length": want["length"],
                            "received_total": want["received_total"], "_w": want["_w"],
                            "_undo": want["_undo"]}
                    if wire == "v1":
                        seq = {"id": sid, "start": i == 0, "end": i == 3}
                        ans = send_v1(srv, None, body={
                            "x": x.tolist(), "weights": "seqwo", "sequence": seq, "dtype": dtype,
                            "reductions": {"received_total": True}})
                    else:
                        dt = "FP64" if dtype == "float64" else "FP32"
                        typed = x.astype(np.float64 if dtype == "float64" else np.float32)
                        req = {"tensors": [("x", dt, [m, 5], typed.tobytes(),
                                            typed.ravel().tolist())],
                               "outputs": ["output", "attention", "length", "received_total"],
                               "total": True, "sid": sid, "start": i == 0, "end": i == 3}
                        ans = send_v2_http(srv, req, True, "seqwo") if wire == "v2bin" else \
                            send_grpc(srv, req, "seqwo") if wire == "grpc" else \
                            stream.send(req, "seqwo")
                    check_step("weight set wo/%s/%s/step %d (m=%d)" % (wire, dtype, i, m), ans,
                               want, {"dtype": dtype})
        finally:
            stream.close()


def check_interleaved(srv):
    """Two sequences stepped alternately, the number 7 and the string "7", stay apart; on the
    stream both go through one call."""
    for wire in WIRES:
        rng = np.random.default_rng(77)
        stream = Stream(srv) if wire == "stream" else None
        refs = {7: Reference(1, 8), "7": Reference(1, 8)}
        try:
            for i, (m, t) in enumerate(PLAN):
                for sid in (7, "7"):
                    q, k, v = random_step(rng, m, t, 8, 4, "float64")
                    req = {"q": q, "k": k, "v": v, "heads": 1, "red": RED, "total": True,
                           "sid": sid, "start": i == 0, "end": i == len(PLAN) - 1}
                    want = refs[sid].step(q, k, v, True, RED, True)
                    check_step("interleaved/%s/id %r step %d" % (wire, sid, i),
                               send(wire, srv, req, stream), want, req)
        finally:
            if stream:
                stream.close()


def check_mixed_wires(srv):
    """One sequence stepped over each wire in turn (the cache is the server's, not a
    connection's); heads and scale given at the start only, then left out (the start's are
    used, the heads axis stays)."""
    rng = np.random.default_rng(5)
    sid = fresh_id()
    ref = Reference(2, 8, 0.3)
    stream = Stream(srv)
    try:
        for i, wire in enumerate(("v2json", "v2bin", "grpc", "stream", "v1", "v2json")):
            m, t = (5, 5) if i == 0 else (1, 2)
            q, k, v = random_step(rng, m, t, 8, 6, "float64")
            req = {"q": q, "k": k, "v": v, "red": RED, "total": True, "sid": sid,
                   "start": i == 0, "end": i == 5, "causal": True if i == 2 else None}
            if i == 0:
                req.update(heads=2, scale=0.3)
            want = ref.step(q, k, v, True, RED, True)
            check_step("mixed wires/step %d over %s" % (i, wire), send(wire, srv, req, stream),
                       want, req)
    finally:
        stream.close()


def check_batch_one(srv):
    """Inputs of rank 3 with batch 1 are a step like any other (the numbers compared with the
    batch axis, if the answer has one, taken away)."""
    rng = np.random.default_rng(3)
    for wire in ("v1", "v2bin", "grpc"):
        ref = Reference(None, 8)
        sid = fresh_id()
        for i, (m, t) in enumerate([(3, 3), (1, 1)]):
            q, k, v = random_step(rng, m, t, 8, 5, "float64")
            req = {"q": q, "k": k, "v": v, "sid": sid, "start": i == 0, "end": i == 1,
                   "batch": 1, "outputs": ["output", "length"]}
            want = ref.step(q, k, v, True, {}, False)
            ans = send(wire, srv, req)
            if ans.ok:
                ans.outs = {n: (a[0] if n == "output" and np.ndim(a) == 3 else a)
                            for n, a in ans.outs.items()}
            check_step("batch 1/%s/step %d" % (wire, i), ans,
                       {"output": want["output"], "length": want["length"],
                        "_w": want["_w"]}, req)


def check_no_sequence(srv):
    """sequence_id 0 (and "") with both flags false is what Triton's clients send when no
    sequence is asked: an ordinary request (no length, causal false by default)."""
    rng = np.random.default_rng(4)
    q, k, v = random_step(rng, 3, 4, 8, 5, "float64")
    want = Reference(None, 8).step(q, k, v, False, {}, False)
    want = {"output": want["output"], "_w": want["_w"]}
    for wire in ("v2json", "v2bin", "grpc"):
        for sid in (0, ""):
            req = {"q": q, "k": k, "v": v, "sid": sid, "outputs": ["output"]}
            ans = send(wire, srv, req)
            check_step("no sequence/%s/sequence_id %r: an ordinary request" % (wire, sid),
                       ans, want, req)
            ans = send(wire, srv, dict(req, outputs=[]))
            check("no sequence/%s/sequence_id %r, no outputs listed: no length output"
                  % (wire, sid), ans.ok and "length" not in ans.outs, ans)
        # in a sequence, with no outputs listed: output, attention (the default), then length
        q2, k2, v2 = random_step(rng, 2, 2, 8, 5, "float64")
        ans = send(wire, srv, {"q": q2, "k": k2, "v": v2, "sid": fresh_id(), "start": True,
                               "end": True, "outputs": []})
        check("no outputs listed/%s: a sequence step answers output, attention, length" % wire,
              ans.ok and list(ans.outs) == ["output", "attention", "length"], ans)


# ---------------------------------------------------------------------------------------------
# Errors

def start_tracked(wire, srv, rng, sid):
    """Starts a sequence (dk 8, dv 6, heads 2, FP64, scale 0.4, 5 keys) and returns its
    reference; the start is checked."""
    ref = Reference(2, 8, 0.4)
    q, k, v = random_step(rng, 5, 5, 8, 6, "float64")
    req = {"q": q, "k": k, "v": v, "heads": 2, "scale": 0.4, "red": RED, "sid": sid,
           "start": True}
    check_step("errors/%s/start id %r" % (wire, sid), send(wire, srv, req),
               ref.step(q, k, v, True, RED, False), req)
    return ref


def good_step(wire, srv, rng, ref, sid, tag, end=False, repeat=False, total=False):
    """One more step of a tracked sequence, checked against its reference (which has not
    seen the refused step before it).  received_total is asked only where total says (the
    reference keeps its sum whatever), so that these checks do not all hang on it."""
    q, k, v = random_step(rng, 1, 1, 8, 6, "float64")
    req = {"q": q, "k": k, "v": v, "red": RED, "total": total, "sid": sid, "end": end}
    if repeat:
        req.update(heads=2, scale=0.4)
    check_step("errors/%s/%s" % (wire, tag), send(wire, srv, req),
               ref.step(q, k, v, True, RED, total), req)


def input_field(wire, index, name, what):
    return name if wire == "v1" else "inputs[%d]%s" % (index, what)


def check_errors(srv, wire):
    rng = np.random.default_rng(151 + WIRES.index(wire))
    v1 = wire == "v1"
    inv = grpc.StatusCode.INVALID_ARGUMENT
    sid_field = "sequence.id" if v1 else "parameters.sequence_id"
    sid = fresh_id()
    ref = start_tracked(wire, srv, rng, sid)
    good_step(wire, srv, rng, ref, sid, "a step repeating heads and scale", repeat=True)
    # conflicting_fields: each fixed setting changed, then a good step as if it never came
    conflicts = [
        ("another dk", dict(q=rng.standard_normal((1, 10)), k=rng.standard_normal((1, 10))),
         input_field(wire, 1, "k", ".shape")),
        ("another dv", dict(v=rng.standard_normal((1, 4))), input_field(wire, 2, "v", ".shape")),
        ("another heads", dict(heads=1), "heads" if v1 else "parameters.heads"),
        ("another datatype", dict(dtype="float32"),
         "dtype" if v1 else input_field(wire, 0, "q", ".datatype")),
        ("another scale", dict(scale=0.5), "scale" if v1 else "parameters.scale"),
        # any mask is refused: one of this step's keys [m, t] (the shape outside a sequence),
        # and one of the whole cache [m, n]
        ("a mask [m, t]", "mask", "mask" if v1 else "inputs[3].shape"),
        ("a mask [m, n]", "mask", "mask" if v1 else "inputs[3].shape"),
    ]
    for what, change, fields in conflicts:
        if change == "mask":
            change = dict(mask=np.ones((1, 1 if "t]" in what else ref.length() + 1), bool))
        q, k, v = random_step(rng, 1, 1, 8, 6, "float64")
        # the refused request asks for nothing else, so that its refusal has one cause
        req = dict({"q": q, "k": k, "v": v, "sid": sid}, **change)
        if req.get("dtype") == "float32":
            req.update(q=f32(req["q"]), k=f32(req["k"]), v=f32(req["v"]))
        expect_error("errors/%s/%s: 400 conflicting_fields" % (wire, what), wire,
                     send(wire, srv, req), 400, "conflicting_fields", fields, inv)
        good_step(wire, srv, rng, ref, sid, "after %s: the next step as if it never came" % what)
    # invalid_shape: a batch of 2
    q, k, v = random_step(rng, 1, 1, 8, 6, "float64")
    req = {"q": q, "k": k, "v": v, "sid": sid, "batch": 2}
    expect_error("errors/%s/batch 2: 400 invalid_shape" % wire, wire, send(wire, srv, req), 400,
                 "invalid_shape", input_field(wire, 0, "q", ".shape"), inv)
    good_step(wire, srv, rng, ref, sid, "after batch 2: the next step as if it never came")
    good_step(wire, srv, rng, ref, sid, "received_total counts none of the refused steps",
              total=True)
    # sequence_end answers, then the id is unknown
    good_step(wire, srv, rng, ref, sid, "sequence_end: answered", end=True)
    q, k, v = random_step(rng, 1, 1, 8, 6, "float64")
    expect_error("errors/%s/after sequence_end: 400 sequence_unknown naming the id" % wire, wire,
                 send(wire, srv, {"q": q, "k": k, "v": v, "sid": sid}), 400, "sequence_unknown",
                 sid_field, inv, words=(sid,))
    never = fresh_id()
    ans = send(wire, srv, {"q": q, "k": k, "v": v, "sid": never})
    expect_error("errors/%s/never started: 400 sequence_unknown naming the id" % wire, wire,
                 ans, 400, "sequence_unknown", sid_field, inv, words=(never,))
    if wire == "grpc":
        twin = send("v2json", srv, {"q": q, "k": k, "v": v, "sid": never})
        check("errors/grpc/never started: the words of HTTP v2's answer", not ans.ok and
              not twin.ok and ans.words == twin.words, (ans, twin))
    expect_error("errors/%s/never started, string id: 400 sequence_unknown naming the id" % wire,
                 wire, send(wire, srv, {"q": q, "k": k, "v": v, "sid": "never-%d" % never}), 400,
                 "sequence_unknown", sid_field, inv, words=("never-%d" % never,))
    # missing_field: a flag without an id
    for flag in ("start", "end"):
        if v1:
            req = {"q": q, "k": k, "v": v, "seq_extra": {flag: True}}
        else:
            req = {"q": q, "k": k, "v": v, "extra": {"sequence_" + flag: True}}
        expect_error("errors/%s/sequence %s without an id: 400 missing_field" % (wire, flag), wire,
                     send(wire, srv, req), 400, "missing_field", sid_field, inv)
    if not v1:
        req = {"q": q, "k": k, "v": v, "extra": {"sequence_id": 0, "sequence_start": True}}
        expect_error("errors/%s/sequence_start with sequence_id 0: 400 missing_field" % wire, wire,
                     send(wire, srv, req), 400, "missing_field", sid_field, inv)
    # ids out of the contract's range
    for bad in (-1, "x" * 129):
        req = {"q": q, "k": k, "v": v, "sid": bad, "start": True, "end": True}
        expect_error("errors/%s/sequence id %s: 400 invalid_value" % (
            wire, "-1" if bad == -1 else "of 129 bytes"), wire, send(wire, srv, req), 400,
            "invalid_value", sid_field, inv)
    if wire != "grpc":          # gRPC's parameters are typed: no boolean id to send as JSON's
        req = {"q": q, "k": k, "v": v, "sid": True, "start": True}
        expect_error("errors/%s/sequence id true: 400 wrong_type" % wire, wire,
                     send(wire, srv, req), 400, "wrong_type", sid_field, inv)
    if v1:
        req = {"q": q, "k": k, "v": v, "sid": fresh_id(), "start": True,
               "seq_extra": {"bogus": 1}}
        ans = send(wire, srv, req)
        check("errors/v1/an unknown member of sequence: 400 unknown_field at sequence.bogus",
              ans.status == 400 and ans.code == "unknown_field" and
              ans.field == "sequence.bogus", ans)
    # a start on a live id starts over
    sid2 = fresh_id()
    ref2 = start_tracked(wire, srv, rng, sid2)
    good_step(wire, srv, rng, ref2, sid2, "a second step")
    ref2 = Reference(2, 8, 0.4)
    q, k, v = random_step(rng, 3, 3, 8, 6, "float64")
    red3 = dict(RED, topk=3)                 # top-k asks at most the keys there are
    req = {"q": q, "k": k, "v": v, "heads": 2, "scale": 0.4, "red": red3, "sid": sid2,
           "start": True}
    check_step("errors/%s/sequence_start on a live id starts over (length 3)" % wire,
               send(wire, srv, req), ref2.step(q, k, v, True, red3, False), req)
    good_step(wire, srv, rng, ref2, sid2, "after starting over: the next step", end=True)
# ---------------------------------------------------------------------------------------------
# Limits: a server with --max-sequences 3 --max-sequence-keys 16

def check_limits(srv, wire):
    rng = np.random.default_rng(251 + WIRES.index(wire))
    before = metrics(srv)
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    inv = grpc.StatusCode.INVALID_ARGUMENT
    sid_field = "sequence.id" if wire == "v1" else "parameters.sequence_id"
    a, b, c, d, e = (fresh_id() for _ in range(5))
    refs = {}

    def step(sid, t, start=False, end=False):
        """A request of one query and t keys, asking for nothing more (a refused one has one
        cause)."""
        q, k, v = random_step(rng, 1, t, 8, 4, "float64")
        return {"q": q, "k": k, "v": v, "sid": sid, "start": start, "end": end}

    def good(sid, t, tag, start=False, end=False):
        req = step(sid, t, start, end)
        if start:
            refs[sid] = Reference(None, 8)
        n = t + (0 if start else refs[sid].length())
        req.update(red=dict(RED, topk=min(4, n)))
        want = refs[sid].step(req["q"], req["k"], req["v"], True, req["red"], False)
        check_step("limits/%s/%s" % (wire, tag), send(wire, srv, req), want, req)

    for sid in (a, b, c):
        good(sid, 4, "start of sequence %d of 3" % (sid - a + 1), start=True)
    ans = send(wire, srv, step(d, 4, start=True))
    expect_error("limits/%s/a 4th start: 429 too_many_sequences" % wire, wire, ans, 429,
                 "too_many_sequences", sid_field, exhausted)
    check("limits/%s/the refusal has Retry-After: 1 (gRPC: retry-after metadata)" % wire,
          ans.headers is not None and str(ans.headers.get("Retry-After") or
                                          ans.headers.get("retry-after")) == "1",
          dict(ans.headers or {}))
    expect_error("limits/%s/the refused start left no sequence" % wire, wire,
                 send(wire, srv, step(d, 1)), 400, "sequence_unknown", sid_field, inv,
                 words=(d,))
    ans = send(wire, srv, step(b, 13))
    expect_error("limits/%s/4 + 13 keys past 16: 413 sequence_too_long" % wire, wire, ans, 413,
                 "sequence_too_long", (), exhausted)
    good(b, 12, "after the refused step, 4 + 12 keys: length 16, as if it never came", end=True)
    good(d, 2, "the slot b left is free again", start=True)
    good(c, 1, "c ends", end=True)
    ans = send(wire, srv, step(e, 17, start=True))
    expect_error("limits/%s/a start of 17 keys: 413 sequence_too_long" % wire, wire, ans, 413,
                 "sequence_too_long", (), exhausted)
    expect_error("limits/%s/the refused start left no sequence" % wire, wire,
                 send(wire, srv, step(e, 1)), 400, "sequence_unknown", sid_field, inv,
                 words=(e,))
    good(a, 1, "a ends", end=True)
    good(d, 1, "d ends", end=True)
    after = metrics(srv)
    for limit in ("max_sequences", "max_sequence_keys"):
        key = REFUSED % limit
        n = after.get(key, -1) - before.get(key, 0)
        want = 1 if limit == "max_sequences" else 2
        check("limits/%s/%s counts %d refusals" % (wire, key, want), n == want,
              (before.get(key), after.get(key)))
    check("limits/%s/%s is 0 when every sequence ended" % (wire, LIVE), after.get(LIVE) == 0,
          after.get(LIVE))


# ---------------------------------------------------------------------------------------------
# Idle timeout, and memory

def check_idle(srv):
    """--sequence-idle-timeout 1: sequences left alone (one per wire) are dropped, counted,
    and their next step is sequence_unknown; the gauges go back to 0."""
    rng = np.random.default_rng(61)
    inv = grpc.StatusCode.INVALID_ARGUMENT
    before = metrics(srv)
    ids = {wire: fresh_id() for wire in ("v1", "v2json", "grpc")}
    started = time.monotonic()
    for wire, sid in ids.items():
        q, k, v = random_step(rng, 2, 2, 8, 4, "float64")
        ans = send(wire, srv, {"q": q, "k": k, "v": v, "sid": sid, "start": True})
        check("idle/%s/start" % wire, ans.ok, ans)
    m = poll_metrics(srv, lambda m: m.get(DROPPED_IDLE, 0) - before.get(DROPPED_IDLE, 0) >= 3,
                     10)
    check("idle/%s counts the 3 left alone (within 10 s)" % DROPPED_IDLE,
          m.get(DROPPED_IDLE, -1) - before.get(DROPPED_IDLE, 0) == 3,
          (before.get(DROPPED_IDLE), m.get(DROPPED_IDLE)))
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))   # ~3 s alone in all
    for wire, sid in ids.items():
        q, k, v = random_step(rng, 1, 1, 8, 4, "float64")
        sid_field = "sequence.id" if wire == "v1" else "parameters.sequence_id"
        expect_error("idle/%s/after ~3 s alone: 400 sequence_unknown naming the id" % wire, wire,
                     send(wire, srv, {"q": q, "k": k, "v": v, "sid": sid}), 400,
                     "sequence_unknown", sid_field, inv, words=(sid,))
    m = metrics(srv)
    check("idle/%s and %s are 0" % (LIVE, CACHED), m.get(LIVE) == 0 and m.get(CACHED) == 0,
          (m.get(LIVE), m.get(CACHED)))


def check_keepalive(srv):
    """A sequence stepped every 0.25 s for 3 s on a server with --sequence-idle-timeout 2 is
    kept (the timeout counts from the last step, not from the start)."""
    rng = np.random.default_rng(62)
    sid = fresh_id()
    ref = Reference(None, 8)
    ok, first_bad = True, None
    for i in range(12):
        q, k, v = random_step(rng, 1, 1, 8, 4, "float64")
        req = {"q": q, "k": k, "v": v, "sid": sid, "start": i == 0, "end": i == 11,
               "outputs": ["output", "length"]}
        want = ref.step(q, k, v, True, {}, False)
        ans = send("v2json", srv, req)
        bad = mismatches(ans.outs, {"output": want["output"], "length": want["length"],
                                    "_w": want["_w"]}, "float64") if ans.ok else [repr(ans)]
        if bad and ok:
            ok, first_bad = False, (i, bad)
        time.sleep(0.25)
    check("keepalive/stepped every 0.25 s for 3 s: every step answered, length 12", ok,
          first_bad)


MANY = 1000
MANY_KEYS, MANY_D = 32, 32      # each sequence caches 32 keys and values of 32 FP64: 16 KiB


def open_many(srv, rng):
    """Starts MANY sequences over gRPC, 64 calls in flight at a time (the server's queue is
    not what is tested here); (seconds it took, the length each answered or its error)."""
    k = rng.standard_normal((MANY_KEYS, MANY_D))
    q = rng.standard_normal((1, MANY_D))
    t0 = time.monotonic()
    calls, answers = [], []

    def collect(c):
        try:
            answers.append(decode_grpc(c.result())[0].get("length"))
        except grpc.RpcError as e:
            answers.append(e.code())
    for _ in range(MANY):
        req = {"q": q, "k": k, "v": k, "sid": fresh_id(), "start": True, "outputs": ["length"]}
        calls.append(srv.stub().ModelInfer.future(grpc_request(req), timeout=CALL_TIMEOUT))
        if len(calls) >= 64:
            collect(calls.pop(0))
    for c in calls:
        collect(c)
    return time.monotonic() - t0, answers


def check_many(srv):
    """1,000 sequences opened (one start step each) and abandoned, twice, on a server with
    --sequence-idle-timeout 2: the gauges go to 1,000 and back to 0, the dropped counter
    counts them, and the resident size after the second round is within half a round's
    cached bytes of what it was after the first.

    Why after the first round and not at start-up: the allocator keeps freed pages for the
    process (glibc's arenas), so a first round raises the resident size whether or not
    anything leaks; a second round of the same sizes reuses them.  A server that kept each
    sequence's cache would grow by the round's whole cache (1,000 x 16 KiB of keys and values
    and more of its own books) in the second round: the margin, half of that, tells the two
    apart.  The timeout is 2 s rather than 1 so that 1,000 starts can all be in before the
    first expires; where they are not (a loaded machine), live + dropped = 1,000 still holds
    and is what is checked."""
    rng = np.random.default_rng(63)
    rss = []
    for rnd in (1, 2):
        before = metrics(srv)
        took, answers = open_many(srv, rng)
        started = sum(1 for a in answers if isinstance(a, np.ndarray) and a.tolist() == [MANY_KEYS])
        check("many/round %d: 1,000 starts answered length %d" % (rnd, MANY_KEYS),
              started == MANY, [a for a in answers if not isinstance(a, np.ndarray)][:3])
        m = metrics(srv)
        dropped = m.get(DROPPED_IDLE, 0) - before.get(DROPPED_IDLE, 0)
        check("many/round %d: %s + idle drops = 1,000 right after (%d + %d, opened in %.1f s)"
              % (rnd, LIVE, m.get(LIVE, -1), dropped, took),
              m.get(LIVE, -1) + dropped == MANY, (m.get(LIVE), dropped))
        if took < 1.5:
            check("many/round %d: %s reached 1,000" % (rnd, LIVE), m.get(LIVE) == MANY,
                  m.get(LIVE))
        check("many/round %d: %s counts 1,000 steps" % (rnd, STEPS),
              m.get(STEPS, -1) - before.get(STEPS, 0) == MANY, (before.get(STEPS), m.get(STEPS)))
        peak = m.get(CACHED, -1)
        if dropped == 0:
            check("many/round %d: %s holds at least the keys and values (%d bytes)"
                  % (rnd, CACHED, MANY * MANY_KEYS * MANY_D * 16),
                  peak >= MANY * MANY_KEYS * MANY_D * 16, peak)
        m = poll_metrics(srv, lambda m: m.get(LIVE) == 0 and m.get(CACHED) == 0, 30)
        check("many/round %d: %s and %s back to 0 (within 30 s)" % (rnd, LIVE, CACHED),
              m.get(LIVE) == 0 and m.get(CACHED) == 0, (m.get(LIVE), m.get(CACHED)))
        check("many/round %d: %s counts the 1,000" % (rnd, DROPPED_IDLE),
              m.get(DROPPED_IDLE, 0) - before.get(DROPPED_IDLE, 0) == MANY,
              (before.get(DROPPED_IDLE), m.get(DROPPED_IDLE)))
        rss.append(rss_kib(srv))
    if ASAN:
        print("SKIPPED: sequences/many/resident size: AddressSanitizer's shadow and quarantine "
              "swamp it (LeakSanitizer's report at the server's exit checks the leaks here)")
        return
    margin = MANY * MANY_KEYS * MANY_D * 16 // 2 // 1024
    check("many: resident size after round 2 within %d KiB of after round 1 (%d -> %d KiB)"
          % (margin, rss[0], rss[1]), rss[1] - rss[0] <= margin, rss)


def check_large(srv):
    """A 20,000-key sequence (d 64, FP64): its cache counted in the gauge while it lives,
    and returned at its sequence_end."""
    rng = np.random.default_rng(64)
    n, d = 20000, 64
    sid = fresh_id()
    ref = Reference(None, d)
    base = metrics(srv).get(CACHED, -1)
    check("large/%s is 0 before" % CACHED, base == 0, base)
    q, k, v = random_step(rng, 1, n, d, d, "float64")
    req = {"q": q, "k": k, "v": v, "sid": sid, "start": True, "outputs": ["output", "length"]}
    want = ref.step(q, k, v, True, {}, False)
    check_step("large/a start of 20,000 keys", send("v2bin", srv, req),
               {"output": want["output"], "length": want["length"], "_w": want["_w"]}, req)
    held = metrics(srv).get(CACHED, -1)
    check("large/%s holds at least the keys and values (%d bytes)" % (CACHED, n * 2 * d * 8),
          held >= n * 2 * d * 8, held)
    q, k, v = random_step(rng, 1, 1, d, d, "float64")
    req = {"q": q, "k": k, "v": v, "sid": sid, "end": True, "outputs": ["output", "length"]}
    want = ref.step(q, k, v, True, {}, False)
    check_step("large/sequence_end at 20,001 keys", send("grpc", srv, req),
               {"output": want["output"], "length": want["length"], "_w": want["_w"]}, req)
    m = poll_metrics(srv, lambda m: m.get(CACHED) == 0, 10)
    check("large/%s back to 0 after sequence_end (within 10 s)" % CACHED, m.get(CACHED) == 0,
          m.get(CACHED))


def check_drain(srv):
    """SIGTERM with live sequences (--shutdown-grace 60): their steps are still answered,
    right, on v1 and v2; a sequence_start and a request outside a sequence are 503
    shutting_down; the process exits 0 once the last sequence ended, long before the grace
    (it waits for them, not for the grace)."""
    rng = np.random.default_rng(71)
    unavailable = grpc.StatusCode.UNAVAILABLE
    live = {}
    for wire in ("v1", "v2json"):
        sid = fresh_id()
        live[wire] = (sid, start_tracked(wire, srv, rng, sid))
    srv.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and srv.request("GET", "/readyz")[0] != 503:
        time.sleep(0.05)
    check("drain/readyz 503 after SIGTERM", srv.request("GET", "/readyz")[0] == 503)
    for wire, (sid, ref) in live.items():
        good_step(wire, srv, rng, ref, sid, "drain: a live sequence's step answered")
    for wire in ("v1", "v2json"):
        q, k, v = random_step(rng, 1, 1, 8, 6, "float64")
        expect_error("drain/%s: a sequence_start is 503 shutting_down" % wire, wire,
                     send(wire, srv, {"q": q, "k": k, "v": v, "sid": fresh_id(),
                                      "start": True}), 503, "shutting_down", (), unavailable,
                     words=("shutting down",))
        expect_error("drain/%s: a request outside a sequence is 503 shutting_down" % wire, wire,
                     send(wire, srv, {"q": q, "k": k, "v": v}), 503, "shutting_down", (),
                     unavailable, words=("shutting down",))
    check("drain/the process waits for the live sequences", srv.proc.poll() is None)
    for wire, (sid, ref) in live.items():
        good_step(wire, srv, rng, ref, sid, "drain: the last step, with sequence_end", end=True)
    try:
        rc = srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    check("drain/exits 0 once the sequences ended, within 30 s of a 60 s grace", rc == 0, rc)


def check_metadata(srv):
    status, body, _ = srv.request("GET", "/v2")
    ext = json.loads(body).get("extensions", []) if status == 200 else []
    check("metadata/GET /v2 lists sequence and sequence(string_id)",
          {"sequence", "sequence(string_id)"} <= set(ext), ext)
    meta = srv.stub().ServerMetadata(pb.ServerMetadataRequest(), timeout=CALL_TIMEOUT)
    check("metadata/ServerMetadata lists them too",
          {"sequence", "sequence(string_id)"} <= set(meta.extensions), list(meta.extensions))


ASAN = False


def guarded(fn):
    """fn, with an exception counted as one failure and the suite going on to the next
    check function (harness.run would end its server's list there)."""
    def run(srv):
        try:
            fn(srv)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(fn.__name__ + " ended by an exception", False, repr(e))
    return named(fn.__name__, run)


def main():
    global ASAN
    args = harness.arguments(__doc__)
    with open(args.server, "rb") as f:
        # the ASan build links libasan's entry point; its name is in the binary's symbols
        ASAN = b"__asan_init" in f.read()
    per_wire = [named("check_correct_" + w, lambda srv, w=w: check_correct(srv, w))
                for w in WIRES]
    errors = [named("check_errors_" + w, lambda srv, w=w: check_errors(srv, w))
              for w in ("v1", "v2json", "v2bin", "grpc")]
    harness.run(args.server, [guarded(c) for c in [check_metadata] + per_wire +
                [check_more_queries_than_keys, check_weight_set, check_weight_set_wo,
                 check_interleaved, check_mixed_wires, check_batch_one,
                 check_no_sequence] + errors], server_class=GrpcServer)
    # a server per wire: a sequence one wire's failure leaves open must not fill another's
    # slots
    for w in ("v1", "v2json", "grpc"):
        harness.run(args.server, [guarded(named("check_limits_" + w,
                                                lambda srv, w=w: check_limits(srv, w)))],
                    "--max-sequences", "3", "--max-sequence-keys", "16", server_class=GrpcServer)
    harness.run(args.server, [guarded(check_idle)], "--sequence-idle-timeout", "1",
                server_class=GrpcServer)
    harness.run(args.server, [guarded(c) for c in (check_keepalive, check_many, check_large)],
                "--sequence-idle-timeout", "2", server_class=GrpcServer)
    harness.run(args.server, [guarded(check_drain)], "--shutdown-grace", "60",
                server_class=GrpcServer)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
