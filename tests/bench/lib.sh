# lib.sh - helpers shared by the benchmark scripts (sourced, not run).
#
# BENCH_PYTHON is the interpreter that has Debian's NumPy and Flask: /usr/bin/python3 unless set,
# because a python3 earlier on PATH (pyenv, a virtualenv) does not see Debian's packages.
# Every service started with bench_start is stopped by bench_stop_all, which the sourcing script
# runs from its EXIT trap, so no server outlives a failed run.

BENCH_PYTHON=${BENCH_PYTHON:-/usr/bin/python3}
export BENCH_PYTHON

# bench_need_debs PKG...: installs the Debian packages among PKG that are missing, as root or
# through sudo, the way the Makefile's `deps` target does. Fails when it cannot.
bench_need_debs() {
    local missing="" p sudo=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    echo "bench: installing Debian packages:$missing"
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
}

# bench_median [FORMAT]: the median of the numbers on stdin, one a line (the mean of the middle two
# for an even count), printed as awk prints it or with the printf FORMAT given.
bench_median() {
    sort -g | awk -v fmt="${1:-}" '{ v[NR] = $1 }
        END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              if (fmt == "") print m; else printf fmt, m }'
}

BENCH_PIDS=()

# bench_free_port: prints a TCP port that is free on 127.0.0.1 right now.
bench_free_port() {
    "$BENCH_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bench_start NAME LOGDIR PORT COMMAND...: starts COMMAND in the background (its own process
# group, so that stopping it stops its children too: gunicorn's workers) and waits up to 20 s
# until 127.0.0.1:PORT answers GET /healthz-or-anything. Sets BENCH_PID and BENCH_URL.
bench_start() {
    local name=$1 logdir=$2 port=$3
    shift 3
    setsid "$@" >"$logdir/$name.out" 2>"$logdir/$name.err" &
    BENCH_PID=$!
    BENCH_PIDS+=("$BENCH_PID")
    BENCH_URL="http://127.0.0.1:$port"
    local i
    for i in $(seq 200); do
        if curl -s -o /dev/null --max-time 1 "$BENCH_URL/" 2>/dev/null; then
            return 0
        fi
        kill -0 "$BENCH_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench: $name did not start:" >&2
    tail -n 20 "$logdir/$name.err" >&2
    return 1
}

# bench_stop PID: SIGTERM to the process group PID leads, then waits for it (SIGKILL after 15 s).
bench_stop() {
    local pid=$1 i
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 150); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

bench_stop_all() {
    local p
    for p in "${BENCH_PIDS[@]}"; do bench_stop "$p"; done
    BENCH_PIDS=()
}

# bench_start_ours NAME LOGDIR [SERVER_FLAG...]: the C server (build/attention-server unless
# BENCH_SERVER is set) on a free port, access log off, gRPC off, its own empty data directory;
# held to the CPUs of BENCH_CPUS (a taskset list) when that is set, so that the sizing it
# derives from its CPUs follows them.
bench_start_ours() {
    local name=$1 logdir=$2
    shift 2
    local port pin=()
    port=$(bench_free_port)
    [ -n "${BENCH_CPUS:-}" ] && pin=(taskset -c "$BENCH_CPUS")
    mkdir -p "$logdir/$name.data"
    bench_start "$name" "$logdir" "$port" "${pin[@]}" env ATTN_QUIET=true \
        "${BENCH_SERVER:-build/attention-server}" \
        --host 127.0.0.1 --port "$port" --data-dir "$logdir/$name.data" --grpc-port 0 "$@"
}

# bench_start_peer NAME LOGDIR: the Flask + NumPy peer under gunicorn, 2 sync workers, the
# deployment a Python user would reach for. NumPy's OpenBLAS keeps its default thread count
# unless OPENBLAS_NUM_THREADS is set by the caller.
bench_start_peer() {
    local name=$1 logdir=$2
    local port
    port=$(bench_free_port)
    bench_start "$name" "$logdir" "$port" "$BENCH_PYTHON" -m gunicorn --workers 2 \
        --bind "127.0.0.1:$port" --chdir tests/bench --timeout 600 --log-level warning peer:app
}

# bench_tree_pids PID: PID and all its descendants, one per line.
bench_tree_pids() {
    local p=$1 c
    echo "$p"
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do bench_tree_pids "$c"; done
}
