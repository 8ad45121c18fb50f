#!/usr/bin/env bash
# The swarm suite (make test-swarm): docker/compose.yaml deployed with `docker stack deploy`
# on a single-node Docker swarm, under a steady load through the balancer of attention
# requests and weight-set PUTs (tests/swarm/loadgen.py, which counts every request and its
# outcome).  It checks that
#   - the stack converges: 3 replicas and the balancer running, every replica answering;
#   - a rolling update to a new image tag completes with no failed request;
#   - a replica killed (docker kill) is replaced by the swarm, with no failed attention
#     request (those may be sent again; a PUT whose replica died may fail, and is then not
#     acknowledged);
#   - scaling 3 -> 5 -> 2 under load fails no request;
#   - every weight set whose PUT was acknowledged is there, with the weights that PUT
#     stored, on every replica left at the end (read inside each replica's network);
#   - the stack and its weight-set volume are removed.
#
# The store the replicas share (swarm.sh [--store s3|volume]):
#   s3      the default, and make test's: docker/compose.s3.yaml, replicas that share only an
#           S3 bucket, each with a tmpfs of its own where the volume was (checked: no replica
#           mounts a volume, and each says its store is the bucket).  The bucket is on a
#           single-node Swift with its S3 middleware (tests/s3/swift_s3.sh), started by the
#           suite with its proxy on the address of the swarm's gateway bridge: the tasks reach
#           the host there, and the host's loopback is not theirs.
#   volume  compose.yaml as it is: one named volume that every replica mounts (on one node).
#
# What it needs and leaves: Debian's docker.io (the container profile of provision.sh), and
# for s3 Swift and memcached (its s3 profile).
# The images are built with podman, the project's engine, and loaded into Docker; where a
# Docker engine answers already, it builds with that one.  When no Docker engine answers,
# the suite starts dockerd itself, on a socket of its own (so that other tools here still
# find no Docker engine), and stops it by its PID at the end.  When the engine is in no
# swarm, it makes a single-node one and leaves it at the end.  It skips, saying why, only
# where no engine can run a container (the rule of tests/container/lib.sh), or dockerd
# cannot be started, or the engine is a swarm worker, which cannot deploy stacks.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=swarm
. "$ROOT/tests/container/lib.sh"
cd "$ROOT" || exit 1

store=s3
case "${1:-}" in
    "") ;;
    --store) store=${2:-}; [ "$store" = s3 ] || [ "$store" = volume ] || { echo "usage: $0 [--store s3|volume]" >&2; exit 2; } ;;
    *) echo "usage: $0 [--store s3|volume]" >&2; exit 2 ;;
esac
stack=attn-swarm-$$
WORKERS=4
# Each load runs until the step it covers is over, and never longer than this, nor for more
# requests than LOAD_MAX_REQUESTS.
LOAD_SECONDS=150
LOAD_MAX_REQUESTS=30000
# The pace of each worker: a steady load that leaves the two cores of a small test machine
# to the swarm, rather than a saturating one.
LOAD_INTERVAL=0.02
started_dockerd=
started_swarm=
made_gwbridge=
# The bridges a dockerd makes (for containers, and for a swarm's gateway), which outlive it:
# those that were not there before the suite's dockerd started are removed after it stops.
DOCKER_BRIDGES="docker0 docker_gwbridge"
bridges_before=
fixture=$FIXTURES/seed004_toy.json
SWIFT_SH=$ROOT/tests/s3/swift_s3.sh
swift_dir=
bucket=attn-swarm-$$

cleanup() {
    if [ -n "${DOCKER_OK:-}" ]; then
        docker stack rm "$stack" >/dev/null 2>&1
        # The volume can go once the stack's containers have.
        local i
        for ((i = 0; i < 60; i++)); do
            [ -z "$(docker ps -a -q --filter "label=com.docker.stack.namespace=$stack")" ] && break
            sleep 0.5
        done
        docker volume rm "${stack}_weight-sets" >/dev/null 2>&1
        docker network rm "${stack}_default" >/dev/null 2>&1
        docker image rm "attention-server:$stack-v2" >/dev/null 2>&1
        [ -n "$started_swarm" ] && docker swarm leave --force >/dev/null 2>&1
        [ -n "$made_gwbridge" ] && docker network rm docker_gwbridge >/dev/null 2>&1
    fi
    # After the swarm, whose replicas were its clients; the folder only once the script
    # has stopped every process it started there (it refuses a folder not its own).
    if [ -n "$swift_dir" ] && [ -d "$swift_dir" ]; then
        bash "$SWIFT_SH" stop "$swift_dir" >/dev/null 2>&1 && rm -rf -- "$swift_dir"
    fi
    if [ -n "$started_dockerd" ]; then
        kill "$started_dockerd" 2>/dev/null
        # dockerd stops its containerd and exits within seconds; wait, bounded.
        for ((i = 0; i < 60; i++)); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.5; done
        local bridge
        for bridge in $DOCKER_BRIDGES; do
            [[ " $bridges_before " == *" $bridge "* ]] && continue
            ip link show "$bridge" >/dev/null 2>&1 && $SUDO ip link delete "$bridge"
        done
    fi
    # engine_build's tag of the build stage, which the steps above do not load anywhere
    [ -n "${ENGINE:-}" ] && $ENGINE image rm "attention-server-build:$stack" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

make -C "$ROOT" --no-print-directory container-deps >"$tmp/deps.log" 2>&1 ||
    skip "the container tools could not be installed: $(tail -n 1 "$tmp/deps.log")"
dockerd=$(command -v dockerd) || skip "dockerd is not installed (Debian's docker.io)"
if [ "$store" = s3 ]; then
    bash "$ROOT/scripts/provision.sh" s3 >"$tmp/deps-s3.log" 2>&1 ||
        skip "Swift could not be installed: $(tail -n 1 "$tmp/deps-s3.log")"
fi
echo "store: $store"

# The images: built by the engine that answers now (podman unless a Docker engine does),
# as the container suites build them, under tags of this run, so that another run's
# latest in podman's store is not replaced under it.
engine_select || skip "$ENGINE_WHY_NOT"
echo "build engine: $ENGINE"
if ! base_image_ensure; then
    fail "swarm/base-image" "could not make $BASE_IMAGE (debootstrap from $(debian_mirror))"
    summary
    exit 1
fi
if ! err=$($ENGINE run --rm --network none "$BASE_IMAGE" true 2>&1); then
    skip "$ENGINE cannot start a container here: $(echo "$err" | tail -n 1)"
fi
t0=$(now)
for image in server balancer; do
    if [ $image = server ]; then file=docker/Dockerfile; else file=docker/balancer/Dockerfile; fi
    if ! engine_build "attention-$image:$stack" "$file" >"$tmp/build.log" 2>&1; then
        tail -n 20 "$tmp/build.log"
        fail "swarm/build-$image" "$ENGINE build of $file failed (the last lines are above)"
        summary
        exit 1
    fi
done
echo "    built both images in $(seconds_since "$t0") s"

# Docker: the engine that answers, or a dockerd of this suite's own.
if [ "$ENGINE" != docker ]; then
    export DOCKER_HOST=unix://$tmp/docker.sock
    for bridge in $DOCKER_BRIDGES; do
        ip link show "$bridge" >/dev/null 2>&1 && bridges_before="$bridges_before $bridge"
    done
    "$dockerd" --host "$DOCKER_HOST" --pidfile "$tmp/dockerd.pid" >"$tmp/dockerd.log" 2>&1 &
    started_dockerd=$!
    for ((i = 0; i < 60; i++)); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$started_dockerd" 2>/dev/null || break
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        tail -n 5 "$tmp/dockerd.log"
        skip "dockerd could not be started here (its last log lines are above)"
    fi
fi
DOCKER_OK=1
echo "docker engine: $(docker version --format '{{.Server.Version}}' 2>&1)${started_dockerd:+ (started by this suite, PID $started_dockerd)}"

swarm_state=$(docker info --format '{{.Swarm.LocalNodeState}}')
if [ "$swarm_state" = inactive ]; then
    if ! err=$(docker swarm init --advertise-addr 127.0.0.1 2>&1); then
        fail "swarm/init" "docker swarm init failed: $(echo "$err" | tail -n 1)"
        summary
        exit 1
    fi
    started_swarm=1
elif [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" != true ]; then
    skip "this Docker engine is a swarm worker (state $swarm_state), which cannot deploy a stack"
fi

# The bucket: Swift's proxy on the swarm's gateway bridge (docker_gwbridge), an address of
# this host that the tasks reach. Docker makes that network when the node runs its first
# task, not at swarm init, so an engine that has never run one has none yet: the suite
# makes it then, as Docker's documentation makes a customised one (a bridge of that name,
# without traffic between its containers, masquerading), and removes it after.
deploy_files=(-c docker/compose.yaml -c docker/swarm.yaml)
if [ "$store" = s3 ]; then
    if ! docker network inspect docker_gwbridge >/dev/null 2>&1; then
        if ! err=$(docker network create --driver bridge \
                       --opt com.docker.network.bridge.name=docker_gwbridge \
                       --opt com.docker.network.bridge.enable_icc=false \
                       --opt com.docker.network.bridge.enable_ip_masquerade=true \
                       docker_gwbridge 2>&1); then
            fail "swarm/s3-store" "the gateway bridge docker_gwbridge could not be made: $(echo "$err" | tail -n 1)"
            summary
            exit 1
        fi
        made_gwbridge=1
    fi
    gateway=$(docker network inspect docker_gwbridge --format '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>&1)
    swift_dir=$(mktemp -d)
    t0=$(now)
    if ! SWIFT_S3_ADDRESS=$gateway bash "$SWIFT_SH" start "$swift_dir" 0 >"$tmp/s3.env" 2>"$tmp/swift.log"; then
        tail -n 5 "$tmp/swift.log"
        fail "swarm/s3-store" "Swift did not start with its proxy on the gateway bridge's address '$gateway'"
        summary
        exit 1
    fi
    s3_endpoint=$(sed -n 's/^S3_ENDPOINT=//p' "$tmp/s3.env")
    s3_key=$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$tmp/s3.env")
    s3_secret=$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$tmp/s3.env")
    # s3_aws ARGS...: awscli against the store, with its key and no file of the user's.
    s3_aws() {
        AWS_ACCESS_KEY_ID=$s3_key AWS_SECRET_ACCESS_KEY=$s3_secret AWS_DEFAULT_REGION=us-east-1 \
            AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_PAGER= \
            aws --endpoint-url "$s3_endpoint" "$@"
    }
    s3_aws s3api create-bucket --bucket "$bucket" >/dev/null 2>"$tmp/aws.err"
    made=$?
    check "swarm/s3-bucket" "the bucket $bucket could not be made at $s3_endpoint: $(tail -n 1 "$tmp/aws.err")" \
        test "$made" = 0
    [ "$failed" -eq 0 ] || { summary; exit 1; }
    (umask 077 && printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
        "$s3_key" "$s3_secret" >"$tmp/s3-credentials")
    export ATTN_STORE_URL=s3://$bucket/swarm ATTN_S3_ENDPOINT=$s3_endpoint \
        ATTN_S3_CREDENTIALS=$tmp/s3-credentials
    deploy_files=(-c docker/compose.yaml -c docker/compose.s3.yaml -c docker/swarm.yaml)
    echo "    Swift's S3 endpoint $s3_endpoint, bucket $bucket, in $(seconds_since "$t0") s"
fi

# Podman's images into Docker, under the names compose.yaml gives them.
t0=$(now)
for image in server balancer; do
    if [ "$ENGINE" = podman ]; then
        podman save "localhost/attention-$image:$stack" -o "$tmp/$image.tar" >/dev/null 2>&1 &&
            docker load -i "$tmp/$image.tar" >/dev/null &&
            docker tag "localhost/attention-$image:$stack" "attention-$image:latest" &&
            docker image rm "localhost/attention-$image:$stack" >/dev/null
        loaded=$?
        rm -f "$tmp/$image.tar"
        podman image rm "localhost/attention-$image:$stack" >/dev/null 2>&1
    else
        docker tag "attention-$image:$stack" "attention-$image:latest" &&
            docker image rm "attention-$image:$stack" >/dev/null
        loaded=$?
    fi
    check "swarm/load-image-$image" "the $image image could not be loaded into Docker" test "$loaded" = 0
done
[ "$failed" -eq 0 ] || { summary; exit 1; }
echo "    loaded into Docker in $(seconds_since "$t0") s"

# Two ports free on every address, HTTP's and gRPC's: the swarm publishes on all of them
# (no host IP).
port= gport=
for candidate in $(shuf -i 20000-39999 -n 40); do
    ss -Htln "sport = :$candidate" | grep -q . && continue
    if [ -z "$port" ]; then port=$candidate; else gport=$candidate; break; fi
done
url=http://127.0.0.1:$port

# running_tasks: the ids of the attention replicas' running containers.
running_tasks() {
    docker ps -q --filter "label=com.docker.swarm.service.name=${stack}_attention" --filter status=running
}

# converged N: true when the attention service runs N of N tasks, every one healthy, and
# the balancer 1 of 1.
converged() {
    local want=$1 line
    line=$(docker service ls --filter "name=${stack}_" --format '{{.Name}} {{.Replicas}}' | sort | tr '\n' ' ')
    [ "$line" = "${stack}_attention $want/$want ${stack}_balancer 1/1 " ] || return 1
    [ "$(docker ps -q --filter "label=com.docker.swarm.service.name=${stack}_attention" \
        --filter health=healthy | wc -l)" = "$want" ]
}

# wait_converged N SECONDS: waits, bounded, until converged N.
wait_converged() {
    local i
    for ((i = 0; i < $2 * 2; i++)); do converged "$1" && return 0; sleep 0.5; done
    return 1
}

t0=$(now)
if ATTN_PUBLISH=$port ATTN_PUBLISH_PORT=$port ATTN_PUBLISH_GRPC=$gport ATTN_PUBLISH_GRPC_PORT=$gport \
        docker stack deploy --resolve-image never "${deploy_files[@]}" "$stack" >"$tmp/deploy.log" 2>&1 &&
    wait_converged 3 120 && wait_healthz "$url" 30; then
    ok "swarm/converges"
    echo "    3 replicas healthy and the balancer answering in $(seconds_since "$t0") s"
else
    cat "$tmp/deploy.log"
    docker service ls
    docker service ps --no-trunc "${stack}_attention" "${stack}_balancer" 2>&1 | tail -n 8
    fail "swarm/converges" "the stack did not converge to 3 healthy replicas and an answering balancer in 150 s"
    summary
    exit 1
fi
: >"$tmp/upstreams"
for ((i = 0; i < 30; i++)); do
    curl -s -o /dev/null --max-time 10 -w '%header{x-upstream}\n' "$url/readyz" >>"$tmp/upstreams"
    [ "$(sort -u "$tmp/upstreams" | wc -l)" -ge 3 ] && break
done
check "swarm/every-replica-answers" "only $(sort -u "$tmp/upstreams" | wc -l) replicas answered 30 requests" \
    test "$(sort -u "$tmp/upstreams" | wc -l)" -ge 3

# store_census: for each running replica, its mounts' types and the store its /v1/info names
# (read inside the replica's network), one line each.
store_census() {
    local task pid
    for task in $(running_tasks); do
        pid=$(docker inspect --format '{{.State.Pid}}' "$task")
        echo "$(docker inspect --format '{{range .Mounts}}{{.Type}} {{end}}' "$task")/" \
            "$($SUDO nsenter --net="/proc/$pid/ns/net" curl -s -m 10 http://127.0.0.1:8080/v1/info |
                jq -r '.store.backend + " " + .store.location')"
    done
}
if [ "$store" = s3 ]; then
    census=$(store_census)
    echo "$census" | sed 's/^/    mounts \/ store: /'
    check "swarm/s3-shares-only-the-bucket" "a replica mounts a volume or keeps its sets elsewhere: $(echo "$census" | tr '\n' ';')" \
        test "$(echo "$census" | grep -cxF "tmpfs / s3 s3://$bucket/swarm")" = 3
fi

# load_start PHASE: starts the load of one phase in the background; load_stop ends it and
# prints its counts.
load_start() {
    rm -f "$tmp/stop"
    /usr/bin/python3 tests/swarm/loadgen.py load --url "$url" --fixture "$fixture" \
        --set api/examples/toy.weight-set.json --log "$tmp/$1.jsonl" --stop-file "$tmp/stop" \
        --workers "$WORKERS" --max-requests "$LOAD_MAX_REQUESTS" --max-seconds "$LOAD_SECONDS" \
        --interval "$LOAD_INTERVAL" \
        --put-every 10 --prefix "$1" >"$tmp/$1.out" 2>&1 &
    load_pid=$!
    # Some load before the step begins.
    sleep 2
}
load_stop() {
    # Some load after the step has ended.
    sleep 2
    touch "$tmp/stop"
    wait "$load_pid"
    echo "    load during $1: $(tail -n 1 "$tmp/$1.out")"
}
# failures PHASE [KIND]: the number of failed requests of the phase (of KIND only).
failures() {
    jq -s --arg k "${2:-}" '[.[] | select(.ok | not) | select($k == "" or .kind == $k)] | length' "$tmp/$1.jsonl"
}
# requests PHASE: how many requests the phase sent.
requests() { wc -l <"$tmp/$1.jsonl"; }
# show_failures PHASE: the first failed requests of the phase.
show_failures() {
    jq -c 'select(.ok | not) | {kind, status, upstream, error}' "$tmp/$1.jsonl" | head -n 5 | sed 's/^/      /'
}

# The rolling update: a new tag of a new image (the same server, another label), one
# replica at a time, the new one healthy before the old one drains.
if ! printf 'FROM attention-server:latest\nLABEL org.opencontainers.image.version=%s\n' "$stack-v2" |
        DOCKER_BUILDKIT=0 docker build -q -t "attention-server:$stack-v2" - >"$tmp/v2.log" 2>&1; then
    tail -n 5 "$tmp/v2.log"
    fail "swarm/rolling-update" "the new image attention-server:$stack-v2 could not be built"
    summary
    exit 1
fi
load_start update
t0=$(now)
timeout 240 docker service update --detach=false --quiet --image "attention-server:$stack-v2" \
    "${stack}_attention" >"$tmp/update.log" 2>&1
# The command returns when the tasks have converged; the update is "completed" once the
# swarm has also watched the last new task for update_config's monitor period.
for ((i = 0; i < 120; i++)); do
    update_state=$(docker service inspect --format '{{.UpdateStatus.State}}' "${stack}_attention")
    case $update_state in updating | *_pending) sleep 0.5 ;; *) break ;; esac
