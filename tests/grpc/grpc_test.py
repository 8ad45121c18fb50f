#!/usr/bin/python3
"""The gRPC front-end (inference.GRPCInferenceService and grpc.health.v1).

Generates the Python stubs from the project's own api/grpc/*.proto with
protoc and Debian's grpc_python_plugin into a temporary folder, starts the
server with --grpc-port -1 (a free port, printed on stdout) on loopback,
and checks every RPC served; the same inference requests sent over HTTP v2
(binary tensors) and over gRPC answered with the same bytes, and bad ones
with the same words; the statistics counting a gRPC request once; bearer
tokens from the authorization metadata; TLS with --tls-cert; a
cancelled call whose computation stops; W3C trace context and request ids in
the metadata, and the access line (text, and JSON with --log-format json)
of every call; Health/Watch (the status at once,
each change while the server drains, cancelled and bounded watches); and FP16
and BF16 tensors (inputs over HTTP binary, HTTP JSON and gRPC raw,
parameters.output_datatype) against NumPy's float16 and a bfloat16 reference
written here.

Usage: grpc_test.py --server PATH [--filter SUBSTR] (only the check
functions whose name contains SUBSTR).  Prints "ok NAME" or "FAIL NAME" per
check and "N passed, N failed" last.
"""
import array
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

import grpc  # noqa: E402  (Debian's python3-grpcio)
import numpy as np  # noqa: E402  (Debian's python3-numpy)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
STUBS = tempfile.TemporaryDirectory(prefix="attn-grpc-stubs-")
subprocess.run(["protoc", "-I" + os.path.join(ROOT, "api", "grpc"), "--python_out=" + STUBS.name,
                "--grpc_python_out=" + STUBS.name,
                "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                os.path.join(ROOT, "api", "grpc", "inference.proto"),
                os.path.join(ROOT, "api", "grpc", "health.proto")], check=True)
sys.path.insert(0, STUBS.name)
import health_pb2 as hpb  # noqa: E402
import health_pb2_grpc as hpg  # noqa: E402
import inference_pb2 as pb  # noqa: E402
import inference_pb2_grpc as pg  # noqa: E402

TOKEN = "grpc-test-token-0123456789"


