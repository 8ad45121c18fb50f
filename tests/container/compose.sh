#!/usr/bin/env bash
# The compose suite (make test-compose): brings docker/compose.yaml up with podman-compose
# (Debian's, 1.0.3; `docker compose` when a Docker engine answers), the balancer published
# on a free loopback port, and checks what a user of the balancer sees:
#   - the balancer answers, and spreads requests over the three replicas;
#   - gRPC goes through the balancer's grpc_pass too (on a second free port): the health
#     service, ServerLive and an inference (tests/container/grpc_probe.py);
#   - the replicas share one weight-set volume: a set PUT through the balancer is then
#     used by name in 300 requests through the balancer, all answered 200 with the same
#     numbers, by every replica (X-Upstream); the requests name the generation the PUT
#     answered, so a replica that has not rescanned yet does at once;
#   - under load from several clients, one replica is killed (SIGKILL).  The only requests
#     allowed to fail are those in flight on that replica when it died; every other one
#     gets the fixture's answer;
#   - nginx routes around the dead replica: the requests after the kill are answered by
#     the two others, both of them;
#   - the balancer's health check passes;
#   - the killed replica, started again, is back on the balancer's list;
#   - sequences (tests/container/seq_route.py): 20 x 50 steps over HTTP with X-Sequence-Id
#     and 6 over gRPC streams, each answered right and by one replica; then the replica
#     holding the most is killed: its sequences answer sequence_unknown, never a 200, and
#     the others go on.
# Containers, the network and the shared weight-set volume carry the suite's project name
# and are removed at the end, whatever happened.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=compose
. "$ROOT/tests/container/lib.sh"
cd "$ROOT" || exit 1

project=attn-compose-$$
WORKERS=4
REQUESTS_PER_WORKER=120

# compose ARGS...: the compose tool of the engine, on docker/compose.yaml and this project.
compose() {
    if [ "$ENGINE" = docker ]; then
        docker compose -p "$project" -f docker/compose.yaml "$@"
    else
        podman-compose -p "$project" -f docker/compose.yaml "$@"
    fi
}

# project_containers: the ids of the containers of this suite's project.
project_containers() {
    $ENGINE ps -a -q --filter "label=com.docker.compose.project=$project"
}

# service_containers SERVICE [PS FLAGS...]: the ids of the project's running containers of
# SERVICE (with -a, also those that stopped).
service_containers() {
    local service=$1; shift
    $ENGINE ps "$@" -q --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=$service"
}

