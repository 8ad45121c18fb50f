#!/usr/bin/python3
"""Sequences through the compose balancer: each sequence must live on one replica, and the
loss of a replica must show as sequence_unknown, never as other numbers.

The balancer hashes the header X-Sequence-Id (gRPC: the metadata x-sequence-id) onto its
replicas (docker/balancer/replicas.conf).  This helper runs HTTP_SEQUENCES sequences over HTTP
v2 JSON with the header and GRPC_SEQUENCES over gRPC ModelStreamInfer streams (one stream a
sequence, its metadata naming the id), STEPS steps each: a start with a prompt of PROMPT
keys and as many queries, then one query and one key a step, d = D, FP64.  Every answer's
output and length are compared with a NumPy float64 reference that recomputes the whole
prefix (bottom-right causal, scale 1/sqrt(D)).  Each answer names the replica that gave it
(X-Upstream, which nginx adds to HTTP answers and to gRPC's initial metadata).

Then it kills (SIGKILL, through the container engine, as the compose suite kills a replica)
the replica that holds the most sequences (one that holds a gRPC sequence, if one does),
and checks that the next two steps of each of its sequences answer sequence_unknown (HTTP
400 naming parameters.sequence_id; gRPC: the stream breaks, and a new stream's step answers
the error), never a 200; that the other sequences go on, right, for AFTER_STEPS steps and
an end; and that a lost sequence started again under a new id with its whole prefix
answers right (what docs/deployment.md tells clients to do).

Usage: seq_route.py HTTP_URL GRPC_HOST:PORT ENGINE IP=CONTAINER...  (the replicas' addresses
and container ids).  Prints "RESULT NAME ok" or "RESULT NAME FAIL why" for each check named in
CHECKS, with what it saw before; exits 0 when every check passed.  Every call has a timeout,
every loop a count, and the whole run a DEADLINE.
"""
import concurrent.futures
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import grpc  # Debian's python3-grpcio
import numpy as np  # Debian's python3-numpy

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
HTTP_SEQUENCES = 20
GRPC_SEQUENCES = 6
STEPS = 50
AFTER_STEPS = 3
PROMPT = 4
D = 8
TOLERANCE = 1e-9
CALL_TIMEOUT = 20
DEADLINE = 150
CHECKS = ("http-steps", "grpc-steps", "one-replica-each", "killed-unknown", "survivors-go-on",
          "start-again")
UNKNOWN_WORDS = "holds no sequence"

started = time.monotonic()


def time_left():
    return DEADLINE - (time.monotonic() - started)


class Sequence:
    """One sequence's keys, values and queries so far, and what the replicas answered."""

    def __init__(self, seq_id, seed):
        self.id = seq_id
        self.rng = np.random.default_rng(seed)
        self.k = np.zeros((0, D))
        self.v = np.zeros((0, D))
        self.upstreams = set()
        self.errors = []

    def next_step(self, rows):
        """Draws the step's rows (q, k, v), without adding them yet: a refused step leaves
        the sequence as it was."""
        return tuple(self.rng.standard_normal((rows, D)) for _ in range(3))

    def expect(self, q, k, v):
        """The reference answer of a step whose keys k, v join the cache: (output, n)."""
        keys = np.vstack([self.k, k])
        values = np.vstack([self.v, v])
        n, m = len(keys), len(q)
        scores = q @ keys.T / np.sqrt(D)
        for i in range(m):
            scores[i, n - m + i + 1:] = -np.inf
        scores -= scores.max(axis=1, keepdims=True)
        w = np.exp(scores)
        w /= w.sum(axis=1, keepdims=True)
        return w @ values, n

    def commit(self, k, v):
        self.k = np.vstack([self.k, k])
        self.v = np.vstack([self.v, v])

    def check(self, q, k, v, output, length, where):
        """True when the answer equals the reference; otherwise records why."""
        want, n = self.expect(q, k, v)
        if length != n:
            self.errors.append(f"{where}: length {length}, want {n}")
            return False
        if output.shape != want.shape or not np.allclose(output, want, rtol=0, atol=TOLERANCE):
            self.errors.append(f"{where}: output differs from the reference by "
                               f"{np.max(np.abs(output - want)) if output.shape == want.shape else output.shape}")
            return False
        return True


