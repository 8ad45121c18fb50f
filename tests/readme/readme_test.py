#!/usr/bin/python3
"""Every shell example of README.md, run in order against a fresh server.

The convention (README.md says it again in an HTML comment at its top):

  * A fenced block opened with ```sh is an example.  Its commands run with
    `bash -e -o pipefail`, every block in the same working directory (a temp
    directory in which `api` points at the repository's api/, so that
    `api/examples/...` works and files one example writes are there for the
    next), against one server started here with an empty data directory.
    "127.0.0.1:8080" in a block is rewritten to that server's address, and
    "127.0.0.1:8001" to its gRPC address.
  * The first ```json or ```text block after an example, before the next
    example, is what the example prints, and every example must have one.
    json: the output is read as a sequence of JSON values, as many as the
    expected block holds, each ending its line (the server ends every JSON
    answer with a newline, so that it never runs into the next output or the
    prompt); an expected object names the members checked (the
    answer may have more), arrays have the same length, numbers agree within
    1e-6 (relative and absolute), other values are equal.  text: every
    non-blank expected line is a line of the output, in that order.
  * `<!-- readme-test: skip (why) -->` right before an example leaves it out
    (it is printed as skipped, with the reason); `<!-- readme-test:
    needs-python-module M -->` runs it only when /usr/bin/python3 can import
    M, which is the `python3` the examples see.
  * A ```bash or ```console block is refused (one convention: ```sh), as is an
    expected block with no example before it.
  * `<!-- newcomer: serve -->` and `<!-- newcomer: skip (why) -->` are for the
    newcomer suite (tests/newcomer/), which imports examples() and check_output()
    from here; this suite passes them by.

Usage: readme_test.py --server PATH [--readme README.md].  Prints "ok N: first
line", "FAIL N: first line: why" or "skip N: first line (why)" per example and
"N passed, N failed" last; stops the server by its PID and deletes its temp
directory whatever happens.
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

README_ADDRESS = "127.0.0.1:8080"
README_GRPC_ADDRESS = "127.0.0.1:8001"
EXAMPLE_TIMEOUT_S = 120
START_TIMEOUT_S = 30
TOLERANCE = 1e-6
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|needs-python-module)\s*(.*?)\s*-->")
NEWCOMER_MARKER = re.compile(r"<!--\s*newcomer:\s*(skip|serve)\s*(.*?)\s*-->")
FENCE = re.compile(r"^```\s*([A-Za-z0-9_-]*)\s*$")

RESULTS = {"passed": 0, "failed": 0}


QUIET = set()   # examples that run only because a chosen one builds on them


def report(n, first_line, ok, why=""):
    if ok and n in QUIET:
        return
    RESULTS["passed" if ok else "failed"] += 1
    print("%s %d: %s%s" % ("ok" if ok else "FAIL", n, first_line, "" if ok else ": " + why),
          flush=True)


# ---------------------------------------------------------------- the README's blocks

def blocks(text):
    """[(language, body, marker or None, line number, newcomer marker or None)] of every
    fenced block, in order; a marker comment applies to the block that follows it."""
    out, lines, i, marker, newcomer = [], text.splitlines(), 0, None, None
    while i < len(lines):
        m = MARKER.search(lines[i])
        if m:
            marker = (m.group(1), m.group(2).strip("() "))
        m = NEWCOMER_MARKER.search(lines[i])
        if m:
            newcomer = (m.group(1), m.group(2).strip("() "))
        f = FENCE.match(lines[i])
        if f:
            start, body, i = i + 1, [], i + 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((f.group(1), "\n".join(body) + "\n", marker, start, newcomer))
            marker = newcomer = None
        i += 1
    return out


def examples(text):
    """[(n, script, expected (language, text) or None, marker, problem or None,
    newcomer marker)]."""
    out = []
    for lang, body, marker, line, newcomer in blocks(text):
        if lang == "sh":
            out.append([len(out) + 1, body, None, marker, None, newcomer])
        elif lang in ("bash", "console", "shell", "zsh"):
            out.append([len(out) + 1, body, None, marker,
                        "line %d: a ```%s block; examples are ```sh" % (line, lang), newcomer])
        elif lang in ("json", "text"):
            if not out or out[-1][2] is not None:
                out.append([len(out) + 1, "(expected output at line %d)\n" % line, None, None,
                            "line %d: a ```%s block with no example before it" % (line, lang),
                            None])
            else:
                out[-1][2] = (lang, body)
    return out


# ---------------------------------------------------------------- comparing answers

def json_values(text, ended=False):
    """The JSON values of text, one after the other; raises ValueError on anything else, and
    with ended on a value that a newline does not follow (blanks may come between)."""
    dec, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return values
        if len(values) >= 1000:
            raise ValueError("more than 1000 JSON values")
        v, i = dec.raw_decode(text, i)
        values.append(v)
        rest = text[i:]
        if ended and not rest.lstrip(" \t").startswith("\n"):
            raise ValueError("JSON value %d does not end its line: %r" % (len(values), rest[:40]))


def differ(want, got, where="$"):
    """None when got matches want, else a sentence saying where they differ."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return "%s: expected an object, got %s" % (where, json.dumps(got)[:80])
        for k, v in want.items():
            if k not in got:
                return "%s: no member %r" % (where, k)
            d = differ(v, got[k], "%s.%s" % (where, k))
            if d:
                return d
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return "%s: expected %d elements, got %s" % (where, len(want), json.dumps(got)[:80])
        for i, (w, g) in enumerate(zip(want, got)):
            d = differ(w, g, "%s[%d]" % (where, i))
            if d:
                return d
        return None
    numeric = (int, float)
    if isinstance(want, numeric) and not isinstance(want, bool):
        if isinstance(got, numeric) and not isinstance(got, bool) and \
                abs(got - want) <= TOLERANCE * (1 + abs(want)):
            return None
        return "%s: expected %r, got %s" % (where, want, json.dumps(got)[:80])
    return None if want == got else "%s: expected %s, got %s" % (
        where, json.dumps(want)[:80], json.dumps(got)[:80])