# cleanup: removes the containers with their anonymous volumes (which `down` of
# podman-compose 1.0.3 leaves behind), then the rest through `down`, and the network.
cleanup() {
    local ids
    ids=$(project_containers)
    [ -n "$ids" ] && $ENGINE rm -f -v $ids >/dev/null 2>&1
    compose down -v >/dev/null 2>&1
    $ENGINE network rm -f "${project}_default" >/dev/null 2>&1
    $ENGINE volume rm -f "${project}_weight-sets" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

# balancer_id: the id of this project's balancer container, running or not.
balancer_id() {
    service_containers balancer -a | head -n 1
}

# balancer_state: one phrase saying whether the balancer container runs, or how it ended.
balancer_state() {
    local id
    id=$(balancer_id)
    [ -n "$id" ] || { echo "no balancer container was created"; return; }
    $ENGINE inspect --format 'balancer {{.State.Status}}, exit code {{.State.ExitCode}}' "$id" 2>&1
}

# balancer_report: shows the balancer's own last log lines (nginx says there why it
# stopped, e.g. an upstream whose name does not resolve) and those of one replica.
balancer_report() {
    local id replica
    id=$(balancer_id)
    if [ -n "$id" ]; then
        echo "    the balancer's log (the last 20 lines):"
        $ENGINE logs --tail 20 "$id" 2>&1 | sed 's/^/      /'
    fi
    replica=$(service_containers attention -a | head -n 1)
    if [ -n "$replica" ]; then
        echo "    one replica's log (the last 5 lines):"
        $ENGINE logs --tail 5 "$replica" 2>&1 | sed 's/^/      /'
    fi
}

engine_ready
if [ "$ENGINE" = podman ] && ! command -v podman-compose >/dev/null 2>&1; then
    skip "podman-compose is not installed"
fi
# The balancer finds the replicas by name, which podman resolves on netavark networks only
# (docker/containers.conf asks for it; a CNI host would otherwise keep CNI).
if [ "$ENGINE" = podman ]; then
    backend=$(podman info --format '{{.Host.NetworkBackend}}' 2>&1)
    check "compose/netavark" "podman uses the '$backend' network backend, where nginx cannot resolve attention:8080 (CONTAINERS_CONF=$CONTAINERS_CONF; is netavark installed?)" \
        test "$backend" = netavark
    [ "$failed" -eq 0 ] || { summary; exit 1; }
fi

t0=$(now)
for image in server balancer; do
    if [ $image = server ]; then tag=$IMAGE; file=docker/Dockerfile; else tag=$BALANCER_IMAGE; file=docker/balancer/Dockerfile; fi
    if ! engine_build "$tag" "$file" >"$tmp/build.log" 2>&1; then
        tail -n 20 "$tmp/build.log"
        fail "compose/build-$image" "$ENGINE build of $file failed (the last lines are above)"
        summary
        exit 1
    fi
done
echo "    built both images in $(seconds_since "$t0") s"

# Two free loopback ports for the balancer, HTTP's and gRPC's: ones that nothing listens on now.
port= gport=
for candidate in $(shuf -i 20000-39999 -n 40); do
    ss -Htln "sport = :$candidate" | grep -q . && continue
    if [ -z "$port" ]; then port=$candidate; else gport=$candidate; break; fi
done
url=http://127.0.0.1:$port

t0=$(now)
if ATTN_PUBLISH=127.0.0.1:$port ATTN_PUBLISH_GRPC=127.0.0.1:$gport compose up -d >"$tmp/up.log" 2>&1 &&
    wait_healthz "$url" 60 "$(balancer_id)"; then
    ok "compose/up"
    echo "    up and answering through the balancer in $(seconds_since "$t0") s"
else
    tail -n 20 "$tmp/up.log"
    balancer_report
    fail "compose/up" "the balancer did not answer $url/healthz ($(balancer_state), $(seconds_since "$t0") s after up)"
    summary
    exit 1
fi

replicas=$(service_containers attention | wc -l)
check "compose/three-replicas" "$replicas replicas are running" test "$replicas" = 3

fixture=$FIXTURES/seed004_toy.json
jq '.request' "$fixture" >"$tmp/request.json"

# Wait until every replica answers through the balancer: one distinct upstream each.
for ((i = 0; i < 30; i++)); do
    curl -s -o /dev/null -D - --max-time 10 "$url/readyz" | awk 'tolower($1) == "x-upstream:" { sub(/\r$/, "", $2); print $2 }' >>"$tmp/upstreams"
    [ "$(sort -u "$tmp/upstreams" | wc -l)" -ge 3 ] && break
done
status=$(http POST "$url/v1/attention" --data-binary @"$tmp/request.json")
check "compose/fixture-through-balancer" "POST through the balancer answered $status, or not the fixture's numbers" \
    eval '[ "$status" = 200 ] && matches_fixture "$tmp/body" "$fixture"'
check "compose/spreads-over-replicas" "only $(sort -u "$tmp/upstreams" | wc -l) replicas answered 30 requests" \
    test "$(sort -u "$tmp/upstreams" | wc -l)" -ge 3

# gRPC through the balancer's grpc_pass: the health service, ServerLive and an inference.
grpc_rc=0
/usr/bin/python3 tests/container/grpc_probe.py "127.0.0.1:$gport" >"$tmp/grpc" 2>&1 || grpc_rc=$?
check "compose/grpc-through-balancer" "gRPC through the balancer on 127.0.0.1:$gport: $(tail -n 3 "$tmp/grpc")" \
    test "$grpc_rc" = 0

# The shared store: PUT once through the balancer, then 300 requests naming the set.
status=$(http PUT "$url/v1/weight-sets/toy" --data-binary @api/examples/toy.weight-set.json)
generation=$(jq -r '.generation // empty' "$tmp/body" 2>/dev/null)
check "compose/put-through-balancer" "PUT through the balancer answered $status, generation '$generation'" \
    eval '[ "$status" = 201 ] || [ "$status" = 200 ] && [ -n "$generation" ]'
jq --argjson g "${generation:-0}" '. + {weights_generation: $g}' api/examples/named_weights.request.json \
    >"$tmp/named.json"
: >"$tmp/named.log"
for ((i = 0; i < 300; i++)); do
    read -r code upstream < <(curl -s -o "$tmp/named.body" --max-time 30 \
        -w '%{http_code} %header{x-upstream}\n' --data-binary @"$tmp/named.json" "$url/v1/attention")
    sum=$(jq -c '.output' "$tmp/named.body" 2>/dev/null | md5sum | cut -c1-12)
    upstream=${upstream// /}
    echo "${code:-000} ${upstream##*,} $sum" >>"$tmp/named.log"
done
named_ok=$(awk '$1 == 200' "$tmp/named.log" | wc -l)
named_sums=$(awk '$1 == 200 { print $3 }' "$tmp/named.log" | sort -u | wc -l)
named_upstreams=$(awk '$1 == 200 { print $2 }' "$tmp/named.log" | sort -u | wc -l)
echo "    300 requests naming the set: $named_ok answered 200, by $named_upstreams replicas"
check "compose/named-set-300-requests" \
    "$named_ok of 300 answered 200 ($named_sums different answers), e.g. $(awk '$1 != 200' "$tmp/named.log" | head -n 1)" \
    eval '[ "$named_ok" = 300 ] && [ "$named_sums" = 1 ]'
check "compose/named-set-on-every-replica" "only $named_upstreams replicas answered the requests naming the set" \
    test "$named_upstreams" -ge 3

# worker N: sends REQUESTS_PER_WORKER fixture requests one after another, one curl each, and
# writes "START END STATUS UPSTREAMS BODY-FILE-OK" per request (times in seconds).
worker() {
    local n=$1 i start code upstream good
    for ((i = 0; i < REQUESTS_PER_WORKER; i++)); do
        start=$EPOCHREALTIME
        read -r code upstream < <(curl -s -o "$tmp/w$n.body" --max-time 30 \
            -w '%{http_code} %header{x-upstream}\n' --data-binary @"$tmp/request.json" "$url/v1/attention")
        upstream=${upstream// /}
        good=0
        [ "$code" = 200 ] && matches_fixture "$tmp/w$n.body" "$fixture" && good=1
        echo "$start $EPOCHREALTIME ${code:-000} ${upstream:--} $good" >>"$tmp/w$n.log"
    done
}

victim=$(service_containers attention | head -n 1)
victim_ip=$($ENGINE inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$victim")

for ((n = 0; n < WORKERS; n++)); do
    : >"$tmp/w$n.log"
    worker "$n" &
done
# Kill when about a third of the requests are answered, so that load runs on both sides.
# The workers end on their own (each sends a fixed count); the wait is also bounded by 120 s.
wait_until=$((SECONDS + 120))
while [ "$(cat "$tmp"/w*.log | wc -l)" -lt $((WORKERS * REQUESTS_PER_WORKER / 3)) ] &&
    [ "$SECONDS" -lt "$wait_until" ]; do sleep 0.05; done
# The replica is dead between kill_sent and kill_done (when the engine saw it exit).
kill_sent=$EPOCHREALTIME
$ENGINE kill --signal KILL "$victim" >/dev/null
$ENGINE wait "$victim" >/dev/null 2>&1
kill_done=$EPOCHREALTIME
echo "    killed replica $victim_ip:8080 at $kill_sent (gone $(awk -v a="$kill_sent" -v b="$kill_done" 'BEGIN { printf "%.2f", b - a }') s later)"
wait
cat "$tmp"/w*.log >"$tmp/all.log"

total=$(wc -l <"$tmp/all.log")
after=$(awk -v k="$kill_done" '$1 > k' "$tmp/all.log" | wc -l)
before=$(awk -v k="$kill_sent" '$2 < k' "$tmp/all.log" | wc -l)
echo "    $total requests: $before answered before the kill, $after sent after it"
check "compose/kill-under-load" "the kill did not fall between requests ($before before, $after after)" \
    test "$before" -gt 0 -a "$after" -gt 0

# A failure is allowed only for a request in flight while the replica died whose upstream
# was the victim.
awk -v s="$kill_sent" -v d="$kill_done" -v ip="$victim_ip:8080" '
    $5 != 1 && !($1 <= d && $2 >= s && index($4, ip)) { print }' "$tmp/all.log" >"$tmp/bad.log"
failures=$(awk '$5 != 1' "$tmp/all.log" | wc -l)
echo "    failed requests: $failures (in flight on the killed replica: $((failures - $(wc -l <"$tmp/bad.log"))))"
check "compose/no-failures-beyond-in-flight" \
    "$(wc -l <"$tmp/bad.log") requests failed that were not in flight on the killed replica, e.g. $(head -n 1 "$tmp/bad.log")" \
    test ! -s "$tmp/bad.log"

# Routed around: every request sent after the kill was answered by another replica (the
# victim may appear first in X-Upstream, as tried and skipped), and both survivors served.
awk -v k="$kill_done" '$1 > k { n = split($4, u, ","); print u[n] }' "$tmp/all.log" |
    sed 's/^ *//' | sort | uniq -c >"$tmp/after-upstreams"
cat "$tmp/after-upstreams" | sed 's/^/    answered after the kill by: /'
check "compose/routes-around-dead-replica" "the killed replica still answered after the kill, or a survivor got nothing" \
    eval '! grep -qw "$victim_ip:8080" "$tmp/after-upstreams" && [ "$(wc -l <"$tmp/after-upstreams")" = 2 ]'

balancer=$(service_containers balancer)
if [ "$ENGINE" = podman ]; then
    check "compose/balancer-healthcheck" "podman healthcheck run did not report the balancer healthy" \
        podman healthcheck run "$balancer"
fi

# Sequences (tests/container/seq_route.py): the replica killed above is started again, and
# the balancer must find it (its address, new or not, comes back on the list); then 20
# sequences x 50 steps over HTTP with X-Sequence-Id and 6 over gRPC streams, every answer
# against a float64 reference; one replica killed, whose sequences must answer
# sequence_unknown while the others go on.
t0=$(now)
$ENGINE start "$victim" >/dev/null 2>&1
back_ip=$($ENGINE inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$victim")
back=
while [ -n "$back_ip" ] && [ "$(seconds_since "$t0" | cut -d. -f1)" -lt 60 ]; do
    read -r code upstream < <(curl -s -o /dev/null --max-time 5 -w '%{http_code} %header{x-upstream}\n' "$url/readyz")
    upstream=${upstream// /}
    [ "$code" = 200 ] && [ "${upstream##*,}" = "$back_ip:8080" ] && { back=1; break; }
    sleep 0.1
done
echo "    the killed replica started again as $back_ip, answering through the balancer after $(seconds_since "$t0") s"
check "compose/balancer-follows-returning-replica" "the replica started again ($back_ip) got no request through the balancer in 60 s" \
    test -n "$back"

t0=$(now)
replica_addresses=()
for id in $(service_containers attention); do
    replica_addresses+=("$($ENGINE inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$id")=$id")
done
timeout 240 /usr/bin/python3 tests/container/seq_route.py "$url" "127.0.0.1:$gport" "$ENGINE" \
    "${replica_addresses[@]}" >"$tmp/seq" 2>&1
grep -v '^RESULT ' "$tmp/seq" | sed 's/^/    /'
echo "    sequences through the balancer: $(seconds_since "$t0") s"
# seq_ok NAME: true when seq_route.py reported its check NAME passed; seq_why NAME: its words.
seq_ok() { grep -qx "RESULT $1 ok" "$tmp/seq"; }
seq_why() { sed -n "s/^RESULT $1 //p" "$tmp/seq" | grep . || echo "seq_route.py reported nothing: $(tail -n 1 "$tmp/seq")"; }
check "compose/seq-http-steps" "$(seq_why http-steps)" seq_ok http-steps
check "compose/seq-grpc-steps" "$(seq_why grpc-steps)" seq_ok grpc-steps
check "compose/seq-one-replica-each" "$(seq_why one-replica-each)" seq_ok one-replica-each
check "compose/seq-killed-replica-unknown" "$(seq_why killed-unknown)" seq_ok killed-unknown
check "compose/seq-survivors-go-on" "$(seq_why survivors-go-on)" seq_ok survivors-go-on
check "compose/seq-start-again" "$(seq_why start-again)" seq_ok start-again

summary