def last_upstream(value):
    """The replica that answered: the last of nginx's comma-separated list of tries."""
    return value.split(",")[-1].strip().rsplit(":", 1)[0] if value else "?"


# --- HTTP v2 JSON -------------------------------------------------------------------------

def http_step(url, seq, q, k, v, start=False, end=False, seq_id=None):
    """Sends one step; returns (status, body, upstream)."""
    sid = seq.id if seq_id is None else seq_id
    body = {
        "inputs": [{"name": name, "shape": list(a.shape), "datatype": "FP64",
                    "data": a.ravel().tolist()} for name, a in (("q", q), ("k", k), ("v", v))],
        "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
        "outputs": [{"name": "output"}, {"name": "length"}],
    }
    req = urllib.request.Request(url + "/v2/models/attention/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "X-Sequence-Id": str(sid)})
    try:
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT) as r:
            return r.status, r.read(), last_upstream(r.headers.get("X-Upstream"))
    except urllib.error.HTTPError as e:
        return e.code, e.read(), last_upstream(e.headers.get("X-Upstream"))
    except OSError as e:
        return 0, str(e).encode(), "?"


def http_answer(body):
    """(output, length) of a 200 answer."""
    outs = {o["name"]: o for o in json.loads(body)["outputs"]}
    out = outs["output"]
    return np.array(out["data"], dtype=np.float64).reshape(out["shape"]), int(outs["length"]["data"][0])


def http_run_step(url, seq, rows, where, start=False, end=False):
    """One step that must answer right; True when it did (then the keys join the sequence)."""
    q, k, v = seq.next_step(rows)
    status, body, upstream = http_step(url, seq, q, k, v, start=start, end=end)
    seq.upstreams.add(upstream)
    if status != 200:
        seq.errors.append(f"{where}: HTTP {status} {body[:200]!r}")
        return False
    output, length = http_answer(body)
    if not seq.check(q, k, v, output, length, where):
        return False
    seq.commit(k, v)
    return True


# --- gRPC streams ---------------------------------------------------------------------------

class Stream:
    """A ModelStreamInfer call for one sequence, its metadata naming the id.  step() puts one
    request and waits (bounded) for its answer, read by a thread of its own."""

    def __init__(self, stub, pb, seq):
        self.pb, self.seq = pb, seq
        self.requests = queue.Queue()
        self.answers = queue.Queue()
        self.call = stub.ModelStreamInfer(iter(self.requests.get, None), timeout=DEADLINE,
                                          metadata=(("x-sequence-id", str(seq.id)),))
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        try:
            for answer in self.call:
                self.answers.put(answer)
            self.answers.put(RuntimeError("the stream ended"))
        except grpc.RpcError as e:
            self.answers.put(e)

    def upstream(self):
        for key, value in self.call.initial_metadata() or ():
            if key == "x-upstream":
                return last_upstream(value)
        return "?"

    def close(self):
        self.requests.put(None)
        self.call.cancel()

    def step(self, q, k, v, start=False, end=False):
        """Returns the ModelStreamInferResponse, or the exception the stream ended with."""
        pb = self.pb
        req = pb.ModelInferRequest(model_name="attention")
        req.parameters["sequence_id"].string_param = str(self.seq.id)
        req.parameters["sequence_start"].bool_param = start
        req.parameters["sequence_end"].bool_param = end
        for name, a in (("q", q), ("k", k), ("v", v)):
            req.inputs.add(name=name, datatype="FP64", shape=list(a.shape))
            req.raw_input_contents.append(a.astype("<f8").tobytes())
        req.outputs.add(name="output")
        req.outputs.add(name="length")
        self.requests.put(req)
        try:
            return self.answers.get(timeout=CALL_TIMEOUT)
        except queue.Empty:
            return TimeoutError(f"no answer in {CALL_TIMEOUT} s")


def grpc_answer(answer):
    """(output, length) of a stream's response."""
    r = answer.infer_response
    by_name = {o.name: i for i, o in enumerate(r.outputs)}
    i, j = by_name["output"], by_name["length"]
    output = np.frombuffer(r.raw_output_contents[i], dtype="<f8").reshape(list(r.outputs[i].shape))
    return output, int(np.frombuffer(r.raw_output_contents[j], dtype="<i8")[0])


