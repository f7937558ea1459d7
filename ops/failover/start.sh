#!/usr/bin/env bash
# A primary and a synchronous standby managed by pg_auto_failover, on one machine, for ledgerflow.
#
#   ops/failover/start.sh [DIR] [BASE_PORT]
#
# Starts a monitor on BASE_PORT and two PostgreSQL nodes on BASE_PORT+1 and BASE_PORT+2, all
# listening on 127.0.0.1 and keeping everything (data, configuration, logs, pid files) under DIR
# (default: a new temporary directory). It never touches another server: ports and directories are
# its own. When every node is up (one primary, one secondary in sync), it prints the multi-host URL
# ledgerflow connects with as its last line, and writes it to DIR/url:
#
#   postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/ledgerflow?target_session_attrs=read-write
#
# The monitor promotes the standby when the primary stops answering; its health checks are tightened
# (FAILOVER_CHECK_MS, default 1000) so that a dead primary is replaced within seconds. Each node runs
# `pg_autoctl run` in a session of its own, whose id is in DIR/<node>.pid, so that a drill can kill a
# node whole. Stop everything with ops/failover/stop.sh DIR.
#
# Run again on the same DIR, it starts whatever is not running: a primary that died rejoins as the
# standby, and the script returns once the pair is in sync again.
#
# Needs Debian's packages pg-auto-failover-cli and postgresql-15-auto-failover (PG_BIN names
# another PostgreSQL's bin directory). PostgreSQL refuses to run as root: run as root, the script
# hands DIR to the `postgres` user and runs itself again as that user.
set -euo pipefail

DIR=${1:-$(mktemp -d "${TMPDIR:-/tmp}/lf-failover.XXXXXX")}
BASE_PORT=${2:-$(cat "$DIR/base_port" 2>/dev/null || echo "${FAILOVER_BASE_PORT:-15432}")}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
CHECK_MS=${FAILOVER_CHECK_MS:-1000}
RUN_AS=${FAILOVER_USER:-postgres}
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
if [ "$(id -u)" = 0 ]; then
    chown "$RUN_AS" "$DIR"
    exec runuser -u "$RUN_AS" -- env PG_BIN="$PG_BIN" FAILOVER_CHECK_MS="$CHECK_MS" \
        "$HERE/start.sh" "$DIR" "$BASE_PORT"
fi

command -v pg_autoctl >/dev/null || {
    echo "pg_autoctl not found: apt-get install pg-auto-failover-cli postgresql-15-auto-failover" >&2
    exit 2
}
export PATH="$PG_BIN:$PATH" PG_CONFIG="$PG_BIN/pg_config"
# pg_autoctl keeps its configuration, state and pid files under the XDG directories: all inside DIR.
export XDG_CONFIG_HOME="$DIR/config" XDG_DATA_HOME="$DIR/share" XDG_RUNTIME_DIR="$DIR/run"
SOCKETS="$DIR/sockets"
mkdir -p "$XDG_CONFIG_HOME" "$XDG_DATA_HOME" "$XDG_RUNTIME_DIR" "$SOCKETS"
chmod 700 "$XDG_RUNTIME_DIR"

MONITOR_PORT=$BASE_PORT
MONITOR="postgres://autoctl_node@127.0.0.1:$MONITOR_PORT/pg_auto_failover?sslmode=disable"

run_detached() {  # name, pgdata: `pg_autoctl run` in its own session, logging to DIR/name.log
    setsid pg_autoctl run --pgdata "$DIR/$1" >>"$DIR/$1.log" 2>&1 </dev/null &
    echo $! >"$DIR/$1.pid"
}

local_only() {  # pgdata: listen on 127.0.0.1 only, with the unix sockets inside DIR
    pg_autoctl config set --pgdata "$1" postgresql.listen_addresses 127.0.0.1 >/dev/null
    pg_autoctl config set --pgdata "$1" postgresql.host "$SOCKETS" >/dev/null
    echo "unix_socket_directories = '$SOCKETS'" >>"$1/postgresql.conf"
}

