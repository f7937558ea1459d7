#!/usr/bin/env bash
# Stops what ops/failover/start.sh DIR started: every node's session, then the monitor's.
set -uo pipefail
DIR=${1:?usage: ops/failover/stop.sh DIR}
for name in node1 node2 monitor; do
    if [ -f "$DIR/$name.pid" ]; then
        kill -TERM -- "-$(cat "$DIR/$name.pid")" 2>/dev/null
    fi
done
