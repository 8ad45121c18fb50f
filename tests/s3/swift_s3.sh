#!/usr/bin/env bash
# swift_s3.sh - a throw-away single-node OpenStack Swift with its s3api middleware: an S3
# server that checks every request's signature (AWS Signature Version 4), for the tests of the
# S3 weight-set backend.  Debian's packages (scripts/provision.sh s3); everything runs on
# 127.0.0.1 (the proxy on SWIFT_S3_ADDRESS when given) and lives under one folder, DIR, that
# the caller made with `mktemp -d`.
#
#   swift_s3.sh start DIR PORT    proxy (the S3 endpoint) on 127.0.0.1:PORT, and the account,
#                                 container and object servers and memcached on the four ports
#                                 above it; PORT 0 picks five free ports.  Returns once a
#                                 signed request is answered (SWIFT_S3_TIMEOUT seconds at most,
#                                 90 by default), printing on stdout
#                                   S3_ENDPOINT=http://127.0.0.1:PORT   (or SWIFT_S3_ADDRESS)
#                                   AWS_ACCESS_KEY_ID=test:tester
#                                   AWS_SECRET_ACCESS_KEY=testing   (or $SWIFT_S3_SECRET)
#                                   AWS_DEFAULT_REGION=us-east-1
#   swift_s3.sh stop DIR          stops the processes start launched, and only those
#   swift_s3.sh stop-proxy DIR    stops the proxy alone: the endpoint refuses connections
#   swift_s3.sh start-proxy DIR   starts it again on the same port, returning once it answers
#   swift_s3.sh suspend DIR       SIGSTOPs the proxy: connections are accepted, never answered
#   swift_s3.sh resume DIR        SIGCONTs it
#   swift_s3.sh start-tls DIR     a second proxy, on a free port, that speaks https with a
#                                 throwaway certificate for 127.0.0.1 (openssl), beside the
#                                 first and on the same servers; prints
#                                   S3_TLS_ENDPOINT=https://127.0.0.1:PORT
#                                   S3_CA_FILE=DIR/etc/tls-cert.pem
#
# SWIFT_S3_ADDRESS (start only): the address the proxy listens on instead of 127.0.0.1, for
# containers, which reach the host through their bridge's gateway and not its loopback.  It
# must be an address of one of this machine's own interfaces (the bridge's gateway is); the
# other servers and memcached stay on 127.0.0.1.
#
# Why each piece is there:
# - Swift 2.30 reads /etc/swift/swift.conf by a fixed path, so each server is started through a
#   small launcher (DIR/bin/swift_run.py) that points it at DIR/etc/swift.conf instead.
# - Servers run with workers = 0 (one process each, no forks), so the PID written at launch is
#   the server itself, and stopping it stops everything it runs.
# - tempauth needs memcached ("Memcache required" otherwise); the servers log to a syslog
#   socket, and a small sink (DIR/bin/log_sink.py) writes what they send to DIR/log/swift.log.
#   proxy-logging's access lines (method, path, status, bytes) do not follow log_address: they
#   go by UDP to a port of 127.0.0.1 that the sink binds and writes to DIR/run/access-log-port.
# - The rings (one replica, one device, DIR/srv/d1) are built in one Python process: the
#   swift-ring-builder command called nine times costs seconds of interpreter start-up.
# - Swift keeps object metadata in user.* extended attributes: start checks that DIR's file
#   system has them before anything runs.
#
# Every PID is written to DIR/run/NAME.pid with the process's start time (field 22 of
# /proc/PID/stat); a PID is signalled only while that start time still matches, so a stop
# after a reboot or a PID reuse never touches another process.  Nothing is found by name.
# Files are removed only through remove_under, which refuses any path outside DIR.
set -u
PY=/usr/bin/python3          # Debian's python: the swift package is not on another python's path
ACCESS_KEY=test:tester        # tempauth's account "test", user "tester"
SECRET=${SWIFT_S3_SECRET:-testing}   # start's; a test may choose one it can look for in logs
REGION=us-east-1
MARKER=.swift_s3_harness      # written into DIR by start: stop refuses a DIR without it