monitor_sql() {
    psql -X -q -At -h 127.0.0.1 -p "$MONITOR_PORT" -U autoctl_node -d pg_auto_failover -c "$1"
}

in_state() {  # node, state: whether the node last reported that state to the monitor
    test "$(monitor_sql "SELECT reportedstate FROM pgautofailover.node WHERE nodename = '$1'")" = "$2"
}

wait_for() {  # seconds, what, command...: poll the command until it succeeds
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "timed out waiting for $what; logs in $DIR" >&2
            exit 1
        fi
        sleep 0.2
    done
}

running() {  # name: whether its `pg_autoctl run` is alive
    [ -f "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null
}

pair_in_sync() {  # one primary and one secondary, each in the state the monitor wants
    test "$(monitor_sql "SELECT string_agg(reportedstate::text, ',' ORDER BY reportedstate::text)
                         FROM pgautofailover.node WHERE reportedstate = goalstate")" = "primary,secondary"
}

if [ -f "$DIR/monitor/PG_VERSION" ]; then
    # Started before: run again whatever is not running. A node that died rejoins: pg_autoctl rewinds
    # it (pg_rewind) and it becomes the synchronous standby of the primary that took its place.
    for name in monitor node1 node2; do
        running "$name" || run_detached "$name"
    done
    wait_for 60 "the monitor" monitor_sql "SELECT 1"
    wait_for 180 "a primary and a secondary in sync" pair_in_sync
    cat "$DIR/url"
    exit 0
fi

echo "$BASE_PORT" >"$DIR/base_port"
pg_autoctl create monitor --pgdata "$DIR/monitor" --pgport "$MONITOR_PORT" --hostname 127.0.0.1 \
    --auth trust --no-ssl >>"$DIR/monitor.log" 2>&1
local_only "$DIR/monitor"
run_detached monitor
wait_for 60 "the monitor" monitor_sql "SELECT 1"
# Health checks every CHECK_MS, a node unhealthy after 3 of them unanswered: the default waits 20 s.
psql -X -q -h 127.0.0.1 -p "$MONITOR_PORT" -U postgres -d pg_auto_failover >/dev/null <<SQL
ALTER SYSTEM SET pgautofailover.health_check_period = $CHECK_MS;
ALTER SYSTEM SET pgautofailover.health_check_timeout = $CHECK_MS;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = $((CHECK_MS / 2));
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = $((CHECK_MS * 3));
-- How long the monitor waits for a primary it lost to step down before it promotes the standby (30 s
-- by default). An isolated primary steps down after network_partition_timeout (set below, shorter);
-- and with synchronous replication it cannot acknowledge a commit without the standby anyway.
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = $((CHECK_MS * 6));
ALTER SYSTEM SET pgautofailover.startup_grace_period = $((CHECK_MS * 3));
SELECT pg_reload_conf();
SQL

for n in 1 2; do
    node=node$n
    pg_autoctl create postgres --pgdata "$DIR/$node" --pgport $((BASE_PORT + n)) --hostname 127.0.0.1 \
        --name "$node" --dbname ledgerflow --monitor "$MONITOR" --auth trust --no-ssl \
        --listen 127.0.0.1 >>"$DIR/$node.log" 2>&1
    local_only "$DIR/$node"
    # A primary cut off from the monitor and its standby steps down after this many seconds (20 by
    # default): before the monitor gives up waiting for it (primary_demote_timeout above).
    pg_autoctl config set --pgdata "$DIR/$node" timeout.network_partition_timeout \
        $((CHECK_MS * 3 / 1000 > 0 ? CHECK_MS * 3 / 1000 : 1)) >/dev/null
    run_detached "$node"
    # The first node runs alone ("single") until the second has caught up with it.
    wanted=$([ "$n" = 1 ] && echo single || echo secondary)
    wait_for 120 "$node to become $wanted" in_state "$node" "$wanted"
done
wait_for 60 "node1 to become primary" in_state node1 primary

URL="postgresql://postgres@127.0.0.1:$((BASE_PORT + 1)),127.0.0.1:$((BASE_PORT + 2))/ledgerflow?target_session_attrs=read-write"
echo "$URL" >"$DIR/url"
echo "$URL"
