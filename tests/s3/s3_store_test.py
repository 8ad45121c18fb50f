#!/usr/bin/python3
"""The S3 weight-set backend against a real S3 server: a single-node OpenStack Swift with its
s3api middleware (tests/s3/swift_s3.sh), which checks every request's signature and answers
conditional PUTs 501, started once for the run.  Three replicas (A, B, C) share only a bucket
(--store-url s3://BUCKET/PREFIX, each with an empty --data-dir of its own); awscli
(/usr/bin/aws) is the independent client that makes the buckets and reads and writes objects
behind the servers' backs.

- bytes: a set PUT on A is the object PREFIX/NAME.wset, whose bytes are a whole .wset file
  (size as its header says, checksum right, name and generation in the header) and are the
  bytes a directory-store server writes for the same set, but for the stored-at time, the
  generation and the checksum; its x-amz-meta-attn-generation is the generation the PUT
  answered.
- awscli: .wset files a directory server wrote, copied into the bucket with `aws s3 cp` (no
  metadata, as a migration would), are served by every replica with their generations.
- visible: a PUT on A is served by B and C within a sync interval and a margin, and at once by
  a replica whose next list is a minute away (D) when the request names weights_generation;
  without the pin D does not have it yet.
- delete: a DELETE on A is gone from the bucket and, after a sync, from B and C.
- if_match: If-Match with a replaced generation is 412 on GET and DELETE of another replica
  (and the DELETE deletes nothing), with the current one 200, as with the directory store.
- info: /v1/info's "store" says s3, the location and, after a PUT on Swift, conditional
  writes not_supported; a directory server's says directory and its folder.
- kill9: A is killed with SIGKILL in the middle of PUTs (a bucket without a prefix): every
  acknowledged PUT is served by B, C and the restarted A, at least as new as acknowledged, every
  answer along the way one whole version, every object a whole version (checksum right).
- damaged: an object overwritten with bad bytes by awscli is reported on the replicas' stderr
  and never served (the last good version or 404), then copied under PREFIX/quarantine/ and
  deleted (three sync intervals later: the quarantine delay is 3 x --store-sync-interval); a
  new PUT of the name is then served everywhere.
- wrong_secret: a server with a wrong secret, an unknown key id, a missing bucket or a clock
  two hours behind the store's (libfaketime, for the server and for awscli) exits non-zero at
  start-up, its stderr naming the endpoint and the S3 error code that awscli gets for the same
  request, and never the secret.
- tls: a second Swift proxy on https with a throwaway certificate (swift_s3.sh start-tls): a
  replica on it with --s3-ca-file shares the plain replicas' bucket both ways; one without the
  CA file exits at start-up naming the endpoint and the certificate.
- outage: with the proxy stopped, loaded sets are served, PUT and DELETE are 503
  store_unreachable with Retry-After, /readyz turns 503 after three intervals and the sync
  errors grow; with the proxy back on its port /readyz is 200 again, a PUT on B is served by A
  and C, and nothing acknowledged is lost.

Every wait polls against a deadline; every process started is stopped by its PID.  The
secret is one of this run's (SWIFT_S3_SECRET), so that its absence from logs can be checked.

Usage: s3_store_test.py --server PATH [--filter SUBSTR] (the checks whose name contains
SUBSTR: bytes, awscli, visible, delete, if_match, info, tls, kill9, damaged, wrong_secret,
outage).
Prints "ok NAME" or "FAIL NAME" per check and "N passed, N failed" last; where Swift or awscli
is missing it prints "SKIPPED: s3-store: why" and "0 passed, 0 failed".
"""
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

AWS = "/usr/bin/aws"
# Debian's libfaketime (the faketime package): a process with it preloaded and FAKETIME set
# sees the clock moved, and signs its requests with that time.
FAKETIME_LIB = "/usr/lib/%s/faketime/libfaketime.so.1" % (
    subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True,
                   text=True).stdout.strip() or "x86_64-linux-gnu")
SWIFT_SH = os.path.join(HERE, "swift_s3.sh")
INTERVAL_MS = 500           # --store-sync-interval of the replicas
MARGIN_S = 5.0              # what a sync may take beyond its interval on a loaded machine
SLOW_INTERVAL_MS = 60000    # replica D's: it lists again only after the checks are over
SEED = 0xCBF29CE484222325   # STORE_CHECKSUM_SEED (server/store/store_internal.h)
HEADER_LEN = {1: 80, 2: 88, 3: 96}
PARTS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")


# ---------------------------------------------------------------------------------------------
# The .wset format, read from outside (docs/weight-sets.md, server/store/store_format.c)

def fold(h, data):
    """store_format_checksum: 8-byte words multiply-xorshift mixed, then single bytes."""
    m = (1 << 64) - 1
    whole = len(data) // 8 * 8
    for (word,) in struct.iter_unpack("<Q", data[:whole]):
        h = ((h ^ word) * 0x9E3779B97F4A7C15) & m
        h ^= h >> 29
    for b in data[whole:]:
        h = ((h ^ b) * 0x100000001B3) & m
    return h


