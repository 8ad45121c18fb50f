#!/usr/bin/python3
"""bench_store_s3.py - the S3 weight-set store against the directory store, 1,000 sets each.

One single-node OpenStack Swift with s3api (tests/s3/swift_s3.sh, in a mktemp -d folder, on
127.0.0.1) holds a bucket; a directory-store server takes 1,000 small sets by PUT (2 x 2
float64 wq, wk, wv: 212-byte .wset files), and `aws s3 cp --recursive` copies those very files
into the bucket under the prefix sets/, so both stores hold the same bytes. Then, for each
store:

- start-up: from the server's launch to its first /readyz 200 with the 1,000 sets loaded
  (attn_store_sets checked), median of --reps fresh starts (an empty --data-dir each for S3);
- one sync with 1,000 unchanged sets, both at --store-sync-interval 1000 over --window
  seconds: the server's CPU time (every thread's /proc/PID/task/TID/schedstat, and utime +
  stime of /proc/PID/stat as a check) over the syncs in the window; for S3 the requests and
  body bytes of the window from Swift's own access log (proxy-logging, DIR/log/swift.log),
  whose LIST count is the count of syncs; for the directory, the syncs from
  attn_store_last_sync_age_seconds at both ends of the window and the file-system calls of
  one window under strace -c -f (a separate window: strace slows what it traces);
- PUT to visible: a PUT on replica A, then HEAD on replica B every 10 ms until its ETag is the
  generation A answered, median of --puts PUTs, each after a random wait within one interval
  (so that the PUTs fall anywhere in B's sync cycle): at each store's default interval
  (directory 1000 ms, S3 5000 ms) and with both at 1000 ms. A and B share the folder
  (directory) or the bucket and prefix (S3, each with its own empty --data-dir).

The servers' idle threads count in the CPU figure: it is the process's time, not the sync
thread's alone. Every process started is stopped by its PID (Swift by its own stop command),
every wait is bounded. Writes table-s3store.tsv into --results (ours = the S3 store, peer = the
directory store; ratio = how many times faster S3 is, so below 1 where it is slower) and prints
the figures side by side. Exit status 0, or 1 when something failed (Swift or awscli missing
included: scripts/provision.sh s3).

Usage: bench_store_s3.py [--server PATH] [--results DIR] [--quick] [--sets N] [--reps N]
                         [--window S] [--puts N]
"""
import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SWIFT_SH = os.path.join(HERE, "..", "s3", "swift_s3.sh")
AWS = "/usr/bin/aws"
PREFIX = "sets"
DIR_DEFAULT_MS, S3_DEFAULT_MS, EQUAL_MS = 1000, 5000, 1000
TICK = os.sysconf("SC_CLK_TCK")


