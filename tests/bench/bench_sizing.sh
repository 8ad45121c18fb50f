#!/usr/bin/env bash
# bench_sizing.sh - the server with the defaults it ships (no sizing flag) held to a set of
# CPUs with taskset, and wrk held to others: how requests per second grow with the cores.
#
# Usage: tests/bench/bench_sizing.sh SERVER_CPUS... [-- WRK_CPUS [SECONDS [CONNECTIONS]]]
#   SERVER_CPUS  taskset lists, one run each (e.g. 0-1 0-3 0-7)
#   WRK_CPUS     the CPUs wrk runs on (default: all of them, shared with the server)
#   SECONDS      per measurement (default 10), CONNECTIONS (default 64)
# For each CPU set it prints what /v1/info says was chosen (sizing) and the requests per
# second of two bodies: seed (the smallest golden fixture's request, tests/bench/make_bodies.py)
# and 256x64 (q, k and v of 256 x 64 float64 as JSON, the attention matrix returned).
# Example, on a 16-core machine:  tests/bench/bench_sizing.sh 0-1 0-3 0-7 -- 8-15 10 64
set -eu
cd "$(dirname "$0")/../.."
server_sets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do server_sets+=("$1"); shift; done
[ $# -gt 0 ] && shift
wrk_cpus=${1:-0-$(($(nproc --all) - 1))}
secs=${2:-10}
conns=${3:-64}
[ ${#server_sets[@]} -gt 0 ] || { echo "usage: $0 SERVER_CPUS... [-- WRK_CPUS [SECONDS [CONNECTIONS]]]" >&2; exit 2; }
. tests/bench/lib.sh
. tests/bench/wrk.sh
work=$(mktemp -d)
trap 'bench_stop_all; rm -rf "$work"' EXIT
/usr/bin/python3 tests/bench/make_bodies.py "$work" seed >/dev/null
/usr/bin/python3 - "$work/attn256.json" <<'PY'
import json, random, sys
rng = random.Random(256)
m = lambda: [[round(rng.uniform(-1, 1), 6) for _ in range(64)] for _ in range(256)]
json.dump({"q": m(), "k": m(), "v": m()}, open(sys.argv[1], "w"))
PY
printf '%-8s %-5s %-8s %-8s %-10s %12s %12s\n' server cpus compute io inflight seed_rps 256x64_rps
for set in "${server_sets[@]}"; do
    BENCH_CPUS=$set bench_start_ours "server-$set" "$work" || exit 1
    url=$BENCH_URL
    sizing=$(curl -s "$url/v1/info" | python3 -c 'import json,sys; s=json.load(sys.stdin)["sizing"]; print(s["cpus"], s["compute_threads"]["value"], s["io_threads"]["value"], s["max_inflight"]["value"])')
    read -r cpus compute io inflight <<<"$sizing"
    rps=()
    for body in seed.json attn256.json; do
        taskset -c "$wrk_cpus" bash -c ". tests/bench/wrk.sh; bench_wrk '$url' '$work/$body' $conns $secs && echo \"\$WRK_RPS \$WRK_ERRORS\"" >"$work/wrk" || true
        read -r r e <"$work/wrk" || { r=failed; e=0; }
        [ "${e:-0}" = 0 ] || r="$r(${e}err)"
        rps+=("$r")
    done
    printf '%-8s %-5s %-8s %-8s %-10s %12s %12s\n' "$set" "$cpus" "$compute" "$io" "$inflight" "${rps[0]}" "${rps[1]}"
    bench_stop_all
done
