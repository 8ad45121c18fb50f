#!/usr/bin/env python3
"""loadgen.py - the steady load of the swarm suite (tests/swarm/swarm.sh), and its check of
the weight sets that load stored.

  loadgen.py load --url URL --fixture FIXTURE.json --set SET.json --log OUT.jsonl
                  --stop-file PATH [--workers N] [--max-requests N] [--max-seconds S]
                  [--put-every K] [--interval S] [--prefix NAME]

sends, from N threads, attention requests (the fixture's request, its answer checked against
the fixture's expected numbers within its tolerance) and, every K-th request of a thread, a
PUT of a weight set under a name of its own (the set of SET.json with one weight changed to
a value unique to the name, so that a set read back proves which PUT it came from).  Each
thread pauses --interval seconds between its requests.  The load stops when PATH exists,
after --max-requests requests in all or after --max-seconds, whichever comes first.
Every request is written to OUT.jsonl as one JSON object: the kind (attention or put),
start and end times, the status (0 when no answer came), the replicas nginx tried
(X-Upstream), whether the answer was right, and for a PUT the set's name and the value it
carries.  The last line of stdout is a count by kind and outcome.

  loadgen.py verify --url URL --log OUT.jsonl... [--max-seconds S]

GETs every set whose PUT was acknowledged (answered 200 or 201) in the logs from URL, and
prints one line per set that is missing or differs, then "verified N sets, M bad".  The
swarm suite runs it inside each replica's network namespace, so URL is that replica.  A
replica loads sets others wrote within its store-sync interval, so a set not found is asked
for again until S seconds have passed.
"""
import argparse
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse


def connect(url, timeout):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def numbers(value):
    """The numbers of a nested list, in order."""
    if isinstance(value, list):
        out = []
        for v in value:
            out.extend(numbers(v))
        return out
    return [value]


def matches(got, expect):
    """True when the answer's output and attention equal the expected ones within the
    tolerance, in the same shape."""
    tol = expect["tolerance"]
    for key in ("output", "attention"):
        if key not in got:
            return False
        if json.dumps(got[key]).count("[") != json.dumps(expect[key]).count("["):
            return False
        a, b = numbers(got[key]), numbers(expect[key])
        if len(a) != len(b) or not a or any(abs(x - y) > tol for x, y in zip(a, b)):
            return False
    return True


def set_body(base, name_value):
    """The weight set of SET.json with wq[0][0] replaced by name_value."""
    body = json.loads(json.dumps(base))
    body["wq"][0][0] = name_value
    return body


def load(args):
    fixture = json.load(open(args.fixture))
    request = json.dumps(fixture["request"]).encode()
    base_set = json.load(open(args.set))
    deadline = time.monotonic() + args.max_seconds
    lock = threading.Lock()
    counter = {"sent": 0}
    log = open(args.log, "w")

    def take_one():
        with lock:
            if counter["sent"] >= args.max_requests:
                return None
            counter["sent"] += 1
            return counter["sent"]

    def worker(w):
        conn = None
        i = 0
        while time.monotonic() < deadline and not os.path.exists(args.stop_file):
            n = take_one()
            if n is None:
                break
            i += 1
            record = {"worker": w, "n": n}
            if i % args.put_every == 0:
                name = f"{args.prefix}-{w}-{i}"
                value = round(0.5 + (w * 100000 + i) * 1e-7, 7)
                method, path = "PUT", f"/v1/weight-sets/{name}"
                body = json.dumps(set_body(base_set, value)).encode()
                record.update(kind="put", name=name, value=value)
            else:
                method, path, body = "POST", "/v1/attention", request
                record.update(kind="attention")
            record["start"] = time.time()
            status, upstream, answer, error = 0, "", b"", ""
            try:
                if conn is None:
                    conn = connect(args.url, 30)
                conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = resp.read()
                status = resp.status
                upstream = resp.getheader("X-Upstream", "")
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                error = f"{type(e).__name__}: {e}"
                if conn is not None:
                    conn.close()
                conn = None
            record.update(end=time.time(), status=status, upstream=upstream)
            good = False
            try:
                got = json.loads(answer) if answer else {}
                if record["kind"] == "attention":
                    good = status == 200 and matches(got, fixture["expect"])
                else:
                    good = status in (200, 201)
            except ValueError:
                error = error or "the answer is not JSON: " + answer[:80].decode("utf-8", "replace")
            record["ok"] = good
            if not good:
                record["error"] = error or answer[:200].decode("utf-8", "replace")
            with lock:
                log.write(json.dumps(record) + "\n")
            time.sleep(args.interval)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    counts = {}
    for line in open(args.log):
        r = json.loads(line)
        key = f"{r['kind']} {'ok' if r['ok'] else 'failed'}"
        counts[key] = counts.get(key, 0) + 1
    print(json.dumps(counts, sort_keys=True))


def verify(args):
    acked = {}
    for path in args.log:
        for line in open(path):
            r = json.loads(line)
            if r["kind"] == "put" and r["ok"]:
                acked[r["name"]] = r["value"]
    deadline = time.monotonic() + args.max_seconds
    bad = {}
    pending = dict(acked)
    while True:
        bad = {}
        for name, value in pending.items():
            try:
                conn = connect(args.url, 10)
                conn.request("GET", f"/v1/weight-sets/{name}")
                resp = conn.getresponse()
                answer = resp.read()
                conn.close()
                if resp.status != 200:
                    bad[name] = f"GET answered {resp.status}"
                    continue
                got = json.loads(answer).get("wq", [[None]])[0][0]
                if got != value:
                    bad[name] = f"wq[0][0] is {got}, the acknowledged PUT stored {value}"
            except (OSError, http.client.HTTPException, ValueError) as e:
                bad[name] = f"{type(e).__name__}: {e}"
        if not bad or time.monotonic() >= deadline:
            break
        pending = {name: acked[name] for name in bad}
        time.sleep(0.5)
    for name, why in sorted(bad.items()):
        print(f"  {args.url}: set {name}: {why}")
    print(f"verified {len(acked)} sets, {len(bad)} bad")
    return 1 if bad or not acked else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("--url", required=True)
    lp.add_argument("--fixture", required=True)
    lp.add_argument("--set", required=True)
    lp.add_argument("--log", required=True)
    lp.add_argument("--stop-file", required=True)
    lp.add_argument("--workers", type=int, default=4)
    lp.add_argument("--max-requests", type=int, default=20000)
    lp.add_argument("--max-seconds", type=float, default=120)
    lp.add_argument("--put-every", type=int, default=10)
    lp.add_argument("--interval", type=float, default=0.0)
    lp.add_argument("--prefix", default="swarm")
    vp = sub.add_parser("verify")
    vp.add_argument("--url", required=True)
    vp.add_argument("--log", required=True, nargs="+")
    vp.add_argument("--max-seconds", type=float, default=10)
    args = p.parse_args()
    if args.mode == "load":
        load(args)
        return 0
    return verify(args)


if __name__ == "__main__":
    sys.exit(main())