def check_output(expected, out):
    lang, want = expected
    if lang == "json":
        wanted = json_values(want)
        try:
            got = json_values(out, ended=True)
        except ValueError as e:
            return "the output is not JSON (%s): %r" % (e, out[:200])
        if len(got) != len(wanted):
            return "expected %d JSON values, got %d: %r" % (len(wanted), len(got), out[:200])
        for i, (w, g) in enumerate(zip(wanted, got)):
            d = differ(w, g, "value %d" % (i + 1))
            if d:
                return d
        return None
    lines, at = out.splitlines(), 0
    for w in (l.rstrip() for l in want.splitlines()):
        if not w:
            continue
        while at < len(lines) and lines[at].rstrip() != w:
            at += 1
        if at == len(lines):
            return "no line %r (in order) in the output %r" % (w, out[:300])
        at += 1
    return None


# ---------------------------------------------------------------- the server

class Server:
    def __init__(self, binary, tmp):
        self.stderr_path = os.path.join(tmp, "server.stderr")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "-1", "--quiet",
             "--data-dir", os.path.join(tmp, "data")],
            stdout=subprocess.PIPE, stderr=open(self.stderr_path, "w"), text=True)
        self.address = self.listening("http")
        self.grpc_address = self.listening("grpc")

    def listening(self, scheme):
        """The address of the next "listening on SCHEME://ADDRESS" line the server prints."""
        deadline, line = time.monotonic() + START_TIMEOUT_S, ""
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        if ready and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
        if "listening on %s://" % scheme not in line:
            self.stop()
            raise RuntimeError("the server did not start %s: %r" % (scheme, line))
        return line.split("listening on %s://" % scheme)[1].strip()

    def stop(self):
        """Ends the server by its PID; its exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                return None
        return self.proc.returncode


# ---------------------------------------------------------------- main

def python_has(module):
    return subprocess.run(["/usr/bin/python3", "-c", "import " + module],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=120).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--readme", default=None)
    ap.add_argument("--filter", default=None,
                    help="run the examples up to the last whose 'N: first line' contains this, "
                         "and report those that contain it")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    readme = args.readme or os.path.join(root, "README.md")
    server_path = os.path.abspath(args.server)
    with open(readme, encoding="utf-8") as f:
        todo = examples(f.read())
    if args.filter is not None:
        def name(example):
            lines = example[1].strip().splitlines()
            return "%d: %s" % (example[0], lines[0].rstrip(" \\") if lines else "")
        chosen = {e[0] for e in todo if args.filter in name(e)}
        if not chosen:
            print("0 passed, 0 failed")
            return 0
        # The examples build on the ones before them: those run too, reported when they fail.
        todo = [e for e in todo if e[0] <= max(chosen)]
    else:
        chosen = None

    tmp = tempfile.mkdtemp(prefix="attn-readme-")
    server = None
    # A SIGTERM (tests/run.sh interrupted) is a failure, and the finally below still stops the
    # server and removes the directory.
    def interrupted(*_):
        raise RuntimeError("interrupted by SIGTERM")
    signal.signal(signal.SIGTERM, interrupted)
    try:
        work, bindir = os.path.join(tmp, "work"), os.path.join(tmp, "bin")
        os.mkdir(work)
        os.mkdir(bindir)
        os.symlink(os.path.join(root, "api"), os.path.join(work, "api"))
        os.symlink("/usr/bin/python3", os.path.join(bindir, "python3"))
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        server = Server(server_path, tmp)
        if chosen is not None:
            QUIET.update(e[0] for e in todo if e[0] not in chosen)
        for n, script, expected, marker, problem, _ in todo:
            first = script.strip().splitlines()[0].rstrip(" \\") if script.strip() \
                else "(empty block)"
            if problem:
                report(n, first, False, problem)
                continue
            if marker and marker[0] == "skip":
                print("skip %d: %s (%s)" % (n, first, marker[1] or "no reason given"), flush=True)
                continue
            if marker and marker[0] == "needs-python-module":
                missing = [m for m in marker[1].split() if not python_has(m)]
                if missing:
                    why = "/usr/bin/python3 cannot import " + ", ".join(missing)
                    print("skip %d: %s (%s)" % (n, first, why), flush=True)
                    print("SKIPPED: readme: example %d: %s" % (n, why), flush=True)
                    continue
            if expected is None:
                report(n, first, False, "no ```json or ```text block says what it prints")
                continue
            body = script.replace("http://" + README_ADDRESS, "http://" + server.address) \
                         .replace(README_ADDRESS, server.address) \
                         .replace(README_GRPC_ADDRESS, server.grpc_address)
            try:
                r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=work,
                                   env=env, capture_output=True, text=True,
                                   timeout=EXAMPLE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                report(n, first, False, "still running after %d s" % EXAMPLE_TIMEOUT_S)
                continue
            if r.returncode != 0:
                report(n, first, False, "exit status %d; stdout %r; stderr %r"
                       % (r.returncode, r.stdout[-300:], r.stderr[-300:]))
                continue
            why = check_output(expected, r.stdout)
            report(n, first, why is None, why or "")
    except Exception as e:  # noqa: BLE001 - reported as a failure, never a silent end
        report(0, "the test itself", False, repr(e))
    finally:
        if server is not None:
            rc = server.stop()
            with open(server.stderr_path, errors="replace") as f:
                bad = [l for l in f.read().splitlines() if "ERROR: " in l or "runtime error" in l]
            report(len(todo) + 1, "the server exited cleanly", rc == 0 and not bad,
                   "exit status %r, %s" % (rc, bad[:3]))
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
