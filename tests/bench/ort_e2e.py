"""ort_e2e.py - the end-to-end row of bench_ort.sh: the q, k, v of a bench-kernel check file sent
as one binary v2 request (FP32 bytes, output only, asked in binary), and the answer checked.

  python3 ort_e2e.py body CHECK N D OUT     writes OUT (the request) and OUT.hlen (its JSON
                                            header's length), q, k, v of N x D from CHECK
  python3 ort_e2e.py check CHECK N D ANSWER ANSWER.headers
                                            exit 0 when the answer's output agrees with the
                                            kernel's in CHECK (1e-4 of the largest), else 1
  python3 ort_e2e.py post URL BODY MIN MOST BUDGET
                                            posts BODY (written by `body`) on one keep-alive
                                            connection, back to back, at least MIN and at most
                                            MOST times, stopping once BUDGET seconds are spent;
                                            prints each request's seconds, one a line

CHECK is raw little-endian doubles: q, k, v, output (bench_kernel.c's check file).
"""

import http.client
import os
import sys
import time
import urllib.parse

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import load_v2_binary  # noqa: E402
from make_bodies import write_v2_binary  # noqa: E402

TOLERANCE = 1e-4


def arrays(check, n, d):
    a = np.fromfile(check, dtype="<f8", count=4 * n * d)
    return [a[i * n * d:(i + 1) * n * d].reshape(n, d) for i in range(4)]


def body(check, n, d, out):
    q, k, v, _ = arrays(check, n, d)
    write_v2_binary(out, {"q": q, "k": k, "v": v}, datatype="FP32", outputs=("output",))


def check(path, n, d, answer, headers):
    expected = arrays(path, n, d)[3]
    got = load_v2_binary(answer, headers).get("output")
    if got is None or got.shape != expected.shape:
        print("ort_e2e: the answer has no output of the right shape", file=sys.stderr)
        return 1
    diff = float(np.abs(got - expected).max())
    scale = float(np.abs(expected).max())
    print(f"max |server - kernel| {diff:.3g} of max {scale:.3g}")
    return 0 if diff <= TOLERANCE * scale else 1


def post(url, body_path, least, most, budget):
    """The requests of a client that keeps its connection and sends the next request when the
    answer is in, as the kernel's own timing runs its repetitions back to back: no idle time
    between requests for the CPUs to fall asleep in (docs/performance.md)."""
    u = urllib.parse.urlsplit(url)
    body = open(body_path, "rb").read()
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": open(body_path + ".hlen").read().strip()}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    spent, n = 0.0, 0
    while n < most and (n < least or spent < budget):
        t0 = time.perf_counter()
        conn.request("POST", u.path, body, headers)
        r = conn.getresponse()
        r.read()
        t = time.perf_counter() - t0
        if r.status != 200:
            print(f"ort_e2e: the server answered {r.status}", file=sys.stderr)
            return 1
        print(f"{t:.6f}")
        spent += t
        n += 1
    return 0


def main():
    if sys.argv[1] == "post":
        url, path = sys.argv[2], sys.argv[3]
        return post(url, path, int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    cmd, path, n, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if cmd == "body":
        body(path, n, d, sys.argv[5])
        return 0
    return check(path, n, d, sys.argv[5], sys.argv[6])


if __name__ == "__main__":
    sys.exit(main())
