#!/usr/bin/python3
"""What an operator relies on: autoscaling signals, a trace of every request, and
the settings that follow the machine.

Starts servers on free loopback ports (stopped by their PIDs) and checks:
- a burst of attention requests at --max-inflight 1 and one compute thread
  queues, and /metrics follows it: attention_requests_queued and
  attention_estimated_wait_seconds rise while it lasts and fall to 0 after,
  attention_compute_slots_busy never passes the one slot, and the queue-wait,
  compute and request-size histograms count every request of the burst (the
  sizes to the byte), and requests stopped by their deadline while queued count
  in the queue-wait and size histograms, not in the compute one;
- every answer (v1, v2, probes, metrics, the page, errors, a 503) carries
  traceresponse, X-Request-Id and Server-Timing, and the CORS answer exposes them;
- a valid traceparent is joined (same trace, new span, the caller's span as
  parent, tracestate kept), a malformed one is ignored (200, a new trace);
- X-Request-Id is echoed when usable and replaced otherwise;
- Server-Timing names the phases that happened (read only for a probe; read,
  parse, queue, compute, encode for a computation; compress for a gzipped answer);
- 64 concurrent requests get 64 different request ids, trace ids and span ids,
  and the JSON access log has exactly one line for each, with the same ids, and
  libmicrohttpd's own complaints are JSON lines as well;
- /v1/info shows each sized setting with its source (flag, env, cores/cgroup);
- the text access log prints a request target with spaces, quotes and
  backslashes as one quoted, escaped field, so that it cannot forge fields;
- 100 weight sets created, used and deleted leave /metrics the size it was,
  and a new set then gets its own series, not "_other";
- a PUT that does not fit a 1 MiB tmpfs is 507 insufficient_storage and
  changes nothing (skipped, with the reason printed, where mount is refused);
- 10,000 stored sets cost an idle server under 5% of a core, rescanned every
  100 ms (utime + stime from /proc/PID/stat over a window).

The burst's checks rest on the work it asks for, never on timing: six
requests of 2 GFLOP each behind one worker and one compute thread must wait
for one another, and the poll of /metrics stops when the burst has been
answered (at most POLLS polls).

Usage: operations_test.py --server PATH [--filter SUBSTR] (only the check
functions whose name contains SUBSTR).  Prints "ok NAME" or "FAIL NAME" per
check and "N passed, N failed" last.
"""
import gzip
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

BURST = 6
REFUSED = 3
POLLS = 20000
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def matrix(n, d, salt=0):
    return [[((i * 7 + j * 3 + salt) % 11) / 10.0 - 0.5 for j in range(d)] for i in range(n)]


def attention_body(n, d, salt=0):
    x = matrix(n, d, salt)
    return json.dumps({"q": x, "k": x, "v": x, "return_attention": False}).encode()


TINY = json.dumps({"q": [[1, 2]], "k": [[1, 2], [3, 4]], "v": [[1, 0], [0, 1]]}).encode()
V2_BODY = json.dumps({"inputs": [
    {"name": n, "shape": [2, 2], "datatype": "FP64", "data": [1, 2, 3, 4]}
    for n in ("q", "k", "v")]}).encode()


