"""numpy_server.py - the competing service: POST /v1/attention in Python's http.server and NumPy.

This is what a notebook turned into a service looks like: the standard library's threading HTTP
server, json for the bodies, npattn.sdpa for the math. bench_http.sh starts it beside the C
server and sends both the same requests. It understands the part of the contract the benchmark
sends (q/k/v or x with inline weights, heads, causal, mask, scale, dtype, return_attention) and
answers {"output", "attention"} in the contract's shapes; it is a baseline, not a second server.

Usage: python3 numpy_server.py [--port N]   (loopback only; --port 0, the default, picks a free
port). Prints "listening on http://127.0.0.1:PORT" on stdout once it accepts connections.
"""

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npattn  # noqa: E402


def attention(body):
    dtype = np.float32 if body.get("dtype") == "float32" else np.float64
    if "x" in body:
        w = body["weights"]
        x = np.asarray(body["x"], dtype=dtype)
        ctx = np.asarray(body["context"], dtype=dtype) if "context" in body else x
        q = npattn.project(x, w["wq"], w.get("bq"), dtype)
        k = npattn.project(ctx, w["wk"], w.get("bk"), dtype)
        v = npattn.project(ctx, w["wv"], w.get("bv"), dtype)
    else:
        q, k, v = body["q"], body["k"], body["v"]
        w = {}
    want_attention = body.get("return_attention", True)
    out, attn = npattn.sdpa(q, k, v, heads=body.get("heads"), causal=body.get("causal", False),
                            mask=body.get("mask"), scale=body.get("scale"), dtype=dtype,
                            return_attention=want_attention)
    if "wo" in w:
        out = npattn.project(out, w["wo"], w.get("bo"), dtype)
    answer = {"output": out.tolist()}
    if want_attention:
        answer["attention"] = attn.tolist()
    return answer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the C server offers
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle and delayed ACKs
    # would add about 40 ms to every answer and make the baseline look worse than it is.
    disable_nagle_algorithm = True

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        if self.path != "/v1/attention":
            self._send(404, {"error": {"code": "not_found", "message": self.path}})
            return
        try:
            answer = attention(json.loads(body))
        except (ValueError, KeyError, TypeError) as e:
            self._send(400, {"error": {"code": "bad_request", "message": str(e)}})
            return
        self._send(200, answer)

    def log_message(self, format, *args):  # no access log
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
