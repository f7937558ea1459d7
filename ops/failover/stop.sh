#!/usr/bin/env bash
# Stops what ops/failover/start.sh DIR started: each node's `pg_autoctl run` session, then the
# monitor's (pg_autoctl stops its PostgreSQL on SIGTERM), and waits up to 60 s for them to end.
set -uo pipefail
DIR=${1:?usage: ops/failover/stop.sh DIR}
pids=()
for name in node1 node2 monitor; do
    if [ -f "$DIR/$name.pid" ] && kill -TERM -- "-$(cat "$DIR/$name.pid")" 2>/dev/null; then
        pids+=("$(cat "$DIR/$name.pid")")
    fi
done
for _ in $(seq 300); do
    alive=0
    for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && exit 0
    sleep 0.2
done
echo "still running after 60 s: ${pids[*]} (see $DIR/*.log)" >&2
exit 1
