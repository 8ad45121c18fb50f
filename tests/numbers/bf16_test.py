#!/usr/bin/python3
"""compute_precision "bfloat16" from outside (docs/numbers.md, "bfloat16 products"): on a
server started with each --kernel path this CPU runs (avx512_bf16's vdpbf16ps where the CPU
has it, and the widening of avx512, avx2 and portable), over v1 JSON, v2 binary tensors and
gRPC, every output number and attention weight within the documented bound of a float64
reference computed here from the numbers the client sent, for: random inputs with odd and
even head dims, heads, a batch of 2, causal, a mask with fully masked rows (zeros, never
NaN), large logits, and one row of 32,768 keys.  Each answer is also checked to differ from
the float32 answer of the same request somewhere (the rounding happened), to say which
precision and path ran (v1 meta, v2 and gRPC parameters: compute_precision, kernel), and to
carry reductions that are float32's (entropy, max weight and top-k equal to the float32
request's).  The row of 32,768 keys goes over v2 binary and gRPC only (as JSON it is past
v1's body limit).  Bad values of compute_precision: 400 naming it on v1 and v2, INVALID_ARGUMENT
on gRPC.  compute_precision float64 on FP32 inputs computes and answers in float64.

The bound, per output row i of a head of width d: with u = 2^-9,
D_i = (2u + u^2 + d 2^-24) scale max_j sum_t |q_it k_jt| and
|o - o64| <= (e^(2 D_i) - 1 + 2u + 1e-5) max_j |v_j|; a weight moves by at most a factor
e^(+-2 D_i) plus its own rounding, |w - w64| <= (e^(2 D_i) - 1) w64 + 2u w64 + 1e-6.  That
bound holds whatever the roundings do, so it is loose (the errors seen are a tenth of it or
less); the output's RMS error is also held to u/2 max|v|, which a rounding coarser than
bfloat16's does not pass.

Usage: bf16_test.py --server PATH [--filter SUBSTR].
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "grpc"))
sys.path.insert(0, os.path.join(HERE, "..", "reductions"))
import harness  # noqa: E402
from harness import check, named  # noqa: E402
import grpc  # noqa: E402  (Debian's python3-grpcio)
from grpc_test import GrpcServer, infer_request  # noqa: E402
from reductions_test import kernel_paths  # noqa: E402

U = 2.0 ** -9


def f32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def reference(q, k, v, heads, causal, mask):
    """float64 output [b, m, dv] and weights [b, h, m, n], and each output row's bound and
    each weight's (docs/numbers.md)."""
    b, m, dk = q.shape
    n, dv = k.shape[1], v.shape[2]
    dh, vh = dk // heads, dv // heads
    scale = 1.0 / np.sqrt(dh)
    out, w_all = np.zeros((b, m, dv)), np.zeros((b, heads, m, n))
    out_bound, w_factor = np.zeros((b, m, dv)), np.zeros((b, heads, m, 1))
    for bi in range(b):
        for h in range(heads):
            qh, kh = q[bi][:, h * dh:(h + 1) * dh], k[bi][:, h * dh:(h + 1) * dh]
            vh_ = v[bi][:, h * vh:(h + 1) * vh]
            s = qh @ kh.T * scale
            see = np.ones((m, n), bool)
            if causal:
                see &= np.arange(n)[None, :] <= np.arange(m)[:, None]
            if mask is not None:
                see &= mask
            s = np.where(see, s, -np.inf)
            mx = s.max(1, keepdims=True)
            dead = ~np.isfinite(mx)
            e = np.where(dead, 0.0, np.exp(s - np.where(dead, 0.0, mx)))
            w = e / np.where(dead, 1.0, e.sum(1, keepdims=True))
            w_all[bi, h] = w
            out[bi][:, h * vh:(h + 1) * vh] = w @ vh_
            D = (2 * U + U * U + dh * 2.0 ** -24) * scale * \
                (np.abs(qh) @ np.abs(kh).T).max(1, keepdims=True)
            vmax = np.abs(vh_).max() if vh_.size else 0.0
            out_bound[bi][:, h * vh:(h + 1) * vh] = (np.expm1(2 * D) + 2 * U + 1e-5) * vmax
            w_factor[bi, h] = np.expm1(2 * D) + 2 * U
    return out, w_all, out_bound, w_factor


def within(name, got, want, bound):
    got = np.asarray(got, np.float64)
    if got.shape != want.shape:
        return "%s shape %s, want %s" % (name, list(got.shape), list(want.shape))
    if not np.all(np.isfinite(got)):
        return "%s holds %s" % (name, got[~np.isfinite(got)][:3])
    over = np.abs(got - want) - bound
    if np.any(over > 0):
        i = int(np.argmax(over))
        return "%s off by %.3g at %d, bound %.3g" % (name, float(np.abs(got - want).ravel()[i]),
                                                    i, float(np.broadcast_to(bound, want.shape)
                                                             .ravel()[i]))
    return None


