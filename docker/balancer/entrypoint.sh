#!/bin/bash
# entrypoint.sh - runs the balancer's two nginx processes and keeps the list of replicas of
# the second one current.
#
# replicas.conf hashes a sequence's id onto the replicas (`hash ... consistent`), which only
# an upstream block can do, and open-source nginx 1.22 (Debian bookworm's) looks the servers
# of an upstream block up once, when it reads its configuration: the `resolve` parameter
# that would follow them is NGINX Plus's (open source only from 1.27.3).  So this script
# does it: it looks the replicas' name up through the network's DNS (compose's; the swarm's
# with endpoint_mode dnsrr), which answers with the address of every replica that runs now,
# writes them as the two upstream blocks of /tmp/upstreams.conf (HTTP's port and gRPC's),
# and starts nginx on replicas.conf.  Then, every second, it looks again, and when the set
# of addresses has changed it writes the file again and sends that nginx SIGHUP: it reads
# the new list, starts a new worker on it, and lets the old one finish the requests and
# gRPC streams it proxies.  A replica killed leaves the list about a second after it
# leaves the DNS; a replica started is on it a second after it appears there.
#
# A reload closes the idle keep-alive connections of that nginx's clients, and an HTTP
# client that sends its next request on one gets no answer; so the clients' connections
# are held by the other nginx (nginx.conf), which is never reloaded and passes each request
# to the first over a connection of its own (see nginx.conf).
#
# A look-up that finds no address leaves the list as it is: a name server that fails for a
# moment must not empty the balancer, and when every replica is gone the old addresses
# refuse connections as an empty list would.  Before the first address is found (nginx may
# start before the replicas), the list is one server marked down: nginx answers 502.
#
# Both nginx run in the foreground (`daemon off`) as this script's children; SIGQUIT (the
# image's STOPSIGNAL, a graceful stop), SIGTERM and SIGINT are passed to both, and the
# script ends when either has ended, stopping the other.  /tmp is the container's tmpfs.
set -u
REPLICAS=${BALANCER_REPLICAS:-attention}
HTTP_PORT=8080
GRPC_PORT=8001
CONF=/tmp/upstreams.conf

# addresses: the replicas' IPv4 addresses, sorted, one line; empty when none is found.
addresses() {
    getent ahostsv4 "$REPLICAS" 2>/dev/null | awk '{ print $1 }' | sort -u | tr '\n' ' '
}

# write_upstreams ADDRESSES: writes CONF whole, then renames it into place, so that nginx
# never reads half a file.  Every server has max_fails=0: a replica is not set aside after
# a failed request, so a sequence's requests go to the replica that holds it as long as
# it is on the list (a failure is retried on the next replica for that request only); a
# dead replica leaves the list itself.
write_upstreams() {
    local list=$1 upstream port ip
    {
        for upstream in attention_http:$HTTP_PORT attention_grpc:$GRPC_PORT; do
            port=${upstream#*:}
            echo "upstream ${upstream%%:*} {"
            echo "    hash \$sequence_key consistent;"
            for ip in $list; do
                echo "    server $ip:$port max_fails=0;"
            done
            [ -n "$list" ] || echo "    server 127.0.0.1:$port down;"
            echo "}"
        done
    } >"$CONF.new" && mv -f "$CONF.new" "$CONF"
}

mkdir -p /tmp/replicas
rm -f /tmp/replicas-http.sock /tmp/replicas-grpc.sock
current=$(addresses)
write_upstreams "$current"
echo "balancer: replicas ${current:-(none yet)}" >&2

nginx -c /etc/nginx/replicas.conf -g "daemon off;" &
replicas_pid=$!
nginx -g "daemon off;" &
front_pid=$!
stopping=
trap 'stopping=1; kill -QUIT "$front_pid" "$replicas_pid" 2>/dev/null' QUIT TERM INT

while kill -0 "$front_pid" 2>/dev/null && kill -0 "$replicas_pid" 2>/dev/null; do
    sleep 1 &
    wait $!
    [ -z "$stopping" ] || continue
    found=$(addresses)
    if [ -n "$found" ] && [ "$found" != "$current" ]; then
        write_upstreams "$found"
        echo "balancer: replicas $found" >&2
        current=$found
        kill -HUP "$replicas_pid" 2>/dev/null
    fi
done
# One has ended: the other goes too, gracefully, and the container with them (exit status 1
# when nobody asked them to stop).
kill -QUIT "$front_pid" "$replicas_pid" 2>/dev/null
wait "$front_pid"
status=$?
wait "$replicas_pid"
if [ -z "$stopping" ]; then
    echo "balancer: an nginx ended by itself; stopping" >&2
    exit 1
fi
exit "$status"
