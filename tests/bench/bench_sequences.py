#!/usr/bin/python3
"""bench_sequences.py - sequences (a key/value cache the server holds per sequence) against
stateless requests that send every key each time (make bench's `sequences` step).

Every request is a binary v2 request (FP32 tensors, d = 64, one head, output only) on one
kept-alive HTTP connection to a build/attention-server started for the part on a free
127.0.0.1 port, and stopped by its PID whatever happens.  Three parts, each on a fresh server:

  step     A sequence started with 32,768 keys; then rounds of: three steps of one token (q, k,
           v of 1 x 64; the first steps after the start, one of which doubles the cache, are
           a warm-up), three empty requests (the floor: q, k, v of 1 x 64, no sequence, the
           smallest request the attention route answers, which its I/O thread computes
           itself), three of the floor on a worker (k and v of 8 x 64: a body past the
           4 KiB of --inline-max-bytes, handed to a worker as a step is; their difference
           is the hand-off), one stateless request of the same
           attention (the step's q and all n keys, causal false), and one stateless request
           that also asks for `received` (the reduction a step computes for received_total).
           The kernel's time: build/bench/bench-kernel --cold --case ...,1,64,0,0,N
           (attention_run in the process, 1 query over N keys, FP32, output only, the
           server's compute threads; the median of up to 100 runs, each after 256 MiB
           written, so that it reads q, k and v from memory as a step reads its cache after
           the round's stateless requests of 16 MB), run before, amid and after the rounds,
           the median of the three.  Target: the step's median time within 2x of (kernel +
           floor).  The step's time is also split by its Server-Timing phases (read, parse,
           queue, compute, encode) and set against its compute_ms, and the stateless
           requests' compute_ms (with and without received) are shown beside.
  replay   An 8,192-token generation replayed step by step: a sequence of 8,192 one-token
           steps (each answer's output used as it comes), the total wall time of the loop;
           against stateless requests that send, at token i, the token's query and all i
           keys, all 8,192 of them (17 GB over loopback, about 30 s here), their times summed
           (not the making of their bodies).  --replay-sample (and --quick) samples them
           instead: BENCH_SEQ_REPS requests at each of 9 lengths (1, 1024, ..., 8192) whose
           medians are interpolated linearly over every length 1 .. 8,192 and summed; the
           output says which.  Target: the sequence at least 100x faster in total.  Peak RSS:
           the server's VmHWM after the sequence's replay (it has done nothing else).
  policy   Cache policies (docs/contract.md, Cache policies) with a budget of 1,024 keys
           against the full cache, 12 heads of 64 (a BERT-base or GPT-2 layer; one head's
           step is mostly the HTTP floor either way): a sequence of each (full; h2o with cache_budget 1024;
           window with 4 sinks and 1,020 newest; snapkv with cache_budget 1024) started with a
           prompt of 32,768 keys and one query, its last (and h2o's also with 2,048, for the
           flatness; snapkv's observation window is then that one query), then rounds
           of one-token steps, their median wall time.  Target: the policy's step at least 10x
           faster than the full one at 32,768 keys, and flat as the generation grows (h2o
           after 2,048 and after 32,768 tokens within 1.5x).  Each step's output is checked
           against NumPy, head by head, over the previous step's kept_positions and its own
           key.  The full sequence then takes as many steps of 4 tokens (each query seeing
           the keys up to its own), their first and last checked against NumPy.  Target: a
           step of 4 tokens at least 2x faster than 4 steps of one.
  memory   Bytes per cached key from attn_sequence_cached_bytes / the keys cached, and 100
           live sequences of 8,192 keys (each started with its 8,192 keys in one request):
           the server's VmRSS growth against the formula 100 x 8,192 x (dk + dv) x 4 + 8 per
           head (the totals received, float64).

Every part first checks its answers: the step's output and the stateless request's agree
with NumPy (float64 from the same float32 numbers) within 1e-4 of the output's largest
magnitude, the sequence's length is what was sent, and the gauges say what was cached; a
failed check fails the step.  Writes table-sequences.tsv (run.sh's summary).  Loops are
bounded: a fixed count of requests, each with a timeout of 120 s.

Usage: bench_sequences.py [--results DIR] [--quick] [--parts step,replay,policy,memory]
                          [--replay-sample] [--server PATH] [--kernel PATH]
Settings: BENCH_SEQ_ROUNDS (rounds of the step part, default 15; 3 with --quick),
BENCH_SEQ_REPS (stateless requests per sampled length, default 9; 2 with --quick).
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

D = 64
STEP_KEYS = 32768
REPLAY_TOKENS = 8192
MEMORY_SEQUENCES = 100
MEMORY_KEYS = 8192
TOLERANCE = 1e-4
WARMUP_STEPS = 3


def start_server(binary, workdir):
    """The server on a free loopback port, quiet, gRPC off; (process, port)."""
    proc = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
         "--data-dir", os.path.join(workdir, "data"), "--max-body", "256M",
         "--max-elements", "64M", "--deadline", "120"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "stderr"), "w"), text=True,
        env=dict(os.environ, ATTN_QUIET="true"))
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError("the server did not start: " + line)
    return proc, int(line.rsplit(":", 1)[1].strip().rstrip("/"))


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def proc_status_mib(pid, key):
    """VmHWM, VmRSS, ... of /proc/PID/status in MiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Client:
    """One kept-alive HTTP connection to the server."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def infer(self, body):
        """Posts a prepared (head, bytes) body; returns (wall seconds, head, outputs by name,
        Server-Timing phases in ms)."""
        text, data = body
        t0 = time.perf_counter()
        self.conn.request("POST", "/v2/models/attention/infer", body=data,
                          headers={"Inference-Header-Content-Length": str(len(text)),
                                   "Content-Type": "application/octet-stream"})
        r = self.conn.getresponse()
        raw = r.read()
        wall = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, raw[:300]))
        hl = int(r.headers["Inference-Header-Content-Length"])
        head = json.loads(raw[:hl])
        outs, at = {}, hl
        for o in head["outputs"]:
            n = o["parameters"]["binary_data_size"]
            dt = np.float32 if o["datatype"] == "FP32" else np.int64
            outs[o["name"]] = np.frombuffer(raw[at:at + n], dt).reshape(o["shape"])
            at += n
        phases = {}
        for part in (r.headers.get("Server-Timing") or "").split(","):
            name, _, dur = part.strip().partition(";dur=")
            if dur:
                phases[name] = float(dur)
        return wall, head, outs, phases

    def metrics(self):
        """/metrics as {series: value} for the sequence gauges and counters."""
        self.conn.request("GET", "/metrics")
        r = self.conn.getresponse()
        text = r.read().decode()
        out = {}
        for line in text.split("\n"):
            if line.startswith("attn_sequence"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def body_of(q, k, v, params, outputs=("output",)):
    """A binary v2 request of FP32 q, k, v."""
    blobs = [np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in (q, k, v)]
    head = {"inputs": [{"name": n, "datatype": "FP32", "shape": list(a.shape),
                        "parameters": {"binary_data_size": len(b)}}
                       for n, a, b in zip("qkv", (q, k, v), blobs)],
            "parameters": dict(params, binary_data_output=True),
            "outputs": [{"name": o} for o in outputs]}
    text = json.dumps(head).encode()
    return text, b"".join([text] + blobs)


def reference(q, k, v):
    """One query over all keys, in float64 from the float32 numbers."""
    q, k, v = (np.asarray(a, dtype=np.float32).astype(np.float64) for a in (q, k, v))
    s = (k @ q.reshape(-1)) / np.sqrt(D)
    w = np.exp(s - s.max())
    return (w / w.sum()) @ v


def agrees(got, want):
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    return float(np.max(np.abs(got - want))) <= TOLERANCE * max(float(np.max(np.abs(want))), 1e-30)


def median_ms(xs):
    return statistics.median(xs) * 1000


class Part:
    """What a part prints and writes; a failed check marks it."""

    def __init__(self):
        self.rows, self.failed = [], False

    def check(self, ok, what):
        print("  check %-60s %s" % (what, "ok" if ok else "FAILED"), flush=True)
        self.failed |= not ok

    def row(self, scenario, ours, peer, unit, target, rss, note):
        self.rows.append("\t".join(["sequences", scenario, ours, peer, unit, target, "", "",
                                    rss, note]))


def kernel_ms(args, n):
    """bench-kernel's median ms of attention_run, 1 query over n keys, FP32, output only,
    its inputs read from memory (--cold)."""
    with tempfile.TemporaryDirectory(prefix="attn-bench-seq-kernel-") as work:
        p = subprocess.run([args.kernel, "--out", work, "--cold", "--case",
                            "seq-step,float32,1,1,1,%d,0,0,%d" % (D, n)],
                           capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("bench-kernel failed: " + p.stderr.strip()[-300:])
    return float(p.stdout.strip().split("\n")[-1].split()[2])


def part_step(args, out, rounds):
    rng = np.random.default_rng(1)
    total = STEP_KEYS + 3 * (rounds + 1) + 1
    K = rng.standard_normal((total, D)).astype(np.float32)
    V = rng.standard_normal((total, D)).astype(np.float32)
    Q = rng.standard_normal((total, D)).astype(np.float32)
    floor_body = body_of(Q[:1], K[:1], V[:1], {})
    worker_body = body_of(Q[:1], K[:8], V[:8], {"causal": False})
    assert len(worker_body[1]) > 4096
    sid = {"sequence_id": 51}
    with tempfile.TemporaryDirectory(prefix="attn-bench-seq-") as work:
        proc, port = start_server(args.server, work)
        try:
            c = Client(port)
            n = STEP_KEYS
            _, head, outs, _ = c.infer(body_of(Q[n - 1:n], K[:n], V[:n],
                                               dict(sid, sequence_start=True),
                                               ("output", "length")))
            out.check(int(outs["length"][0]) == n, "the start caches %d keys" % n)
            out.check(agrees(outs["output"], reference(Q[n - 1], K[:n], V[:n])),
                      "the start's output agrees with NumPy")
            gauges = c.metrics()
            per_key = gauges.get("attn_sequence_cached_bytes", 0) / n
            want_key = 2 * D * 4 + 8
            out.check(per_key == want_key, "attn_sequence_cached_bytes / length = %d" % want_key)
            for _ in range(WARMUP_STEPS):
                c.infer(body_of(Q[n:n + 1], K[n:n + 1], V[n:n + 1], sid))
                c.infer(floor_body)
                n += 1
            first_n = n + 1
            kernel = [kernel_ms(args, first_n)]
            steps, floors, worker_floors, stateless = [], [], [], []
            step_phase, compute = {}, {"step": [], "stateless": [], "stateless_received": []}
            for r in range(rounds):
                if r == rounds // 2:
                    kernel.append(kernel_ms(args, n + 1))
                for _ in range(3):
                    body = body_of(Q[n:n + 1], K[n:n + 1], V[n:n + 1], sid, ("output", "length"))
                    wall, head, outs, ph = c.infer(body)
                    n += 1
                    steps.append(wall)
                    compute["step"].append(head["parameters"]["compute_ms"])
                    for name, ms in ph.items():
                        step_phase.setdefault(name, []).append(ms)
                    if r == 0 and len(steps) == 1:
                        out.check(int(outs["length"][0]) == n, "a step's length is %d" % n)
                        want = reference(Q[n - 1], K[:n], V[:n])
                        out.check(agrees(outs["output"], want), "the step's output agrees with NumPy")
                    floors.append(c.infer(floor_body)[0])
                    worker_floors.append(c.infer(worker_body)[0])
                body = body_of(Q[n - 1:n], K[:n], V[:n], {"causal": False})
                wall, head, outs, _ = c.infer(body)
                stateless.append(wall)
                compute["stateless"].append(head["parameters"]["compute_ms"])
                if r == 0:
                    out.check(agrees(outs["output"], reference(Q[n - 1], K[:n], V[:n])),
                              "the stateless request agrees with NumPy")
                body = body_of(Q[n - 1:n], K[:n], V[:n], {"causal": False, "received": True},
                               ("output", "received"))
                _, head, outs, _ = c.infer(body)
                compute["stateless_received"].append(head["parameters"]["compute_ms"])
                if r == 0:
                    out.check(abs(float(outs["received"].astype(np.float64).sum()) - 1) < 1e-3,
                              "received of one query sums to 1")
                del body
            kernel.append(kernel_ms(args, n))
        finally:
            stop_server(proc)
    step_ms, floor_ms, full_ms = median_ms(steps), median_ms(floors), median_ms(stateless)
    kernel = statistics.median(kernel)
    worker_ms = median_ms(worker_floors)
    stateless_compute = statistics.median(compute["stateless"])
    step_compute = statistics.median(compute["step"])
    rcv_compute = statistics.median(compute["stateless_received"])
    ratio = step_ms / (kernel + floor_ms)
    phases = ", ".join("%s %.3f" % (k, statistics.median(v)) for k, v in step_phase.items())
    phase_sum = sum(statistics.median(v) for v in step_phase.values())
    print("  one step at n = %d .. %d keys (d=64, one head, 1 query, FP32), medians of %d "
          "(%d rounds):" % (first_n, n, len(steps), rounds))
    print("    step (server wall, client's view)   %8.3f ms" % step_ms)
    print("    kernel (bench-kernel --cold)        %8.3f ms" % kernel)
    print("    empty-request floor                 %8.3f ms" % floor_ms)
    print("    the floor on a worker (hand-off)    %8.3f ms" % worker_ms)
    print("    stateless with all keys             %8.3f ms" % full_ms)
    print("    step / (kernel + floor)             %8.2f   (target <= 2)" % ratio)
    print("    stateless / step                    %8.2f" % (full_ms / step_ms))
    print("  the step's split: compute_ms %.3f (the stateless request's: %.3f, with received "
          "%.3f); Server-Timing medians (ms): %s; sum %.3f, the rest (HTTP, hand-off, client) "
          "%.3f" % (step_compute, stateless_compute, rcv_compute, phases, phase_sum,
                    step_ms - phase_sum), flush=True)
    out.row("one step at %d cached keys, 1 query d=64 FP32: step vs kernel from memory "
            "(bench-kernel --cold) + empty-request floor" % STEP_KEYS, "%.3f" % step_ms,
            "%.3f" % (kernel + floor_ms), "ms", "<=2", "",
            "kernel %.3f ms + floor %.3f ms (on a worker: %.3f); the step's compute_ms %.3f, "
            "the stateless request's %.3f (with received %.3f); the step's Server-Timing "
            "medians (ms): %s" % (kernel, floor_ms, worker_ms, step_compute, stateless_compute,
                                  rcv_compute, phases))
    out.row("one step at %d cached keys vs the stateless request with all keys (info)"
            % STEP_KEYS, "%.3f" % step_ms, "%.3f" % full_ms, "ms", "", "",
            "stateless body %d B" % (len(body_of(Q[:1], K[:n], V[:n], {})[1])))
    out.row("bytes per cached key, d=64 FP32, one head (attn_sequence_cached_bytes / length)",
            "%.0f" % per_key, "", "B", "", "", "formula (dk + dv) x 4 + 8 x heads = %d" % want_key)


def stateless_body(Q, K, V, i):
    """Token i's stateless request: its query and the i + 1 keys up to it."""
    return body_of(Q[i:i + 1], K[:i + 1], V[:i + 1], {"causal": False})


