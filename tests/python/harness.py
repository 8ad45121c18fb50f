"""The harness of the Python suites: counted checks and a server on a free
loopback port.

check() prints "ok NAME" or "FAIL NAME: why" and counts it; summary() prints
"N passed, N failed" (the line tests/run.sh reads) and gives the exit status.
Server starts the binary with --port 0, reads the address it prints, and
stop() ends that PID only and counts a check that it exited cleanly (status
0, no sanitizer report on stderr).

A suite's tests are the check functions it hands to run(); arguments() adds
--filter SUBSTR to a suite's options, and then run() calls only the check
functions whose name contains SUBSTR and starts no server when none does, so
that a suite with no match prints "0 passed, 0 failed".
"""
import argparse
import os
import subprocess
import tempfile
import urllib.error
import urllib.request

RESULTS = {"passed": 0, "failed": 0}
FILTER = None  # --filter SUBSTR: only the check functions whose name contains it


def arguments(doc):
    """Parses a suite's options: --server PATH and --filter SUBSTR (which sets FILTER)."""
    global FILTER
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--server", required=True)
    ap.add_argument("--filter", default=None,
                    help="run only the check functions whose name contains SUBSTR")
    args = ap.parse_args()
    FILTER = args.filter
    return args


def named(name, fn):
    """fn with the name --filter selects it by (for a check built by a lambda)."""
    fn.__name__ = name
    return fn


def selected(fn):
    return FILTER is None or FILTER in fn.__name__


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[:600]),
          flush=True)


def run(binary, checks, *options, server_class=None):
    """Runs each check(server) against one server (of server_class, a
    subclass of Server, or Server) started with options; an exception is a
    failure, and the server is stopped whatever happens.  With --filter only
    the checks it selects run, and no server starts when it selects none."""
    checks = [c for c in checks if selected(c)]
    if not checks:
        return
    try:
        srv = (server_class or Server)(binary, *options)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        check("server started", False, repr(e))
        return
    try:
        for c in checks:
            c(srv)
    except Exception as e:  # noqa: BLE001 - a crash of a check is a failure, not a silent end
        check("no exception in " + ", ".join(c.__name__ for c in checks), False, repr(e))
    finally:
        srv.stop()


def summary():
    print("%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
    return 1 if RESULTS["failed"] else 0


class Server:
    def __init__(self, binary, *options):
        self.dir = tempfile.TemporaryDirectory(prefix="attn-py-")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0",
             "--data-dir", os.path.join(self.dir.name, "data")] + list(options),
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir.name, "stderr"), "w"),
            text=True)
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            self.proc.kill()
            raise RuntimeError("the server did not start: " + line)
        self.base = line.split("listening on ")[1].strip()

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=60)
        with open(os.path.join(self.dir.name, "stderr")) as f:
            bad = [l for l in f.read().splitlines() if "ERROR: " in l or "runtime error" in l]
        check("server exited cleanly", rc == 0 and not bad, (rc, bad[:3]))
        self.dir.cleanup()

    def request(self, method, path, body=None, headers=None):
        """(status, body bytes, headers) of one request; body is bytes or None."""
        req = urllib.request.Request(self.base + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers
