#!/usr/bin/env bash
# The container suite (make test-container): builds docker/Dockerfile with Docker or podman
# and uses the image as a user would, through a port published on 127.0.0.1:
#   - the image: a non-root user, the health check, the port and the volume are declared,
#     and the runtime stage carries no compiler;
#   - /healthz, and a seed fixture compared element by element with its expected answer;
#   - the server process, seen from the host, does not run as root;
#   - with --cpus 1 the server computes on one thread (the cgroup's CPU quota);
#   - the image's own health check passes, and fails when nothing listens;
#   - SIGTERM while a request computes: /readyz turns 503, the request still gets its whole
#     200 answer, and the container exits 0 within a few seconds;
#   - a weight set stored before that stop is there, byte for byte, in a new container on
#     the same volume.
# It prints the build time and the image size.  Containers and volumes it makes carry the
# suite's process id and are removed at the end, whatever happened.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=container
. "$ROOT/tests/container/lib.sh"
cd "$ROOT" || exit 1

name=attn-test-$$
volume=attn-test-data-$$
cleanup() {
    $ENGINE rm -f "$name" "$name-2" "$name-cpus" >/dev/null 2>&1
    $ENGINE volume rm -f "$volume" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

engine_ready

t0=$(now)
if engine_build "$IMAGE" docker/Dockerfile >"$tmp/build.log" 2>&1; then
    ok "image/build"
    echo "    built $IMAGE in $(seconds_since "$t0") s"
else
    tail -n 20 "$tmp/build.log"
    fail "image/build" "$ENGINE build failed (the last lines are above)"
    summary
    exit 1
fi

$ENGINE image inspect "$IMAGE" >"$tmp/inspect.json"
config() { jq -r ".[0].Config$1 // empty" "$tmp/inspect.json"; }
check "image/non-root-user" "the image's USER is '$(config .User)'" \
    test -n "$(config .User)" -a "$(config .User | cut -d: -f1)" != root -a "$(config .User | cut -d: -f1)" != 0
# Docker shows the health check in Config, podman beside it.
healthcmd=$(jq -r '(.[0].Config.Healthcheck // .[0].Healthcheck).Test // [] | .[1:] | join(" ")' "$tmp/inspect.json")
check "image/healthcheck" "the image declares no HEALTHCHECK (podman needs --format docker)" \
    test -n "$healthcmd"
check "image/exposes-8080" "EXPOSE 8080 is missing" test -n "$(config '.ExposedPorts["8080/tcp"]')"
check "image/data-volume" "VOLUME /var/lib/attention is missing" test -n "$(config '.Volumes["/var/lib/attention"]')"

# The automatic health checks of podman need systemd, which this kind of host lacks; the test
# runs the image's own check with `podman healthcheck run` instead, and hides podman's
# complaint about the missing timer.  Docker runs the check itself.
health_flags=(--health-interval disable)
[ "$ENGINE" = docker ] && health_flags=(--health-interval 1s)

check "image/no-toolchain" "the runtime stage has a compiler or make" \
    $ENGINE run --rm "${health_flags[@]}" --entrypoint bash "$IMAGE" \
        -c '! command -v cc gcc make pkg-config >/dev/null' 2>/dev/null

# start_container NAME: runs the image detached, publishing 8080 on a free loopback port,
# with the suite's volume; sets url.  False when it does not answer /healthz within 30 s.
start_container() {
    $ENGINE run -d --name "$1" -p 127.0.0.1::8080 -v "$volume:/var/lib/attention" \
        "${health_flags[@]}" "$IMAGE" --shutdown-grace 10 >/dev/null 2>"$tmp/run.err" || {
        cat "$tmp/run.err"
        return 1
    }
    url="http://$($ENGINE port "$1" 8080/tcp | head -n 1 | sed 's/^0\.0\.0\.0:/127.0.0.1:/')"
    wait_healthz "$url" 30
}

url=
if start_container "$name"; then
    ok "run/healthz"
else
    fail "run/healthz" "the container did not answer $url/healthz within 30 s"
    route_conflicts
    $ENGINE logs "$name" 2>&1 | tail -n 10
    summary
    exit 1
fi
check "run/listens-on-all-interfaces" "the server did not say it listens on 0.0.0.0:8080" \
    grep -q 'listening on http://0.0.0.0:8080' <($ENGINE logs "$name" 2>&1)

fixture=$FIXTURES/seed004_toy.json
jq '.request' "$fixture" >"$tmp/fixture-request.json"
status=$(http POST "$url/v1/attention" -H 'Content-Type: application/json' --data-binary @"$tmp/fixture-request.json")
check "run/seed-fixture" "POST $(basename "$fixture") answered $status, or not the fixture's numbers" \
    eval '[ "$status" = 200 ] && matches_fixture "$tmp/body" "$fixture"'

# The compute threads follow the container's CPU limit (its cgroup's CPU quota): with
# --cpus 1 the server computes on one thread, however many CPUs the host has.
threads=
if $ENGINE run -d --name "$name-cpus" --cpus 1 -p 127.0.0.1::8080 "${health_flags[@]}" "$IMAGE" \
        >/dev/null 2>"$tmp/run.err"; then
    cpus_url="http://$($ENGINE port "$name-cpus" 8080/tcp | head -n 1 | sed 's/^0\.0\.0\.0:/127.0.0.1:/')"
    wait_healthz "$cpus_url" 30 && threads=$(curl -s --max-time 5 "$cpus_url/v1/info" | jq -r '.compute.threads')
else
    cat "$tmp/run.err"
fi
$ENGINE rm -f "$name-cpus" >/dev/null 2>&1
check "run/compute-threads-follow-cpu-limit" "with --cpus 1, /v1/info says compute.threads is '${threads:-}'" \
    test "${threads:-}" = 1

pid=$($ENGINE inspect --format '{{.State.Pid}}' "$name")
uids=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status" 2>/dev/null)
check "run/process-not-root" "the server process $pid has uids '$uids' on the host" \
    eval '[ -n "$uids" ] && ! echo "$uids" | grep -qw 0'

if [ "$ENGINE" = podman ]; then
    check "run/healthcheck-passes" "podman healthcheck run did not report healthy" \
        podman healthcheck run "$name"
else
    health=
    for ((i = 0; i < 30; i++)); do
        health=$(docker inspect --format '{{.State.Health.Status}}' "$name")
        [ "$health" = healthy ] && break
        sleep 1
    done
    check "run/healthcheck-passes" "the health status is '$health'" test "$health" = healthy
fi
# The same command with nothing listening on its port must fail, or it checks nothing.
check "run/healthcheck-fails-without-server" "the health check passed with nothing listening" \
    eval '! $ENGINE exec -e ATTN_PORT=1 "$name" sh -c "$healthcmd" >/dev/null 2>&1'

status=$(http PUT "$url/v1/weight-sets/toy" --data-binary @api/examples/toy.weight-set.json)
check "store/put" "PUT /v1/weight-sets/toy answered $status" test "$status" = 201
http GET "$url/v1/weight-sets/toy" >/dev/null
cp "$tmp/body" "$tmp/toy-before.json"

# The slow request: x of 4 x 3000 tokens of width 8, projected to dk = 512 (about 41 GFLOP),
# numbers multiples of 1/8 so the body stays short, and no attention matrix in the answer.
awk 'BEGIN {
    srand(7)
    printf "{\"return_attention\": false, \"x\": ["
    for (b = 0; b < 4; b++) {
        printf "%s[", b ? "," : ""
        for (i = 0; i < 3000; i++) {
            printf "%s[", i ? "," : ""
            for (j = 0; j < 8; j++) printf "%s%g", j ? "," : "", int(rand() * 17) / 8 - 1
            printf "]"
        }
        printf "]"
    }
    printf "], \"weights\": {"
    split("wq wk wv", names, " "); split("512 512 64", widths, " ")
    for (k = 1; k <= 3; k++) {
        printf "%s\"%s\": [", (k > 1) ? "," : "", names[k]
        for (i = 0; i < 8; i++) {
            printf "%s[", i ? "," : ""
            for (j = 0; j < widths[k]; j++) printf "%s%g", j ? "," : "", int(rand() * 17) / 8 - 1
            printf "]"
        }
        printf "]"
    }
    printf "}}\n"
}' >"$tmp/slow.json"