def part_replay(args, out, reps):
    rng = np.random.default_rng(2)
    N = REPLAY_TOKENS
    K, V, Q = (rng.standard_normal((N, D)).astype(np.float32) for _ in range(3))
    bodies = [body_of(Q[i:i + 1], K[i:i + 1], V[i:i + 1],
                      dict(sequence_id="replay", sequence_start=(i == 0)))
              for i in range(N)]
    with tempfile.TemporaryDirectory(prefix="attn-bench-seq-") as work:
        proc, port = start_server(args.server, work)
        try:
            c = Client(port)
            rss_start = proc_status_mib(proc.pid, "VmRSS")
            last, step_walls, computes, phase_sums = None, [], [], []
            t0 = time.perf_counter()
            for b in bodies:
                last = c.infer(b)
                step_walls.append(last[0])
                computes.append(last[1]["parameters"]["compute_ms"])
                phase_sums.append(sum(last[3].values()))
            seq_s = time.perf_counter() - t0
            peak = proc_status_mib(proc.pid, "VmHWM")
            out.check(agrees(last[2]["output"], reference(Q[N - 1], K, V)),
                      "the last step's output agrees with NumPy")
            out.check(c.metrics().get("attn_sequence_steps_total") == N,
                      "attn_sequence_steps_total = %d" % N)
            del bodies
            if not args.replay_sample:
                stateless_s = sum(c.infer(stateless_body(Q, K, V, i))[0] for i in range(N))
                how = ("all %d stateless requests run, their times summed (not the making of "
                       "their bodies)" % N)
            else:
                lengths = [1] + [1024 * j for j in range(1, N // 1024 + 1)]
                walls = {L: [] for L in lengths}
                for _ in range(reps):
                    for L in lengths:
                        walls[L].append(c.infer(stateless_body(Q, K, V, L - 1))[0])
                med = [statistics.median(walls[L]) for L in lengths]
                stateless_s = float(np.interp(np.arange(1, N + 1), lengths, med).sum())
                how = ("stateless total estimated, not run whole: medians of %d requests at "
                       "each of %d lengths (%s keys), interpolated linearly over 1 .. %d keys "
                       "and summed" % (reps, len(lengths), ", ".join(map(str, lengths)), N))
                print("  stateless medians (ms) by keys: %s" % ", ".join(
                    "%d: %.2f" % (L, m * 1000) for L, m in zip(lengths, med)))
            whole = c.infer(stateless_body(Q, K, V, N - 1))
            out.check(agrees(whole[2]["output"], last[2]["output"].astype(np.float64).reshape(-1)),
                      "the stateless request agrees with the last step")
        finally:
            stop_server(proc)
    ratio = stateless_s / seq_s
    print("  replay of %d tokens (d=64, one head, FP32): sequence %.2f s (%.3f ms a step), "
          "stateless %.1f s, ratio %.1fx (target >= 100x)" % (N, seq_s, seq_s * 1000 / N,
                                                              stateless_s, ratio))
    print("  %s" % how)
    print("  the sequence's steps: wall per step median %.3f ms, compute_ms median %.3f, "
          "Server-Timing sum median %.3f (the last 1,024 steps: %.3f, %.3f, %.3f)"
          % (median_ms(step_walls), statistics.median(computes), statistics.median(phase_sums),
             median_ms(step_walls[-1024:]), statistics.median(computes[-1024:]),
             statistics.median(phase_sums[-1024:])))
    print("  server peak RSS after the sequence's replay (VmHWM) %.0f MiB (at start %.0f MiB)"
          % (peak, rss_start), flush=True)
    out.row("replay of an %d-token generation, d=64 FP32: sequence steps vs stateless "
            "requests, total" % N, "%.0f" % (seq_s * 1000), "%.0f" % (stateless_s * 1000),
            "ms", "100", "%.0f MiB" % peak,
            "%s; a step's median wall %.3f ms, compute_ms %.3f, Server-Timing %.3f; peak RSS "
            "is the server's VmHWM after the sequence's replay (at start %.0f MiB)"
            % (how, median_ms(step_walls), statistics.median(computes),
               statistics.median(phase_sums), rss_start))


def part_memory(args, out):
    rng = np.random.default_rng(3)
    N = MEMORY_KEYS
    K, V = (rng.standard_normal((N, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, D)).astype(np.float32)
    per_key = 2 * D * 4 + 8
    formula = MEMORY_SEQUENCES * N * per_key
    with tempfile.TemporaryDirectory(prefix="attn-bench-seq-") as work:
        proc, port = start_server(args.server, work)
        try:
            c = Client(port)
            c.infer(body_of(q, K[:1], V[:1], {}))
            rss0 = proc_status_mib(proc.pid, "VmRSS")
            for s in range(MEMORY_SEQUENCES):
                body = body_of(q, K, V, {"sequence_id": s + 1, "sequence_start": True},
                               ("output", "length"))
                if int(c.infer(body)[2]["length"][0]) != N:
                    out.check(False, "sequence %d caches %d keys" % (s + 1, N))
            del body
            time.sleep(0.2)
            rss = proc_status_mib(proc.pid, "VmRSS")
            gauges = c.metrics()
        finally:
            stop_server(proc)
    cached = gauges.get("attn_sequence_cached_bytes", 0)
    out.check(gauges.get("attn_sequences_live") == MEMORY_SEQUENCES,
              "attn_sequences_live = %d" % MEMORY_SEQUENCES)
    out.check(cached == formula, "attn_sequence_cached_bytes = %d" % formula)
    grown = (rss - rss0) * 1048576
    print("  %d live sequences of %d keys (d=64, FP32): attn_sequence_cached_bytes %.0f "
          "(%.1f B a key; formula %d B a key, %.1f MiB in all); server RSS %.0f MiB, %.0f MiB "
          "above its RSS before them (%.1f B a key, %.3f x the formula)"
          % (MEMORY_SEQUENCES, N, cached, cached / (MEMORY_SEQUENCES * N), per_key,
             formula / 1048576, rss, rss - rss0, grown / (MEMORY_SEQUENCES * N), grown / formula),
          flush=True)
    out.row("%d live sequences of %d keys, d=64 FP32: the server's RSS growth vs the formula "
            "(info)" % (MEMORY_SEQUENCES, N), "%.1f" % ((rss - rss0)), "%.1f" % (formula / 1048576),
            "MiB", "", "%.0f MiB" % rss,
            "formula 100 x 8192 x ((64 + 64) x 4 + 8) B; %.1f B a key by RSS; "
            "attn_sequence_cached_bytes %.0f" % (grown / (MEMORY_SEQUENCES * N), cached))


POLICY_BUDGET = 1024
POLICIES = (("full", {}, STEP_KEYS),
            ("h2o", {"cache_policy": "h2o", "cache_budget": POLICY_BUDGET}, 2048),
            ("h2o", {"cache_policy": "h2o", "cache_budget": POLICY_BUDGET}, STEP_KEYS),
            ("window", {"cache_policy": "window", "cache_sink": 4,
                        "cache_window": POLICY_BUDGET - 4}, STEP_KEYS),
            ("snapkv", {"cache_policy": "snapkv", "cache_budget": POLICY_BUDGET}, STEP_KEYS))


POLICY_HEADS = 12
# Tokens of each step of the full sequence's multi-token rounds (a draft model's guesses
# checked at once, or a prompt fed in chunks).
MULTI_TOKENS = 4


def heads_reference(q, K, V, kept):
    """One query over each head's kept keys (kept: [heads, n] positions), float64."""
    out = []
    for h, pos in enumerate(kept):
        cols = slice(h * D, (h + 1) * D)
        out.append(reference(q[cols], K[pos][:, cols], V[pos][:, cols]))
    return np.concatenate(out)


def part_tokens(c, seq, K, V, Q, at, steps):
    """Steps of MULTI_TOKENS tokens each on the full sequence seq, whose cache holds keys
    [0, at): their wall times, and whether the first step's and the last one's outputs agree
    with NumPy (query i of a step sees the keys up to its own: causal, bottom-right)."""
    walls, good = [], True
    for i in range(steps):
        rows = slice(at, at + MULTI_TOKENS)
        wall, _, outs, _ = c.infer(body_of(Q[rows], K[rows], V[rows], seq, ("output", "length")))
        at += MULTI_TOKENS
        if i == 0 or i == steps - 1:
            every = np.arange(at)
            for r in range(MULTI_TOKENS):
                seen = np.tile(every[:at - MULTI_TOKENS + r + 1], (POLICY_HEADS, 1))
                got = outs["output"].reshape(MULTI_TOKENS, -1)[r]
                good &= agrees(got, heads_reference(Q[at - MULTI_TOKENS + r], K, V, seen))
            good &= int(outs["length"][0]) == at
        if i >= WARMUP_STEPS:
            walls.append(wall)
    return walls, good


def part_policy(args, out, rounds):
    rng = np.random.default_rng(4)
    steps = WARMUP_STEPS + 3 * rounds
    total = STEP_KEYS + steps + MULTI_TOKENS * steps
    W = D * POLICY_HEADS
    K, V, Q = (rng.standard_normal((total, W)).astype(np.float32) for _ in range(3))
    times = {}
    with tempfile.TemporaryDirectory(prefix="attn-bench-seq-") as work:
        proc, port = start_server(args.server, work)
        try:
            c = Client(port)
            for sid, (name, params, prompt) in enumerate(POLICIES, 1):
                seq = {"sequence_id": 600 + sid, "heads": POLICY_HEADS}
                outs_named = ("output", "length") + (("kept_positions",) if params else ())
                # the prompt's keys with one query (its last), as the step part starts
                _, _, outs, _ = c.infer(body_of(Q[prompt - 1:prompt], K[:prompt], V[:prompt],
                                                dict(seq, sequence_start=True, **params),
                                                outs_named))
                every = np.tile(np.arange(prompt), (POLICY_HEADS, 1))
                kept = outs["kept_positions"] if params else every
                walls, good = [], True
                for i in range(steps):
                    at = prompt + i
                    wall, _, outs, _ = c.infer(body_of(Q[at:at + 1], K[at:at + 1],
                                                       V[at:at + 1], seq, outs_named))
                    seen = np.hstack([kept, np.full((POLICY_HEADS, 1), at)])
                    if i % 8 == 0 or i == steps - 1:    # NumPy over 32,768 keys is slow
                        good &= agrees(outs["output"], heads_reference(Q[at], K, V, seen))
                    kept = outs["kept_positions"] if params else seen
                    if i >= WARMUP_STEPS:
                        walls.append(wall)
                want = min(prompt + steps, POLICY_BUDGET) if params else prompt + steps
                out.check(good and int(outs["length"][0]) == want,
                          "%s after %d: outputs agree with NumPy, %d keys" % (name, prompt,
                                                                             want))
                times[(name, prompt)] = median_ms(walls)
                if name == "full":
                    walls, good = part_tokens(c, seq, K, V, Q, prompt + steps, steps)
                    out.check(good, "full, steps of %d tokens: outputs agree with NumPy"
                              % MULTI_TOKENS)
                    multi = median_ms(walls)
        finally:
            stop_server(proc)
    full = times[("full", STEP_KEYS)]
    print("  one-token steps, %d heads of 64, FP32, medians of %d:" % (POLICY_HEADS, 3 * rounds))
    for name, params, prompt in POLICIES:
        t = times[(name, prompt)]
        print("    %-7s after %6d tokens %8.3f ms   full / this %6.1f" % (
            name, prompt, t, full / t))
    print("    full, steps of %d tokens     %8.3f ms   %d one-token steps / this %6.2f" % (
        MULTI_TOKENS, multi, MULTI_TOKENS, MULTI_TOKENS * full / multi))
    flat = times[("h2o", STEP_KEYS)] / times[("h2o", 2048)]
    print("    h2o after 32,768 / after 2,048       %8.2f   (target <= 1.5)" % flat,
          flush=True)
    for name, params, prompt in POLICIES[2:]:
        out.row("a %s step, budget %d, after %d tokens vs a full step at %d keys (12 heads "
                "of 64, FP32, 1 query)" % (name, POLICY_BUDGET, prompt, STEP_KEYS),
                "%.3f" % times[(name, prompt)], "%.3f" % full, "ms", "10", "",
                "full / %s = %.1f" % (name, full / times[(name, prompt)]))
    out.row("h2o step with budget %d: after %d tokens vs after 2048 (flat as it grows)" %
            (POLICY_BUDGET, STEP_KEYS), "%.3f" % times[("h2o", STEP_KEYS)],
            "%.3f" % times[("h2o", 2048)], "ms", "<=1.5", "", "ratio %.2f" % flat)
    out.row("a step of %d tokens vs %d steps of one at %d keys, full cache (12 heads of 64, "
            "FP32)" % (MULTI_TOKENS, MULTI_TOKENS, STEP_KEYS), "%.3f" % multi,
            "%.3f" % (MULTI_TOKENS * full), "ms", "2", "",
            "one-token step %.3f ms" % full)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="build/attention-server")
    ap.add_argument("--kernel", default="build/bench/bench-kernel")
    ap.add_argument("--results", default="build/bench/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="step,replay,policy,memory")
    ap.add_argument("--replay-sample", action="store_true")
    args = ap.parse_args()
    args.replay_sample |= args.quick
    rounds = 3 if args.quick else int(os.environ.get("BENCH_SEQ_ROUNDS", "15"))
    reps = 2 if args.quick else int(os.environ.get("BENCH_SEQ_REPS", "9"))
    os.makedirs(args.results, exist_ok=True)
    out = Part()
    parts = args.parts.split(",")
    for name, run in (("step", lambda: part_step(args, out, rounds)),
                      ("replay", lambda: part_replay(args, out, reps)),
                      ("policy", lambda: part_policy(args, out, rounds)),
                      ("memory", lambda: part_memory(args, out))):
        if name in parts:
            print("%s:" % name, flush=True)
            try:
                run()
            except (RuntimeError, OSError, http.client.HTTPException, KeyError) as e:
                out.check(False, "%s: %s" % (name, e))
    with open(os.path.join(args.results, "table-sequences.tsv"), "w") as f:
        f.write("\n".join(out.rows) + "\n")
    return 1 if out.failed else 0


if __name__ == "__main__":
    sys.exit(main())
