#!/usr/bin/python3
"""README.md's quick start followed as written, in a fresh minimal Debian container.

What a new user does, in order: every ```sh block of the README, as written (the package
installs too), in one container started from the minimal Debian image given (no make, no
curl, no python3), in a copy of the working tree with the README under test as README.md.
The blocks are read by tests/readme/readme_test.py's examples(), and what each prints is
compared by its check_output(), so that the two suites read the README alike:

  * `<!-- newcomer: serve -->` before a block: it starts the server and serves until
    stopped.  It runs in the background, and the next block starts once something listens
    on 127.0.0.1:8080 in the container; it fails when the block ends first, or after
    SERVE_TIMEOUT_S.
  * `<!-- newcomer: skip (why) -->` before a block leaves it out, printed with the reason.
  * Any other block runs with `bash -e -o pipefail` from the repository root, and must end
    with status 0 and print what the ```json or ```text block after it says, when one does
    (package installs have none).

Packages come from the Debian mirror the image's apt sources name.  The downloaded ones are
kept in build/newcomer/apt/ on the host, bind-mounted as the container's apt cache (with
the image's rule that deletes them after each install turned off), so that a second run
downloads nothing; `apt-get update` still runs as written.

Usage: newcomer_test.py --engine podman|docker --image IMAGE [--readme README.md]
[--filter SUBSTR].  Prints "ok N: first line", "FAIL N: first line: why" or "skip N: first
line (why)" per block and "N passed, N failed" last; removes its container by its ID
whatever happens.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "readme"))
import readme_test  # noqa: E402  (examples(), check_output(), report())

WORKDIR = "/root/attention-server"
BLOCK_TIMEOUT_S = 900      # a package install on a slow mirror; `make run`'s build is the serve
SERVE_TIMEOUT_S = 900      # `make run` from nothing: its packages, then the whole build
SERVE_LOG = "/root/serve.log"
SERVE_STATUS = "/root/serve.status"


def working_tree_files():
    """The files of the working tree that git tracks or would track, as paths from ROOT."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True).stdout
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if os.path.isfile(os.path.join(ROOT, n))]


