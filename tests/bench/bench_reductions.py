#!/usr/bin/python3
"""bench_reductions.py - the reductions of the attention weights at long context against the
output alone, on the same server (make bench's `reductions` step).

For each L (16384, 32768, 131072): q, k, v of L x 64, one head, causal, as binary v2 tensors of
BENCH_REDUCE_DATATYPE (default FP16; FP32 or FP64), with the parameter compute_precision
BENCH_REDUCE_PRECISION when that is set (float64, float32 or bfloat16; else none, so float32 for
16- and 32-bit inputs), sent to a
freshly started build/attention-server on a free 127.0.0.1 port:
  reductions  parameters entropy, received, sink 4, local 16, topk 8; outputs those (no output)
  output      the same inputs, outputs ["output"] alone
Each is answered once first (and the reductions checked for their shapes and that each row's
top-8 weights are descending and within (0, 1], and received sums to L: every causal row's
weights sum to 1), then timed BENCH_REDUCE_REPS times (default 3; 1 with --quick), reductions
first, so that the server's VmHWM (/proc/PID/status) read between the two is the peak RSS of
the reductions requests (and the start-up, the bodies and the answers).  Prints the medians,
the ratio reductions / output (target <= 1.6) and that peak RSS (target < 512 MiB), and writes
table-reductions.tsv rows for run.sh's summary.  It also prints the server's CPU time per
request (utime + stime from /proc/PID/stat, median) and their ratio: on a machine that other
work shares, wall time measures the neighbours as much as the server.  Loops are bounded: REPS requests per way, and
each request's own timeout of 600 s.  The server is stopped by its PID whatever happens.

Usage: bench_reductions.py [--results DIR] [--quick] [--sizes 16384,32768,131072]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

DATATYPE = os.environ.get("BENCH_REDUCE_DATATYPE", "FP16")
PRECISION = os.environ.get("BENCH_REDUCE_PRECISION", "")
NP = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT64": np.int64}
D = 64


def start_server(binary, workdir):
    proc = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
         "--data-dir", os.path.join(workdir, "data"), "--max-body", "1G",
         "--max-elements", "64M", "--max-request-memory", "4G",
         "--deadline", "600"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "stderr"), "w"), text=True,
        env=dict(os.environ, ATTN_QUIET="true"))
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        proc.kill()
        raise RuntimeError("the server did not start: " + line)
    return proc, line.split("listening on ")[1].strip()


def vmhwm_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def cpu_seconds(pid):
    """The process's user + system CPU time so far (/proc/PID/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(pid, base, text, body):
    """(wall seconds, server CPU seconds) of one request."""
    c0 = cpu_seconds(pid)
    wall = post(base, text, body)[0]
    return wall, cpu_seconds(pid) - c0


def body_of(q, k, v, params, outputs):
    blobs = [a.astype(NP[DATATYPE]).tobytes() for a in (q, k, v)]
    head = {"inputs": [{"name": n, "datatype": DATATYPE, "shape": list(a.shape),
                        "parameters": {"binary_data_size": len(b)}}
                       for n, a, b in zip("qkv", (q, k, v), blobs)],
            "parameters": dict(params, causal=True, binary_data_output=True,
                               **({"compute_precision": PRECISION} if PRECISION else {})),
            "outputs": [{"name": o} for o in outputs]}
    text = json.dumps(head).encode()
    return text, b"".join([text] + blobs)


def post(base, text, body):
    req = urllib.request.Request(base + "/v2/models/attention/infer", data=body, method="POST",
                                 headers={"Inference-Header-Content-Length": str(len(text)),
                                          "Content-Type": "application/octet-stream"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            data = r.read()
            hl = int(r.headers["Inference-Header-Content-Length"])
    except urllib.error.HTTPError as e:
        raise RuntimeError("HTTP %d: %s" % (e.code, e.read()[:300])) from None
    return time.perf_counter() - t0, json.loads(data[:hl]), data[hl:]


def check_reductions(L, head, blob):
    """The answer's shapes and a few facts any right answer has."""
    outs, at = {}, 0
    for o in head["outputs"]:
        n = o["parameters"]["binary_data_size"]
        dt = NP[o["datatype"]]
        outs[o["name"]] = np.frombuffer(blob[at:at + n], dt).reshape(o["shape"])
        at += n
    w = outs["topk_weights"]
    ok = (sorted(outs) == ["entropy", "local", "received", "sink", "topk_indices", "topk_weights"]
          and outs["entropy"].shape == (L,) and outs["received"].shape == (L,)
          and w.shape == (L, 8) and bool(np.all(np.diff(w[8:], axis=1) <= 0))
          and bool(np.all((w[8:] > 0) & (w[8:] <= 1)))
          and abs(float(outs["received"].astype(float).sum()) - L) < 1e-3 * L
          and bool(np.all(outs["sink"] <= 1 + 1e-6)))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", default="build/attention-server")
    ap.add_argument("--results", default="build/bench/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="16384,32768,131072")
    args = ap.parse_args()
    reps = 1 if args.quick else int(os.environ.get("BENCH_REDUCE_REPS", "3"))
    os.makedirs(args.results, exist_ok=True)
    rows, failed = [], False
    red = {"entropy": True, "received": True, "sink": 4, "local": 16, "topk": 8}
    red_outs = ["entropy", "received", "sink", "local", "topk_indices", "topk_weights"]
    precision = ", compute_precision " + PRECISION if PRECISION else ""
    what = DATATYPE + precision
    print("L\treductions_ms\toutput_ms\tratio\treductions_cpu_s\toutput_cpu_s\tcpu_ratio"
          "\tpeak_rss_MiB (%s inputs%s, %d reps, medians)" % (DATATYPE, precision, reps))
    for L in [int(x) for x in args.sizes.split(",")]:
        rng = np.random.default_rng(L)
        q, k, v = (rng.standard_normal((L, D)) for _ in range(3))
        rt, rb = body_of(q, k, v, red, red_outs)
        ot, ob = body_of(q, k, v, {}, ["output"])
        del q, k, v
        with tempfile.TemporaryDirectory(prefix="attn-bench-red-") as work:
            proc, base = start_server(args.server, work)
            try:
                _, head, blob = post(base, rt, rb)
                if not check_reductions(L, head, blob):
                    print("L=%d: the reductions' answer fails its checks" % L)
                    failed = True
                red_s = [timed(proc.pid, base, rt, rb) for _ in range(reps)]
                rss = vmhwm_mib(proc.pid)
                post(base, ot, ob)
                out_s = [timed(proc.pid, base, ot, ob) for _ in range(reps)]
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        rm = statistics.median(w for w, _ in red_s) * 1000
        om = statistics.median(w for w, _ in out_s) * 1000
        rc = statistics.median(c for _, c in red_s)
        oc = statistics.median(c for _, c in out_s)
        print("%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f" % (L, rm, om, rm / om, rc, oc,
                                                               rc / oc if oc else 0, rss),
              flush=True)
        rows.append("reductions\tL=%d x 64 causal %s: reductions vs output alone\t%.0f\t%.0f\tms"
                    "\t<=1.6\t\t\t%.0f MiB\treductions: entropy, received, sink 4, local 16, "
                    "top-8, no output; peak RSS is the reductions'" % (L, what, rm, om, rss))
        if L >= 131072:
            rows.append("reductions\tL=%d: peak RSS of the reductions request\t\t\tMiB\t<512 MiB"
                        "\t\t\t%.0f MiB\t" % (L, rss))
    with open(os.path.join(args.results, "table-reductions.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