# inflight: the server's gauge of requests being received or answered (the /metrics request
# that asks counts itself).
inflight() { curl -s --max-time 5 "$url/metrics" | awk '$1 == "attn_http_inflight_requests" { print $2 }'; }

{
    curl -s -o "$tmp/slow-body" -w '%{http_code}' --max-time 60 --data-binary @"$tmp/slow.json" \
        "$url/v1/attention" >"$tmp/slow-status"
    now >"$tmp/slow-end"
} &
slow_pid=$!
for ((i = 0; i < 100; i++)); do
    [ "$(inflight)" -ge 2 ] 2>/dev/null && break
    sleep 0.05
done
t0=$(now)
$ENGINE kill --signal TERM "$name" >/dev/null
# /readyz turns 503 once the server has handled the signal, which the engine delivers on its
# own time: asked until then, 60 times at most, while the slow request keeps it draining.
for ((i = 0; i < 60; i++)); do
    readyz=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/readyz")
    [ "$readyz" = 200 ] || break
    sleep 0.05
done
exit_code=$($ENGINE wait "$name" 2>/dev/null | tail -n 1)
stop_seconds=$(seconds_since "$t0")
wait "$slow_pid"
echo "    SIGTERM to exit: $stop_seconds s"
check "stop/request-in-flight-at-sigterm" "the slow request was answered before SIGTERM; make it slower" \
    awk -v end="$(cat "$tmp/slow-end")" -v t0="$t0" 'BEGIN { exit !(end > t0) }'
check "stop/readyz-503-while-draining" "/readyz answered $readyz after SIGTERM" test "$readyz" = 503
check "stop/in-flight-request-completes" "the request in flight got $(cat "$tmp/slow-status"), not a whole answer" \
    eval '[ "$(cat "$tmp/slow-status")" = 200 ] && [ "$(jq ".output | length" "$tmp/slow-body")" = 4 ]'
check "stop/exit-code-0" "the container exited with $exit_code" test "$exit_code" = 0
check "stop/within-a-few-seconds" "it took $stop_seconds s from SIGTERM to exit" \
    awk -v s="$stop_seconds" 'BEGIN { exit !(s < 10) }'

url=
if start_container "$name-2"; then
    http GET "$url/v1/weight-sets/toy" >/dev/null
    check "store/survives-restart" "the weight set is not the same in a new container on the volume" \
        cmp -s "$tmp/body" "$tmp/toy-before.json"
else
    fail "store/survives-restart" "the second container did not answer /healthz"
fi
$ENGINE stop --time 15 "$name-2" >/dev/null 2>&1

size=$(engine_image_size "$IMAGE")
echo "    image $IMAGE: $((size / 1000000)) MB"
summary