die() { echo "swift_s3: $*" >&2; exit 1; }
say() { echo "swift_s3: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# check_dir DIR: DIR must be a folder the caller made with mktemp -d: a real directory (not a
# link) directly inside ${TMPDIR:-/tmp}, owned by us, mode 0700.  Prints its absolute path.
check_dir() {
    local dir=$1 tmp
    if [ -z "$dir" ] || [ ! -d "$dir" ] || [ -L "$dir" ]; then
        die "DIR '$dir' is not an existing directory"
    fi
    dir=$(cd "$dir" && pwd -P) || die "cannot enter $1"
    tmp=$(cd "${TMPDIR:-/tmp}" && pwd -P) || die "no temporary folder ${TMPDIR:-/tmp}"
    [ "$(dirname "$dir")" = "$tmp" ] ||
        die "DIR $dir is not directly inside $tmp: make it with mktemp -d"
    [ "$(stat -c '%u %a' "$dir")" = "$(id -u) 700" ] ||
        die "DIR $dir is not a mktemp -d folder (owner $(id -u), mode 700)"
    echo "$dir"
}

# remove_under DIR PATH...: removes each PATH (a file or a socket, never a folder) after
# checking that it lies inside DIR; a path outside DIR stops the script.
remove_under() {
    local dir=$1 p real; shift
    for p in "$@"; do
        [ -e "$p" ] || [ -L "$p" ] || continue
        real=$(cd "$(dirname "$p")" && pwd -P)/$(basename "$p")
        case $real in
            "$dir"/*) rm -f -- "$real" ;;
            *) die "refusing to remove $p: outside $dir" ;;
        esac
    done
}

start_time_of() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }

# ours NAME: the PID recorded for NAME when that process still runs (not a zombie) and is
# the one we launched; empty otherwise.
ours() {
    local f=$DIR/run/$1.pid pid st state
    [ -f "$f" ] || return 0
    read -r pid st < "$f"
    [ -n "${pid:-}" ] || return 0
    state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)
    [ -n "$state" ] && [ "$state" != Z ] && [ "$(start_time_of "$pid")" = "$st" ] && echo "$pid"
}

# port_of NAME: the port recorded for proxy, account, container, object or memcached (or,
# for address, the proxy's address).
port_of() { sed -n "s/^$1=//p" "$DIR/run/ports"; }

# proxy_address: the address the proxy listens on (start's SWIFT_S3_ADDRESS).
proxy_address() { local a; a=$(port_of address); echo "${a:-127.0.0.1}"; }

# check_address ADDR: ADDR must be an IPv4 address of one of this machine's interfaces, so
# that the proxy is never bound to, nor the tests sent to, another machine.
check_address() {
    [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "SWIFT_S3_ADDRESS '$1' is not an IPv4 address"
    ip -4 -o addr show | awk '{ sub(/\/.*/, "", $4); print $4 }' | grep -qxF "$1" ||
        die "SWIFT_S3_ADDRESS $1 is not an address of this machine's interfaces"
}

# free_ports: five distinct free loopback ports below the kernel's ephemeral range.  Not in
# it: while the proxy is stopped, the kernel could hand its port to any outgoing connection
# (or to a server bound to port 0), and start-proxy could not bind it again.
free_ports() {
    $PY - <<'EOF'
import random, socket
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    low = int(f.read().split()[0])
held, tries = [], 0
while len(held) < 5 and tries < 1000:
    tries += 1
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, max(low, 10001))))
        held.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in held) if len(held) == 5 else "")
EOF
}

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# launch NAME COMMAND...: starts COMMAND in a session of its own (so that a signal to the
# caller's process group does not half-stop the node), output to DIR/log/NAME.out, and records
# its PID and start time.
launch() {
    local name=$1 pid; shift
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    pid=$!
    local st=""
    for _ in $(seq 50); do st=$(start_time_of "$pid"); [ -n "$st" ] && break; sleep 0.02; done
    echo "$pid $st" > "$DIR/run/$name.pid"
}

launch_swift() {  # launch KIND-server
    launch "$1" "$PY" "$DIR/bin/swift_run.py" "$DIR/etc/swift.conf" "$1" "$DIR/etc/$1.conf"
}

