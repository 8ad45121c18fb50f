#!/usr/bin/python3
"""Compressed bodies, in and out, end to end.

Starts the server on a free loopback port (stopped by its PID) and checks:
gzip, deflate (zlib) and raw deflate request bodies answer as the same
request sent plain; an unknown Content-Encoding is 415; a damaged or cut
short body is 400; a gzip bomb is 413 with the server's peak memory barely
moved; answers of v1, v2 and the /viz files are compressed when
Accept-Encoding asks and they are over 1 KB, with Vary: Accept-Encoding, and
decompress to the plain answer, made by a worker as by the I/O thread; a binary answer
of float weights past 64 KiB, which would barely shrink, is sent uncompressed.

Usage: compression_test.py --server PATH [--filter SUBSTR] (only the check
functions whose name contains SUBSTR).  Prints "ok NAME" or "FAIL NAME"
per check and "N passed, N failed" last.
"""
import gzip
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402



class Server(harness.Server):
    def peak_rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0


def attention_request(n, d):
    x = [[((i * 7 + j * 3) % 11) / 10.0 - 0.5 for j in range(d)] for i in range(n)]
    return json.dumps({"q": x, "k": x, "v": x}).encode()


def output_of(body):
    return json.loads(body)["output"]


def check_request_bodies(srv):
    body = attention_request(64, 16)
    status, plain, _ = srv.request("POST", "/v1/attention", body)
    check("plain request", status == 200, plain[:200])
    raw = zlib.compressobj(wbits=-15)
    codings = {"gzip": gzip.compress(body), "deflate": zlib.compress(body),
               "deflate (raw)": raw.compress(body) + raw.flush()}
    for name, data in codings.items():
        status, answer, _ = srv.request("POST", "/v1/attention", data, {
            "Content-Encoding": name.split()[0], "Content-Type": "application/json"})
        check(name + " request answers as plain", status == 200 and
              output_of(answer) == output_of(plain), answer[:200])
    status, answer, _ = srv.request("POST", "/v1/attention", body, {"Content-Encoding": "br"})
    err = json.loads(answer).get("error", {}) if answer else {}
    check("unknown Content-Encoding is 415", status == 415 and
          err.get("code") == "unsupported_encoding", answer[:200])
    # RFC 1952: a gzip file is a series of members (cat a.gz b.gz, or Python's gzip in
    # append mode); the body is all of them, one after the other.
    cut = len(body) // 3
    members = gzip.compress(body[:cut]) + gzip.compress(body[cut:])
    status, answer, _ = srv.request("POST", "/v1/attention", members, {"Content-Encoding": "gzip"})
    check("multi-member gzip request answers as plain", status == 200 and
          output_of(answer) == output_of(plain), (status, answer[:200]))
    status, answer, _ = srv.request("POST", "/v1/attention", members + b"junk",
                                    {"Content-Encoding": "gzip"})
    err = json.loads(answer).get("error", {}) if answer else {}
    check("garbage after the last gzip member is 400", status == 400 and
          err.get("code") == "invalid_encoding", (status, answer[:200]))
    status, answer, _ = srv.request("POST", "/v1/attention", members[:-3],
                                    {"Content-Encoding": "gzip"})
    err = json.loads(answer).get("error", {}) if answer else {}
    check("a cut second gzip member is 400", status == 400 and
          err.get("code") == "invalid_encoding", (status, answer[:200]))
    z = gzip.compress(body)
    for name, data in (("damaged", z[:20] + bytes(b ^ 0x5a for b in z[20:40]) + z[40:]),
                       ("cut short", z[:len(z) // 2])):
        status, answer, _ = srv.request("POST", "/v1/attention", data, {"Content-Encoding": "gzip"})
        err = json.loads(answer).get("error", {}) if answer else {}
        check(name + " gzip body is 400", status == 400 and err.get("code") == "invalid_encoding",
              (status, answer[:200]))


def check_bomb(srv):
    """256 MiB of zeros in a gzip body of about 250 KiB, against --max-body 1 MiB."""
    before = srv.peak_rss_kib()
    bomb = gzip.compress(b"0" * (256 << 20), compresslevel=9)
    status, answer, _ = srv.request("PUT", "/v1/weight-sets/bomb", bomb,
                                    {"Content-Encoding": "gzip"})
    grown = srv.peak_rss_kib() - before
    err = json.loads(answer).get("error", {}) if answer else {}
    check("gzip bomb is 413", status == 413 and err.get("code") == "body_too_large",
          (status, answer[:200]))
    check("gzip bomb leaves peak memory within 32 MiB", grown < 32 * 1024,
          "peak RSS grew by %d KiB" % grown)
    check("server serves after the bomb", srv.request("GET", "/healthz")[0] == 200)


def check_answers(srv):
    body = attention_request(64, 16)
    _, plain, plain_headers = srv.request("POST", "/v1/attention", body)
    check("plain answer varies with Accept-Encoding",
          "Accept-Encoding" in (plain_headers.get("Vary") or ""), plain_headers)
    for coding, decode in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        status, z, headers = srv.request("POST", "/v1/attention", body,
                                         {"Accept-Encoding": coding})
        ok = status == 200 and headers.get("Content-Encoding") == coding and \
            "Accept-Encoding" in headers.get("Vary", "") and len(z) < len(plain)
        check("v1 answer in " + coding, ok and output_of(decode(z)) == output_of(plain), headers)
    status, small, headers = srv.request("GET", "/healthz", None, {"Accept-Encoding": "gzip"})
    check("a small answer is not compressed", status == 200 and
          headers.get("Content-Encoding") is None and json.loads(small)["status"] == "ok")
    _, page, _ = srv.request("GET", "/viz/viz.js")
    status, z, headers = srv.request("GET", "/viz/viz.js", None, {"Accept-Encoding": "gzip, br"})
    check("/viz file in gzip", status == 200 and headers.get("Content-Encoding") == "gzip" and
          gzip.decompress(z) == page, headers)
    x = [float(i % 13) / 13 for i in range(64 * 8)]
    infer = json.dumps({"inputs": [
        {"name": n, "shape": [64, 8], "datatype": "FP64", "data": x} for n in "qkv"]}).encode()
    _, plain, _ = srv.request("POST", "/v2/models/attention/infer", infer)
    status, z, headers = srv.request("POST", "/v2/models/attention/infer", infer,
                                     {"Accept-Encoding": "deflate"})
    check("v2 answer in deflate", status == 200 and headers.get("Content-Encoding") == "deflate"
          and json.loads(zlib.decompress(z))["outputs"] == json.loads(plain)["outputs"], headers)


def worker_dispatches(srv):
    """attn_http_dispatch_total{path="worker"} of /metrics: requests a worker answered."""
    _, text, _ = srv.request("GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith('attn_http_dispatch_total{path="worker"}'):
            return int(float(line.split()[-1]))
    return -1


def check_worker_answers(srv):
    """An answer a worker made is compressed by that worker (http_answer_encode), not by the
    I/O thread that sends it: the same headers and bytes as an answer made on the I/O thread.
    A 512 x 64 attention is too much work for the I/O thread, and a weight set's GET always
    goes to a worker; /metrics confirms both were a worker's."""
    body = attention_request(512, 64)
    _, plain, _ = srv.request("POST", "/v1/attention", body)
    before = worker_dispatches(srv)
    status, z, headers = srv.request("POST", "/v1/attention", body, {"Accept-Encoding": "gzip"})
    check("a worker's attention answer in gzip", status == 200 and
          headers.get("Content-Encoding") == "gzip" and
          "Accept-Encoding" in headers.get("Vary", "") and
          output_of(gzip.decompress(z)) == output_of(plain) and
          worker_dispatches(srv) == before + 1, (status, dict(headers), before))
    # Past compress.h's COMPRESS_SPLIT_FROM (1 MiB) an answer is deflated in two halves at
    # once: Python's own gzip and zlib must read the stream as one, check values and all.
    big = json.loads(body)
    big["return_attention"] = True
    big = json.dumps(big).encode()
    _, plain, _ = srv.request("POST", "/v1/attention", big)
    for coding, decode in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        status, z, headers = srv.request("POST", "/v1/attention", big,
                                         {"Accept-Encoding": coding})
        ok = status == 200 and headers.get("Content-Encoding") == coding and len(plain) > 2 << 20
        try:
            got = json.loads(decode(z)) if ok else {}
        except (OSError, zlib.error, ValueError) as e:  # a bad stream or check value
            got = {"error": str(e)}
        want = json.loads(plain)
        check("a %d-byte answer in %s, deflated in two halves" % (len(plain), coding),
              ok and got.get("output") == want["output"] and
              got.get("attention") == want["attention"], (status, dict(headers), got.get("error")))
    w = [[((i * 5 + j) % 9) / 8.0 for j in range(32)] for i in range(32)]
    status, _, _ = srv.request("PUT", "/v1/weight-sets/zipped",
                               json.dumps({"wq": w, "wk": w, "wv": w}).encode())
    _, plain, _ = srv.request("GET", "/v1/weight-sets/zipped")
    before = worker_dispatches(srv)
    got, z, headers = srv.request("GET", "/v1/weight-sets/zipped", None,
                                  {"Accept-Encoding": "deflate"})
    check("a weight set's GET in deflate", status == 201 and got == 200 and
          headers.get("Content-Encoding") == "deflate" and zlib.decompress(z) == plain and
          len(z) < len(plain) and worker_dispatches(srv) == before + 1,
          (status, got, dict(headers), before))


def check_incompressible_answer(srv):
    """A binary v2 answer of float32 weights from random inputs barely shrinks: past 64 KiB
    it goes uncompressed whatever Accept-Encoding says (compress.c samples its start),
    while a JSON answer past 64 KiB is still compressed."""
    import random
    rng = random.Random(7)
    n, d = 256, 16
    data = [rng.uniform(-3, 3) for _ in range(n * d)]
    header = json.dumps({"inputs": [
        {"name": name, "shape": [n, d], "datatype": "FP32", "data": data} for name in "qkv"],
        "outputs": [{"name": "attention", "parameters": {"binary_data": True}}]}).encode()
    _, plain, plain_headers = srv.request("POST", "/v2/models/attention/infer", header)
    status, got, headers = srv.request("POST", "/v2/models/attention/infer", header,
                                       {"Accept-Encoding": "gzip"})
    # the weights after the JSON header (whose compute_ms differs from run to run)
    weights = lambda body, h: body[int(h.get("Inference-Header-Content-Length") or 0):]
    check("binary float answer past 64 KiB goes uncompressed", status == 200 and
          len(plain) > 65536 and headers.get("Content-Encoding") is None and
          weights(got, headers) == weights(plain, plain_headers) and
          "Accept-Encoding" in headers.get("Vary", ""),
          (status, len(plain), headers.get("Content-Encoding")))
    body = attention_request(128, 16)
    _, plain, _ = srv.request("POST", "/v1/attention", body)
    status, z, headers = srv.request("POST", "/v1/attention", body, {"Accept-Encoding": "gzip"})
    check("JSON answer past 64 KiB is compressed", status == 200 and len(plain) > 65536 and
          headers.get("Content-Encoding") == "gzip" and
          output_of(gzip.decompress(z)) == output_of(plain),
          (status, len(plain), headers.get("Content-Encoding")))


def main():
    args = harness.arguments(__doc__)
    harness.run(args.server, [check_request_bodies, check_answers, check_worker_answers,
                              check_incompressible_answer],
                server_class=Server)
    harness.run(args.server, [check_bomb], "--max-body", "1048576", server_class=Server)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