done
echo "    rolling update: $update_state in $(seconds_since "$t0") s"
load_stop update
images=$(docker ps --filter "label=com.docker.swarm.service.name=${stack}_attention" \
    --filter status=running --format '{{.Image}}' | sort | uniq -c | tr -s ' ')
check "swarm/rolling-update" "the update ended '$update_state', replicas running: $images" \
    eval '[ "$update_state" = completed ] && wait_converged 3 30 && [ "$images" = " 3 attention-server:$stack-v2" ]'
n=$(failures update)
[ "$n" = 0 ] || show_failures update
check "swarm/rolling-update-no-failures" "$n of $(requests update) requests failed during the update" \
    test "$n" = 0 -a "$(requests update)" -gt 0

# A replica killed: the swarm starts another; attention requests are sent again by nginx.
victim=$(running_tasks | head -n 1)
load_start kill
docker kill "$victim" >/dev/null
t0=$(now)
replaced=no
for ((i = 0; i < 120; i++)); do
    if converged 3 && ! running_tasks | grep -q "^$victim"; then replaced=yes; break; fi
    sleep 0.5
done
echo "    killed replica ${victim:0:12}: replaced ($replaced) in $(seconds_since "$t0") s"
load_stop kill
check "swarm/kill-replaced" "3 healthy replicas were not running again 60 s after the kill" test "$replaced" = yes
n=$(failures kill attention)
[ "$n" = 0 ] || show_failures kill
check "swarm/kill-no-failed-attention" "$n attention requests failed around the kill" \
    test "$n" = 0 -a "$(requests kill)" -gt 0