def grpc_run_step(stream, rows, where, start=False, end=False):
    seq = stream.seq
    q, k, v = seq.next_step(rows)
    answer = stream.step(q, k, v, start=start, end=end)
    if isinstance(answer, Exception) or answer.error_message:
        seq.errors.append(f"{where}: {answer if isinstance(answer, Exception) else answer.error_message}")
        return False
    seq.upstreams.add(stream.upstream())
    output, length = grpc_answer(answer)
    if not seq.check(q, k, v, output, length, where):
        return False
    seq.commit(k, v)
    return True


# --- the run --------------------------------------------------------------------------------

def load_stubs(folder):
    subprocess.run(["protoc", "-I" + os.path.join(ROOT, "api", "grpc"),
                    "--python_out=" + folder, "--grpc_python_out=" + folder,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.join(ROOT, "api", "grpc", "inference.proto")], check=True)
    sys.path.insert(0, folder)
    import inference_pb2 as pb
    import inference_pb2_grpc as pg
    return pb, pg


def main():
    url, target, engine = sys.argv[1], sys.argv[2], sys.argv[3]
    containers = dict(arg.split("=", 1) for arg in sys.argv[4:])
    results = {}
    with tempfile.TemporaryDirectory(prefix="attn-seq-route-") as stubs:
        pb, pg = load_stubs(stubs)
        channel = grpc.insecure_channel(target)
        stub = pg.GRPCInferenceServiceStub(channel)
        http_seqs = [Sequence(101 + i, 1000 + i) for i in range(HTTP_SEQUENCES)]
        grpc_seqs = [Sequence(f"g{i + 1}", 2000 + i) for i in range(GRPC_SEQUENCES)]
        streams = [Stream(stub, pb, s) for s in grpc_seqs]
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)

        def round_of(http_fn, grpc_fn):
            jobs = [pool.submit(http_fn, s) for s in http_seqs] + \
                   [pool.submit(grpc_fn, st) for st in streams]
            return [j.result(timeout=max(time_left(), 1)) for j in jobs]

        # 50 steps, every sequence in step with the others.
        t0 = time.monotonic()
        ok_http = ok_grpc = True
        for step in range(STEPS):
            if time_left() < 40:
                print(f"out of time at step {step}")
                ok_http = ok_grpc = False
                break
            rows = PROMPT if step == 0 else 1
            got = round_of(lambda s: http_run_step(url, s, rows, f"step {step}", start=step == 0),
                           lambda st: grpc_run_step(st, rows, f"step {step}", start=step == 0))
            ok_http &= all(got[:HTTP_SEQUENCES])
            ok_grpc &= all(got[HTTP_SEQUENCES:])
            if not (ok_http and ok_grpc):
                break
        print(f"{HTTP_SEQUENCES} HTTP and {GRPC_SEQUENCES} gRPC sequences x {STEPS} steps in "
              f"{time.monotonic() - t0:.1f} s")
        bad = [f"{s.id}: {s.errors[0]}" for s in http_seqs if s.errors]
        results["http-steps"] = "ok" if ok_http and not bad else f"FAIL {len(bad)} sequences went wrong, e.g. {bad[:1]}"
        bad = [f"{s.id}: {s.errors[0]}" for s in grpc_seqs if s.errors]
        results["grpc-steps"] = "ok" if ok_grpc and not bad else f"FAIL {len(bad)} sequences went wrong, e.g. {bad[:1]}"

        # Each sequence on one replica, and the sequences on more than one replica.
        place = {}
        for s in http_seqs + grpc_seqs:
            place.setdefault(",".join(sorted(s.upstreams)), []).append(s)
        print("sequences by replica: " + ", ".join(f"{k}: {len(v)}" for k, v in sorted(place.items())))
        split = [s.id for s in http_seqs + grpc_seqs if len(s.upstreams) != 1 or "?" in s.upstreams]
        homes = {next(iter(s.upstreams)) for s in http_seqs + grpc_seqs if len(s.upstreams) == 1}
        results["one-replica-each"] = ("ok" if not split and len(homes) >= 2 and homes <= set(containers)
                                       else f"FAIL sequences answered by several replicas or none: {split[:3]}; "
                                            f"replicas holding sequences: {sorted(homes)}")
        if any(r != "ok" for r in results.values()):
            return report(results)

        # Kill the replica holding the most sequences, one over gRPC among them if any does.
        victim = max(homes, key=lambda ip: (any(isinstance(s.id, str) for s in place.get(ip, [])),
                                            len(place.get(ip, []))))
        lost = [s for s in http_seqs + grpc_seqs if victim in s.upstreams]
        kept = [s for s in http_seqs + grpc_seqs if victim not in s.upstreams]
        t0 = time.monotonic()
        subprocess.run([engine, "kill", "--signal", "KILL", containers[victim]], timeout=30,
                       stdout=subprocess.DEVNULL, check=True)
        subprocess.run([engine, "wait", containers[victim]], timeout=30, stdout=subprocess.DEVNULL)
        print(f"killed {victim} ({containers[victim][:12]}), which held {len(lost)} sequences "
              f"({sum(isinstance(s.id, str) for s in lost)} over gRPC), in {time.monotonic() - t0:.1f} s")

        # The lost sequences: twice sequence_unknown, never a 200.
        t0 = time.monotonic()
        unknown_bad = []

        def expect_unknown_http(s):
            for attempt in range(2):
                q, k, v = s.next_step(1)
                status, body, _ = http_step(url, s, q, k, v)
                if status != 400 or UNKNOWN_WORDS.encode() not in body or b"parameters.sequence_id" not in body:
                    unknown_bad.append(f"{s.id} step {attempt + 1} after the kill: HTTP {status} {body[:160]!r}")

        def expect_unknown_grpc(stream):
            s = stream.seq
            answer = stream.step(*s.next_step(1))
            if not isinstance(answer, Exception) and not answer.error_message:
                unknown_bad.append(f"{s.id}: its stream answered a step after its replica died")
            stream.close()
            fresh = Stream(stub, pb, s)
            for attempt in range(2):
                answer = fresh.step(*s.next_step(1))
                if isinstance(answer, Exception) or UNKNOWN_WORDS not in answer.error_message:
                    unknown_bad.append(f"{s.id} new stream step {attempt + 1}: {answer!r}"[:240])
            fresh.close()

        def survivor_http(s):
            return all(http_run_step(url, s, 1, f"step {STEPS + i} after the kill", end=i == AFTER_STEPS - 1)
                       for i in range(AFTER_STEPS))

        def survivor_grpc(stream):
            return all(grpc_run_step(stream, 1, f"step {STEPS + i} after the kill", end=i == AFTER_STEPS - 1)
                       for i in range(AFTER_STEPS))

        jobs = []
        for s in http_seqs:
            jobs.append(pool.submit(expect_unknown_http if s in lost else survivor_http, s))
        for st in streams:
            jobs.append(pool.submit(expect_unknown_grpc if st.seq in lost else survivor_grpc, st))
        for j in jobs:
            j.result(timeout=max(time_left(), 1))
        print(f"the steps after the kill in {time.monotonic() - t0:.1f} s")
        results["killed-unknown"] = "ok" if not unknown_bad else f"FAIL {unknown_bad[0]} ({len(unknown_bad)} in all)"
        bad = [f"{s.id}: {s.errors[0]}" for s in kept if s.errors]
        results["survivors-go-on"] = "ok" if not bad else f"FAIL {len(bad)} of {len(kept)}, e.g. {bad[0]}"

        # A lost HTTP sequence started again under a new id, with its whole prefix.
        again_bad = []
        for s in (s for s in http_seqs if s in lost):
            q = s.rng.standard_normal((1, D))
            k, v = s.k, s.v
            s.k, s.v = np.zeros((0, D)), np.zeros((0, D))
            status, body, _ = http_step(url, s, q, k, v, start=True, end=True, seq_id=s.id + 1000)
            if status != 200:
                again_bad.append(f"{s.id + 1000}: HTTP {status} {body[:160]!r}")
            elif not s.check(q, k, v, *http_answer(body), "started again"):
                again_bad.append(f"{s.id + 1000}: {s.errors[-1]}")
        results["start-again"] = "ok" if not again_bad else f"FAIL {again_bad[0]}"
        for st in streams:
            st.close()
        pool.shutdown(wait=False, cancel_futures=True)
        channel.close()
    return report(results)


def report(results):
    for name in CHECKS:
        print(f"RESULT {name} {results.get(name, 'FAIL not reached')}")
    return 0 if all(results.get(name) == "ok" for name in CHECKS) else 1


if __name__ == "__main__":
    sys.exit(main())