# signed_ok: true when a signed ListBuckets is answered 200 (curl signs with SigV4; the key
# id's colon goes in the URL encoded, or curl would split the user name there).
signed_ok() {
    LAST_CODE=$(curl -s -m 3 -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:$REGION:s3" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
        "http://${ACCESS_KEY/:/%3A}:$SECRET@$(proxy_address):$(port_of proxy)/")
    [ "$LAST_CODE" = 200 ]
}

# wait_ready WHAT NAMES...: waits, up to SWIFT_S3_TIMEOUT seconds, until every NAMES process
# lives and a signed request is answered; on failure prints the log tails and fails.
wait_ready() {
    local what=$1 began deadline name; shift
    began=$(now)
    deadline=$(( $(date +%s) + ${SWIFT_S3_TIMEOUT:-90} ))
    while :; do
        for name in "$@"; do
            if [ -z "$(ours "$name")" ]; then
                say "$name died during $what; the end of its output:"
                tail -n 20 "$DIR/log/$name.out" >&2
                return 1
            fi
        done
        signed_ok && break
        if (( $(date +%s) >= deadline )); then
            say "no signed request answered 200 within ${SWIFT_S3_TIMEOUT:-90} s of $what (the last: ${LAST_CODE:-none}); the ends of the logs in $DIR/log:"
            for name in "$@"; do tail -n 5 "$DIR/log/$name.out" >&2; done
            tail -n 10 "$DIR/log/swift.log" >&2
            ss -Htanp "( sport = :$(port_of proxy) or dport = :$(port_of proxy) )" >&2
            return 1
        fi
        sleep 0.1
    done
    say "$what: a signed request answered $(since "$began") s after launch"
}

