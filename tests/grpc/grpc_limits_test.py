#!/usr/bin/python3
"""The limits HTTP holds, held on gRPC: each attack of the issue "one edge for both
transports", scaled to run in seconds on loopback, with the server's memory and
descriptors read from /proc.

- a message of many empty inputs (2 bytes each on the wire) is refused within the
  memory budget (VmHWM stays below the budget over the resident set at start);
- messages that stall half-way end within --header-timeout and --min-body-rate, and
  what they had sent is reserved in the client's share of the budget;
- streams that never send their message end, and MAX_CONCURRENT_STREAMS is advertised
  (--grpc-max-streams); calls opened and left waiting are bounded by the client's share;
- gRPC connections count against --max-connections-per-ip together with HTTP's, close
  when idle past --timeout, and give their descriptors back;
- a NUL inside the authorization metadata is refused, never cut;
- a call refused before its handler is logged with its RPC and status, and gRPC core's own
  lines reach the JSON log as JSON.
Each check also sends ordinary calls while the attack runs: they must keep answering.

The raw HTTP/2 (a message that stops half-way, streams with no message, metadata
with a NUL) is spoken through Debian's python3-h2, since no gRPC client sends it.

Usage: grpc_limits_test.py --server PATH [--filter SUBSTR].  Prints "ok NAME" or
"FAIL NAME" per check and "N passed, N failed" last.
"""
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc_test as gt  # noqa: E402  (the stubs, the server class, the request builders)
from grpc_test import pb, rpc_error  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

import grpc  # noqa: E402
import h2.config  # noqa: E402  (Debian's python3-h2)
import h2.connection  # noqa: E402
import h2.events  # noqa: E402

MIB = 1 << 20
ATTACKER = "127.0.0.2"   # another loopback address: the per-address caps are its own


def proc_status(srv):
    """VmHWM and VmRSS of the server in bytes."""
    out = {}
    with open("/proc/%d/status" % srv.proc.pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) * 1024
    return out


def open_fds(srv):
    return len(os.listdir("/proc/%d/fd" % srv.proc.pid))


def small_call(srv):
    """One ordinary ModelInfer from 127.0.0.1; True when it answers OK."""
    q = gt.floats(8, 1)
    req = gt.infer_request("attention", [("q", "FP32", [2, 4], q), ("k", "FP32", [2, 4], q),
                                         ("v", "FP32", [2, 4], q)])
    code, _ = rpc_error(srv.stub().ModelInfer, req, timeout=20)
    return code == grpc.StatusCode.OK


def grpc_frame(message_len):
    """gRPC's length prefix of an uncompressed message."""
    return struct.pack(">BI", 0, message_len)