echo "    PUTs that failed around the kill (not acknowledged, so not checked below): $(failures kill put)"

# Scaling 3 -> 5 -> 2 under load.
load_start scale
t0=$(now)
timeout 180 docker service scale --detach=false "${stack}_attention=5" >"$tmp/scale.log" 2>&1
wait_converged 5 60
five=$(running_tasks | wc -l)
echo "    scaled to $five replicas in $(seconds_since "$t0") s"
t0=$(now)
timeout 180 docker service scale --detach=false "${stack}_attention=2" >>"$tmp/scale.log" 2>&1
# The replicas scaled away drain first (up to --shutdown-grace).
for ((i = 0; i < 60; i++)); do [ "$(running_tasks | wc -l)" = 2 ] && break; sleep 0.5; done
wait_converged 2 30
two=$(running_tasks | wc -l)
echo "    then to $two replicas in $(seconds_since "$t0") s"
load_stop scale
check "swarm/scale-3-5-2" "ran $five replicas after scaling to 5 and $two after scaling to 2" \
    test "$five" = 5 -a "$two" = 2
n=$(failures scale)
[ "$n" = 0 ] || show_failures scale
check "swarm/scale-no-failures" "$n of $(requests scale) requests failed while scaling" \
    test "$n" = 0 -a "$(requests scale)" -gt 0