def clean_env(**more):
    """The environment without the caller's AWS_ settings, gRPC off, plus more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_EC2_METADATA_DISABLED": "true", "ATTN_GRPC_PORT": "0",
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_PAGER": ""})
    env.update(more)
    return env


class Swift:
    """The Swift node (tests/s3/swift_s3.sh in a mktemp -d folder)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp()
        p = subprocess.run(["bash", SWIFT_SH, "start", self.dir, "0"], capture_output=True,
                           text=True, timeout=150)
        if p.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError("swift_s3.sh start failed: " + p.stderr[-1500:])
        v = dict(l.split("=", 1) for l in p.stdout.split() if "=" in l)
        self.endpoint = v["S3_ENDPOINT"]
        self.env = clean_env(AWS_ACCESS_KEY_ID=v["AWS_ACCESS_KEY_ID"],
                             AWS_SECRET_ACCESS_KEY=v["AWS_SECRET_ACCESS_KEY"],
                             AWS_DEFAULT_REGION=v["AWS_DEFAULT_REGION"])
        self.log = os.path.join(self.dir, "log", "swift.log")

    def aws(self, *args, timeout=300):
        p = subprocess.run([AWS, "--endpoint-url", self.endpoint] + list(args), env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("aws %s: %s" % (" ".join(args[:2]), p.stderr.strip()[-300:]))
        return p.stdout

    def log_size(self):
        return os.path.getsize(self.log)

    def access_lines(self, since):
        """The proxy's access lines written after byte offset since: (method, path, status,
        bytes received, bytes sent) each.  The line: TIME <PRI>proxy-server: CLIENT REMOTE
        DATE METHOD PATH PROTOCOL STATUS REFERER AGENT TOKEN RECEIVED SENT ..."""
        out = []
        with open(self.log, "rb") as f:
            f.seek(since)
            for raw in f.read().decode("utf-8", "replace").splitlines():
                w = raw.split(" ")
                if len(w) < 14 or w[1] != "<134>proxy-server:" or w[7] != "HTTP/1.0":
                    continue
                num = [0 if x == "-" else int(x) for x in (w[12], w[13])]
                out.append((w[5], w[6], w[8], num[0], num[1]))
        return out

    def stop(self):
        subprocess.run(["bash", SWIFT_SH, "stop", self.dir], capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """One attention server on the directory store (url None) or the S3 one."""

    def __init__(self, binary, data, interval_ms, swift=None, url=None):
        os.makedirs(data, exist_ok=True)
        argv = [binary, "--host", "127.0.0.1", "--port", "0", "--quiet", "--data-dir", data,
                "--store-sync-interval", str(interval_ms)]
        env = clean_env()
        if url:
            argv += ["--store-url", url, "--s3-endpoint", swift.endpoint]
            env = swift.env
        self.stderr = open(os.path.join(os.path.dirname(data.rstrip("/")),
                                        "stderr-%d" % random.randrange(1 << 30)), "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=env)
        line = self.proc.stdout.readline()     # bounded: the server prints it or exits
        if "listening on http://" not in line:
            self.stop()
            raise RuntimeError("the server did not start: %r" % line)
        self.port = int(line.rsplit(":", 1)[1].strip().rstrip("/"))
        self.conn = None

    def request(self, method, path, body=None):
        """(status, body, headers) on a kept-alive connection, opened again after a failure."""
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.conn.request(method, path, body=body,
                                  headers={"Content-Type": "application/json"} if body else {})
                r = self.conn.getresponse()
                return r.status, r.read(), r.headers
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def wait_ready(self, timeout=120):
        """Seconds from launch to the first /readyz 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return time.monotonic() - self.t0
            except (OSError, http.client.HTTPException):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        raise RuntimeError("no /readyz 200 within %d s" % timeout)

    def metric(self, name):
        s, b, _ = self.request("GET", "/metrics")
        for line in b.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise RuntimeError("no %s in /metrics (%d)" % (name, s))

    def cpu(self):
        """(ns on CPU of every live thread from schedstat, utime + stime in seconds)."""
        ns = 0
        for tid in os.listdir("/proc/%d/task" % self.proc.pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (self.proc.pid, tid)) as f:
                    ns += int(f.read().split()[0])
            except OSError:
                pass
        with open("/proc/%d/stat" % self.proc.pid) as f:
            w = f.read().rsplit(")", 1)[1].split()
        return ns, (int(w[11]) + int(w[12])) / TICK

    def stop(self):
        if self.conn:
            self.conn.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.stderr.close()


def set_body(value):
    m = [[value, value], [value, value]]
    return json.dumps({"wq": m, "wk": m, "wv": m})


def fill(binary, work, swift, bucket, n):
    """n sets PUT to a directory server; the same files copied into the bucket by awscli.
    Returns (the folder, seconds of the PUTs, seconds of the copy)."""
    data = os.path.join(work, "data-dir")
    srv = Server(binary, data, DIR_DEFAULT_MS)
    try:
        t0 = time.monotonic()
        for i in range(n):
            s, b, _ = srv.request("PUT", "/v1/weight-sets/set%04d" % i, set_body(i + 0.5))
            if s not in (200, 201):
                raise RuntimeError("PUT set%04d: %d %s" % (i, s, b[:200]))
        put_s = time.monotonic() - t0
    finally:
        srv.stop()
    wsets = [f for f in os.listdir(data) if f.endswith(".wset")]
    if len(wsets) != n:
        raise RuntimeError("%d .wset files in %s, not %d" % (len(wsets), data, n))
    t0 = time.monotonic()
    swift.aws("s3", "cp", "--recursive", "--quiet", "--exclude", "*", "--include", "*.wset",
              data, "s3://%s/%s/" % (bucket, PREFIX))
    copy_s = time.monotonic() - t0
    listed = json.loads(swift.aws("s3api", "list-objects-v2", "--bucket", bucket, "--prefix",
                                  PREFIX + "/", "--query", "length(Contents)"))
    if listed != n:
        raise RuntimeError("%s objects in the bucket, not %d" % (listed, n))
    return data, put_s, copy_s


def median(xs):
    return statistics.median(xs) if xs else float("nan")


class Bench:
    def __init__(self, args, swift, work, bucket, data):
        self.args, self.swift, self.work, self.bucket, self.data = args, swift, work, bucket, data
        self.url = "s3://%s/%s" % (bucket, PREFIX)
        self.figures = {}
        self.failed = False

    def check(self, ok, what):
        print("  check %-66s %s" % (what, "ok" if ok else "FAILED"), flush=True)
        self.failed |= not ok

    def server(self, store, interval_ms):
        """A server on the directory (the filled folder) or on the bucket (an empty folder)."""
        if store == "dir":
            return Server(self.args.server, self.data, interval_ms)
        return Server(self.args.server, tempfile.mkdtemp(dir=self.work), interval_ms,
                      self.swift, self.url)

    def startup(self, store):
        times = []
        for _ in range(self.args.reps):
            srv = self.server(store, DIR_DEFAULT_MS if store == "dir" else S3_DEFAULT_MS)
            try:
                times.append(srv.wait_ready() * 1000)
                sets = srv.metric("attn_store_sets")
            finally:
                srv.stop()
            self.check(sets == self.args.sets, "%s start-up: %d sets loaded" % (store, sets))
        print("  %s start-up to /readyz 200: %s ms" % (store, " ".join("%.0f" % t for t in times)))
        self.figures[store + "_start"] = (median(times), times)

    def sync_cost(self, store):
        """CPU per sync at EQUAL_MS over the window; S3's requests and bytes per sync."""
        srv = self.server(store, EQUAL_MS)
        try:
            srv.wait_ready()
            time.sleep(2 * EQUAL_MS / 1000)       # past start-up's own work
            age0, t0 = srv.metric("attn_store_last_sync_age_seconds"), time.monotonic()
            log0, (ns0, tick0) = self.swift.log_size(), srv.cpu()
            time.sleep(self.args.window)
            ns1, tick1 = srv.cpu()
            time.sleep(0.5)                       # the sink writes what the proxy sent by then
            lines = self.swift.access_lines(log0)
            age1, t1 = srv.metric("attn_store_last_sync_age_seconds"), time.monotonic()
            span = (t1 - age1) - (t0 - age0)      # from the last sync before to the last after
            f = {"cpu_ms": (ns1 - ns0) / 1e6, "tick_ms": (tick1 - tick0) * 1000,
                 "window": self.args.window}
            if store == "s3":
                mine = [l for l in lines if l[1].startswith("/" + self.bucket)]
                lists = [l for l in mine if l[0] == "GET" and "list-type" in l[1]]
                f["syncs"] = len(lists)
                f["requests"] = len(mine)
                f["bytes_in"] = sum(l[3] for l in mine)
                f["bytes_out"] = sum(l[4] for l in mine)
                f["other"] = sorted({"%s %s" % (l[0], l[2]) for l in mine if l not in lists})
                self.check(all(l[2] == "200" for l in mine), "s3 sync: every request 200")
            else:
                f["syncs"] = round(span * 1000 / EQUAL_MS)
                f["syscalls"] = self.strace(srv)
            self.check(f["syncs"] >= self.args.window * 1000 / EQUAL_MS / 2,
                       "%s sync: %d syncs in %.0f s" % (store, f["syncs"], self.args.window))
            print("  %s sync: %s" % (store, f), flush=True)
            self.figures[store + "_sync"] = f
        finally:
            srv.stop()

    def strace(self, srv):
        """File-system calls per sync of the directory store: strace -c -f over a window."""
        if shutil.which("strace") is None:
            return None
        out = os.path.join(self.work, "strace.txt")
        age0 = srv.metric("attn_store_last_sync_age_seconds")
        t0 = time.monotonic()
        p = subprocess.Popen(["strace", "-c", "-f", "-q", "-o", out, "-p", str(srv.proc.pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(self.args.window / 2)
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        age1 = srv.metric("attn_store_last_sync_age_seconds")
        syncs = round(((time.monotonic() - age1) - (t0 - age0)) * 1000 / EQUAL_MS)
        calls = {}
        try:
            with open(out) as f:
                for line in f:
                    w = line.split()
                    if len(w) >= 5 and w[0][0].isdigit() and w[-1] != "total":
                        calls[w[-1]] = int(w[3])
        except OSError:
            return None
        fs = {k: v for k, v in calls.items()
              if k in ("newfstatat", "statx", "stat", "fstat", "lstat", "openat", "getdents64",
                       "read", "close", "pread64", "mmap", "munmap", "fstatfs", "statfs")}
        return {"syncs": syncs, "calls": calls, "fs_per_sync":
                round(sum(fs.values()) / syncs, 1) if syncs else None}

    def visible(self, store, interval_ms, key):
        """Median ms from A's PUT answer to B's HEAD showing its generation."""
        a, b = self.server(store, interval_ms), None
        put_ms, seen_ms = [], []
        try:
            b = self.server(store, interval_ms)
            a.wait_ready()
            b.wait_ready()
            for i in range(self.args.puts):
                time.sleep(random.uniform(0, interval_ms / 1000))
                name = "set%04d" % random.randrange(self.args.sets)
                t0 = time.monotonic()
                s, body, h = a.request("PUT", "/v1/weight-sets/" + name,
                                       set_body(random.random()))
                t1 = time.monotonic()
                if s not in (200, 201):
                    raise RuntimeError("PUT %s on A: %d %s" % (name, s, body[:200]))
                etag = h.get("ETag")
                deadline = t1 + interval_ms / 1000 * 3 + 10
                while time.monotonic() < deadline:
                    if b.request("HEAD", "/v1/weight-sets/" + name)[2].get("ETag") == etag:
                        break
                    time.sleep(0.01)
                else:
                    raise RuntimeError("B did not serve %s %s within %.0f s" % (
                        name, etag, deadline - t1))
                put_ms.append((t1 - t0) * 1000)
                seen_ms.append((time.monotonic() - t1) * 1000)
        finally:
            a.stop()
            if b:
                b.stop()
        print("  %s at %d ms: PUT %s ms; visible on B after %s ms" % (
            store, interval_ms, " ".join("%.0f" % x for x in put_ms),
            " ".join("%.0f" % x for x in seen_ms)), flush=True)
        self.figures[key] = (median(seen_ms), seen_ms)
        self.figures[key + "_put"] = (median(put_ms), put_ms)


def rows_of(fg, args, machine_note):
    """The table rows (perf_table.py's ten fields): ours = S3, peer = the directory."""
    rows = []

    def row(scenario, ours, peer, unit, note):
        rows.append("\t".join(["s3store", scenario, ours, peer, unit, "", "", "", "", note]))

    n = "{:,}".format(args.sets)
    s3s, dirs = fg["s3_start"], fg["dir_start"]
    row("store start-up to /readyz 200 with %s sets: S3 (Swift) vs directory" % n,
        "%.0f" % s3s[0], "%.0f" % dirs[0], "ms",
        "median of %d fresh starts each; S3 %s ms, directory %s ms" % (
            args.reps, " ".join("%.0f" % t for t in s3s[1]),
            " ".join("%.0f" % t for t in dirs[1])))
    s3c, dirc = fg["s3_sync"], fg["dir_sync"]
    per_s3 = s3c["cpu_ms"] / max(1, s3c["syncs"])
    per_dir = dirc["cpu_ms"] / max(1, dirc["syncs"])
    sc = dirc.get("syscalls") or {}
    row("one sync of %s unchanged sets, server CPU per sync (both at 1000 ms): S3 vs directory"
        % n, "%.3f" % per_s3, "%.3f" % per_dir, "ms",
        "process CPU over %.0f s / syncs (S3 %d, directory %d); utime+stime %.0f and %.0f ms; "
        "S3: %.1f requests, %.0f B sent and %.0f B received by Swift per sync (%s); directory: "
        "no request, %s file-system calls per sync (strace -c), a full read of the folder "
        "every 60 s" % (
            s3c["window"], s3c["syncs"], dirc["syncs"], s3c["tick_ms"], dirc["tick_ms"],
            s3c["requests"] / max(1, s3c["syncs"]), s3c["bytes_out"] / max(1, s3c["syncs"]),
            s3c["bytes_in"] / max(1, s3c["syncs"]), ", ".join(s3c["other"]) or "LIST only",
            sc.get("fs_per_sync", "-")))
    for key, what in (("vis_default", "each at its default interval (S3 5000 ms, directory "
                                      "1000 ms)"),
                      ("vis_equal", "both at 1000 ms")):
        s3v, dirv = fg["s3_" + key], fg["dir_" + key]
        row("PUT on one replica to visible on another, %s: S3 vs directory" % what,
            "%.0f" % s3v[0], "%.0f" % dirv[0], "ms",
            "median of %d PUTs, each after a random wait within one interval; S3 %s, "
            "directory %s ms" % (args.puts, " ".join("%.0f" % x for x in s3v[1]),
                                 " ".join("%.0f" % x for x in dirv[1])))
    s3p, dirp = fg["s3_vis_equal_put"], fg["dir_vis_equal_put"]
    row("PUT of a set to its answer (2 x 2 float64, %s sets in the store): S3 vs directory" % n,
        "%.1f" % s3p[0], "%.1f" % dirp[0], "ms", machine_note)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="build/attention-server")
    ap.add_argument("--results", default="build/bench/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--puts", type=int, default=7)
    args = ap.parse_args()
    if args.quick:
        args.reps, args.window, args.puts = 1, 5.0, 2
    args.server = os.path.abspath(args.server)
    for need in (AWS, shutil.which("swift-proxy-server"), shutil.which("memcached")):
        if not need or not os.path.exists(need):
            print("bench_store_s3: Swift or awscli is missing: scripts/provision.sh s3",
                  file=sys.stderr)
            return 1
    os.makedirs(args.results, exist_ok=True)
    work = tempfile.mkdtemp(prefix="attn-bench-s3-")
    swift, bench, started = None, None, time.monotonic()
    try:
        t0 = time.monotonic()
        swift = Swift()
        bucket = "attn-bench-%d" % os.getpid()
        swift.aws("s3api", "create-bucket", "--bucket", bucket)
        print("Swift ready in %.1f s" % (time.monotonic() - t0), flush=True)
        data, put_s, copy_s = fill(args.server, work, swift, bucket, args.sets)
        print("filled: %d sets PUT to a directory server in %.1f s, copied into the bucket by "
              "aws s3 cp in %.1f s" % (args.sets, put_s, copy_s), flush=True)
        bench = Bench(args, swift, work, bucket, data)
        for store in ("dir", "s3"):
            bench.startup(store)
        for store in ("dir", "s3"):
            bench.sync_cost(store)
        bench.visible("dir", DIR_DEFAULT_MS, "dir_vis_default")
        bench.visible("s3", S3_DEFAULT_MS, "s3_vis_default")
        bench.figures["dir_vis_equal"] = bench.figures["dir_vis_default"]
        bench.figures["dir_vis_equal_put"] = bench.figures["dir_vis_default_put"]
        bench.visible("s3", EQUAL_MS, "s3_vis_equal")
    except (RuntimeError, OSError, http.client.HTTPException, subprocess.TimeoutExpired) as e:
        print("bench_store_s3: FAILED: %s" % e, file=sys.stderr)
        return 1
    finally:
        if swift:
            swift.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = rows_of(bench.figures, args, "the sets: PUT through a directory server, its files "
                   "copied by aws s3 cp (%.1f s); Swift's s3api on loopback, one replica, one "
                   "device; the directory's row at 1000 ms is its default-interval run" % copy_s)
    with open(os.path.join(args.results, "table-s3store.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n%-92s %10s %10s %8s" % ("scenario", "S3", "directory", "dir/S3"))
    for r in rows:
        w = r.split("\t")
        ratio = float(w[3]) / float(w[2]) if float(w[2]) > 0 else float("nan")
        print("%-92s %10s %10s %7.2fx  %s" % (w[1][:92], w[2] + " " + w[4], w[3] + " " + w[4],
                                             ratio, ""))
    print("%.0f s in all" % (time.monotonic() - started))
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