class RawH2:
    """One HTTP/2 connection from `source` spoken by hand: streams whose message stops
    half-way or never comes, or with metadata a client library would refuse."""

    def __init__(self, target, source=ATTACKER):
        host, port = target.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30,
                                             source_address=(source, 0))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self.conn.initiate_connection()
        self.flush()
        self.ended = {}        # stream id -> how it ended ("reset", or the grpc-status)
        self.closed = False
        self.remote_settings = {}

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.settimeout(30)
            self.sock.sendall(data)

    def start(self, method, extra=()):
        sid = self.conn.get_next_available_stream_id()
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", method),
                   (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                   (b"te", b"trailers")] + list(extra)
        self.conn.send_headers(sid, headers)
        self.flush()
        return sid

    def send(self, sid, data, deadline):
        """Sends data on stream sid as flow control lets it, until `deadline` (a
        time.monotonic()); returns the bytes sent."""
        sent = 0
        while sent < len(data) and time.monotonic() < deadline and sid not in self.ended:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size,
                       len(data) - sent)
            if room <= 0:
                self.pump(0.05)
                continue
            self.conn.send_data(sid, data[sent:sent + room])
            self.flush()
            sent += room
            self.pump(0)  # the server's window updates and pings, as a client reads them
        return sent

    def pump(self, seconds):
        """Reads what the server sends for up to `seconds`."""
        end = time.monotonic() + seconds
        while not self.closed:
            left = end - time.monotonic()
            if left <= 0 and seconds > 0:
                return
            self.sock.settimeout(left if seconds > 0 else 0)
            try:
                data = self.sock.recv(1 << 16)
            except (socket.timeout, BlockingIOError):
                return
            except OSError:
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.StreamReset):
                    self.ended.setdefault(ev.stream_id, "reset")
                elif isinstance(ev, h2.events.TrailersReceived) or (
                        isinstance(ev, h2.events.ResponseReceived) and ev.stream_ended):
                    status = dict(ev.headers).get(b"grpc-status", b"?").decode()
                    self.ended.setdefault(ev.stream_id, status)
                elif isinstance(ev, h2.events.RemoteSettingsChanged):
                    for k, v in ev.changed_settings.items():
                        self.remote_settings[k] = v.new_value
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.closed = True
            try:
                self.flush()
            except OSError:
                self.closed = True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def check_unpack_budget(srv):
    """A ModelInferRequest of 400,000 empty inputs (800 KB on the wire), four at once:
    each refused, and the server's high-water mark stays within its 128 MiB budget."""
    small_call(srv)
    base = proc_status(srv)["VmRSS"]
    req = pb.ModelInferRequest(model_name="attention")
    for _ in range(400000):
        req.inputs.add()
    blob = req.SerializeToString()
    codes = []

    def one():
        fn = srv.stub().ModelInfer.with_call
        try:
            fn(pb.ModelInferRequest.FromString(blob), timeout=60)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    check("unpack: 400,000 empty inputs are refused (INVALID_ARGUMENT or RESOURCE_EXHAUSTED)",
          len(codes) == 4 and all(c in (grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.RESOURCE_EXHAUSTED) for c in codes),
          codes)
    hwm = proc_status(srv)["VmHWM"]
    check("unpack: the high-water mark stays within the budget (128 MiB over the start)",
          hwm - base < 128 * MIB, "VmHWM %d MiB, VmRSS at start %d MiB" % (hwm >> 20, base >> 20))
    check("unpack: an ordinary call answers afterwards", small_call(srv))


def check_stalled_messages(srv):
    """Eight calls from one address announce 40 MB messages and stall after 12 MB: the
    client's share (64 MiB of the 128 MiB budget) ends those past it at once, the rest end
    within --header-timeout by --min-body-rate; the high-water mark stays within the budget
    and an ordinary call from another address answers throughout."""
    small_call(srv)
    base = proc_status(srv)
    conns, sids, t0 = [], [], time.monotonic()
    payload = grpc_frame(40 * 1000 * 1000) + b"\0" * (12 * 1000 * 1000)
    for _ in range(8):
        c = RawH2(srv.target)
        sid = c.start(b"/inference.GRPCInferenceService/ModelInfer")
        c.send(sid, payload, time.monotonic() + 20)
        conns.append(c)
        sids.append(sid)
    during = small_call(srv)
    end = time.monotonic() + 15
    while time.monotonic() < end and not all(s in c.ended or c.closed for c, s in zip(conns, sids)):
        for c in conns:
            c.pump(0.1)
    took = time.monotonic() - t0
    ends = [c.ended.get(s, "closed" if c.closed else None) for c, s in zip(conns, sids)]
    check("stall: every stalled call ended (header-timeout 2 s, min-body-rate 1M)",
          all(e is not None for e in ends), (ends, "%.1f s" % took))
    check("stall: some ended at once by the client's share (RESOURCE_EXHAUSTED, 8)",
          "8" in ends, ends)
    check("stall: an ordinary call answered while they stalled", during)
    hwm = proc_status(srv)["VmHWM"]
    check("stall: the high-water mark stays within the budget (128 MiB over the start)",
          hwm - base["VmRSS"] < 128 * MIB,
          "VmHWM %d MiB, VmRSS at start %d MiB" % (hwm >> 20, base["VmRSS"] >> 20))
    for c in conns:
        c.close()
    check("stall: an ordinary call answers afterwards", small_call(srv))


def check_idle_streams(srv):
    """A connection opens as many calls as MAX_CONCURRENT_STREAMS allows (it is advertised:
    --grpc-max-streams 16) and sends no message: each ends within --header-timeout (2 s)
    plus a sweep, DEADLINE_EXCEEDED, logged with its RPC; ordinary calls answer meanwhile."""
    c = RawH2(srv.target)
    c.pump(0.5)
    advertised = c.remote_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
    check("idle streams: MAX_CONCURRENT_STREAMS is advertised (16)", advertised == 16, advertised)
    sids = [c.start(b"/inference.GRPCInferenceService/ModelInfer") for _ in range(16)]
    during = small_call(srv)
    end = time.monotonic() + 10
    while time.monotonic() < end and not all(s in c.ended for s in sids) and not c.closed:
        c.pump(0.2)
    ends = [c.ended.get(s) for s in sids]
    check("idle streams: each call without a message ends DEADLINE_EXCEEDED (4)",
          ends == ["4"] * 16, ends)
    check("idle streams: an ordinary call answered meanwhile", during)
    c.close()
    log = srv.log()
    check("idle streams: the ended calls are logged as ModelInfer with their status",
          sum(1 for l in log.splitlines() if "ModelInfer" in l and " status=4 " in l) >= 16,
          [l for l in log.splitlines() if "ModelInfer" in l][-3:])