def metrics(srv):
    """The samples of /metrics as {name{labels}: value}."""
    status, body, _ = srv.request("GET", "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def series(name, model="attention"):
    return '%s{model="%s",protocol="http"}' % (name, model)


def check_metrics_burst(srv):
    bodies = [attention_body(1024, 64, salt) for salt in range(BURST)]
    before = metrics(srv)
    answers = [None] * BURST

    def send(i):
        answers[i] = srv.request("POST", "/v1/attention", bodies[i])[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    most_queued = most_busy = 0
    most_wait = 0.0
    for _ in range(POLLS):
        m = metrics(srv)
        most_queued = max(most_queued, m["attention_requests_queued"])
        most_busy = max(most_busy, m["attention_compute_slots_busy"])
        most_wait = max(most_wait, m["attention_estimated_wait_seconds"])
        if not any(t.is_alive() for t in threads):
            break
    for t in threads:
        t.join()
    after = metrics(srv)
    check("metrics/burst answered", answers == [200] * BURST, answers)
    check("metrics/requests queued rose during the burst", most_queued >= 1, most_queued)
    check("metrics/estimated wait rose during the burst", most_wait > 0, most_wait)
    check("metrics/slots busy within the one compute thread",
          most_busy == 1 and after["attention_compute_slots"] == 1, (most_busy, after))
    check("metrics/gauges back to 0 after the burst",
          after["attention_requests_queued"] == 0 and after["attention_compute_slots_busy"] == 0
          and after["attention_estimated_wait_seconds"] == 0,
          {k: v for k, v in after.items() if "_bucket" not in k and k.startswith("attention_")})

    def grew(name):
        return after.get(series(name), 0) - before.get(series(name), 0)

    for h in ("attention_queue_wait_seconds", "attention_compute_seconds",
              "attention_request_size_bytes"):
        check("metrics/%s counts the burst" % h, grew(h + "_count") == BURST, grew(h + "_count"))
    check("metrics/request sizes add up to the bodies sent",
          grew("attention_request_size_bytes_sum") == sum(len(b) for b in bodies),
          (grew("attention_request_size_bytes_sum"), sum(len(b) for b in bodies)))
    # Five of the six waited behind at least one whole computation of another.
    check("metrics/queue wait exceeds the shortest computation",
          grew("attention_queue_wait_seconds_sum") > grew("attention_compute_seconds_sum") / BURST,
          (grew("attention_queue_wait_seconds_sum"), grew("attention_compute_seconds_sum")))
    label = 'attention_queue_wait_seconds_bucket{model="attention",protocol="http",le="+Inf"}'
    check("metrics/histogram has HELP, TYPE and +Inf",
          label in after and "# TYPE attention_queue_wait_seconds histogram" in
          srv.request("GET", "/metrics")[1].decode(), label)


def check_refused_while_queued(srv):
    """Requests stopped by their deadline while they wait behind a long computation
    never reach a handler, yet count in the queue-wait and size histograms (not in
    the compute one).  The long request is 17 GFLOP on the one compute thread, the
    refused ones are sent once /metrics shows it computing, with X-Deadline-Ms 1."""
    big = attention_body(8192, 64)
    before = metrics(srv)
    first = []
    t = threading.Thread(target=lambda: first.append(srv.request("POST", "/v1/attention", big)[0]))
    t.start()
    for _ in range(POLLS):
        if metrics(srv)["attention_compute_slots_busy"] == 1 or not t.is_alive():
            break
    answers = [None] * REFUSED
    errors = [None] * REFUSED

    def send(i):
        status, body, _ = srv.request("POST", "/v2/models/attention/infer", V2_BODY,
                                      {"Content-Type": "application/json", "X-Deadline-Ms": "1"})
        answers[i] = status
        errors[i] = json.loads(body).get("error") if status != 200 else None

    threads = [threading.Thread(target=send, args=(i,)) for i in range(REFUSED)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.join()
    after = metrics(srv)
    check("refused/the long request computed", first == [200], first)
    check("refused/each waiting request stopped by its deadline",
          answers == [503] * REFUSED, (answers, errors))

    def grew(name, model="attention"):
        return after.get(series(name, model), 0) - before.get(series(name, model), 0)

    check("refused/queue wait counts them under the path's model",
          grew("attention_queue_wait_seconds_count") == REFUSED + 1,
          grew("attention_queue_wait_seconds_count"))
    check("refused/their bodies count in the sizes",
          grew("attention_request_size_bytes_sum") == REFUSED * len(V2_BODY) + len(big),
          grew("attention_request_size_bytes_sum"))
    check("refused/no compute time for them, one for the long request",
          grew("attention_compute_seconds_count") == 1 and
          grew("attention_compute_seconds_count", "_unknown") == 0,
          (grew("attention_compute_seconds_count"),
           grew("attention_compute_seconds_count", "_unknown")))


def trace_of(headers):
    m = TRACEPARENT_RE.match(headers.get("traceresponse") or "")
    return m.groups() if m else None


def check_headers_on_every_route(srv):
    cases = [
        ("GET", "/healthz", None, {}, 200),
        ("GET", "/readyz", None, {}, 200),
        ("GET", "/v1/info", None, {}, 200),
        ("GET", "/metrics", None, {}, 200),
        ("GET", "/v1/weight-sets", None, {}, 200),
        ("POST", "/v1/attention", TINY, {}, 200),
        ("POST", "/v1/attention", attention_body(64, 16), {}, 200),
        ("POST", "/v1/attention", b"{", {}, 400),
        ("PUT", "/v1/weight-sets/bad", b"{}", {}, 400),
        ("GET", "/no/such/path", None, {}, 404),
        ("DELETE", "/healthz", None, {}, 405),
        ("OPTIONS", "/v1/attention", None, {"Origin": "https://page.example",
                                           "Access-Control-Request-Method": "POST"}, 204),
        ("GET", "/v2/health/live", None, {}, 200),
        ("GET", "/v2/health/ready", None, {}, 200),
        ("GET", "/v2/models/attention", None, {}, 200),
        ("POST", "/v2/models/attention/infer", V2_BODY, {}, 200),
        ("POST", "/v2/models/nope/infer", V2_BODY, {}, 404),
        ("GET", "/viz", None, {}, 200),
        # 2 GFLOP cannot be computed within the 1 ms the request allows itself.
        ("POST", "/v1/attention", attention_body(2048, 64), {"X-Deadline-Ms": "1"}, 503),
    ]
    for method, path, body, headers, want in cases:
        status, _, h = srv.request(method, path, body, headers)
        name = "headers/%s %s %d" % (method, path, want)
        check(name + " status", status == want, status)
        check(name + " traceresponse, X-Request-Id, Server-Timing",
              trace_of(h) is not None and h.get("X-Request-Id") and
              "read;dur=" in (h.get("Server-Timing") or ""), dict(h))
    _, _, h = srv.request("GET", "/healthz", None, {"Origin": "https://page.example"})
    exposed = h.get("Access-Control-Expose-Headers") or ""
    check("headers/CORS exposes them", all(x in exposed for x in (
        "Server-Timing", "traceresponse", "X-Request-Id")), exposed)
    _, _, h = srv.request("OPTIONS", "/v1/attention", None, {
        "Origin": "https://page.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "traceparent, tracestate, x-request-id"})
    allowed = (h.get("Access-Control-Allow-Headers") or "").lower()
    check("headers/a page may send trace context", all(x in allowed for x in (
        "traceparent", "tracestate", "x-request-id")), allowed)


def check_trace_context(srv):
    parent = "00-%s-%s-01" % (TRACE, PARENT)
    status, _, h = srv.request("POST", "/v1/attention", TINY,
                               {"traceparent": parent, "tracestate": "vendor=abc,other=1"})
    t = trace_of(h)
    check("trace/valid traceparent joined",
          status == 200 and t is not None and t[0] == TRACE and t[1] != PARENT and t[2] == "01",
          (status, h.get("traceresponse")))
    bad = ["garbage", "00-%s-%s-01-extra" % (TRACE, PARENT), "00-%s-%s-01" % ("0" * 32, PARENT),
           "00-%s-%s-01" % (TRACE, "0" * 16), "ff-%s-%s-01" % (TRACE, PARENT),
           "00-%s-%s-01" % (TRACE.upper(), PARENT), "00-%s-%s-0" % (TRACE, PARENT), ""]
    for i, value in enumerate(bad):
        status, _, h = srv.request("POST", "/v1/attention", TINY,
                                   {"traceparent": value, "tracestate": "vendor=bad"})
        t = trace_of(h)
        check("trace/malformed traceparent %d ignored, a new trace" % i,
              status == 200 and t is not None and t[0] != TRACE and t[0] != "0" * 32,
              (value, status, h.get("traceresponse")))
    # A later version may carry more fields; they are ignored.
    status, _, h = srv.request("GET", "/healthz", None,
                               {"traceparent": "01-%s-%s-01-what-comes" % (TRACE, PARENT)})
    t = trace_of(h)
    check("trace/a later version is read as 00", t is not None and t[0] == TRACE, h.get("traceresponse"))


def check_request_id(srv):
    _, _, h = srv.request("GET", "/healthz", None, {"X-Request-Id": "client-42.a_b:c"})
    check("request-id/usable one echoed", h.get("X-Request-Id") == "client-42.a_b:c",
          h.get("X-Request-Id"))
    for value in ("has space", "x" * 65, "quote\"d"):
        _, _, h = srv.request("GET", "/healthz", None, {"X-Request-Id": value})
        check("request-id/unusable one replaced (%s)" % value[:10],
              re.match(r"^[0-9a-f]{32}$", h.get("X-Request-Id") or "") is not None,
              h.get("X-Request-Id"))


def phases(headers):
    return [p.split(";")[0].strip() for p in (headers.get("Server-Timing") or "").split(",")]


def check_server_timing(srv):
    _, _, h = srv.request("GET", "/healthz")
    check("server-timing/probe: read only", phases(h) == ["read"], h.get("Server-Timing"))
    _, _, h = srv.request("POST", "/v1/attention", attention_body(64, 16))
    check("server-timing/computation: its phases",
          phases(h) == ["read", "parse", "queue", "compute", "encode"], h.get("Server-Timing"))
    _, body, h = srv.request("POST", "/v1/attention", attention_body(64, 16),
                             {"Accept-Encoding": "gzip"})
    check("server-timing/gzipped answer: compress too",
          h.get("Content-Encoding") == "gzip" and "compress" in phases(h) and
          json.loads(gzip.decompress(body))["output"], h.get("Server-Timing"))
    _, _, h = srv.request("POST", "/v1/attention", b"{")
    check("server-timing/refused body: read and parse",
          phases(h) == ["read", "parse"], h.get("Server-Timing"))


def check_ids_unique_and_logged(srv):
    results = []
    lock = threading.Lock()

    def client(k):
        for i in range(8):
            rid = "conc-%d-%d" % (k, i) if i % 2 else None
            _, _, h = srv.request("POST", "/v1/attention", TINY,
                                  {"X-Request-Id": rid} if rid else {})
            with lock:
                results.append((h.get("X-Request-Id"), trace_of(h)))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [r[0] for r in results]
    traces = [r[1][0] for r in results if r[1]]
    spans = [r[1][1] for r in results if r[1]]
    check("ids/64 concurrent requests: 64 request ids, trace ids, span ids",
          len(results) == 64 and len(set(ids)) == 64 and len(set(traces)) == 64 and
          len(set(spans)) == 64, (len(set(ids)), len(set(traces)), len(set(spans))))
    # A path that unescapes to bytes that are not UTF-8 nor printable is logged all the same.
    _, body, h = srv.request("GET", "/v1/%ff%fe%01", None, {"X-Request-Id": "odd-path"})
    odd = h.get("X-Request-Id")
    # An error that quotes such bytes (a model's name from the path) is JSON in UTF-8 still.
    _, body, _ = srv.request("GET", "/v2/models/%ff%fe")
    try:
        words = json.loads(body.decode("utf-8"))["error"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        words = e
    check("ids/an error quoting bytes that are not UTF-8 is JSON, the bytes as U+FFFD",
          isinstance(words, str) and '"\ufffd\ufffd"' in words, (body[:120], words))
    # Two connections libmicrohttpd itself complains about: its message is a JSON line too.
    host, port = srv.base.split("//")[1].rsplit(":", 1)
    for raw in (b"GARBAGE\r\n\r\n", b"GET /healthz HTTP/1.1\r\nContent-Length: x\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=30) as c:
            c.sendall(raw)
            c.shutdown(socket.SHUT_WR)
            while c.recv(4096):
                pass
    srv.stop_quietly = True
    srv.proc.terminate()
    srv.proc.wait(timeout=60)
    with open(os.path.join(srv.dir.name, "stderr")) as f:
        text = f.read().splitlines()
    objects = [json.loads(l) for l in text if l.startswith("{")]
    library = [o for o in objects if o.get("source") == "libmicrohttpd"]
    check("ids/libmicrohttpd's messages are JSON lines too",
          library and not any(l.startswith("libmicrohttpd") for l in text),
          [l for l in text if not l.startswith("{")][:5])
    lines = [o for o in objects if "request_id" in o]
    by_id = {}
    for line in lines:
        by_id.setdefault(line["request_id"], []).append(line)
    ok = True
    for rid, (trace, span, _) in results:
        got = by_id.get(rid, [])
        if len(got) != 1 or got[0]["trace_id"] != trace or got[0]["span_id"] != span:
            ok = False
            check("ids/log line of %s" % rid, False, got)
            break
    check("ids/one JSON log line per request, with the same ids", ok, len(lines))
    check("ids/a path of bytes that are not UTF-8 is logged, as '?'",
          odd == "odd-path" and [l["path"] for l in by_id.get(odd, [])] == ["/v1/???"],
          by_id.get(odd))
    sample = by_id.get(results[0][0], [{}])[0]
    fields = ("time", "request_id", "trace_id", "span_id", "method", "route", "model", "status",
              "bytes_in", "bytes_out", "duration_ms", "phases_ms", "client", "served")
    check("ids/log line fields", all(f in sample for f in fields) and
          sample["route"] == "/v1/attention" and sample["model"] == "attention" and
          sample["client"] == "127.0.0.1" and "compute" in sample["phases_ms"], sample)


def raw_request(srv, raw):
    """Sends raw bytes on a new connection and reads the answer until the server closes."""
    host, port = srv.base.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as c:
        c.sendall(raw)
        c.shutdown(socket.SHUT_WR)
        answer = b""
        while True:
            part = c.recv(4096)
            if not part:
                return answer
            answer += part


def check_text_log_escaped(srv):
    """The text access line (the binary's default) prints a value a client chose
    as one word or one quoted string: a target with spaces cannot forge fields."""
    forged = "/v1/x status=200 model=evil id=forged"
    raw_request(srv, ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: forge-1\r\n"
                      "Connection: close\r\n\r\n" % forged).encode())
    raw_request(srv, b'GET /v1/a"b\\c HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: forge-2\r\n'
                     b"Connection: close\r\n\r\n")
    srv.request("GET", "/healthz", None, {"X-Request-Id": "plain-1"})
    srv.stop_quietly = True
    srv.proc.terminate()
    srv.proc.wait(timeout=60)
    with open(os.path.join(srv.dir.name, "stderr")) as f:
        lines = [l for l in f.read().splitlines() if l.startswith("access ")]

    def line_of(rid):
        got = [l for l in lines if " id=%s " % rid in l or l.endswith(" id=%s" % rid)]
        return got[0] if len(got) == 1 else None

    def words(line):
        try:
            return shlex.split(line)
        except ValueError as e:
            return ["unreadable: %s" % e]

    one = line_of("forge-1")
    w = words(one) if one else []
    check("log/a target with spaces is one quoted field",
          one is not None and one.startswith('access GET "%s" status=' % forged) and
          w[:3] == ["access", "GET", forged] and w[3].startswith("status=") and
          not any(x.startswith("model=") for x in w) and
          [x for x in w if x.startswith("id=")] == ["id=forge-1"], one or lines[-5:])
    two = line_of("forge-2")
    check("log/quotes and backslashes are escaped",
          two is not None and two.startswith('access GET "/v1/a\\"b\\\\c" status=') and
          words(two)[2] == '/v1/a"b\\c', two or lines[-5:])
    plain = line_of("plain-1")
    check("log/a plain path is printed as it is",
          plain is not None and plain.startswith("access GET /healthz status=200 "), plain)


def put_set(srv, name, body):
    return srv.request("PUT", "/v1/weight-sets/" + name, body,
                       {"Content-Type": "application/json"})[0]


def metrics_text(srv):
    return srv.request("GET", "/metrics")[1].decode()


def check_metrics_after_deletes(srv):
    """A deleted set's per-model series go with it: 100 sets created, used and
    deleted leave /metrics the size it was, and a new set gets its own series."""
    toy = open(os.path.join(ROOT, "api", "examples", "toy.weight-set.json"), "rb").read()
    use = json.dumps({"x": [[0.3, 0.8, -0.3]], "weights": "NAME"})

    def cycle(name):
        ok = put_set(srv, name, toy) == 201
        ok = ok and srv.request("POST", "/v1/attention",
                                use.replace("NAME", name).encode())[0] == 200
        return ok and srv.request("DELETE", "/v1/weight-sets/" + name)[0] in (200, 204)

    # one cycle and one page first, so that every route's counters exist before
    # the size is taken
    ok = cycle("warm") and srv.request("POST", "/v1/attention", TINY)[0] == 200
    # /metrics counts itself once it has completed, which its client may see first
    for _ in range(100):
        page = metrics_text(srv)
        if 'attn_http_requests_total{route="/metrics"' in page:
            break
    before = len(metrics_text(srv))
    for i in range(100):
        ok = ok and cycle("cycle-%03d" % i)
    page = metrics_text(srv)
    check("metrics/100 sets created, used and deleted", ok)
    # the counters' digits may grow a little; a series of a set is some 4 KB
    check("metrics/the page is the size it was after 100 deleted sets",
          len(page) <= before + 400 and 'model="cycle-' not in page,
          "%d bytes before, %d after" % (before, len(page)))
    ok = put_set(srv, "prod", toy) == 201 and srv.request(
        "POST", "/v1/attention", use.replace("NAME", "prod").encode())[0] == 200
    page = metrics_text(srv)
    check("metrics/a new set gets its own series, not _other",
          ok and 'attention_compute_seconds_count{model="prod",protocol="http"} 1' in page and
          'model="_other"' not in page,
          [l for l in page.splitlines() if "compute_seconds_count" in l][:6])


def check_full_disk(srv):
    """A weight set that does not fit on the disk is 507 insufficient_storage,
    and nothing is changed: the set it would replace is still served, and no
    file is left behind.  Needs a small tmpfs, which only a test allowed to
    mount one can have."""
    mnt = tempfile.mkdtemp(prefix="attn-enospc-", dir=srv.dir.name)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("SKIPPED: full-disk: cannot mount a tmpfs here (%s)" %
              (r.stderr.strip() or r.returncode), flush=True)
        os.rmdir(mnt)
        return
    small = harness.Server(BINARY, "--quiet", "--data-dir", os.path.join(mnt, "data"))
    try:
        toy = open(os.path.join(ROOT, "api", "examples", "toy.weight-set.json"), "rb").read()
        n = 256  # three 256 x 256 float64 arrays: 1.5 MB, more than the 1 MiB disk
        big = json.dumps({k: matrix(n, n, s) for s, k in enumerate(("wq", "wk", "wv"))}).encode()
        stored = put_set(small, "kept", toy) == 201
        files = sorted(os.listdir(os.path.join(mnt, "data")))
        for name in ("kept", "new"):
            status, body, _ = small.request("PUT", "/v1/weight-sets/" + name, big,
                                            {"Content-Type": "application/json"})
            try:
                code = json.loads(body)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = body[:200]
            check("full-disk/PUT %s on a full disk: 507 insufficient_storage" % name,
                  stored and status == 507 and code == "insufficient_storage", (status, code))
        status, body, _ = small.request("GET", "/v1/weight-sets/kept")
        check("full-disk/nothing changed: the set is served as it was, no file left behind",
              status == 200 and json.loads(body)["shapes"]["wq"] == [3, 2] and
              sorted(os.listdir(os.path.join(mnt, "data"))) == files and
              small.request("GET", "/v1/weight-sets/new")[0] == 404,
              (status, files, sorted(os.listdir(os.path.join(mnt, "data")))))
    finally:
        small.stop()
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)


def cpu_seconds(pid):
    """utime + stime of a process, from /proc/PID/stat, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wset_checksum(data):
    """The store's checksum (server/store/store_format.c) of bytes whose length
    is a multiple of 8, as a whole set file's are."""
    h = 0xCBF29CE484222325
    for (word,) in struct.iter_unpack("<Q", data):
        h = ((h ^ word) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


def write_sets(template, directory, count):
    """count copies of a float64 set file (format version 2: its name at offset
    88 and its length at 68) named s00000.wset, ... in directory, each with its
    own name and checksum."""
    head = 88
    if template[:8] != b"ATTNWSET" or struct.unpack_from("<I", template, 8)[0] != 2:
        raise ValueError("the template is not a float64 set file of format version 2")
    name_len = struct.unpack_from("<I", template, 68)[0]
    arrays = template[head + (name_len + 7) // 8 * 8:-8]
    for i in range(count):
        name = b"s%05d" % i
        header = bytearray(template[:head])
        struct.pack_into("<I", header, 68, len(name))
        body = bytes(header) + name + b"\0" * (-len(name) % 8) + arrays
        with open(os.path.join(directory, name.decode() + ".wset"), "wb") as f:
            f.write(body + struct.pack("<Q", wset_checksum(body)))


SETS = 10000
IDLE_WINDOW = 3.0
BINARY = None  # the server under test (--server), for the checks that start their own


def check_rescan_idle(srv):
    """The store's rescans cost nothing measurable while nothing changes, however
    many sets there are: 10,000 sets on disk, a rescan every 100 ms, and the
    server's CPU time (utime + stime from /proc) over a window of idleness stays
    under 5% of a core."""
    toy = open(os.path.join(ROOT, "api", "examples", "toy.weight-set.json"), "rb").read()
    put_set(srv, "template", toy)
    with open(os.path.join(srv.dir.name, "data", "template.wset"), "rb") as f:
        template = f.read()
    directory = tempfile.mkdtemp(prefix="many-", dir=srv.dir.name)
    write_sets(template, directory, SETS)
    # a directory nobody has written to for a minute, as a store at rest is
    old = os.stat(directory).st_mtime - 60
    os.utime(directory, (old, old))
    many = harness.Server(BINARY, "--quiet", "--data-dir", directory,
                          "--store-sync-interval", "100")
    try:
        page = metrics_text(many)
        loaded = "attn_store_sets %d" % SETS in page
        start_cpu, start = cpu_seconds(many.proc.pid), time.monotonic()
        time.sleep(IDLE_WINDOW)  # the window measured, not a wait for anything
        used = (cpu_seconds(many.proc.pid) - start_cpu) / (time.monotonic() - start)
        age = re.search(r"attn_store_last_sync_age_seconds ([0-9.e+-]+)", metrics_text(many))
        print("rescan idle: %d sets, %.1f%% of a core over %.1f s" %
              (SETS, 100 * used, IDLE_WINDOW), flush=True)
        check("rescan/10,000 sets loaded", loaded,
              [l for l in page.splitlines() if l.startswith("attn_store_sets")])
        check("rescan/idle at 10,000 sets: under 5% of a core", used < 0.05,
              "%.1f%% of a core" % (100 * used))
        check("rescan/the rescans kept running (the last good one under a second ago)",
              age is not None and float(age.group(1)) < 1.0, age and age.group(0))
    finally:
        many.stop()


def check_sizing_info(srv):
    _, body, _ = srv.request("GET", "/v1/info")
    sizing = json.loads(body)["sizing"]
    check("sizing/flag named as the source",
          sizing["max_inflight"] == {"value": 5, "source": "flag"}, sizing)
    check("sizing/environment named as the source",
          sizing["io_threads"] == {"value": 3, "source": "env"}, sizing)
    cpus = sizing["cpus"]
    check("sizing/compute threads follow the CPUs",
          sizing["compute_threads"] == {"value": cpus, "source": sizing["cpus_source"]} and
          sizing["cpus_source"] in ("cores", "cgroup") and cpus == len(os.sched_getaffinity(0))
          or sizing["cpus_source"] == "cgroup", sizing)


class Server(harness.Server):
    """A server whose stop() may find it already stopped by its check (which
    read its log), and then counts only its exit status."""
    stop_quietly = False

    def stop(self):
        if not self.stop_quietly:
            return super().stop()
        rc = self.proc.wait(timeout=60)
        check("server exited cleanly", rc == 0, rc)
        self.dir.cleanup()


def main():
    global BINARY
    args = harness.arguments(__doc__)
    BINARY = args.server
    harness.run(args.server, [check_metrics_burst, check_refused_while_queued], "--quiet",
                "--max-inflight", "1",
                "--compute-threads", "1", "--queue-wait-ms", "60000", "--inline-max-bytes", "0")
    harness.run(args.server, [check_headers_on_every_route, check_trace_context, check_request_id,
                              check_server_timing], "--quiet")
    harness.run(args.server, [check_ids_unique_and_logged], "--log-format", "json",
                server_class=Server)
    harness.run(args.server, [check_text_log_escaped], server_class=Server)
    harness.run(args.server, [check_metrics_after_deletes, check_full_disk, check_rescan_idle],
                "--quiet")
    os.environ["ATTN_IO_THREADS"] = "3"
    try:
        harness.run(args.server, [check_sizing_info], "--quiet", "--max-inflight", "5")
    finally:
        del os.environ["ATTN_IO_THREADS"]
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