def parse_wset(data):
    """{version, name, generation, stored_at, size_ok, checksum_ok} of a .wset file's bytes, or
    a string saying why they are not one.  The checksum runs as the loader's: the header with
    the padded name, then each array on its own."""
    if len(data) < 88 or data[:8] != b"ATTNWSET":
        return "no ATTNWSET header (%d bytes)" % len(data)
    version = struct.unpack_from("<I", data, 8)[0]
    if version not in HEADER_LEN:
        return "format version %d" % version
    hl = HEADER_LEN[version]
    d_in, d_ctx, dk, dv, d_out = struct.unpack_from("<5Q", data, 24)
    present, name_len = struct.unpack_from("<II", data, 64)
    stored_at = struct.unpack_from("<q", data, 72)[0]
    generation = struct.unpack_from("<Q", data, 80)[0] if version >= 2 else stored_at * 1000
    elem = struct.unpack_from("<I", data, 88)[0] if version >= 3 else 0
    size = 8 if elem == 0 else 4
    shapes = {"wq": d_in * dk, "wk": d_ctx * dk, "wv": d_ctx * dv, "wo": dv * d_out,
              "bq": dk, "bk": dk, "bv": dv, "bo": d_out}
    arrays_at = hl + (name_len + 7) // 8 * 8
    runs, at = [(0, arrays_at)], arrays_at
    for bit, part in enumerate(PARTS):
        if present & (1 << bit):
            runs.append((at, at + shapes[part] * size))
            at += shapes[part] * size
    info = {"version": version, "name": data[hl:hl + name_len].decode("utf-8", "replace"),
            "generation": generation, "stored_at": stored_at, "size_ok": len(data) == at + 8,
            "arrays_at": arrays_at}
    h = SEED
    for a, b in runs:
        h = fold(h, data[a:b])
    info["checksum_ok"] = info["size_ok"] and struct.unpack_from("<Q", data, at)[0] == h
    return info


# ---------------------------------------------------------------------------------------------
# awscli and Swift