def check_refused_logged(srv):
    """A ModelInfer that ends with no message, and one whose message is not a
    ModelInferRequest, are logged as ModelInfer with their status and its HTTP twin
    (INVALID_ARGUMENT, 400), never as /v1/attention answered 200."""
    before = srv.request("GET", "/metrics")[1].decode()
    c = RawH2(srv.target, source="127.0.0.1")
    empty = c.start(b"/inference.GRPCInferenceService/ModelInfer")
    c.conn.end_stream(empty)
    junk = c.start(b"/inference.GRPCInferenceService/ModelInfer")
    c.conn.send_data(junk, grpc_frame(3) + b"\xff\xff\xff", end_stream=True)
    c.flush()
    end = time.monotonic() + 10
    while time.monotonic() < end and not (empty in c.ended and junk in c.ended) and not c.closed:
        c.pump(0.2)
    c.close()
    check("refused: no message and junk are INVALID_ARGUMENT (3)",
          [c.ended.get(empty), c.ended.get(junk)] == ["3", "3"], c.ended)
    lines = [l for l in srv.log().splitlines() if l.startswith("access grpc ModelInfer")]
    check("refused: both logged as ModelInfer, status 3, http 400",
          sum(1 for l in lines if " status=3 http=400 " in l) == 2, lines[-2:])
    after = srv.request("GET", "/metrics")[1].decode()
    attention = lambda text: [l for l in text.splitlines()  # noqa: E731
                              if 'route="/v1/attention"' in l and "_count" in l]
    check("refused: /v1/attention's counts did not move", attention(before) == attention(after),
          attention(after)[:3])


def check_open_calls_share(srv):
    """3,000 calls opened from one address and left waiting (12 connections of 250) hold
    about 15 KB each in gRPC's core: each reserves 16 KiB in the client's share (16 MiB of a
    32 MiB budget), so those past it are RESOURCE_EXHAUSTED at once, the high-water mark
    stays within the budget, and an ordinary call from another address answers."""
    small_call(srv)
    base = proc_status(srv)["VmRSS"]
    conns = []
    for _ in range(12):
        c = RawH2(srv.target)
        c.pump(0.1)
        for _ in range(250):
            c.start(b"/inference.GRPCInferenceService/ModelInfer")
        c.pump(0.1)
        conns.append(c)
    end = time.monotonic() + 5
    while time.monotonic() < end and sum(len(c.ended) for c in conns) < 3000 - 1024:
        for c in conns:
            c.pump(0.05)
    ended = [e for c in conns for e in c.ended.values()]
    check("open calls: those past the share are RESOURCE_EXHAUSTED (8) at once",
          len(ended) >= 3000 - 1024 and set(ended) == {"8"},
          (len(ended), sorted(set(ended))))
    check("open calls: an ordinary call from another address answers", small_call(srv))
    hwm = proc_status(srv)["VmHWM"]
    check("open calls: the high-water mark stays within the budget (32 MiB over the start)",
          hwm - base < 32 * MIB, "VmHWM %d MiB, VmRSS at start %d MiB" % (hwm >> 20, base >> 20))
    for c in conns:
        c.close()


def http_from(srv, source):
    """The status of GET /healthz from `source`, or the error when refused."""
    host, port = srv.base.split("//")[1].rsplit(":", 1)
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(source, 0))
        c.request("GET", "/healthz")
        status = c.getresponse().status
        c.close()
        return status
    except (OSError, http.client.HTTPException) as e:
        return repr(e)