# Every acknowledged set, from every replica, inside its own network namespace.
bad=0
for task in $(running_tasks); do
    pid=$(docker inspect --format '{{.State.Pid}}' "$task")
    if ! $SUDO nsenter --net="/proc/$pid/ns/net" /usr/bin/python3 tests/swarm/loadgen.py verify \
            --url http://127.0.0.1:8080 --log "$tmp"/{update,kill,scale}.jsonl >"$tmp/verify.out" 2>&1; then
        bad=$((bad + 1))
        head -n 5 "$tmp/verify.out"
    fi
    echo "    replica ${task:0:12}: $(tail -n 1 "$tmp/verify.out")"
done
check "swarm/acknowledged-sets-on-every-replica" "$bad replicas lack acknowledged sets or hold other weights" \
    test "$bad" = 0 -a -n "$(running_tasks)"
if [ "$store" = s3 ]; then
    # The replicas that hold the sets now were started by the update and the scaling: they
    # read them from the bucket, which holds an object for every acknowledged set's name.
    # One listing (awscli follows its pages), not a request per set.
    s3_aws s3api list-objects-v2 --bucket "$bucket" --prefix swarm/ --query 'Contents[].Key' \
        --output text >"$tmp/keys.raw" 2>"$tmp/aws.err"
    listed=$?
    tr '\t' '\n' <"$tmp/keys.raw" | sed -n 's#^swarm/\(.*\)\.wset$#\1#p' | sort -u >"$tmp/keys"
    jq -r 'select(.kind == "put" and .ok) | .name' "$tmp"/{update,kill,scale}.jsonl | sort -u >"$tmp/acked"
    missing=$(comm -23 "$tmp/acked" "$tmp/keys")
    check "swarm/s3-acknowledged-sets-in-the-bucket" "the listing failed ($(tail -n 1 "$tmp/aws.err")) or has no object for $(echo "$missing" | head -n 3 | tr '\n' ' ')" \
        test "$listed" = 0 -a -s "$tmp/acked" -a -z "$missing"
fi

# Removed: the stack, then its volume.
docker stack rm "$stack" >/dev/null 2>&1
for ((i = 0; i < 60; i++)); do
    [ -z "$(docker ps -a -q --filter "label=com.docker.stack.namespace=$stack")" ] && break
    sleep 0.5
done
docker volume rm "${stack}_weight-sets" >/dev/null 2>&1
check "swarm/stack-removed" "services, containers or the volume of the stack are left" \
    eval '[ -z "$(docker service ls -q --filter "name=${stack}_")" ] &&
          [ -z "$(docker ps -a -q --filter "label=com.docker.stack.namespace=$stack")" ] &&
          ! docker volume inspect "${stack}_weight-sets" >/dev/null 2>&1'

summary
