#!/bin/bash
# entrypoint.sh - starts the balancer's nginx after writing /tmp/resolver.conf, the
# `resolver` directive that nginx.conf includes: the name server of this container's network
# (Docker's and podman's both put it in /etc/resolv.conf), so that nginx looks the replicas
# up again while it runs instead of once at start.  /tmp is the container's tmpfs.
set -eu
ns=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)
if [ -z "$ns" ]; then
    echo "entrypoint.sh: no nameserver in /etc/resolv.conf; nginx cannot find the replicas" >&2
    exit 1
fi
# An IPv6 address is written in brackets.
case $ns in *:*) ns="[$ns]" ;; esac
echo "resolver $ns valid=1s ipv6=off;" >/tmp/resolver.conf
exec nginx -g "daemon off;"