class Swift:
    """The Swift node of the run (tests/s3/swift_s3.sh in a mktemp -d folder)."""

    def __init__(self, secret):
        self.dir = tempfile.mkdtemp()
        env = dict(os.environ, SWIFT_S3_SECRET=secret)
        t0 = time.monotonic()
        p = subprocess.run(["bash", SWIFT_SH, "start", self.dir, "0"], env=env,
                           capture_output=True, text=True, timeout=150)
        self.took = time.monotonic() - t0
        self.log = p.stderr
        if p.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError("swift_s3.sh start failed: " + p.stderr[-1500:])
        self.vars = dict(l.split("=", 1) for l in p.stdout.split() if "=" in l)
        self.endpoint = self.vars["S3_ENDPOINT"]
        self.key, self.secret = self.vars["AWS_ACCESS_KEY_ID"], self.vars["AWS_SECRET_ACCESS_KEY"]

    def control(self, what):
        """stop-proxy, start-proxy (bounded by the script's own wait): (ok, its stderr)."""
        p = subprocess.run(["bash", SWIFT_SH, what, self.dir], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, SWIFT_S3_TIMEOUT="45"))
        return p.returncode == 0, p.stderr.strip()

    def start_tls(self):
        """A second proxy on https (swift_s3.sh start-tls): (endpoint, CA file)."""
        p = subprocess.run(["bash", SWIFT_SH, "start-tls", self.dir], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, SWIFT_S3_TIMEOUT="45"))
        if p.returncode != 0:
            raise RuntimeError("swift_s3.sh start-tls failed: " + p.stderr[-800:])
        v = dict(l.split("=", 1) for l in p.stdout.split() if "=" in l)
        return v["S3_TLS_ENDPOINT"], v["S3_CA_FILE"]

    def stop(self):
        subprocess.run(["bash", SWIFT_SH, "stop", self.dir], capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def clean_env(**more):
    """The environment without any AWS_ variable of the caller's (a credentials file or a
    profile of the user's must not decide a test), plus more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_EC2_METADATA_DISABLED": "true", "ATTN_GRPC_PORT": "0"})
    env.update(more)
    return env


def aws(swift, *args, key=None, secret=None, binary=False, more_env=None):
    """(return code, stdout, stderr) of one awscli command against swift."""
    env = clean_env(AWS_ACCESS_KEY_ID=key or swift.key,
                    AWS_SECRET_ACCESS_KEY=secret or swift.secret,
                    AWS_DEFAULT_REGION="us-east-1", AWS_PAGER="",
                    AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                    **(more_env or {}))
    p = subprocess.run([AWS, "--endpoint-url", swift.endpoint] + list(args), env=env,
                       capture_output=True, timeout=60)
    out = p.stdout if binary else p.stdout.decode("utf-8", "replace")
    return p.returncode, out, p.stderr.decode("utf-8", "replace")


def aws_json(swift, *args):
    rc, out, err = aws(swift, *args)
    if rc != 0:
        raise RuntimeError("aws %s: %s" % (" ".join(args[:2]), err.strip()[-300:]))
    return json.loads(out) if out.strip() else {}


def object_bytes(swift, bucket, key, where):
    """The object's bytes through `aws s3api get-object`, or None when there is none."""
    path = os.path.join(where, "got-" + key.replace("/", "_"))
    rc, _, err = aws(swift, "s3api", "get-object", "--bucket", bucket, "--key", key, path)
    if rc != 0:
        if "NoSuchKey" in err or "404" in err:
            return None
        raise RuntimeError("aws get-object %s: %s" % (key, err.strip()[-300:]))
    with open(path, "rb") as f:
        return f.read()


def list_keys(swift, bucket, prefix=""):
    j = aws_json(swift, "s3api", "list-objects-v2", "--bucket", bucket, "--prefix", prefix)
    return sorted(o["Key"] for o in j.get("Contents", []))


def error_code(stderr):
    """The S3 error code awscli printed ("An error occurred (CODE) ...")."""
    m = re.search(r"An error occurred \(([A-Za-z0-9]+)\)", stderr)
    return m.group(1) if m else None


_buckets = [0]


def new_bucket(swift, what):
    _buckets[0] += 1
    name = "attn-%s-%d-%d" % (what.replace("_", "-"), os.getpid(), _buckets[0])
    aws_json(swift, "s3api", "create-bucket", "--bucket", name)
    return name


# ---------------------------------------------------------------------------------------------
# Servers

class Replica:
    """One attention server on the S3 store (or, with url None, on its --data-dir alone),
    stdout read for its address with a deadline, stderr kept in a file across restarts."""

    def __init__(self, label, binary, work, url=None, endpoint=None, interval_ms=INTERVAL_MS,
                 env=None, extra=()):
        self.label, self.binary, self.url, self.endpoint = label, binary, url, endpoint
        self.data = os.path.join(work, "data-" + label)
        self.stderr_path = os.path.join(work, "stderr-" + label)
        self.interval_ms, self.env, self.extra = interval_ms, env, list(extra)
        self.proc, self.base = None, None

    def argv(self):
        a = [self.binary, "--host", "127.0.0.1", "--port", "0", "--quiet",
             "--data-dir", self.data, "--store-sync-interval", str(self.interval_ms)]
        if self.url:
            a += ["--store-url", self.url, "--s3-endpoint", self.endpoint]
        return a + self.extra

    def launch(self):
        os.makedirs(self.data, exist_ok=True)
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.PIPE,
                                     stderr=open(self.stderr_path, "ab"), env=self.env)

    def start(self, timeout=30):
        """Starts it and waits for "listening on http://..." (RuntimeError with the end of its
        stderr when it exits or says nothing within timeout)."""
        self.launch()
        line = read_line(self.proc, timeout)
        if "listening on http://" not in line:
            self.kill()
            self.proc = None            # nothing left to stop or to report
            raise RuntimeError("replica %s did not start (%r): %s" % (
                self.label, line[:200], " | ".join(self.stderr().splitlines()[-2:])))
        self.base = line.split("listening on ")[1].strip()
        return self

    def stderr(self):
        try:
            with open(self.stderr_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait(timeout=30)
            self.proc.stdout.close()

    def stop(self):
        """SIGTERM, and (exit status, sanitizer or error lines) once it ended (SIGKILL after
        30 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return (self.proc.returncode if self.proc else None), []
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        bad = [l for l in self.stderr().splitlines() if "ERROR: " in l or "runtime error" in l]
        return rc, bad

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, body bytes, headers); status None (body the error) when no answer came."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers
        except OSError as e:
            return None, repr(e).encode(), {}

    def json(self, method, path, body=None, headers=None):
        s, b, h = self.request(method, path, body, headers)
        try:
            return s, json.loads(b) if b else None, h
        except ValueError:
            return s, b, h


def read_line(proc, timeout):
    """The first line of proc's stdout, or what came before it exited or timeout passed."""
    fd, got, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got.decode("utf-8", "replace").split("\n")[0]


class Group:
    """Three replicas A, B and C on one bucket and prefix (started lazily by the checks that
    need them, once), stopped together; the clean exit of each is a check of its own."""

    def __init__(self, run, what, prefix="sets"):
        self.run, self.what, self.prefix = run, what, prefix
        self.bucket, self.reps, self.error = None, {}, None
        self.work = tempfile.mkdtemp(prefix="attn-s3-%s-" % what)

    def url(self):
        return "s3://%s/%s" % (self.bucket, self.prefix) if self.prefix else "s3://" + self.bucket

    def key(self, name):
        return "%s/%s.wset" % (self.prefix, name) if self.prefix else name + ".wset"

    def up(self):
        """The replicas by letter, started on first use (RuntimeError if they cannot be)."""
        if self.error:
            raise RuntimeError(self.error)
        if not self.reps:
            try:
                self.bucket = new_bucket(self.run.swift, self.what)
                for label in "ABC":
                    self.add(label)
            except Exception as e:  # noqa: BLE001 - reported by each check that needs them
                self.error = "%s replicas: %s" % (self.what, e)
                raise RuntimeError(self.error)
        return self.reps

    def add(self, label, interval_ms=INTERVAL_MS, env=None):
        r = Replica(label, self.run.binary, self.work, self.url(), self.run.swift.endpoint,
                    interval_ms, env or self.run.env)
        self.reps[label] = r
        return r.start()

    def stop(self):
        for label, r in sorted(self.reps.items()):
            if r.proc is None:
                continue
            rc, bad = r.stop()
            leaked = self.run.swift.secret in r.stderr()
            check("%s/replica %s exited cleanly, the secret never in its stderr" % (
                self.what, label), rc == 0 and not bad and not leaked, (rc, bad[:3], leaked))
        shutil.rmtree(self.work, ignore_errors=True)


class Run:
    def __init__(self, binary, swift):
        self.binary, self.swift = binary, swift
        self.env = clean_env(AWS_ACCESS_KEY_ID=swift.key, AWS_SECRET_ACCESS_KEY=swift.secret,
                             AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        self.plain = Group(self, "plain")
        self.work = tempfile.mkdtemp(prefix="attn-s3-run-")
        self.dir_server = None

    def directory_server(self):
        """A plain server on a --data-dir of its own (the directory store), started once."""
        if self.dir_server is None:
            self.dir_server = Replica("dir", self.binary, self.work).start()
        return self.dir_server

    def stop(self):
        self.plain.stop()
        if self.dir_server:
            rc, bad = self.dir_server.stop()
            check("directory server exited cleanly", rc == 0 and not bad, (rc, bad[:3]))
        shutil.rmtree(self.work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Sets

def set_body(value):
    m = [[value, value], [value, value]]
    return {"wq": m, "wk": m, "wv": m}


def put_set(r, name, value, headers=None):
    """(status, generation or None, the answer) of a PUT of name = value on r; the generation
    only when the ETag agrees with the body's."""
    s, b, h = r.json("PUT", "/v1/weight-sets/" + name, set_body(value), headers)
    gen = None
    if s in (200, 201) and isinstance(b, dict):
        g = b.get("generation")
        if isinstance(g, int) and h.get("ETag") == '"%d"' % g:
            gen = g
    return s, gen, b


def whole_value(body):
    """The one value every number of wq, wk and wv holds, or None when they differ."""
    try:
        vals = {x for p in ("wq", "wk", "wv") for row in body[p] for x in row}
    except (KeyError, TypeError):
        return None
    return vals.pop() if len(vals) == 1 else None


def served(r, name):
    """(status, generation, whole value) of GET name on r."""
    s, b, _ = r.json("GET", "/v1/weight-sets/" + name)
    if s != 200 or not isinstance(b, dict):
        return s, None, None
    return s, b.get("generation"), whole_value(b)


def poll(fn, timeout, step=0.05):
    """fn() until it is truthy or timeout seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(step)


def sync_wait():
    return INTERVAL_MS / 1000.0 + MARGIN_S


def metrics(r):
    s, b, _ = r.request("GET", "/metrics")
    out = {}
    if s == 200:
        for line in b.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def attention(r, name, generation=None):
    body = {"x": [[1.0, 2.0]], "weights": name}
    if generation is not None:
        body["weights_generation"] = generation
    return r.json("POST", "/v1/attention", body)


# ---------------------------------------------------------------------------------------------
# The checks

def check_bytes(run):
    g = run.plain
    reps = g.up()
    s, gen, ans = put_set(reps["A"], "bytes1", 0.25)
    check("bytes/PUT on A answered 201 with a generation (ETag agreeing)", s == 201 and gen,
          (s, ans))
    data = object_bytes(run.swift, g.bucket, g.key("bytes1"), g.work)
    check("bytes/the object %s is in the bucket" % g.key("bytes1"), data is not None)
    if data is None:
        return
    info = parse_wset(data)
    ok = isinstance(info, dict)
    check("bytes/the object is a .wset file of the set: size as its header says, checksum "
          "right, name bytes1, the generation the PUT answered",
          ok and info["size_ok"] and info["checksum_ok"] and info["name"] == "bytes1"
          and info["generation"] == gen, info)
    head = aws_json(run.swift, "s3api", "head-object", "--bucket", g.bucket, "--key",
                    g.key("bytes1"))
    meta = head.get("Metadata", {})
    check("bytes/x-amz-meta-attn-generation is the generation in decimal",
          meta.get("attn-generation") == str(gen), (meta, gen))
    d = run.directory_server()
    s, dgen, _ = put_set(d, "bytes1", 0.25)
    with open(os.path.join(d.data, "bytes1.wset"), "rb") as f:
        file_bytes = f.read()
    # what must differ: stored-at (72..80), generation (80..88) and so the checksum (last 8)
    def masked(b):
        return b[:72] + b[88:-8] if len(b) > 96 else b
    check("bytes/the object is the directory store's file of the same set, but for stored-at, "
          "generation and checksum (%d and %d bytes)" % (len(data), len(file_bytes)),
          s == 201 and len(data) == len(file_bytes) and masked(data) == masked(file_bytes),
          (s, len(data), len(file_bytes)))


def check_awscli(run):
    g = run.plain
    reps = g.up()
    d = run.directory_server()
    gens = {}
    for name, value in (("fromaws1", 1.5), ("fromaws2", -2.0)):
        s, gens[name], _ = put_set(d, name, value)
    src = os.path.join(g.work, "to-copy")
    os.makedirs(src, exist_ok=True)
    for name in gens:
        shutil.copy(os.path.join(d.data, name + ".wset"), src)
    dest = "s3://%s/%s/" % (g.bucket, g.prefix)
    rc, _, err = aws(run.swift, "s3", "cp", "--recursive", src, dest)
    check("awscli/aws s3 cp --recursive of two .wset files a directory server wrote", rc == 0,
          err[-300:])
    want = {"fromaws1": 1.5, "fromaws2": -2.0}
    for label, r in sorted(reps.items()):
        def all_served():
            got = {n: served(r, n) for n in want}
            return got if all(got[n] == (200, gens[n], want[n]) for n in want) else None
        got = poll(all_served, sync_wait())
        check("awscli/replica %s serves both, with the directory server's generations, within "
              "%.1f s" % (label, sync_wait()), got, {n: served(r, n) for n in want})


def check_visible(run):
    g = run.plain
    reps = g.up()
    s, gen, ans = put_set(reps["A"], "vis1", 3.0)
    check("visible/PUT on A", s == 201 and gen, (s, ans))
    for label in "BC":
        got = poll(lambda: served(reps[label], "vis1") == (200, gen, 3.0), sync_wait())
        check("visible/B and C serve it within %.1f s: %s" % (sync_wait(), label), got,
              served(reps[label], "vis1"))
    # D lists the bucket at start-up and then only a minute later: only the pin can bring it
    # a set PUT after it started.  Its credentials come from a file, profile "attn".
    cred = os.path.join(g.work, "credentials")
    with open(cred, "w") as f:
        f.write("[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n"
                "[attn]\naws_access_key_id = %s\naws_secret_access_key = %s\n"
                % (run.swift.key, run.swift.secret))
    try:
        dr = g.add("D", SLOW_INTERVAL_MS, clean_env(AWS_SHARED_CREDENTIALS_FILE=cred,
                                                     AWS_PROFILE="attn"))
    except RuntimeError as e:
        check("visible/replica D (credentials from a file, profile attn) started", False, e)
        return
    s, gen2, ans = put_set(reps["A"], "vis2", 4.0)
    s0, b0, _ = attention(dr, "vis2")
    check("visible/D, a minute from its next list, does not have a set PUT after it started "
          "(404 unknown_weight_set)", s0 == 404 and isinstance(b0, dict)
          and b0.get("error", {}).get("code") == "unknown_weight_set", (s0, b0))
    t0 = time.monotonic()
    s1, b1, h1 = attention(dr, "vis2", gen2)
    if s1 == 503 and h1.get("Retry-After"):   # generation_not_here_yet: one retry, as told
        time.sleep(min(float(h1.get("Retry-After")), 2.0))
        s1, b1, h1 = attention(dr, "vis2", gen2)
    check("visible/D serves attention naming weights_generation %s at once (%.1f s, at most "
          "one Retry-After)" % (gen2, time.monotonic() - t0), s1 == 200, (s1, b1))
    check("visible/then D's GET has that generation", served(dr, "vis2") == (200, gen2, 4.0),
          served(dr, "vis2"))


def check_delete(run):
    g = run.plain
    reps = g.up()
    s, gen, _ = put_set(reps["A"], "del1", 5.0)
    poll(lambda: all(served(reps[l], "del1")[0] == 200 for l in "BC"), sync_wait())
    check("delete/PUT on A served on B and C", all(served(reps[l], "del1") == (200, gen, 5.0)
                                                   for l in "BC"), s)
    s, b, _ = reps["A"].request("DELETE", "/v1/weight-sets/del1")
    check("delete/DELETE on A answers 204", s == 204, (s, b))
    check("delete/the object is gone from the bucket",
          g.key("del1") not in list_keys(run.swift, g.bucket, g.prefix + "/"))
    for label in "BC":
        got = poll(lambda: served(reps[label], "del1")[0] == 404, sync_wait())
        check("delete/gone on %s within %.1f s" % (label, sync_wait()), got,
              served(reps[label], "del1"))


def check_if_match(run):
    g = run.plain
    reps = g.up()
    _, g1, _ = put_set(reps["A"], "ifm1", 6.0)
    s, g2, _ = put_set(reps["A"], "ifm1", 7.0)
    check("if_match/two PUTs on A, the second with a newer generation", g1 and g2 and g2 > g1,
          (g1, g2))
    b = reps["B"]
    s, body, _ = b.json("GET", "/v1/weight-sets/ifm1", headers={"If-Match": '"%s"' % g1})
    check("if_match/GET on B with If-Match of the replaced generation: 412 generation_mismatch",
          s == 412 and isinstance(body, dict)
          and body.get("error", {}).get("code") == "generation_mismatch", (s, body))
    s, body, _ = b.json("DELETE", "/v1/weight-sets/ifm1", headers={"If-Match": '"%s"' % g1})
    check("if_match/DELETE on B with the replaced generation: 412", s == 412, (s, body))
    check("if_match/and the object is still there with the second version",
          g.key("ifm1") in list_keys(run.swift, g.bucket, g.prefix + "/"))

    def current():
        s, body, h = b.json("GET", "/v1/weight-sets/ifm1", headers={"If-Match": '"%s"' % g2})
        return (s, whole_value(body) if s == 200 else body)
    got = poll(lambda: current() == (200, 7.0), 3.0, step=0.3)
    check("if_match/GET on B with the current generation: 200, the second version", got,
          current())
    for label in "AC":
        s, body, _ = reps[label].json("GET", "/v1/weight-sets/ifm1",
                                      headers={"If-Match": '"%s"' % g1})
        check("if_match/412 on %s too" % label, s == 412, (s, body))


def check_info(run):
    g = run.plain
    reps = g.up()
    put_set(reps["A"], "info1", 8.0)
    s, info, _ = reps["A"].json("GET", "/v1/info")
    store = info.get("store") if isinstance(info, dict) else None
    want = {"backend": "s3", "location": g.url(), "conditional_writes": "not_supported"}
    check("info/A's store after a PUT on Swift is %s" % json.dumps(want),
          isinstance(store, dict) and all(store.get(k) == v for k, v in want.items()), store)
    d = run.directory_server()
    s, info, _ = d.json("GET", "/v1/info")
    store = info.get("store") if isinstance(info, dict) else None
    check("info/a directory server's store is backend directory, location its --data-dir",
          isinstance(store, dict) and store.get("backend") == "directory"
          and os.path.realpath(str(store.get("location"))) == os.path.realpath(d.data), store)


def check_kill9(run):
    """Writer on A over five names; a reader on B checks whole versions; A is killed with
    SIGKILL at a random moment between 0.6 and 1.6 s; then restarted."""
    g = Group(run, "kill9", prefix="")       # no prefix: objects are NAME.wset
    try:
        reps = g.up()
        rng = random.Random(9)
        names = ["k%d" % i for i in range(5)]
        acked, torn, errors = {}, [], []
        stop = threading.Event()

        def writer():
            for i in range(400):
                if stop.is_set():
                    return
                name = names[i % len(names)]
                s, gen, _ = put_set(reps["A"], name, float(i + 1))
                if gen:
                    acked[name] = (gen, float(i + 1))
                elif s is not None:
                    errors.append(s)

        def reader():
            while not stop.is_set():
                for name in names:
                    s, b, _ = reps["B"].json("GET", "/v1/weight-sets/" + name)
                    if s == 200 and whole_value(b) is None:
                        torn.append(name)
                time.sleep(0.02)
        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.6, 1.6))
        reps["A"].kill()
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        check("kill9/PUTs acknowledged before the SIGKILL (%d names), no other answer than "
              "success" % len(acked), acked and not errors, errors[:5])
        try:
            reps["A"].start()
            restarted = True
        except RuntimeError as e:
            restarted = False
            check("kill9/A restarts", False, e)

        def fine(r, name):
            s, gen, val = served(r, name)
            return s == 200 and gen is not None and val is not None and (
                gen > acked[name][0] or (gen == acked[name][0] and val == acked[name][1]))
        for label in "BCA":
            if label == "A" and not restarted:
                continue
            got = poll(lambda: all(fine(reps[label], n) for n in acked), sync_wait())
            check("kill9/%s serves every acknowledged PUT, at least as new, whole" % label, got,
                  {n: (served(reps[label], n), acked[n]) for n in acked})
        check("kill9/B never served a torn version while A wrote", not torn, torn[:5])
        local = os.path.join(g.work, "objects")
        rc, _, err = aws(run.swift, "s3", "cp", "--recursive", "s3://%s/" % g.bucket, local)
        bad = {}
        for name in names:
            p = os.path.join(local, name + ".wset")
            if not os.path.exists(p):
                if name in acked:
                    bad[name] = "missing"
                continue
            with open(p, "rb") as f:
                info = parse_wset(f.read())
            if not isinstance(info, dict) or not info["checksum_ok"] or (
                    name in acked and info["generation"] < acked[name][0]):
                bad[name] = info
        check("kill9/every object is one whole version (checksum right), at least as new as "
              "acknowledged", rc == 0 and not bad, (err[-200:], bad))
        check("kill9/nothing under quarantine/",
              not [k for k in list_keys(run.swift, g.bucket) if k.startswith("quarantine/")])
    finally:
        g.stop()


def check_damaged(run):
    g = Group(run, "damaged")
    try:
        reps = g.up()
        _, gen, _ = put_set(reps["A"], "dmg1", 9.0)
        put_set(reps["A"], "good1", 10.0)
        got = poll(lambda: all(served(reps[l], "dmg1") == (200, gen, 9.0) for l in "BC"),
                   sync_wait())
        check("damaged/a good version served everywhere first", got)
        good = object_bytes(run.swift, g.bucket, g.key("dmg1"), g.work)
        info = parse_wset(good or b"")
        bad = bytearray(good or b"")
        if isinstance(info, dict) and len(bad) > info["arrays_at"]:
            bad[info["arrays_at"]] ^= 0x40     # a flipped bit in wq: only the checksum tells
        bad_path = os.path.join(g.work, "bad.wset")
        with open(bad_path, "wb") as f:
            f.write(bad)
        rc, _, err = aws(run.swift, "s3", "cp", bad_path, "s3://%s/%s" % (g.bucket, g.key("dmg1")))
        check("damaged/aws s3 cp of a damaged version over it", rc == 0, err[-300:])
        for label in "ABC":
            got = poll(lambda: re.search(r"dmg1\.wset.*(checksum|damaged)",
                                         reps[label].stderr()), sync_wait())
            check("damaged/%s's stderr reports dmg1.wset damaged" % label, got,
                  reps[label].stderr()[-400:])
        for label in "ABC":
            s, gen_now, val = served(reps[label], "dmg1")
            check("damaged/%s serves the last good version or 404, never the damage" % label,
                  (s, gen_now, val) == (200, gen, 9.0) or s == 404, (s, gen_now, val))

        def quarantined():
            keys = list_keys(run.swift, g.bucket, g.prefix + "/")
            q = [k for k in keys if k.startswith(g.prefix + "/quarantine/dmg1.wset.")]
            return (q, keys) if q and g.key("dmg1") not in keys else None
        got = poll(quarantined, 3 * INTERVAL_MS / 1000.0 + 2 * MARGIN_S, step=0.2)
        check("damaged/moved to %s/quarantine/dmg1.wset.HOST.TIMESTAMP and deleted, within "
              "%.1f s" % (g.prefix, 3 * INTERVAL_MS / 1000.0 + 2 * MARGIN_S), got,
              list_keys(run.swift, g.bucket))
        if got:
            kept = object_bytes(run.swift, g.bucket, got[0][0], g.work)
            check("damaged/the quarantined object holds the damaged bytes", kept == bytes(bad))
            check("damaged/the good set is not quarantined", g.key("good1") in got[1]
                  and not [k for k in got[0] if "good1" in k], got)
        s, gen3, _ = put_set(reps["B"], "dmg1", 11.0)
        got = poll(lambda: all(served(reps[l], "dmg1") == (200, gen3, 11.0) for l in "ABC"),
                   sync_wait())
        check("damaged/a new PUT of the name on B is served everywhere", s in (200, 201) and got,
              {l: served(reps[l], "dmg1") for l in "ABC"})
    finally:
        g.stop()


def check_wrong_secret(run):
    bucket = run.plain.bucket or new_bucket(run.swift, "secret")
    work = tempfile.mkdtemp(prefix="attn-s3-secret-")
    wrong = "wrong-%08x" % random.getrandbits(32)
    # S3 refuses a request signed more than 15 minutes away from its own clock.
    skewed = {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": "-2h"}
    cases = (("wrong secret", run.swift.key, wrong, bucket, {}),
             ("unknown key id", "nobody:%08x" % random.getrandbits(32), run.swift.secret, bucket,
              {}),
             ("missing bucket", run.swift.key, run.swift.secret, "attn-missing-%d" % os.getpid(),
              {}),
             ("clock two hours behind", run.swift.key, run.swift.secret, bucket, skewed))
    try:
        for i, (what, key, secret, bkt, more_env) in enumerate(cases):
            if more_env and not os.path.exists(FAKETIME_LIB):
                check("wrong_secret/%s: libfaketime is installed" % what, False,
                      "%s is missing: scripts/provision.sh s3" % FAKETIME_LIB)
                continue
            rc, _, err = aws(run.swift, "s3api", "list-objects-v2", "--bucket", bkt,
                             "--max-keys", "1", key=key, secret=secret, more_env=more_env)
            code = error_code(err)
            r = Replica("w%d" % i, run.binary, work, "s3://%s/sets" % bkt, run.swift.endpoint,
                        env=clean_env(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
                                      AWS_SHARED_CREDENTIALS_FILE=os.devnull, **more_env))
            r.launch()
            try:
                status = r.proc.wait(timeout=30)
                out = r.proc.stdout.read().decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                status, out = "still running after 30 s", ""
            r.kill()
            text = r.stderr()
            host = run.swift.endpoint.split("//", 1)[1]
            check("wrong_secret/%s: exits non-zero at start-up, stderr naming %s and %s (the code "
                  "awscli gets)" % (what, host, code),
                  isinstance(status, int) and status != 0 and code and host in text
                  and code in text, (status, " | ".join(text.splitlines()[-2:])))
            check("wrong_secret/%s: the secret is not in its output" % what,
                  secret not in text + out, (text + out)[-300:])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_tls(run):
    """tls: a replica on the https proxy with --s3-ca-file shares the plain replicas' bucket
    both ways; without the CA file it does not start, its stderr naming the endpoint and the
    certificate."""
    reps = run.plain.up()
    endpoint, ca = run.swift.start_tls()
    t = Replica("T", run.binary, run.plain.work, run.plain.url(), endpoint, env=run.env,
                extra=["--s3-ca-file", ca])
    u = Replica("U", run.binary, run.plain.work, run.plain.url(), endpoint, env=run.env)
    try:
        t.start()
        _, gen, _ = put_set(t, "tls1", 21.0)
        check("tls/a PUT over https with --s3-ca-file", gen is not None)
        got = poll(lambda: served(reps["A"], "tls1") == (200, gen, 21.0), sync_wait())
        check("tls/served by a replica on plain http", got, served(reps["A"], "tls1"))
        _, gen2, _ = put_set(reps["B"], "tls2", 22.0)
        got = poll(lambda: served(t, "tls2") == (200, gen2, 22.0), sync_wait())
        check("tls/a set PUT over http served by the https replica", got, served(t, "tls2"))
        u.launch()
        try:
            status = u.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            status = "still running after 30 s"
        text = u.stderr()
        host = endpoint.split("//", 1)[1]
        check("tls/without --s3-ca-file: exits non-zero at start-up, naming %s and the "
              "certificate" % host,
              isinstance(status, int) and status != 0 and host in text
              and "certificate" in text.lower(), (status, text.splitlines()[-1:]))
    finally:
        u.kill()
        rc, bad = t.stop()
        check("tls/replica T exited cleanly, the secret never in its stderr",
              rc == 0 and not bad and run.swift.secret not in t.stderr(), (rc, bad[:3]))


def check_outage(run):
    g = Group(run, "outage")
    proxy_down = False
    try:
        reps = g.up()
        _, gen, _ = put_set(reps["A"], "out1", 12.0)
        got = poll(lambda: all(served(reps[l], "out1") == (200, gen, 12.0) for l in "BC"),
                   sync_wait())
        check("outage/a set served everywhere before", got)
        before = {l: metrics(r).get("attn_store_sync_errors_total", 0) for l, r in reps.items()}
        ok, msg = run.swift.control("stop-proxy")
        proxy_down = ok
        check("outage/the Swift proxy stopped", ok, msg)
        t0 = time.monotonic()
        for label, r in sorted(reps.items()):
            check("outage/%s still serves the loaded set" % label,
                  served(r, "out1") == (200, gen, 12.0) and attention(r, "out1")[0] == 200,
                  served(r, "out1"))
        s, b, h = reps["A"].json("PUT", "/v1/weight-sets/out2", set_body(13.0))
        check("outage/PUT is 503 store_unreachable with Retry-After",
              s == 503 and isinstance(b, dict) and b.get("error", {}).get("code")
              == "store_unreachable" and h.get("Retry-After"), (s, b, dict(h or {})))
        s, b, h = reps["B"].json("DELETE", "/v1/weight-sets/out1")
        check("outage/DELETE is 503 store_unreachable with Retry-After",
              s == 503 and isinstance(b, dict) and b.get("error", {}).get("code")
              == "store_unreachable" and h.get("Retry-After"), (s, b, dict(h or {})))
        for label, r in sorted(reps.items()):
            got = poll(lambda: r.request("GET", "/readyz")[0] == 503,
                       3 * INTERVAL_MS / 1000.0 + MARGIN_S)
            check("outage/%s's /readyz turns 503 (after %.1f s; three intervals are %.1f s)"
                  % (label, time.monotonic() - t0, 3 * INTERVAL_MS / 1000.0), got,
                  r.request("GET", "/readyz")[:2])
        for label, r in sorted(reps.items()):
            m = metrics(r)
            check("outage/%s's /metrics: sync errors grew, last sync age over an interval"
                  % label, m.get("attn_store_sync_errors_total", 0) > before[label]
                  and m.get("attn_store_last_sync_age_seconds", 0) > INTERVAL_MS / 1000.0,
                  (before[label], m.get("attn_store_sync_errors_total"),
                   m.get("attn_store_last_sync_age_seconds")))
        ok, msg = run.swift.control("start-proxy")
        proxy_down = not ok
        check("outage/the proxy started again on its port", ok, msg)
        for label, r in sorted(reps.items()):
            got = poll(lambda: r.request("GET", "/readyz")[0] == 200, sync_wait())
            check("outage/%s's /readyz 200 again" % label, got, r.request("GET", "/readyz")[:2])
        s, gen2, ans = put_set(reps["B"], "out2", 14.0)
        check("outage/a PUT on B once it is back", s == 201 and gen2, (s, ans))
        for label in "AC":
            got = poll(lambda: served(reps[label], "out2") == (200, gen2, 14.0)
                       and served(reps[label], "out1") == (200, gen, 12.0), sync_wait())
            check("outage/%s serves it, and the set from before" % label, got,
                  (served(reps[label], "out2"), served(reps[label], "out1")))
        check("outage/the bucket holds both", [g.key("out1"), g.key("out2")] ==
              list_keys(run.swift, g.bucket, g.prefix + "/"))
    finally:
        if proxy_down:
            run.swift.control("start-proxy")
        g.stop()


PLAIN = [check_bytes, check_awscli, check_visible, check_delete, check_if_match, check_info,
         check_tls]
# outage last: it takes the one Swift proxy away from everything
OTHERS = [check_wrong_secret, check_damaged, check_kill9, check_outage]


def missing():
    """Why the suite cannot run here, or None."""
    for path in (AWS, "/usr/bin/swift-proxy-server", "/usr/bin/memcached"):
        if not os.access(path, os.X_OK):
            return "%s is missing (scripts/provision.sh s3 installs it)" % path
    return None


def main():
    args = harness.arguments(__doc__)
    chosen = [c for c in PLAIN + OTHERS if harness.selected(c)]
    if not chosen:
        return harness.summary()
    why = missing()
    if why:
        print("SKIPPED: s3-store: " + why)
        return harness.summary()
    if not os.access(args.server, os.X_OK):
        check("server/%s is there" % args.server, False, "build it first (make)")
        return harness.summary()
    p = subprocess.run([args.server, "--help"], capture_output=True, text=True, timeout=30)
    check("server/--help names --store-url and --s3-endpoint",
          "--store-url" in p.stdout + p.stderr and "--s3-endpoint" in p.stdout + p.stderr,
          "the S3 backend is not in this build")
    secret = "attn-s3-%08x" % random.getrandbits(32)
    try:
        swift = Swift(secret)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        check("swift/started", False, e)
        return harness.summary()
    print("swift started in %.1f s at %s" % (swift.took, swift.endpoint), flush=True)
    run = Run(args.server, swift)
    try:
        for c in chosen:
            try:
                c(run)
            except Exception as e:  # noqa: BLE001 - one failure, and on to the next check
                check(c.__name__[len("check_"):] + " ended by an exception", False, repr(e))
    finally:
        try:
            run.stop()
        finally:
            swift.stop()
    return harness.summary()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # so that the finally stops Swift
    sys.exit(main())