def check_connection_caps(srv):
    """--max-connections-per-ip 10 holds across both ports: 15 gRPC connections from one
    address leave 10 open, and that address's HTTP is refused while another's answers;
    the idle ones close past --timeout (3 s) and their descriptors come back."""
    small_call(srv)
    fds = open_fds(srv)
    conns = [RawH2(srv.target) for _ in range(15)]
    for c in conns:
        c.pump(0.05)
    time.sleep(0.5)
    for c in conns:
        c.pump(0.05)
    open_now = sum(1 for c in conns if not c.closed)
    check("caps: 10 of 15 gRPC connections from one address stay open", open_now == 10, open_now)
    refused = http_from(srv, ATTACKER)
    check("caps: that address's HTTP is refused while its gRPC holds the cap",
          not isinstance(refused, int), refused)
    check("caps: another address's HTTP answers", http_from(srv, "127.0.0.1") == 200)
    check("caps: another address's gRPC answers", small_call(srv))
    end = time.monotonic() + 12
    while time.monotonic() < end and not all(c.closed for c in conns):
        for c in conns:
            c.pump(0.05)
    check("caps: the idle connections are closed past --timeout (3 s)",
          all(c.closed for c in conns), sum(1 for c in conns if not c.closed))
    for c in conns:
        c.close()
    end = time.monotonic() + 5
    while time.monotonic() < end and open_fds(srv) > fds + 2:
        time.sleep(0.2)
    check("caps: the descriptors come back", open_fds(srv) <= fds + 2, (open_fds(srv), fds))
    again = RawH2(srv.target)
    again.pump(0.3)
    check("caps: the address connects again once its connections are gone", not again.closed)
    again.close()
    check("caps: and its HTTP answers again", http_from(srv, ATTACKER) == 200)


def check_nul_token(srv):
    """authorization "Bearer TOKEN\\0junk" is refused (UNAUTHENTICATED, 16), not read as
    the token; the token itself is accepted."""
    results = []
    for value in (b"Bearer " + gt.TOKEN.encode() + b"\0junk", b"Bearer " + gt.TOKEN.encode()):
        c = RawH2(srv.target, source="127.0.0.1")
        sid = c.start(b"/inference.GRPCInferenceService/ServerMetadata",
                      [(b"authorization", value)])
        c.conn.send_data(sid, grpc_frame(0), end_stream=True)
        c.flush()
        end = time.monotonic() + 10
        while time.monotonic() < end and sid not in c.ended and not c.closed:
            c.pump(0.2)
        results.append(c.ended.get(sid))
        c.close()
    check("nul: a token with a NUL and more after it is UNAUTHENTICATED", results[0] == "16",
          results)
    check("nul: the token alone is accepted", results[1] == "0", results)


def check_core_log_json(srv):
    """gRPC core's own lines (here a TLS handshake that fails: a plaintext client on the
    grpcs port) reach the --log-format json log as JSON lines, source "grpc"."""
    host, port = srv.target.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0" * 64)
    try:
        s.recv(100)
    except OSError:
        pass
    s.close()
    end = time.monotonic() + 10
    lines = []
    while time.monotonic() < end:
        lines = [l for l in srv.log().splitlines() if "andshake" in l]
        if lines:
            break
        time.sleep(0.2)

    def grpc_json(line):
        try:
            return json.loads(line).get("source") == "grpc"
        except ValueError:
            return False
    check("core log: the failed handshake is logged", bool(lines), srv.log()[-500:])
    check("core log: as JSON lines with source grpc", lines and all(grpc_json(l) for l in lines),
          lines[:2])


def main():
    args = harness.arguments(__doc__)
    run = lambda checks, *opts: harness.run(args.server, checks, *opts,  # noqa: E731
                                            server_class=gt.GrpcServer)
    run([check_unpack_budget], "--max-memory", "128M")
    run([check_stalled_messages], "--max-memory", "128M", "--header-timeout", "2",
        "--min-body-rate", "1M", "--max-body", "64M")
    run([check_idle_streams], "--header-timeout", "2", "--grpc-max-streams", "16")
    run([check_refused_logged])
    run([check_open_calls_share], "--max-memory", "32M", "--header-timeout", "60")
    run([check_connection_caps], "--max-connections-per-ip", "10", "--timeout", "3")
    run([check_nul_token], "--auth-all", "--auth-tokens", gt.TOKEN)
    if harness.selected(check_core_log_json):
        with tempfile.TemporaryDirectory(prefix="attn-grpc-tls-") as tmp:
            cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                            key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
                           check=True, capture_output=True)
            run([check_core_log_json], "--tls-cert", cert, "--tls-key", key,
                "--log-format", "json")
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