write_files() {
    mkdir -p "$DIR/etc" "$DIR/run" "$DIR/log" "$DIR/srv/d1" "$DIR/cache" "$DIR/bin"
    cat > "$DIR/bin/log_sink.py" <<'EOF'
# Receives the servers' syslog datagrams on a unix socket, and the proxy's access lines
# (proxy-logging, which does not follow log_address) on a UDP port of 127.0.0.1 that it
# writes to PORT_FILE, and appends both to a file.
import os, select, socket, sys, time
path, out, port_file = sys.argv[1], open(sys.argv[2], "ab", buffering=0), sys.argv[3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
with open(port_file + ".tmp", "w") as f:
    f.write("%d\n" % u.getsockname()[1])
os.rename(port_file + ".tmp", port_file)
while True:
    for r in select.select([s, u], [], [])[0]:
        d = r.recv(65536)
        out.write(time.strftime("%H:%M:%S ").encode() + d.rstrip(b"\0\n") + b"\n")
EOF
    cat > "$DIR/bin/swift_run.py" <<'EOF'
# swift_run.py SWIFT_CONF KIND CONF: runs one Swift server (KIND: proxy-server, ...) with
# SWIFT_CONF in place of /etc/swift/swift.conf.
import sys
swift_conf, kind, conf = sys.argv[1:4]
from swift.common import utils
utils.SWIFT_CONF_FILE = swift_conf
utils.HASH_PATH_PREFIX = utils.HASH_PATH_SUFFIX = b""
utils.validate_configuration()
from swift.common import constraints, storage_policy
storage_policy.reload_storage_policies()
constraints.reload_constraints()
from swift.common.wsgi import run_wsgi
kw = {}
if kind == "object-server":
    from swift.obj import server
    kw["global_conf_callback"] = server.global_conf_callback
sys.exit(run_wsgi(conf, kind, **kw))
EOF
    cat > "$DIR/bin/rings.py" <<'EOF'
# rings.py ETC ACCOUNT_PORT CONTAINER_PORT OBJECT_PORT: one replica, one device (d1) per ring.
import sys
from swift.cli.ringbuilder import main
etc = sys.argv[1]
for kind, port in zip(("account", "container", "object"), sys.argv[2:5]):
    b = "%s/%s.builder" % (etc, kind)
    for cmd in (["create", "6", "1", "1"],
                ["add", "--region", "1", "--zone", "1", "--ip", "127.0.0.1", "--port", port,
                 "--device", "d1", "--weight", "100"],
                ["rebalance"]):
        try:
            main(["swift-ring-builder", b] + cmd)
        except SystemExit as e:
            if e.code not in (0, None):
                sys.exit("swift-ring-builder %s %s failed: %r" % (b, cmd, e.code))
EOF
    cat > "$DIR/etc/swift.conf" <<EOF
[swift-hash]
swift_hash_path_suffix = attn-s3-test
swift_hash_path_prefix = attn-s3-test
[storage-policy:0]
name = only
default = yes
EOF
    local common user kind
    user=$(id -un)
    common="user = $user
swift_dir = $DIR/etc
devices = $DIR/srv
mount_check = false
workers = 0
log_address = $DIR/log/dev-log
log_level = INFO
fallocate_reserve = 0
recon_cache_path = $DIR/cache"
    for kind in account container object; do
        cat > "$DIR/etc/$kind-server.conf" <<EOF
[DEFAULT]
$common
bind_ip = 127.0.0.1
bind_port = $(port_of "$kind")
log_name = $kind-server
conn_timeout = 5
node_timeout = 20
$([ "$kind" = object ] && echo "container_update_timeout = 20")

[pipeline:main]
pipeline = healthcheck $kind-server

[app:$kind-server]
use = egg:swift#$kind

[filter:healthcheck]
use = egg:swift#healthcheck
EOF
    done
    # s3api before tempauth, which authenticates the requests s3api has checked the signature
    # of; slo and dlo for multipart uploads; account_autocreate so that the first request of
    # the account makes it.
    cat > "$DIR/etc/proxy-server.conf" <<EOF
[DEFAULT]
$common
bind_ip = $(proxy_address)
bind_port = $(port_of proxy)
log_name = proxy-server

[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats s3api tempauth copy slo dlo proxy-logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
conn_timeout = 5
node_timeout = 30

[filter:s3api]
use = egg:swift#s3api
location = $REGION

[filter:tempauth]
use = egg:swift#tempauth
reseller_prefix = AUTH
user_${ACCESS_KEY%%:*}_${ACCESS_KEY#*:} = $SECRET .admin

[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:$(port_of memcached)

[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:healthcheck]
use = egg:swift#healthcheck
[filter:proxy-logging]
use = egg:swift#proxy_logging
access_log_udp_host = 127.0.0.1
access_log_udp_port = @ACCESS_LOG_PORT@
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
EOF
}

cmd_start() {
    local began port=$1 ports p
    began=$(now)
    if ! [[ $port =~ ^[0-9]+$ ]] || { [ "$port" != 0 ] && (( port <= 1024 || port >= 65531 )); }; then
        die "PORT must be 0 or 1025-65530, not '$port'"
    fi
    [ -n "${SWIFT_S3_ADDRESS:-}" ] && check_address "$SWIFT_S3_ADDRESS"
    for b in swift-proxy-server memcached curl ss ip; do
        command -v "$b" >/dev/null || die "$b is missing: scripts/provision.sh s3"
    done
    if [ -e "$DIR/$MARKER" ]; then
        for p in syslog memcached account-server container-server object-server proxy-server; do
            [ -z "$(ours "$p")" ] || die "already running in $DIR ($p); stop it first"
        done
    elif [ -n "$(ls -A "$DIR")" ]; then
        die "DIR $DIR is not empty and not one of this script's"
    fi
    : > "$DIR/$MARKER"
    if [ "$port" = 0 ]; then
        ports=$(free_ports)
        [ -n "$ports" ] || die "could not find five free ports below the ephemeral range"
    else ports="$port $((port + 1)) $((port + 2)) $((port + 3)) $((port + 4))"; fi
    # shellcheck disable=SC2086  # five words, the ports
    set -- $ports
    for p in "$@"; do port_busy "$p" && die "port $p is already in use"; done
    mkdir -p "$DIR/run"
    printf 'proxy=%s\naccount=%s\ncontainer=%s\nobject=%s\nmemcached=%s\n' "$@" > "$DIR/run/ports"
    [ -n "${SWIFT_S3_ADDRESS:-}" ] && echo "address=$SWIFT_S3_ADDRESS" >> "$DIR/run/ports"
    write_files
    # what start prints, kept for the later commands (start-proxy signs with this secret)
    (umask 077 && cat > "$DIR/etc/s3.env" <<EOF
S3_ENDPOINT=http://$(proxy_address):$(port_of proxy)
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET
AWS_DEFAULT_REGION=$REGION
EOF
    )
    local sock=$DIR/log/dev-log
    (( ${#sock} < 100 )) || die "DIR is too long for a unix socket path ($sock)"

    $PY - "$DIR/srv/d1" <<'EOF' || die "the file system of $DIR has no user.* extended attributes, which Swift needs"
import os, sys
p = os.path.join(sys.argv[1], ".xattr-probe")
open(p, "wb").close()
try:
    os.setxattr(p, "user.swift.metadata", b"x" * 2000)
    assert os.getxattr(p, "user.swift.metadata") == b"x" * 2000
finally:
    os.unlink(p)
EOF
    $PY "$DIR/bin/rings.py" "$DIR/etc" "$(port_of account)" "$(port_of container)" \
        "$(port_of object)" > "$DIR/log/rings.log" 2>&1 ||
        die "the rings were not built (is python3-swift there? scripts/provision.sh s3): $(tail -n 3 "$DIR/log/rings.log")"

    # the servers choose at start-up between the socket and UDP to port 514: the sink first
    launch syslog "$PY" "$DIR/bin/log_sink.py" "$sock" "$DIR/log/swift.log" \
        "$DIR/run/access-log-port"
    for _ in $(seq 100); do [ -S "$sock" ] && [ -s "$DIR/run/access-log-port" ] && break; sleep 0.05; done
    [ -S "$sock" ] && [ -s "$DIR/run/access-log-port" ] ||
        { cmd_stop; die "the log sink did not start: $(tail -n 3 "$DIR/log/syslog.out")"; }
    sed -i "s/@ACCESS_LOG_PORT@/$(cat "$DIR/run/access-log-port")/" "$DIR/etc/proxy-server.conf"
    local as_root=()
    [ "$(id -u)" = 0 ] && as_root=(-u root)   # memcached refuses to run as root without -u
    launch memcached memcached "${as_root[@]}" -l 127.0.0.1 -p "$(port_of memcached)" -U 0 \
        -m 16 -t 1 -c 128
    for p in account-server container-server object-server proxy-server; do launch_swift "$p"; done
    if ! wait_ready start syslog memcached account-server container-server object-server \
            proxy-server; then
        cmd_stop
        die "Swift did not start (logs in $DIR/log)"
    fi
    say "ready on http://$(proxy_address):$(port_of proxy) after $(since "$began") s in all"
    cat "$DIR/etc/s3.env"
}

# stop_named NAME...: SIGTERM to each that is ours, up to 10 s for them to end, then SIGKILL.
stop_named() {
    local name pid pids=() left
    for name in "$@"; do
        pid=$(ours "$name")
        [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid:$name")
    done
    for _ in $(seq 100); do
        left=0
        for pid in "${pids[@]}"; do [ -n "$(ours "${pid#*:}")" ] && left=1; done
        (( left )) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        [ -n "$(ours "${pid#*:}")" ] && kill -KILL "${pid%%:*}" 2>/dev/null
        # a stopped (suspended) process gets the SIGTERM only once it runs again
    done
    for name in "$@"; do remove_under "$DIR" "$DIR/run/$name.pid"; done
    echo "${#pids[@]}"
}

cmd_stop() {
    local n
    [ -d "$DIR/run" ] || { say "nothing started in $DIR"; return 0; }
    # a suspended proxy would not act on SIGTERM until continued
    [ -n "$(ours proxy-server)" ] && kill -CONT "$(ours proxy-server)" 2>/dev/null
    n=$(stop_named proxy-tls proxy-server object-server container-server account-server memcached \
        syslog)
    remove_under "$DIR" "$DIR/log/dev-log"
    say "stopped $n processes"
}

cmd_stop_proxy() {
    [ -n "$(ours proxy-server)" ] || die "no proxy of ours runs in $DIR"
    kill -CONT "$(ours proxy-server)" 2>/dev/null
    stop_named proxy-server >/dev/null
    say "proxy stopped; $(proxy_address):$(port_of proxy) refuses connections"
}

cmd_start_proxy() {
    [ -z "$(ours proxy-server)" ] || die "the proxy of $DIR runs already"
    [ -f "$DIR/run/ports" ] || die "nothing started in $DIR"
    local deadline=$(( $(date +%s) + 10 ))
    while port_busy "$(port_of proxy)"; do   # a closing socket may hold it a moment
        (( $(date +%s) < deadline )) || die "port $(port_of proxy) stays in use"
        sleep 0.1
    done
    launch_swift proxy-server
    wait_ready start-proxy proxy-server || { stop_named proxy-server >/dev/null; die "the proxy did not start again"; }
}

# start-tls: Swift's proxy serves TLS itself when its [DEFAULT] names cert_file and key_file
# (eventlet's; Swift warns it is for tests, which this is).
cmd_start_tls() {
    [ -f "$DIR/run/ports" ] || die "nothing started in $DIR"
    [ -z "$(ours proxy-tls)" ] || die "the TLS proxy of $DIR runs already"
    command -v openssl >/dev/null || die "openssl is missing"
    local port cert=$DIR/etc/tls-cert.pem key=$DIR/etc/tls-key.pem began deadline code
    began=$(now)
    port=$(free_ports | cut -d' ' -f1)
    [ -n "$port" ] || die "no free port for the TLS proxy"
    echo "tls=$port" >> "$DIR/run/ports"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$key" -out "$cert" -days 1 \
        -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" >/dev/null 2>&1 ||
        die "openssl could not make a certificate"
    sed -e "s#^bind_port = .*#bind_port = $port#" -e "s#^bind_ip = .*#bind_ip = 127.0.0.1#" \
        -e "s#^\[DEFAULT\]#[DEFAULT]\ncert_file = $cert\nkey_file = $key#" \
        "$DIR/etc/proxy-server.conf" > "$DIR/etc/proxy-tls.conf"
    launch proxy-tls "$PY" "$DIR/bin/swift_run.py" "$DIR/etc/swift.conf" proxy-server \
        "$DIR/etc/proxy-tls.conf"
    deadline=$(( $(date +%s) + ${SWIFT_S3_TIMEOUT:-90} ))
    while :; do
        [ -n "$(ours proxy-tls)" ] || { tail -n 5 "$DIR/log/proxy-tls.out" >&2; die "the TLS proxy died"; }
        code=$(curl -s -m 3 --cacert "$cert" -o /dev/null -w '%{http_code}' \
            "https://127.0.0.1:$port/healthcheck")
        [ "$code" = 200 ] && break
        (( $(date +%s) < deadline )) || { stop_named proxy-tls >/dev/null; die "the TLS proxy did not answer"; }
        sleep 0.1
    done
    say "TLS proxy ready on https://127.0.0.1:$port after $(since "$began") s"
    echo "S3_TLS_ENDPOINT=https://127.0.0.1:$port"
    echo "S3_CA_FILE=$cert"
}

cmd_signal_proxy() {  # SIG WORD
    local pid
    pid=$(ours proxy-server)
    [ -n "$pid" ] || die "no proxy of ours runs in $DIR"
    kill "-$1" "$pid" || die "kill -$1 $pid failed"
    say "proxy $2"
}

[ $# -ge 2 ] || die "usage: $0 start DIR PORT | stop DIR | stop-proxy DIR | start-proxy DIR | suspend DIR | resume DIR | start-tls DIR"
DIR=$(check_dir "$2") || exit 1
if [ "$1" != start ] && [ -f "$DIR/etc/s3.env" ]; then
    SECRET=$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$DIR/etc/s3.env")
fi
case $1 in
    start) [ $# = 3 ] || die "usage: $0 start DIR PORT"; cmd_start "$3" ;;
    stop) [ -e "$DIR/$MARKER" ] || die "$DIR was not set up by this script"; cmd_stop ;;
    stop-proxy) cmd_stop_proxy ;;
    start-proxy) cmd_start_proxy ;;
    suspend) cmd_signal_proxy STOP "suspended: connections are accepted and never answered" ;;
    resume) cmd_signal_proxy CONT "resumed" ;;
    start-tls) cmd_start_tls ;;
    *) die "unknown command $1" ;;
esac