class GrpcServer(harness.Server):
    """The harness's server with gRPC on a free port: the second line it prints."""

    def __init__(self, binary, *options):
        # as harness.Server, but the first line may be https:// (check_tls)
        self.dir = tempfile.TemporaryDirectory(prefix="attn-py-")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "-1",
             "--data-dir", os.path.join(self.dir.name, "data")] + list(options),
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir.name, "stderr"), "w"),
            text=True)
        line = self.proc.stdout.readline()
        if not re.match(r"listening on https?://", line):
            self.proc.kill()
            raise RuntimeError("the server did not start: " + line)
        self.base = line.split("listening on ")[1].strip()
        line = self.proc.stdout.readline()
        m = re.match(r"listening on grpcs?://(\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("gRPC did not start: " + line)
        self.target = m.group(1)
        self.channel = None

    def stub(self, credentials=None):
        if self.channel is None:
            self.channel = (grpc.secure_channel(self.target, credentials) if credentials
                            else grpc.insecure_channel(self.target))
        return pg.GRPCInferenceServiceStub(self.channel)

    def health(self):
        self.stub()
        return hpg.HealthStub(self.channel)

    def stop(self):
        if self.channel is not None:
            self.channel.close()
        super().stop()

    def log(self):
        with open(os.path.join(self.dir.name, "stderr")) as f:
            return f.read()


def rpc_error(fn, *args, **kw):
    """(code, details) of a call that fails, (OK, answer) of one that does not."""
    try:
        return grpc.StatusCode.OK, fn(*args, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()


def floats(n, seed):
    """n float32 numbers, the same for a seed, exactly representable."""
    return array.array("f", [((i * 7 + seed * 13) % 17 - 8) / 8.0 for i in range(n)])


def input_bytes(dtype, data):
    """The little-endian bytes of an input: data as they are when bytes already."""
    if isinstance(data, bytes):
        return data
    return bytes(bytearray(data)) if dtype == "BOOL" else array.array(
        "f" if dtype == "FP32" else "d", data).tobytes()


def infer_request(model, inputs, outputs=None, params=None, raw=True):
    """A ModelInferRequest: inputs is [(name, datatype, shape, array, list or bytes)]."""
    req = pb.ModelInferRequest(model_name=model)
    for name, dtype, shape, data in inputs:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            req.raw_input_contents.append(input_bytes(dtype, data))
        elif dtype == "FP32":
            t.contents.fp32_contents.extend(data)
        elif dtype == "FP64":
            t.contents.fp64_contents.extend(data)
        else:
            t.contents.bool_contents.extend(bool(b) for b in data)
    for o in outputs or []:
        req.outputs.add(name=o)
    for k, v in (params or {}).items():
        p = req.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, str):
            p.string_param = v
        else:
            p.double_param = v
    return req


def http_infer(srv, model, inputs, outputs=None, params=None):
    """The HTTP v2 twin with binary inputs and outputs: (status, outputs by name as
    (shape, bytes)) or (status, error words)."""
    head = {"inputs": [], "parameters": dict(params or {}, binary_data_output=True)}
    blobs = []
    for name, dtype, shape, data in inputs:
        blob = input_bytes(dtype, data)
        head["inputs"].append({"name": name, "datatype": dtype, "shape": shape,
                               "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    if outputs:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    text = json.dumps(head).encode()
    status, body, headers = srv.request("POST", "/v2/models/%s/infer" % model,
                                        text + b"".join(blobs),
                                        {"Inference-Header-Content-Length": str(len(text)),
                                         "Content-Type": "application/octet-stream"})
    if status != 200:
        return status, json.loads(body)["error"]
    hl = int(headers.get("Inference-Header-Content-Length"))
    answer, at, outs = json.loads(body[:hl]), hl, {}
    for o in answer["outputs"]:
        n = o["parameters"]["binary_data_size"]
        outs[o["name"]] = (o["shape"], body[at:at + n])
        at += n
    return status, outs


def grpc_outputs(answer):
    return {o.name: (list(o.shape), raw) for o, raw in
            zip(answer.outputs, answer.raw_output_contents)}


def check_every_rpc(srv):
    s = srv.stub()
    check("ServerLive: live", s.ServerLive(pb.ServerLiveRequest()).live)
    check("ServerReady: ready", s.ServerReady(pb.ServerReadyRequest()).ready)
    meta = s.ServerMetadata(pb.ServerMetadataRequest())
    _, body, _ = srv.request("GET", "/v2")
    v2 = json.loads(body)
    check("ServerMetadata: as GET /v2", meta.name == v2["name"] and
          meta.version == v2["version"] and list(meta.extensions) == v2["extensions"], meta)
    mm = s.ModelMetadata(pb.ModelMetadataRequest(name="attention"))
    _, body, _ = srv.request("GET", "/v2/models/attention")
    v2 = json.loads(body)
    check("ModelMetadata: as GET /v2/models/attention", mm.name == "attention" and
          list(mm.versions) == v2["versions"] and mm.platform == v2["platform"] and
          [(t.name, t.datatype, list(t.shape)) for t in mm.inputs] ==
          [(t["name"], t["datatype"], t["shape"]) for t in v2["inputs"]] and
          [t.name for t in mm.outputs] == [t["name"] for t in v2["outputs"]], mm)
    check("ModelReady: attention is ready",
          s.ModelReady(pb.ModelReadyRequest(name="attention")).ready)
    check("ModelReady: version 1 is ready",
          s.ModelReady(pb.ModelReadyRequest(name="attention", version="1")).ready)
    code, words = rpc_error(s.ModelReady, pb.ModelReadyRequest(name="absent"))
    check("ModelReady: an unknown model is NOT_FOUND", code == grpc.StatusCode.NOT_FOUND and
          "absent" in words, (code, words))
    code, words = rpc_error(s.ModelMetadata, pb.ModelMetadataRequest(name="attention",
                                                                     version="7"))
    check("ModelMetadata: an unknown version is NOT_FOUND",
          code == grpc.StatusCode.NOT_FOUND, (code, words))
    code, words = rpc_error(s.ModelMetadata, pb.ModelMetadataRequest(name="a/b"))
    check("ModelMetadata: a name with a slash is NOT_FOUND",
          code == grpc.StatusCode.NOT_FOUND, (code, words))
    cfg = s.ModelConfig(pb.ModelConfigRequest(name="attention")).config
    _, body, _ = srv.request("GET", "/v2/models/attention/config")
    v2 = json.loads(body)
    check("ModelConfig: as GET /v2/models/attention/config", cfg.name == "attention" and
          cfg.platform == v2["platform"] and cfg.max_batch_size == v2["max_batch_size"] and
          [(t.name, pb.DataType.Name(t.data_type), list(t.dims), t.optional) for t in cfg.input] ==
          [(t["name"], t["data_type"], t["dims"], t.get("optional", False)) for t in v2["input"]]
          and [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output] ==
          [(t["name"], t["data_type"], t["dims"]) for t in v2["output"]] and
          {k: p.string_value for k, p in cfg.parameters.items()} ==
          {k: p["string_value"] for k, p in v2["parameters"].items()}, cfg)
    check("ModelConfig: FP16 and BF16 listed among the input and output datatypes",
          all(set(cfg.parameters[k].string_value.split(",")) == {"FP32", "FP64", "FP16", "BF16"}
              for k in ("input_datatypes", "output_datatypes")), cfg)
    code, _ = rpc_error(s.ModelConfig, pb.ModelConfigRequest(name="absent"))
    check("ModelConfig: an unknown model is NOT_FOUND", code == grpc.StatusCode.NOT_FOUND, code)
    s.ModelInfer(infer_request("attention", SEED))
    st = s.ModelStatistics(pb.ModelStatisticsRequest(name="attention"))
    _, body, _ = srv.request("GET", "/v2/models/attention/stats")
    v2 = json.loads(body)["model_stats"][0]
    m = st.model_stats[0] if len(st.model_stats) == 1 else None
    check("ModelStatistics: as GET /v2/models/attention/stats", m is not None and
          m.name == "attention" and m.version == v2["version"] and
          m.execution_count == v2["execution_count"] >= 1 and
          m.inference_count == v2["inference_count"] and
          m.last_inference == v2["last_inference"] and
          m.inference_stats.success.count == v2["inference_stats"]["success"]["count"] and
          m.inference_stats.compute_infer.ns == v2["inference_stats"]["compute_infer"]["ns"] and
          [(b.batch_size, b.compute_infer.count) for b in m.batch_stats] ==
          [(b["batch_size"], b["compute_infer"]["count"]) for b in v2["batch_stats"]], (st, v2))
    every = s.ModelStatistics(pb.ModelStatisticsRequest())
    check("ModelStatistics of every model", [m.name for m in every.model_stats] ==
          [m["name"] for m in json.loads(srv.request("GET", "/v2/models/stats")[1])["model_stats"]],
          every)
    code, _ = rpc_error(s.ModelStatistics, pb.ModelStatisticsRequest(name="absent"))
    check("ModelStatistics: an unknown model is NOT_FOUND", code == grpc.StatusCode.NOT_FOUND, code)
    index = s.RepositoryIndex(pb.RepositoryIndexRequest())
    _, body, _ = srv.request("POST", "/v2/repository/index", b"{}",
                             {"Content-Type": "application/json"})
    check("RepositoryIndex: as POST /v2/repository/index",
          [(m.name, m.version, m.state, m.reason) for m in index.models] ==
          [(m["name"], m["version"], m["state"], m["reason"]) for m in json.loads(body)], index)
    for name, fn, req in (("load", s.RepositoryModelLoad, pb.RepositoryModelLoadRequest),
                          ("unload", s.RepositoryModelUnload, pb.RepositoryModelUnloadRequest)):
        _, body, _ = srv.request("POST", "/v2/repository/models/attention/" + name, b"{}",
                                 {"Content-Type": "application/json"})
        code, words = rpc_error(fn, req(model_name="attention"))
        check("RepositoryModel" + name.capitalize() + ": answered as its HTTP twin",
              code == grpc.StatusCode.INVALID_ARGUMENT and words == json.loads(body)["error"],
              (code, words, body))
    _, body, _ = srv.request("GET", "/v1/info")
    check("/v1/info says where gRPC listens",
          json.loads(body).get("grpc", {}).get("port") == int(srv.target.rsplit(":", 1)[1]),
          body[-200:])
    h = srv.health()
    status = h.Check(hpb.HealthCheckRequest()).status
    check("Health/Check: SERVING", status == hpb.HealthCheckResponse.SERVING, status)
    status = h.Check(hpb.HealthCheckRequest(service="inference.GRPCInferenceService")).status
    check("Health/Check of the inference service: SERVING",
          status == hpb.HealthCheckResponse.SERVING, status)
    code, _ = rpc_error(h.Check, hpb.HealthCheckRequest(service="other"))
    check("Health/Check of another service: NOT_FOUND", code == grpc.StatusCode.NOT_FOUND, code)
    unknown = srv.channel.unary_unary("/inference.GRPCInferenceService/CudaSharedMemoryStatus",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
    code, _ = rpc_error(unknown, b"")
    check("a method not served: UNIMPLEMENTED", code == grpc.StatusCode.UNIMPLEMENTED, code)


SEED = [("q", "FP32", [3, 4], floats(12, 1)), ("k", "FP32", [5, 4], floats(20, 2)),
        ("v", "FP32", [5, 2], floats(10, 3))]
MASK = [1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1]


def same_answer(srv, name, model, inputs, outputs=None, params=None, raw=True):
    status, http = http_infer(srv, model, inputs, outputs, params)
    code, answer = rpc_error(srv.stub().ModelInfer,
                             infer_request(model, inputs, outputs, params, raw))
    got = grpc_outputs(answer) if code == grpc.StatusCode.OK else None
    check("same answer over HTTP and gRPC: " + name, status == 200 and code == grpc.StatusCode.OK
          and got == http and len(got) >= 1, (status, code, answer if got is None else
                                              sorted(got), sorted(http) if status == 200 else http))


def check_same_answers(srv):
    same_answer(srv, "seed, raw FP32", "attention", SEED)
    same_answer(srv, "seed, typed fp32_contents", "attention", SEED, raw=False)
    d = [(n, "FP64", s, list(x)) for n, _, s, x in SEED]
    same_answer(srv, "FP64, raw", "attention", d)
    same_answer(srv, "FP64, typed fp64_contents", "attention", d, raw=False)
    masked = SEED + [("mask", "BOOL", [3, 5], MASK)]
    same_answer(srv, "mask, raw BOOL", "attention", masked)
    same_answer(srv, "mask, typed bool_contents", "attention", masked, raw=False)
    same_answer(srv, "causal and scale", "attention",
                [("q", "FP32", [5, 4], floats(20, 4))] + SEED[1:],
                params={"causal": True, "scale": 0.25})
    same_answer(srv, "heads 2", "attention", SEED, params={"heads": 2})
    same_answer(srv, "output only", "attention", SEED, outputs=["output"])
    same_answer(srv, "attention then output", "attention", SEED, outputs=["attention", "output"])
    same_answer(srv, "pooled attention", "attention", SEED, outputs=["attention"],
                params={"attention_pool_rows": 1, "attention_pool_cols": 2})
    same_answer(srv, "batched", "attention", [(n, t, [2] + s, list(x) * 2) for n, t, s, x in SEED])
    # the reductions (checked against NumPy in tests/reductions): the same INT64 and FP32
    # outputs through gRPC's parameters and raw contents
    same_answer(srv, "reductions", "attention", SEED,
                outputs=["entropy", "argmax", "received", "topk_indices", "topk_weights"],
                params={"entropy": True, "max": True, "received": True, "topk": 2})
    srv.request("PUT", "/v1/weight-sets/toy", json.dumps(
        {"wq": [[1.0, 0.5]], "wk": [[0.5, 1.0]], "wv": [[1.0, -1.0]]}).encode(),
        {"Content-Type": "application/json"})
    same_answer(srv, "a stored set as a model", "toy", [("x", "FP32", [3, 1], [1.0, 2.0, -1.0])])
    answer = srv.stub().ModelInfer(infer_request("attention", SEED))
    params = {k: v.WhichOneof("parameter_choice") for k, v in answer.parameters.items()}
    check("ModelInfer: model, version, parameters and output shapes",
          answer.model_name == "attention" and answer.model_version == "1" and
          params.get("scale") == "double_param" and params.get("heads") == "int64_param" and
          [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] ==
          [("output", "FP32", [3, 2]), ("attention", "FP32", [3, 5])], answer)
    # The answer's fields (v2 gives them to gRPC beside its JSON part): the same model, id
    # and parameters, of the same kinds, as the JSON answer of the HTTP twin.
    params = {"attention_pool_rows": 1, "attention_pool_cols": 2, "scale": 0.3}
    head = {"id": "call-7", "parameters": params,
            "inputs": [{"name": n, "datatype": t, "shape": s, "data": list(x)}
                       for n, t, s, x in SEED]}
    status, body, _ = srv.request("POST", "/v2/models/attention/infer", json.dumps(head).encode(),
                                  {"Content-Type": "application/json"})
    want = json.loads(body) if status == 200 else {}
    req = infer_request("attention", SEED, ["attention"], params)
    req.id = "call-7"
    answer = srv.stub().ModelInfer(req)
    got = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in answer.parameters.items()}
    hp = want.get("parameters", {})
    check("ModelInfer: id, model and parameters (pool block sizes, scale) are HTTP v2's",
          status == 200 and answer.id == want.get("id") == "call-7" and
          answer.model_name == want.get("model_name") and set(got) == set(hp) and
          "attention_pool_block_cols" in got and isinstance(got.get("compute_ms"), float) and
          all(got[k] == hp[k] and isinstance(got[k], int) == isinstance(hp[k], int)
              for k in hp if k != "compute_ms"), (status, got, hp))


def same_error(srv, name, model, inputs, code, raw=True, req=None, params=None):
    status, words = http_infer(srv, model, inputs, params=params)
    got, details = rpc_error(srv.stub().ModelInfer,
                             req or infer_request(model, inputs, raw=raw, params=params))
    check("same error over HTTP and gRPC: " + name, status != 200 and got == code and
          details == words, (status, words, got, details))


def check_bad_inputs(srv):
    s = srv.stub()
    same_error(srv, "k narrower than q", "attention",
               [SEED[0], ("k", "FP32", [5, 3], floats(15, 2)), SEED[2]],
               grpc.StatusCode.INVALID_ARGUMENT)
    same_error(srv, "unknown datatype", "attention",
               [("q", "INT8", [3, 4], floats(12, 1))] + SEED[1:], grpc.StatusCode.INVALID_ARGUMENT)
    same_error(srv, "unknown model", "absent", SEED, grpc.StatusCode.NOT_FOUND)
    same_error(srv, "bad scale", "attention", SEED, grpc.StatusCode.INVALID_ARGUMENT,
               params={"scale": -1.0})
    lying = infer_request("attention", SEED)
    lying.raw_input_contents[1] = lying.raw_input_contents[1][:-4]
    code, words = rpc_error(s.ModelInfer, lying)
    check("raw contents shorter than the shape: INVALID_ARGUMENT naming the input",
          code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[1]" in words, (code, words))
    huge = infer_request("attention", SEED)
    del huge.inputs[0].shape[:]
    huge.inputs[0].shape.extend([1 << 40, 1 << 40])
    code, words = rpc_error(s.ModelInfer, huge)
    check("a shape whose product overflows: refused, naming the shape",
          code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED) and
          "inputs[0]" in words, (code, words))
    neg = infer_request("attention", SEED)
    neg.inputs[0].shape[0] = -3
    code, words = rpc_error(s.ModelInfer, neg)
    check("a negative dimension: INVALID_ARGUMENT", code == grpc.StatusCode.INVALID_ARGUMENT,
          (code, words))
    few = infer_request("attention", SEED)
    del few.raw_input_contents[2]
    code, words = rpc_error(s.ModelInfer, few)
    check("raw contents for some inputs only: INVALID_ARGUMENT",
          code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in words,
          (code, words))
    mixed = infer_request("attention", SEED, raw=False)
    mixed.inputs[0].contents.fp64_contents.extend([1.0] * 12)
    code, words = rpc_error(s.ModelInfer, mixed)
    check("fp64_contents beside fp32_contents: INVALID_ARGUMENT naming contents",
          code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[0].contents" in words,
          (code, words))
    tiny = pb.ModelInferRequest(model_name="attention")
    for i in range(10000):
        tiny.inputs.add(name="q%d" % i, datatype="FP32", shape=[1, 1])
        tiny.raw_input_contents.append(b"\0\0\0\0")
    code, words = rpc_error(s.ModelInfer, tiny)
    check("10k tiny inputs: INVALID_ARGUMENT", code == grpc.StatusCode.INVALID_ARGUMENT,
          (code, words[:200]))
    code, words = rpc_error(s.ModelInfer, pb.ModelInferRequest(model_name="attention"))
    check("no inputs: INVALID_ARGUMENT naming inputs",
          code == grpc.StatusCode.INVALID_ARGUMENT and "inputs" in words, (code, words))
    garbage = srv.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
    # model_name "attention", and parameters {"x": <no value>} (found by make fuzz)
    code, words = rpc_error(garbage, b"\x0a\x09attention\x22\x03\x0a\x01x")
    check("a parameter with no value: INVALID_ARGUMENT naming it",
          code == grpc.StatusCode.INVALID_ARGUMENT and "parameters.x" in words, (code, words))
    code, words = rpc_error(garbage, b"\x0a\xff\xff\xff\xff\x0f")
    check("bytes that are no ModelInferRequest: INVALID_ARGUMENT",
          code == grpc.StatusCode.INVALID_ARGUMENT, (code, words))


# ---- FP16 and BF16 --------------------------------------------------------

BF16_MAX = (2 - 2 ** -7) * 2.0 ** 127


def round_even(x, fraction_bits, min_exp, largest):
    """x rounded to the nearest number of a binary format (fraction_bits bits after the
    point, least normal exponent min_exp, largest finite number `largest`), ties to even,
    Inf past the tie above `largest`: the definition, written without the server's bit
    arithmetic.  x / ulp is exact (ulp is a power of two) and Python's round() of a float
    rounds half to even exactly."""
    if x == 0 or not math.isfinite(x):
        return x
    _, e = math.frexp(abs(x))           # abs(x) = m * 2**e, 0.5 <= m < 1
    ulp = math.ldexp(1.0, max(e - 1, min_exp) - fraction_bits)
    r = round(abs(x) / ulp) * ulp
    return math.copysign(r if r <= largest else math.inf, x)


def bf16_round(a):
    """float64 array -> the float64 values of its nearest bfloat16 numbers (reference)."""
    return np.array([round_even(float(x), 7, -126, BF16_MAX) for x in np.ravel(a)],
                    dtype=np.float64).reshape(np.shape(a))


def bf16_bytes(values):
    """Exact bfloat16 values -> their little-endian bytes (the top half of the float32)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    assert not np.any(bits & 0xffff), "not bfloat16 numbers"
    return (bits >> 16).astype("<u2").tobytes()


def fp16_round(a):
    return np.asarray(a, dtype=np.float64).astype(np.float16).astype(np.float64)


def fp16_bytes(values):
    return np.asarray(values, dtype=np.float64).astype("<f2").tobytes()


HALF = {"FP16": (fp16_round, fp16_bytes), "BF16": (bf16_round, bf16_bytes)}


def half_inputs(rng):
    """q, k, v (float64) with what rounding and widening get wrong: subnormals of both
    formats, +-0, halfway ties of both, numbers past FP16's range in k."""
    q = rng.standard_normal((7, 8)) * 2
    q[0, :8] = [2.0 ** -24, -(2.0 ** -20), -0.0, 0.0, 3 * 2.0 ** -25, 1 + 2.0 ** -11,
                1 + 2.0 ** -8, 1e-39]
    k = rng.standard_normal((9, 8))
    k[0, 0], k[1, 1] = -(2.0 ** -130), 1 + 3 * 2.0 ** -11
    v = rng.standard_normal((9, 4)) * 3
    return {"q": q, "k": k, "v": v}


def post_json(srv, head):
    """POST a JSON v2 body: (status, parsed answer or error words)."""
    status, body, _ = srv.request("POST", "/v2/models/attention/infer",
                                  json.dumps(head).encode(),
                                  {"Content-Type": "application/json"})
    answer = json.loads(body)
    return status, answer if status == 200 else answer["error"]


def check_decoder_bounds(srv):
    """A NUL byte inside a string, too many inputs or outputs, and an unpacked
    form past the call's bound: refused before the request is decoded."""
    s = srv.stub()
    for what, mutate in [
            ("model_name", lambda r: setattr(r, "model_name", "attention\0junk")),
            ("inputs[1].name", lambda r: setattr(r.inputs[1], "name", "k\0")),
            ("inputs[0].datatype", lambda r: setattr(r.inputs[0], "datatype", "FP32\0")),
            ("outputs[0].name", lambda r: r.outputs.add(name="output\0x")),
            ("id", lambda r: setattr(r, "id", "a\0b")),
            ("parameters[0].key", lambda r: setattr(r.parameters["sca\0le"], "double_param", 1)),
            ("parameters[0].value.string_param",
             lambda r: setattr(r.parameters["output_datatype"], "string_param", "FP32\0"))]:
        req = infer_request("attention", SEED)
        mutate(req)
        code, words = rpc_error(s.ModelInfer, req)
        check("a NUL byte in %s: INVALID_ARGUMENT naming it" % what,
              code == grpc.StatusCode.INVALID_ARGUMENT and
              ("%s holds a NUL byte" % what) in words, (code, words))
    many = infer_request("attention", SEED)
    for i in range(7):
        many.inputs.add(name="x%d" % i, datatype="FP32", shape=[1, 1])
    code, words = rpc_error(s.ModelInfer, many)
    check("more inputs than the models take: INVALID_ARGUMENT naming inputs",
          code == grpc.StatusCode.INVALID_ARGUMENT and "inputs has more than 6" in words,
          (code, words))
    many = infer_request("attention", SEED)
    for i in range(18):
        many.outputs.add(name="output")
    code, words = rpc_error(s.ModelInfer, many)
    check("more outputs than there are: INVALID_ARGUMENT naming outputs",
          code == grpc.StatusCode.INVALID_ARGUMENT and "outputs has more than 17" in words,
          (code, words))
    # a packed int64 of one byte unpacks to eight: past four times the wire
    wide = infer_request("attention", SEED)
    wide.inputs[0].shape.extend([1] * 200000)
    code, words = rpc_error(s.ModelInfer, wide)
    check("an unpacked form past the call's bound: RESOURCE_EXHAUSTED naming the limit",
          code == grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes once unpacked" in words,
          (code, words))
    code, answer = rpc_error(s.ModelInfer, infer_request("attention", SEED))
    check("and a request within the bounds is answered", code == grpc.StatusCode.OK, code)

def check_half_inputs(srv):
    """FP16 and BF16 inputs, binary and JSON over HTTP and raw over gRPC, answer as the FP32
    request of their widened values, bit for bit."""
    rng = np.random.default_rng(32)
    x = half_inputs(rng)
    # the bfloat16 reference agrees with NumPy where NumPy has the format
    ref16 = np.array([round_even(float(v), 10, -14, 65504.0) for v in x["q"].ravel()])
    check("half: the rounding reference is NumPy's float16 rounding (q, with ties and "
          "subnormals)", np.array_equal(ref16, fp16_round(x["q"]).ravel()) and
          np.array_equal(np.signbit(ref16), np.signbit(fp16_round(x["q"]).ravel())))
    for dtype, (rounder, packer) in HALF.items():
        for params in ({}, {"causal": True, "heads": 2}):
            r = {n: rounder(a) for n, a in x.items()}
            twin = [(n, "FP32", list(a.shape), a.astype("<f4").tobytes()) for n, a in r.items()]
            half = [(n, dtype, list(a.shape), packer(a)) for n, a in r.items()]
            what = "%s%s" % (dtype, " causal, heads 2" if params else "")
            s32, want = http_infer(srv, "attention", twin, params=params)
            status, got = http_infer(srv, "attention", half, params=params)
            check("half: %s binary over HTTP as FP32 of the widened values" % what,
                  s32 == 200 and status == 200 and got == want, (s32, status))
            code, answer = rpc_error(srv.stub().ModelInfer,
                                     infer_request("attention", half, params=params))
            check("half: %s raw over gRPC as FP32 of the widened values" % what,
                  code == grpc.StatusCode.OK and grpc_outputs(answer) == want,
                  (code, answer if code != grpc.StatusCode.OK else ""))
            # JSON numbers, not rounded by the client: the server rounds them
            head = {"parameters": dict(params, binary_data_output=True),
                    "inputs": [{"name": n, "datatype": dtype, "shape": list(a.shape),
                                "data": a.ravel().tolist()} for n, a in x.items()]}
            text = json.dumps(head).encode()
            status, body, headers = srv.request("POST", "/v2/models/attention/infer", text,
                                                {"Content-Type": "application/json"})
            hl = int(headers.get("Inference-Header-Content-Length") or 0)
            json_bin = body[hl:] if status == 200 else body
            check("half: %s JSON numbers rounded to nearest even, as FP32 of the rounded "
                  "values" % what, status == 200 and
                  json_bin == want["output"][1] + want["attention"][1], (status, body[:200]))
    # 65520 rounds to Inf in FP16 and is refused; 65519 rounds to 65504; BF16 holds both
    for dtype, value, ok in (("FP16", 65519.0, True), ("FP16", 65520.0, False),
                             ("BF16", 65520.0, True), ("BF16", 3.4e38, False),
                             ("FP16", -1e6, False)):
        head = {"inputs": [{"name": "q", "datatype": dtype, "shape": [1, 2], "data": [0, value]},
                           {"name": "k", "datatype": dtype, "shape": [1, 2], "data": [1, 2]},
                           {"name": "v", "datatype": dtype, "shape": [1, 1], "data": [3]}]}
        status, answer = post_json(srv, head)
        check("half: JSON %s %g %s" % (dtype, value, "accepted" if ok else
                                         "refused, naming the input (rounds to Inf)"),
              status == 200 if ok else status == 400 and
              answer.startswith("inputs[0].data") and "Inf" in answer, (status, answer))
    # NaN and Inf in binary data: refused as for FP32, the same words over gRPC
    for dtype, bits, what in (("FP16", 0x7e00, "NaN"), ("FP16", 0xfc00, "-Inf"),
                              ("BF16", 0x7fc1, "NaN"), ("BF16", 0x7f80, "Inf")):
        raw = np.array([0x3c00, bits] if dtype == "FP16" else [0x3f80, bits],
                       dtype="<u2").tobytes()
        bad = [("q", dtype, [1, 2], raw), ("k", dtype, [1, 2], raw[:2] * 2),
               ("v", dtype, [1, 1], raw[:2])]
        status, words = http_infer(srv, "attention", bad)
        check("half: binary %s %s refused as FP32's are" % (dtype, what), status == 400 and
              "inputs[0]" in words and "NaN or Inf at element 1" in words, (status, words))
        same_error(srv, "%s %s in raw contents" % (dtype, what), "attention", bad,
                   grpc.StatusCode.INVALID_ARGUMENT)
    mixed = [("q", "FP16", [1, 2], fp16_bytes([1, 2])), ("k", "FP32", [1, 2], [1.0, 2.0]),
             ("v", "FP16", [1, 1], fp16_bytes([3]))]
    same_error(srv, "FP16 q beside FP32 k", "attention", mixed, grpc.StatusCode.INVALID_ARGUMENT)
    status, words = http_infer(srv, "attention", mixed)
    check("half: inputs share one datatype", status == 400 and "share one datatype" in words,
          words)
    short = [("q", "FP16", [1, 2], fp16_bytes([1, 2])[:2])] + mixed[1:]
    same_error(srv, "FP16 raw bytes short of the shape", "attention", short,
               grpc.StatusCode.INVALID_ARGUMENT)
    req = infer_request("attention", [(n, "FP32", s, [1.0] * int(np.prod(s)))
                                      for n, s in (("q", [1, 2]), ("k", [1, 2]), ("v", [1, 1]))],
                        raw=False)
    for t in req.inputs:
        t.datatype = "FP16"
    code, words = rpc_error(srv.stub().ModelInfer, req)
    check("half: FP16 in fp32_contents is INVALID_ARGUMENT (raw only, as Triton)",
          code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in words,
          (code, words))


def decode(dtype, raw):
    """The float64 values of an answer's bytes."""
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(
            np.float64)
    return np.frombuffer(raw, {"FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}[dtype]).astype(
        np.float64)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a, b) and np.array_equal(np.signbit(a),
                                                                          np.signbit(b))


def check_output_datatype(srv):
    """parameters.output_datatype: every float output rounded to nearest even, binary and
    JSON, over HTTP and gRPC; values that would round to Inf refused."""
    rng = np.random.default_rng(7)
    q = (rng.standard_normal((6, 8)) * 3).astype(np.float32)
    k = (rng.standard_normal((10, 8)) * 3).astype(np.float32)
    v = (rng.standard_normal((10, 4)) * 1e4).astype(np.float32)
    v[0, 0], v[1, 1] = 1e-6, -3e-8      # outputs in FP16's subnormal range on some rows
    f32 = [("q", "FP32", [6, 8], q.tobytes()), ("k", "FP32", [10, 8], k.tobytes()),
           ("v", "FP32", [10, 4], v.tobytes())]
    f64 = [(n, "FP64", s, np.frombuffer(b, "<f4").astype("<f8").tobytes()) for n, t, s, b in f32]
    pool = {"attention_pool_rows": 3, "attention_pool_cols": 4}
    cases = [("FP32 inputs", f32, {}, ["output", "attention"]),
             ("FP64 inputs", f64, {}, ["output", "attention"]),
             ("FP32 inputs, pooled attention", f32, pool, ["attention"]),
             ("FP64 inputs, causal", f64, {"causal": True}, ["attention", "output"])]
    for name, inputs, params, outputs in cases:
        # the numbers as the server holds them (FP64 widens them exactly), which every
        # other datatype rounds once; the default is the computation's precision
        wide = "FP64" if inputs is f64 else "FP32"
        s64, held = http_infer(srv, "attention", inputs, outputs,
                               dict(params, output_datatype="FP64"))
        status, base = http_infer(srv, "attention", inputs, outputs, params)
        sw, same = http_infer(srv, "attention", inputs, outputs,
                              dict(params, output_datatype=wide))
        check("output_datatype: %s, the default is %s" % (name, wide),
              s64 == 200 and status == 200 and sw == 200 and same == base, (s64, status, sw))
        if s64 != 200:
            continue
        exact = {o: decode("FP64", raw) for o, (_, raw) in held.items()}
        for od in ("FP16", "BF16", "FP32", "FP64"):
            p = dict(params, output_datatype=od)
            status, got = http_infer(srv, "attention", inputs, outputs, p)
            want = {o: (fp16_round(x) if od == "FP16" else bf16_round(x) if od == "BF16"
                        else x.astype(np.float32).astype(np.float64) if od == "FP32" else x)
                    for o, x in exact.items()}
            ok = status == 200 and all(same_bits(decode(od, got[o][1]), want[o])
                                       and got[o][0] == base[o][0] for o in outputs)
            check("output_datatype %s, %s: binary rounded to nearest even (NumPy / the "
                  "bfloat16 reference)" % (od, name), ok, (status, got if status != 200 else ""))
            code, answer = rpc_error(srv.stub().ModelInfer,
                                     infer_request("attention", inputs, outputs, p))
            check("output_datatype %s, %s: the same bytes and datatype over gRPC" % (od, name),
                  code == grpc.StatusCode.OK and status == 200 and
                  grpc_outputs(answer) == got and
                  all(o.datatype == od for o in answer.outputs), (code, answer))
            # JSON numbers: each reads back to the same number of the datatype
            head = {"parameters": p, "outputs": [{"name": o} for o in outputs],
                    "inputs": [{"name": n, "datatype": t, "shape": s,
                                "data": decode(t, b).tolist()} for n, t, s, b in inputs]}
            status, answer = post_json(srv, head)
            ok = status == 200
            for o in (answer["outputs"] if ok else []):
                data = np.array(o["data"], dtype=np.float64)
                back = (fp16_round(data) if od == "FP16" else bf16_round(data) if od == "BF16"
                        else data.astype(np.float32).astype(np.float64) if od == "FP32"
                        else data)
                ok &= o["datatype"] == od and same_bits(back, want[o["name"]])
            check("output_datatype %s, %s: JSON numbers read back to the rounded values"
                  % (od, name), ok, (status, answer if status != 200 else ""))
    # an output past the datatype's range is refused, naming it; one within it is sent
    big = [("v", "FP32", [10, 4], (np.abs(v) * 10 + 7e4).astype(np.float32).tobytes())]
    status, words = http_infer(srv, "attention", f32[:2] + big, params={"output_datatype": "FP16"})
    check("output_datatype FP16: an output past 65504 is 400 naming it", status == 400 and
          'Output "output"' in words and "FP16" in words, (status, words))
    same_error(srv, "an output past FP16's range", "attention", f32[:2] + big,
               grpc.StatusCode.INVALID_ARGUMENT, params={"output_datatype": "FP16"})
    status, got = http_infer(srv, "attention", f32[:2] + big, ["attention"],
                             {"output_datatype": "FP16"})
    check("output_datatype FP16: the attention alone of the same request is sent", status == 200,
          got)
    status, got = http_infer(srv, "attention", f32[:2] + big, params={"output_datatype": "BF16"})
    check("output_datatype BF16: the same output fits BF16", status == 200, got)
    huge = [("v", "FP64", [10, 4], np.full(40, 1e300, "<f8").tobytes())]
    status, words = http_infer(srv, "attention", f64[:2] + huge,
                               params={"output_datatype": "FP32"})
    check("output_datatype FP32 of an FP64 job past FP32's range: 400 naming the output",
          status == 400 and 'Output "output"' in words, (status, words))
    for bad in ("FP8", "fp16", 16, True):
        status, words = http_infer(srv, "attention", f32, params={"output_datatype": bad})
        check("output_datatype %r: 400 naming parameters.output_datatype" % (bad,),
              status == 400 and words.startswith("parameters.output_datatype"), (status, words))
    same_error(srv, "an unknown output_datatype", "attention", f32,
               grpc.StatusCode.INVALID_ARGUMENT, params={"output_datatype": "FP8"})


def check_stream(srv):
    s = srv.stub()
    good = infer_request("attention", SEED)
    bad = infer_request("attention", SEED[:2])
    expected = grpc_outputs(s.ModelInfer(good))
    _, words = rpc_error(s.ModelInfer, bad)
    n = 1000
    answers = list(s.ModelStreamInfer(iter(
        [bad if i % 10 == 3 else
         pb.ModelInferRequest(model_name="attention", id="r%d" % i, inputs=good.inputs,
                              raw_input_contents=good.raw_input_contents) for i in range(n)])))
    check("stream: 1000 requests, one answer each", len(answers) == n, len(answers))
    ok_in_order = all(a.infer_response.id == "r%d" % i and not a.error_message and
                      grpc_outputs(a.infer_response) == expected
                      for i, a in enumerate(answers) if i % 10 != 3)
    check("stream: the answers in order, each as ModelInfer's", ok_in_order)
    check("stream: a bad request answers error_message with ModelInfer's words, and the "
          "stream goes on", all(answers[i].error_message == words for i in range(3, n, 10)),
          [answers[3].error_message, words])
    check("stream: an empty stream ends OK", list(s.ModelStreamInfer(iter([]))) == [])

    def broken():
        for i in range(50):
            if i == 5:
                raise RuntimeError("the client breaks the stream")
            yield good
    code, _ = rpc_error(lambda: list(s.ModelStreamInfer(broken())))
    check("stream: a stream broken mid-way ends on the client's side", code != grpc.StatusCode.OK,
          code)
    check("stream: the server serves on after it",
          grpc_outputs(s.ModelInfer(good)) == expected)


def check_limits(srv):
    """--max-elements 4096 and --max-body 1M (the server of this check)."""
    s = srv.stub()
    n = 4096
    big = [("q", "FP32", [n, 2], floats(2 * n, 1)), ("k", "FP32", [n, 2], floats(2 * n, 2)),
           ("v", "FP32", [n, 2], floats(2 * n, 3))]
    same_error(srv, "past --max-elements", "attention", big, grpc.StatusCode.RESOURCE_EXHAUSTED)
    over = infer_request("attention", SEED)
    over.parameters["padding"].string_param = "x" * (2 << 20)
    code, words = rpc_error(s.ModelInfer, over)
    check("a message past --max-body: RESOURCE_EXHAUSTED",
          code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, words))


def check_statistics(srv):
    def stats():
        _, body, _ = srv.request("GET", "/v2/models/attention/stats")
        m = json.loads(body)["model_stats"][0]
        return m["execution_count"], m["inference_stats"]["fail"]["count"]
    before = stats()
    srv.stub().ModelInfer(infer_request("attention", SEED))
    rpc_error(srv.stub().ModelInfer, infer_request("attention", SEED[:2]))
    after = stats()
    check("a gRPC inference counts once in /v2/models/stats, a failure once",
          after == (before[0] + 1, before[1] + 1), (before, after))
    _, body, _ = srv.request("GET", "/metrics")
    check("/metrics counts gRPC inferences under the v2 infer route",
          re.search(rb'attn_http_requests_total\{route="/v2/models/\{model\}/infer",code="200"\} [1-9]',
                    body) is not None,
          body[:300])


def check_auth(srv):
    s = srv.stub()
    code, words = rpc_error(s.ModelInfer, infer_request("attention", SEED))
    check("auth: no token is UNAUTHENTICATED", code == grpc.StatusCode.UNAUTHENTICATED and
          "bearer token" in words, (code, words))
    code, words = rpc_error(s.ModelInfer, infer_request("attention", SEED),
                            metadata=[("authorization", "Bearer wrong-token-0123456789")])
    check("auth: a wrong token is UNAUTHENTICATED", code == grpc.StatusCode.UNAUTHENTICATED,
          (code, words))
    code, answer = rpc_error(s.ModelInfer, infer_request("attention", SEED),
                             metadata=[("authorization", "Bearer " + TOKEN)])
    check("auth: the token is accepted", code == grpc.StatusCode.OK, (code, answer))
    code, _ = rpc_error(s.ModelMetadata, pb.ModelMetadataRequest(name="attention"))
    check("auth: metadata needs the token too", code == grpc.StatusCode.UNAUTHENTICATED, code)
    check("auth: the probes need none", s.ServerReady(pb.ServerReadyRequest()).ready and
          srv.health().Check(hpb.HealthCheckRequest()).status == hpb.HealthCheckResponse.SERVING)


def gauge(srv, name):
    """The value of the gauge `name` (a whole number) in /metrics, or None when it is absent."""
    _, body, _ = srv.request("GET", "/metrics")
    m = re.search(rb"\n" + name.encode() + rb" (\d+)", body)
    return int(m.group(1)) if m else None


def check_cancel(srv):
    """A 32k-token request (max-inflight 1) cancelled once it computes: its computation
    stops (the server logs CANCELLED, status 1, not OK), and the compute slot is free again."""
    s = srv.stub()
    n, d = 32768, 64
    req = infer_request("attention", [("q", "FP32", [n, d], floats(n * d, 1)),
                                      ("k", "FP32", [n, d], floats(n * d, 2)),
                                      ("v", "FP32", [n, d], floats(n * d, 3))], outputs=["output"])

    def inflight():
        return gauge(srv, "attn_grpc_inflight_calls")
    future = s.ModelInfer.future(req)
    started = False
    for _ in range(2000):  # until the server holds the call (it counts in the gauge)
        if inflight() == 1 or future.done():
            started = not future.done()
            break
        time.sleep(0.01)
    check("cancel: the 32k-token call is computing", started)
    time.sleep(0.1)
    future.cancel()
    for _ in range(3000):  # until the call is answered; bounded
        if "access grpc ModelInfer status=" in srv.log():
            break
        time.sleep(0.01)
    line = [l for l in srv.log().splitlines() if "access grpc ModelInfer" in l]
    check("cancel: the computation stopped (CANCELLED, not OK)",
          len(line) == 1 and "status=1 " in line[0], line)
    for _ in range(3000):  # the gauge drops when the answer's batch is done; bounded
        calls = inflight()
        if calls == 0:
            break
        time.sleep(0.01)
    check("cancel: no gRPC call in flight afterwards (attn_grpc_inflight_calls)", calls == 0,
          calls)
    code, _ = rpc_error(s.ModelInfer, infer_request("attention", SEED), timeout=60)
    check("cancel: the compute slot serves the next call", code == grpc.StatusCode.OK, code)
    code, _ = rpc_error(s.ModelInfer, req, timeout=0.2)
    check("deadline: a 32k-token call past its 200 ms deadline is DEADLINE_EXCEEDED",
          code == grpc.StatusCode.DEADLINE_EXCEEDED, code)


SERVING = hpb.HealthCheckResponse.SERVING
NOT_SERVING = hpb.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = hpb.HealthCheckResponse.SERVICE_UNKNOWN


def open_watches(srv):
    """The gauge attn_grpc_health_watches of /metrics."""
    return gauge(srv, "attn_grpc_health_watches")


def watches_drop_to(srv, n):
    """Waits (bounded) until n watches are open; returns how many are."""
    for _ in range(3000):
        now = open_watches(srv)
        if now == n:
            break
        time.sleep(0.01)
    return now


def cancelled_code(watch):
    """Cancels a Watch and returns the code its stream ends with."""
    watch.cancel()
    try:
        for _ in watch:
            pass
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def check_watch(srv):
    """Health/Watch: the status at once with the call left open; SERVICE_UNKNOWN for a
    service not served (the call open too); cancelled watches leave the server (the gauge
    attn_grpc_health_watches back to 0; the asan suite checks nothing leaks); 100 at once."""
    h = srv.health()
    whole = h.Watch(hpb.HealthCheckRequest(), timeout=120)
    named = h.Watch(hpb.HealthCheckRequest(service="inference.GRPCInferenceService"),
                    timeout=120)
    unknown = h.Watch(hpb.HealthCheckRequest(service="no.such.Service"), timeout=120)
    check("watch: the whole server is SERVING at once", next(whole).status == SERVING)
    check("watch: the inference service by name is SERVING at once",
          next(named).status == SERVING)
    check("watch: a service not served is SERVICE_UNKNOWN", next(unknown).status == SERVICE_UNKNOWN)
    # each has had its first status, which is sent once it is in the list
    check("watch: three open in attn_grpc_health_watches", open_watches(srv) == 3,
          open_watches(srv))
    codes = [cancelled_code(w) for w in (whole, named, unknown)]
    check("watch: the calls were open until cancelled (CANCELLED, not ended by the server)",
          codes == [grpc.StatusCode.CANCELLED] * 3, codes)
    left = watches_drop_to(srv, 0)
    check("watch: cancelled watches leave the server", left == 0, left)
    many = [h.Watch(hpb.HealthCheckRequest(), timeout=120) for _ in range(100)]
    first = [next(w).status for w in many]
    check("watch: 100 at once are each told SERVING", first == [SERVING] * 100,
          sorted(set(first)))
    check("watch: 100 open", open_watches(srv) == 100, open_watches(srv))
    check("watch: Check answers beside 100 watches",
          h.Check(hpb.HealthCheckRequest(), timeout=30).status == SERVING)
    codes = {cancelled_code(w) for w in many}
    check("watch: the 100 cancelled", codes == {grpc.StatusCode.CANCELLED}, codes)
    left = watches_drop_to(srv, 0)
    check("watch: the 100 leave the server", left == 0, left)
    garbage = srv.channel.unary_stream("/grpc.health.v1.Health/Watch")
    code, words = rpc_error(lambda: next(garbage(b"\x0a\xff\xff\xff\xff\x0f", timeout=30)))
    check("watch: a request that is not a HealthCheckRequest is INVALID_ARGUMENT",
          code == grpc.StatusCode.INVALID_ARGUMENT and "HealthCheckRequest" in words,
          (code, words))


def check_watch_limit(srv):
    """At most --max-connections (8 here) watches are open at once: the next is
    RESOURCE_EXHAUSTED naming the flag; when one is cancelled another may open."""
    h = srv.health()
    held = [h.Watch(hpb.HealthCheckRequest(), timeout=120) for _ in range(8)]
    check("watch limit: 8 open", [next(w).status for w in held] == [SERVING] * 8)
    code, words = rpc_error(lambda: next(h.Watch(hpb.HealthCheckRequest(), timeout=30)))
    check("watch limit: the 9th is RESOURCE_EXHAUSTED naming --max-connections",
          code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-connections" in words,
          (code, words))
    cancelled_code(held.pop())
    check("watch limit: a cancelled one leaves", watches_drop_to(srv, 7) == 7)
    again = h.Watch(hpb.HealthCheckRequest(), timeout=120)
    check("watch limit: then another opens", next(again).status == SERVING)
    for w in held + [again]:
        cancelled_code(w)


def check_drain(srv):
    """SIGTERM while a long call computes and an HTTP body is half sent (--shutdown-grace 60):
    a Watch opened before is told NOT_SERVING while the server still answers, the health
    service says NOT_SERVING, ServerReady false, a new inference is UNAVAILABLE; the long
    call cancelled by its client stops, the upload finished is answered, and the Watch ends
    UNAVAILABLE when the server stops.

    The drain lasts while the upload is unfinished, which this test decides: the checks
    above do not depend on how fast the machine computes the long call (on an idle machine
    it had ended, and the drain with it, before the new inference was sent)."""
    s = srv.stub()
    n, d = 32768, 256
    req = infer_request("attention", [("q", "FP32", [n, d], floats(n * d, 1)),
                                      ("k", "FP32", [n, d], floats(n * d, 2)),
                                      ("v", "FP32", [n, d], floats(n * d, 3))], outputs=["output"])
    future = s.ModelInfer.future(req)
    for _ in range(3000):  # until the server holds the call; bounded
        if gauge(srv, "attn_grpc_inflight_calls") == 1 or future.done():
            break
        time.sleep(0.01)
    check("drain: the long call is held", not future.done())
    host, port = srv.base.split("//")[1].rsplit(":", 1)
    upload = socket.create_connection((host, int(port)), timeout=60)
    text = json.dumps({"q": [[1.0]], "k": [[1.0]], "v": [[2.0]]}).encode()
    upload.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % (host.encode(), len(text)) + text[:5])
    for _ in range(3000):  # until the server counts the upload (and this request); bounded
        requests = gauge(srv, "attn_http_inflight_requests")
        if requests is not None and requests >= 2:
            break
        time.sleep(0.01)
    check("drain: the upload is being received", requests is not None and requests >= 2,
          requests)
    h = srv.health()
    watch = h.Watch(hpb.HealthCheckRequest(), timeout=120)
    check("drain: a Watch is told SERVING first", next(watch).status == SERVING)
    srv.proc.terminate()
    # the checks below are answered by the server, so it had not exited when this came
    check("drain: the Watch is told NOT_SERVING", next(watch).status == NOT_SERVING)
    for _ in range(500):  # until the signal is taken; bounded
        status = h.Check(hpb.HealthCheckRequest()).status
        if status != hpb.HealthCheckResponse.SERVING:
            break
        time.sleep(0.01)
    check("drain: Health/Check says NOT_SERVING", status == hpb.HealthCheckResponse.NOT_SERVING,
          status)
    check("drain: ServerReady is false", not s.ServerReady(pb.ServerReadyRequest()).ready)
    code, words = rpc_error(s.ModelInfer, infer_request("attention", SEED))
    check("drain: a new inference is UNAVAILABLE", code == grpc.StatusCode.UNAVAILABLE and
          "shutting down" in words, (code, words))
    future.cancel()
    for _ in range(3000):  # until the server has let the call go; bounded
        calls = gauge(srv, "attn_grpc_inflight_calls")
        if calls == 0:
            break
        time.sleep(0.01)
    check("drain: the long call, cancelled by its client, stops while the server drains",
          calls == 0, calls)
    upload.sendall(text[5:])
    answer = b""
    while b"\r\n\r\n" not in answer:  # the status line and headers; bounded by the timeout
        got = upload.recv(4096)
        if not got:
            break
        answer += got
    upload.close()
    check("drain: the upload finished is answered (200, or 503 while draining)",
          re.match(rb"HTTP/1\.1 (200|503) ", answer) is not None, answer[:60])
    code, rest = grpc.StatusCode.OK, []
    try:
        rest = [m.status for m in watch]
    except grpc.RpcError as e:
        code = e.code()
    check("drain: the Watch ends UNAVAILABLE when the server stops, told nothing more",
          code == grpc.StatusCode.UNAVAILABLE and rest == [], (code, rest))


def check_port_taken(srv):
    """A second server whose --grpc-port is the first's busy port fails to start, naming the
    address, and exits non-zero (no SO_REUSEPORT: it must not take half of the calls)."""
    port = srv.target.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory(prefix="attn-grpc-second-") as tmp:
        try:
            second = subprocess.run(
                [srv.proc.args[0], "--host", "127.0.0.1", "--port", "0", "--grpc-port", port,
                 "--data-dir", os.path.join(tmp, "data")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        except subprocess.TimeoutExpired as e:
            check("port taken: the second server exits", False, e)
            return
    check("port taken: the second server exits non-zero", second.returncode != 0,
          second.returncode)
    check("port taken: the message names the address",
          "127.0.0.1:" + port in second.stderr and "grpc" in second.stderr.lower(), second.stderr)
    check("port taken: the first still answers",
          srv.stub().ServerLive(pb.ServerLiveRequest(), timeout=10).live)


def trace_of(call):
    """(request id, trace id, span id, flags) from a call's initial metadata, or None."""
    md = dict(call.initial_metadata())
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})", md.get("traceresponse", ""))
    return (md.get("x-request-id"),) + m.groups() if m else None


def check_trace(srv):
    """W3C trace context and request ids over gRPC, and one JSON access line per call
    (--log-format json), as HTTP has them."""
    s = srv.stub()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    _, call = s.ServerLive.with_call(pb.ServerLiveRequest(), metadata=[
        ("traceparent", parent), ("tracestate", "congo=t61rcWkgMzE"),
        ("x-request-id", "req-7.a:b_c")])
    t = trace_of(call)
    check("trace: traceparent joins the caller's trace with a span of the server's",
          t is not None and t[1] == "4bf92f3577b34da6a3ce929d0e0e4736" and
          t[2] != "00f067aa0ba902b7" and t[3] == "01", t)
    check("trace: a usable x-request-id is echoed", t is not None and t[0] == "req-7.a:b_c", t)
    _, call = s.ServerLive.with_call(pb.ServerLiveRequest(), metadata=[
        ("traceparent", "00-zz-00f067aa0ba902b7-01"), ("x-request-id", "bad id with spaces")])
    t2 = trace_of(call)
    check("trace: a malformed traceparent starts a new trace, and the call is served",
          t2 is not None and t2[1] != t[1] and t2[3] == "00", t2)
    check("trace: an unusable x-request-id is replaced by a new one",
          t2 is not None and re.fullmatch(r"[0-9a-f]{32}", t2[0] or ""), t2)
    answer, call = s.ModelInfer.with_call(infer_request("attention", SEED, ["output"]))
    plain = trace_of(call)
    code, _ = rpc_error(s.ModelInfer, infer_request("no-such-model", SEED))
    # calls at once: each has ids of its own
    futures = [s.ModelInfer.future(infer_request("attention", SEED, ["output"]))
               for _ in range(16)]
    ids = [trace_of(f) for f in futures if f.result(timeout=60) is not None]
    check("trace: 16 concurrent calls, 16 request ids, trace ids and span ids",
          len(ids) == 16 and all(ids) and all(len({i[k] for i in ids}) == 16 for k in (0, 1, 2)),
          ids[:2])
    lines = [json.loads(l) for l in srv.log().splitlines() if l.startswith("{")]
    by_id = {}
    for line in lines:
        by_id.setdefault(line.get("request_id"), []).append(line)
    live = by_id.get("req-7.a:b_c", [])
    check("trace: one JSON line for the call, with its ids, parent and tracestate",
          len(live) == 1 and live[0]["trace_id"] == t[1] and live[0]["span_id"] == t[2] and
          live[0]["parent_id"] == "00f067aa0ba902b7" and
          live[0]["tracestate"] == "congo=t61rcWkgMzE" and live[0]["protocol"] == "grpc" and
          live[0]["method"] == "ServerLive" and
          live[0]["path"] == "/inference.GRPCInferenceService/ServerLive", live)
    infer = by_id.get(plain[0] if plain else None, [])
    fields = ("time", "request_id", "trace_id", "span_id", "method", "route", "path", "model",
              "status", "grpc_status", "bytes_in", "bytes_out", "duration_ms", "phases_ms",
              "client", "served")
    check("trace: ModelInfer's line has HTTP's fields, its route and phases",
          len(infer) == 1 and all(f in infer[0] for f in fields) and
          infer[0]["route"] == "/v2/models/{model}/infer" and infer[0]["model"] == "attention" and
          infer[0]["status"] == 200 and infer[0]["grpc_status"] == 0 and
          infer[0]["client"] == "127.0.0.1" and
          {"read", "parse", "compute", "encode"} <= set(infer[0]["phases_ms"]), infer)
    failed = [l for l in lines if l.get("grpc_status") == 5]
    check("trace: a failed call's line has its gRPC code and its HTTP twin's status",
          code == grpc.StatusCode.NOT_FOUND and len(failed) == 1 and failed[0]["status"] == 404,
          (code, failed))
    check("trace: every ModelInfer of the concurrent calls has one line",
          all(len(by_id.get(i[0], [])) == 1 for i in ids), len(lines))
    check("trace: only JSON lines on stderr",
          not [l for l in srv.log().splitlines() if l.startswith("access")])


def check_trace_text(srv):
    """The text access line of a gRPC call names its request and trace ids."""
    _, call = srv.stub().ServerLive.with_call(pb.ServerLiveRequest())
    t = trace_of(call)
    line = [l for l in srv.log().splitlines()
            if t is not None and (" id=%s " % t[0]) in l]
    check("trace: the text line has id= and trace=", len(line) == 1 and
          line[0].startswith("access grpc ServerLive status=0 ") and
          line[0].endswith(" trace=%s" % t[1]), line)


def check_tls(binary):
    with tempfile.TemporaryDirectory(prefix="attn-grpc-tls-") as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(cert, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())

        def tls_checks(srv):
            answer = srv.stub(creds).ModelInfer(infer_request("attention", SEED))
            check("TLS: ModelInfer over grpcs with --tls-cert", len(answer.outputs) == 2)
            plain = grpc.insecure_channel(srv.target)
            code, _ = rpc_error(pg.GRPCInferenceServiceStub(plain).ServerLive,
                                pb.ServerLiveRequest(), timeout=5)
            plain.close()
            check("TLS: a plaintext client is refused", code != grpc.StatusCode.OK, code)
        harness.run(binary, [harness.named("check_tls", tls_checks)], "--tls-cert", cert,
                    "--tls-key", key, server_class=GrpcServer)


def main():
    args = harness.arguments(__doc__)
    harness.run(args.server, [check_every_rpc, check_same_answers, check_bad_inputs,
                              check_decoder_bounds, check_half_inputs, check_output_datatype,
                              check_statistics, check_stream, check_port_taken, check_watch,
                              check_trace_text],
                server_class=GrpcServer)
    harness.run(args.server, [check_trace], "--log-format", "json", server_class=GrpcServer)
    harness.run(args.server, [check_watch_limit], "--max-connections", "8",
                server_class=GrpcServer)
    harness.run(args.server, [check_limits], "--max-elements", "4096", "--max-body", "1M",
                server_class=GrpcServer)
    harness.run(args.server, [check_auth], "--auth-all", "--auth-tokens", TOKEN,
                server_class=GrpcServer)
    harness.run(args.server, [check_cancel], "--max-inflight", "1", server_class=GrpcServer)
    harness.run(args.server, [check_drain], "--shutdown-grace", "60", "--min-body-rate", "0",
                "--max-body", "256M",
                server_class=GrpcServer)
    if harness.FILTER is None or harness.FILTER in "check_tls":
        check_tls(args.server)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
