#!/usr/bin/env bash
# A Docker engine for tests/deploy/test_compose_cluster.py, started and stopped so
# that the machine is left as it was.
#
#   .ci/dockerd.sh start   # unless an engine already answers `docker info`
#   .ci/dockerd.sh stop    # only the engine that `start` started
#
# The engine gets no default bridge (docker0), no masquerading and does not turn
# on IP forwarding: the test's containers talk only to each other, on their
# compose project's own bridge network, and reach nothing outside (builds run
# with --network none). It does write iptables rules (on a host whose FORWARD
# policy drops, containers on one bridge need its ACCEPT rule): `stop` removes
# every rule and chain of Docker's, puts back the FORWARD policy and
# net.ipv4.ip_forward as they were, and deletes any bridge the engine left.
set -uo pipefail
STATE=${MONARCH_DOCKERD_STATE:-/run/monarch-ci-dockerd}

bridges() { ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | sort; }

case "${1:-}" in
start)
    if docker info >/dev/null 2>&1; then
        echo "dockerd: an engine is already running; the compose test uses it"
        exit 0
    fi
    if ! command -v dockerd >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
        echo "dockerd: not installed or not root; the compose test will say it skips"
        exit 0
    fi
    mkdir -p "$STATE"
    bridges >"$STATE/bridges-before"
    iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}' >"$STATE/forward-policy"
    sysctl -n net.ipv4.ip_forward >"$STATE/ip-forward" 2>/dev/null
    dockerd --host unix:///var/run/docker.sock --bridge=none --ip-forward=false \
        --ip-masq=false --pidfile "$STATE/dockerd.pid" \
        >"$STATE/dockerd.log" 2>&1 &
    echo $! >"$STATE/pid"
    for _ in $(seq 120); do
        if docker info >/dev/null 2>&1; then
            echo "dockerd: started (pid $(cat "$STATE/pid"), log $STATE/dockerd.log)"
            exit 0
        fi
        sleep 0.5
    done
    echo "dockerd: did not answer in 60 s; the compose test will say it skips:"
    tail -20 "$STATE/dockerd.log"
    ;;
stop)
    [ -f "$STATE/pid" ] || exit 0
    pid=$(cat "$STATE/pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    if command -v iptables-save >/dev/null 2>&1; then
        iptables-save | grep -v -E 'DOCKER|docker0|br-[0-9a-f]{12}' | iptables-restore
        policy=$(cat "$STATE/forward-policy" 2>/dev/null)
        [ -n "$policy" ] && iptables -P FORWARD "$policy"
    fi
    forward=$(cat "$STATE/ip-forward" 2>/dev/null)
    [ -n "$forward" ] && sysctl -q -w net.ipv4.ip_forward="$forward"
    # Bridges the engine made and left (a compose network of a killed run).
    if [ -f "$STATE/bridges-before" ]; then
        bridges | comm -13 "$STATE/bridges-before" - | grep -E '^(docker0|br-[0-9a-f]{12})$' |
            while read -r br; do ip link delete "$br" 2>/dev/null || true; done
    fi
    rm -rf "$STATE"
    # quiet: it runs after the test summary, which must stay the last line CI prints
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