class Container:
    """One container of the image, running `sleep infinity`, with the apt cache of the host
    mounted; removed by its ID in stop()."""

    def __init__(self, engine, image):
        self.engine, self.id = engine, None
        cache = os.path.join(ROOT, "build", "newcomer", "apt")
        for sub in ("archives/partial", "lists/partial"):
            os.makedirs(os.path.join(cache, sub), exist_ok=True)
        keep = os.path.join(cache, "keep-downloads.conf")
        with open(keep, "w") as f:
            f.write("// the newcomer suite keeps downloaded packages in build/newcomer/apt/\n")
        r = subprocess.run(
            [engine, "run", "-d", "--rm",
             "-v", os.path.join(cache, "archives") + ":/var/cache/apt/archives",
             "-v", os.path.join(cache, "lists") + ":/var/lib/apt/lists",
             "-v", keep + ":/etc/apt/apt.conf.d/docker-clean:ro",
             image, "sleep", "infinity"],
            capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or not r.stdout.strip():
            raise RuntimeError("%s run failed: %s" % (engine, r.stderr.strip()[-300:]))
        self.id = r.stdout.strip().splitlines()[-1]

    def exec(self, script, timeout, stdin=None, detach=False):
        """Runs script with bash -e -o pipefail in WORKDIR; a CompletedProcess."""
        cmd = [self.engine, "exec"] + (["-d"] if detach else []) + (["-i"] if stdin else []) + \
              ["-w", WORKDIR, self.id, "bash", "-e", "-o", "pipefail", "-c", script]
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)

    def copy_tree(self, readme):
        """Copies the working tree to WORKDIR, with readme as its README.md."""
        subprocess.run([self.engine, "exec", self.id, "mkdir", "-p", WORKDIR], check=True,
                       timeout=60)
        files = [f for f in working_tree_files() if f != "README.md"]
        tar = subprocess.Popen(["tar", "-C", ROOT, "-c", "--null", "-T", "-"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        untar = subprocess.Popen([self.engine, "exec", "-i", self.id, "tar", "-C", WORKDIR,
                                  "-x"], stdin=tar.stdout)
        tar.stdout.close()
        tar.stdin.write("\0".join(files).encode())
        tar.stdin.close()
        if tar.wait(timeout=120) != 0 or untar.wait(timeout=120) != 0:
            raise RuntimeError("copying the working tree into the container failed")
        with open(readme, "rb") as f:
            r = self.exec("cat > README.md", 60, stdin=f.read())
        if r.returncode != 0:
            raise RuntimeError("writing README.md failed: %r" % r.stderr[-200:])

    def stop(self):
        if self.id:
            subprocess.run([self.engine, "rm", "-f", self.id], capture_output=True, timeout=120)
            self.id = None


def serve(box, script):
    """Starts script in the background; None once 127.0.0.1:8080 accepts a connection, else
    why not."""
    wrapped = "{ %s\n} >%s 2>&1 </dev/null; echo $? >%s" % (script, SERVE_LOG, SERVE_STATUS)
    r = box.exec("bash -c %s" % shell_quote(wrapped), 60, detach=True)
    if r.returncode != 0:
        return "could not start it: %r" % r.stderr[-200:]
    # One loop inside the container waits on the condition: a connection, or the block's
    # end (its status file); bounded by SERVE_TIMEOUT_S.
    wait = ("for ((i = 0; i < %d; i++)); do\n"
            "  [ -e %s ] && exit 3\n"
            "  (: </dev/tcp/127.0.0.1/8080) 2>/dev/null && exit 0\n"
            "  sleep 0.5\n"
            "done; exit 4") % (SERVE_TIMEOUT_S * 2, SERVE_STATUS)
    t0 = time.monotonic()
    try:
        r = box.exec(wait, SERVE_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        r = None
    if r is not None and r.returncode == 0:
        print("    listening on 127.0.0.1:8080 after %.0f s" % (time.monotonic() - t0), flush=True)
        return None
    log = box.exec("tail -n 15 %s; echo; cat %s 2>/dev/null || true" % (SERVE_LOG, SERVE_STATUS),
                   60).stdout.decode(errors="replace")
    if r is not None and r.returncode == 3:
        return "it ended before anything listened on 127.0.0.1:8080; its last lines: %r" % log
    return "nothing listened on 127.0.0.1:8080 within %d s; its last lines: %r" % (
        SERVE_TIMEOUT_S, log)


def shell_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def first_line(script):
    lines = script.strip().splitlines()
    return lines[0].rstrip(" \\") if lines else "(empty block)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--filter", default=None,
                    help="run the blocks up to the last whose 'N: first line' contains this, "
                         "and report those that contain it")
    args = ap.parse_args()
    with open(args.readme, encoding="utf-8") as f:
        todo = readme_test.examples(f.read())
    if args.filter is not None:
        chosen = {e[0] for e in todo if args.filter in "%d: %s" % (e[0], first_line(e[1]))}
        if not chosen:
            print("0 passed, 0 failed")
            return 0
        todo = [e for e in todo if e[0] <= max(chosen)]
        readme_test.QUIET.update(e[0] for e in todo if e[0] not in chosen)

    def interrupted(*_):
        raise RuntimeError("interrupted by SIGTERM")
    signal.signal(signal.SIGTERM, interrupted)
    t0, box, served = time.monotonic(), None, False
    try:
        box = Container(args.engine, args.image)
        box.copy_tree(args.readme)
        for n, script, expected, _, problem, newcomer in todo:
            first = first_line(script)
            if problem:
                readme_test.report(n, first, False, problem)
                continue
            if newcomer and newcomer[0] == "skip":
                print("skip %d: %s (%s)" % (n, first, newcomer[1] or "no reason given"),
                      flush=True)
                continue
            if newcomer and newcomer[0] == "serve":
                why = serve(box, script)
                served = why is None
                readme_test.report(n, first, served, why or "")
                continue
            started = time.monotonic()
            try:
                r = box.exec(script, BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                readme_test.report(n, first, False, "still running after %d s" % BLOCK_TIMEOUT_S)
                continue
            out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
            if r.returncode != 0:
                readme_test.report(n, first, False, "exit status %d; stdout %r; stderr %r"
                                   % (r.returncode, out[-300:], err[-300:]))
                continue
            why = readme_test.check_output(expected, out) if expected else None
            readme_test.report(n, first, why is None, why or "")
            if time.monotonic() - started > 10:
                print("    (%.0f s)" % (time.monotonic() - started), flush=True)
        if served:
            # The server the README started is still the one answering: it did not die on
            # the way, whatever the examples sent it.
            r = box.exec("test ! -e %s" % SERVE_STATUS, 60)
            readme_test.report(len(todo) + 1, "the server still serves", r.returncode == 0,
                               "the serve block ended: %r" % box.exec(
                                   "tail -n 5 %s" % SERVE_LOG, 60).stdout[-300:])
    except Exception as e:  # noqa: BLE001 - reported as a failure, never a silent end
        readme_test.report(0, "the test itself", False, repr(e))
    finally:
        if box is not None:
            box.stop()
    print("newcomer: %.0f s in all" % (time.monotonic() - t0), flush=True)
    print("%d passed, %d failed" % (readme_test.RESULTS["passed"], readme_test.RESULTS["failed"]))
    return 1 if readme_test.RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