# ---- the wires: each returns (outputs by name as float64 arrays, what the answer says of the
# ---- precision and path, error (status, words) or None)

def ask_v1(srv, case, precision):
    body = {"q": case["q"].tolist(), "k": case["k"].tolist(), "v": case["v"].tolist(),
            "dtype": "float32", "compute_precision": precision, "heads": case["heads"],
            "causal": case["causal"], "return_attention": True,
            "reductions": {"entropy": True, "max": True, "topk": 3}}
    if case["mask"] is not None:
        body["mask"] = case["mask"].astype(int).tolist()
    status, raw, _ = srv.request("POST", "/v1/attention", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    ans = json.loads(raw)
    if status != 200:
        return None, None, (status, ans.get("error", {}))
    outs = {"output": np.array(ans["output"], float), "attention": np.array(ans["attention"])}
    for key in ("entropy", "max_weight", "topk_indices"):
        outs[key] = np.array(ans["reductions"][key], float)
    meta = ans["meta"]
    return outs, (meta.get("compute_precision"), meta.get("kernel")), None


OUTPUTS = ["output", "attention", "entropy", "max_weight", "topk_indices"]


def v2_params(case, precision):
    return {"compute_precision": precision, "heads": case["heads"], "causal": case["causal"],
            "entropy": True, "max": True, "topk": 3}


def v2_inputs(case):
    ins = [(n, "FP32", list(case[n].shape), np.asarray(case[n], np.float32).tobytes())
           for n in ("q", "k", "v")]
    if case["mask"] is not None:
        mask = np.broadcast_to(case["mask"], case["q"].shape[:2] + (case["k"].shape[1],))
        ins.append(("mask", "BOOL", list(mask.shape), np.asarray(mask, np.uint8).tobytes()))
    return ins


def decode(name, datatype, shape, raw):
    t = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64}[datatype]
    return np.frombuffer(raw, t).astype(np.float64).reshape(shape)


def ask_v2(srv, case, precision):
    head = {"inputs": [], "parameters": dict(v2_params(case, precision),
                                             binary_data_output=True),
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in OUTPUTS]}
    blobs = []
    for name, dt, shape, raw in v2_inputs(case):
        head["inputs"].append({"name": name, "datatype": dt, "shape": shape,
                               "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    text = json.dumps(head).encode()
    status, body, headers = srv.request("POST", "/v2/models/attention/infer",
                                        text + b"".join(blobs),
                                        {"Inference-Header-Content-Length": str(len(text)),
                                         "Content-Type": "application/octet-stream"})
    if status != 200:
        return None, None, (status, json.loads(body).get("error"))
    hl = int(headers.get("Inference-Header-Content-Length"))
    answer, at, outs = json.loads(body[:hl]), hl, {}
    for o in answer["outputs"]:
        n = o["parameters"]["binary_data_size"]
        outs[o["name"]] = decode(o["name"], o["datatype"], o["shape"], body[at:at + n])
        at += n
    p = answer.get("parameters", {})
    return outs, (p.get("compute_precision"), p.get("kernel")), None


def ask_grpc(srv, case, precision):
    try:
        r = srv.stub().ModelInfer(infer_request("attention", v2_inputs(case), OUTPUTS,
                                                v2_params(case, precision)), timeout=120)
    except grpc.RpcError as e:
        return None, None, (e.code(), e.details())
    outs = {o.name: decode(o.name, o.datatype, list(o.shape), r.raw_output_contents[i])
            for i, o in enumerate(r.outputs)}
    said = (r.parameters["compute_precision"].string_param, r.parameters["kernel"].string_param)
    return outs, said, None


WIRES = {"v1": ask_v1, "v2": ask_v2, "grpc": ask_grpc}


def cases(rng):
    """The requests: q, k, v as float32 numbers [b, m|n, d], heads, causal, mask [m, n]."""
    def make(name, b, m, n, dk, dv, heads, causal=False, mask=None, scale=1.0):
        return {"name": name, "q": f32(rng.standard_normal((b, m, dk)) * scale),
                "k": f32(rng.standard_normal((b, n, dk)) * scale),
                "v": f32(rng.standard_normal((b, n, dv))), "heads": heads, "causal": causal,
                "mask": mask}
    dead = np.ones((6, 40), bool)
    dead[2] = False                                   # a row that sees no key
    dead[4, 20:] = False
    return [make("random d=64", 1, 33, 200, 64, 64, 1),
            make("odd head dim 7, 3 heads", 1, 5, 70, 21, 9, 3),
            make("batch 2, heads 4, causal", 2, 48, 48, 128, 64, 4, causal=True),
            make("mask with a fully masked row", 1, 6, 40, 16, 16, 1, mask=dead),
            make("large logits", 1, 8, 64, 32, 32, 1, scale=6.0),
            dict(make("one row of 32,768 keys", 1, 2, 32768, 64, 64, 1), binary_only=True)]


def check_path(srv, path):
    rng = np.random.default_rng(54)
    for case in cases(rng):
        q, k, v = case["q"], case["k"], case["v"]
        out64, w64, out_bound, w_factor = reference(q, k, v, case["heads"], case["causal"],
                                                    case["mask"])
        for wire, ask in WIRES.items():
            if wire == "v1" and case.get("binary_only"):
                continue            # 32,768 x 64 x 2 numbers: past v1's JSON body limit
            tag = "%s/%s/%s" % (path, wire, case["name"])
            outs, said, err = ask(srv, case, "bfloat16")
            if err is not None:
                check(tag, False, err)
                continue
            got_out = outs["output"].reshape(out64.shape)
            got_w = outs["attention"].reshape(w64.shape)
            bad = [x for x in (within("output", got_out, out64, out_bound),
                               within("attention", got_w, w64, w_factor * w64 + 1e-6)) if x]
            # the worst-case bound is loose (the errors seen are a tenth of it or less): the
            # typical error is held to half a bfloat16 unit of the largest value, which a
            # coarser rounding than bfloat16's would pass
            rms = float(np.sqrt(np.mean((got_out - out64) ** 2)))
            if rms > U / 2 * np.abs(v).max():
                bad.append("RMS error %.3g over u/2 max|v| = %.3g" % (rms, U / 2 * np.abs(v).max()))
            if case["mask"] is not None:
                row = got_out[:, 2]
                if not np.all(row == 0) or not np.all(got_w[:, :, 2] == 0):
                    bad.append("the fully masked row is %s, want zeros" % row.ravel()[:4])
            check(tag + ": within the bound", not bad, "; ".join(bad))
            check(tag + ": says bfloat16 on " + path, said == ("bfloat16", path), said)
            f32_outs, _, err = ask(srv, case, "float32")
            if err is not None:
                check(tag + ": the float32 twin", False, err)
                continue
            check(tag + ": not float32's answer unchanged",
                  not np.array_equal(f32_outs["output"], outs["output"]), "equal")
            same = [r for r in ("entropy", "max_weight", "topk_indices")
                    if not np.array_equal(f32_outs[r], outs[r])]
            check(tag + ": the reductions are float32's", not same, same)


def check_errors(srv):
    case = {"q": f32([[[1.0, 0.0]]]), "k": f32([[[1.0, 0.0]]]), "v": f32([[[1.0]]]),
            "heads": 1, "causal": False, "mask": None}
    for value, code in (("half", "invalid_value"), (16, "wrong_type"), ("", "invalid_value")):
        outs, _, err = ask_v1(srv, case, value)
        check("errors/v1 %r: 400 %s at compute_precision" % (value, code),
              err is not None and err[0] == 400 and err[1].get("code") == code and
              err[1].get("field") == "compute_precision", err)
        outs, _, err = ask_v2(srv, case, value)
        check("errors/v2 %r: 400 naming parameters.compute_precision" % (value,),
              err is not None and err[0] == 400 and "compute_precision" in str(err[1]), err)
        outs, _, err = ask_grpc(srv, case, value)
        check("errors/grpc %r: INVALID_ARGUMENT naming compute_precision" % (value,),
              err is not None and err[0] == grpc.StatusCode.INVALID_ARGUMENT and
              "compute_precision" in str(err[1]), err)
    # float64 asked of FP32 inputs: computed and answered in float64
    rng = np.random.default_rng(55)
    big = {"q": f32(rng.standard_normal((1, 4, 8))), "k": f32(rng.standard_normal((1, 9, 8))),
           "v": f32(rng.standard_normal((1, 9, 8))), "heads": 1, "causal": False, "mask": None}
    out64 = reference(big["q"], big["k"], big["v"], 1, False, None)[0]
    outs, said, err = ask_v2(srv, big, "float64")
    check("float64 of FP32 inputs: FP64 within 1e-12",
          err is None and said[0] == "float64" and
          within("output", outs["output"].reshape(out64.shape), out64,
                 1e-12 * np.abs(out64) + 1e-15) is None, (err, said))


def main():
    args = harness.arguments(__doc__)
    for path in kernel_paths(with_bf16=True):
        harness.run(args.server, [named("check_" + path, lambda srv, p=path: check_path(srv, p))],
                    "--kernel", path, server_class=GrpcServer)
    harness.run(args.server, [check_errors], server_class=GrpcServer)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
