"""What `ledgerflow --help` and `ledgerflow workflows --help` list of the commands other modules define:
where each command is, and the first paragraph of its help. The groups import a command's module only
when the command runs or shows its own help (`ops.cli.lazy`); tests/unit/test_cli_lazy.py checks each
summary against its command. A new command of another module is added here."""

from __future__ import annotations

from ops.cli.lazy import LazyCommand

#: `ledgerflow`'s commands defined outside ops.cli.commands.
COMMANDS = {
    "append": LazyCommand("ops.cli.streams:append", "Append one event to a stream."),
    "db": LazyCommand("ops.cli.database:db_group", "The database ledgerflow uses."),
    "demo": LazyCommand(
        "ops.cli.demo:demo",
        "Run the six-node extraction pipeline with live progress; kill its worker mid-node and watch the "
        "run resume at the right item. Then an event starts a review run, which waits for an approval.",
    ),
    "doctor": LazyCommand(
        "ops.cli.database:doctor",
        "Check the database, migrations, leases, the safe horizon and stuck work; say what to do.",
    ),
    "events": LazyCommand("ops.cli.events:events_group", "Event types: versions, upcasters and counts."),
    "events-demo": LazyCommand(
        "ops.cli.global_log:events_demo",
        "Append sample events from several threads and follow them live through a subscription.",
    ),
    "failures": LazyCommand(
        "ops.cli.projections:failures_group", "Events projections could not apply: list, retry, skip."
    ),
    "horizon": LazyCommand(
        "ops.cli.global_log:horizon",
        "Show the log's safe horizon and the writers of the log holding it back.",
    ),
    "keys": LazyCommand("ops.cli.subjects:keys_group", "The master key that wraps the subjects' data keys."),
    "log": LazyCommand(
        "ops.cli.log:log_group",
        "The event log's partitions: list them, archive old ones to files, restore them for a rebuild.",
    ),
    "migrate": LazyCommand(
        "ops.cli.database:migrate", "Apply pending database migrations (also done automatically on start-up)."
    ),
    "projections": LazyCommand(
        "ops.cli.projections:projections_group",
        "Inspect and operate projections: status, runs, replay, rebuild, verify, failures.",
    ),
    "projector": LazyCommand(
        "ops.cli.projections:projector_command",
        "Run a projector worker until SIGTERM or Ctrl-C; start as many as you like.",
    ),
    "psql": LazyCommand(
        "ops.cli.database:psql",
        "Open psql on ledgerflow's database (the embedded one too); extra arguments go to psql, e.g. "
        "`ledgerflow psql -c 'select * from ledgerflow.stream_catalogue'`.",
    ),
    "quotas": LazyCommand(
        "ops.cli.quotas:quotas_group", "Per-tenant quotas: runs in flight, starts and appends per second."
    ),
    "read": LazyCommand("ops.cli.streams:read", "Print a stream's events, as stored unless --upcast."),
    "recover": LazyCommand(
        "ops.cli.worker:recover",
        "Reclaim orphaned nodes now (workers also do this continuously) and show recent recoveries.",
    ),
    "subjects": LazyCommand(
        "ops.cli.subjects:subjects_group",
        "Subjects of personal data: forget one (its personal fields then read as [forgotten]).",
    ),
    "tail": LazyCommand(
        "ops.cli.global_log:tail",
        "Follow the global log from a cursor, one JSON line per event, until interrupted.",
    ),
    "tokens": LazyCommand(
        "ops.cli.tokens:tokens_group",
        "API tokens: each bound to one tenant and to scopes (append, read, operate, admin).",
    ),
    "worker": LazyCommand(
        "ops.cli.worker:worker_command",
        "Run a workflow worker until SIGTERM or Ctrl-C; start as many as you like.",
    ),
    "workflows": LazyCommand(
        "ops.cli.workflows:workflows_group",
        "Start, list, show, signal, pause, resume, cancel, retry and refresh workflow runs.",
    ),
}

#: The `workflows` commands other modules define: where each is, and the first paragraph of its help.
WORKFLOWS_COMMANDS = {
    "bulk": LazyCommand(
        "ops.cli.bulk:bulk_group",
        "Act on every run a filter keeps (the filters of `workflows list`), as one recorded action.",
    ),
    "cancel": LazyCommand("ops.cli.run_actions:cancel", ""),
    "history": LazyCommand(
        "ops.cli.run_search:history",
        "Every event of a run, oldest first, from its own stream: time, node, attempt, worker and a summary "
        "of its payload.",
    ),
    "list": LazyCommand(
        "ops.cli.run_search:list_runs",
        "Runs, newest first, that every given filter keeps, from the workflow_runs projection (kept by "
        "`ledgerflow projector` or `serve`, so a moment behind); a page at a time (--after the printed "
        "cursor).",
    ),
    "restore": LazyCommand(
        "ops.cli.retention:restore",
        "Bring a run that retention released back into the run tables, equal to what it was (folded again "
        "from its stream by the projector). It stays for another retention from now.",
    ),
    "retention": LazyCommand(
        "ops.cli.retention:retention",
        "Release the tenant's ended runs older than their workflow's retention (`Workflow(retention=)`, else "
        "LEDGERFLOW_RUN_RETENTION; unset: runs are kept for ever) from the run tables, as recorded bulk "
        "actions (see `workflows bulk show`), at most LEDGERFLOW_RETENTION_BATCH runs per workflow a pass. "
        "A pass first finishes what a killed pass left, and waits out a restart of the database "
        "(LEDGERFLOW_OUTAGE_WAIT). Released runs are still found by id and can be restored.",
    ),
    "pause": LazyCommand(
        "ops.cli.run_actions:pause",
        "Pause a run: it starts no new node until `workflows resume`; its running nodes finish.",
    ),
    "refresh": LazyCommand(
        "ops.cli.run_actions:refresh",
        "Re-run a completed run with new input: only what changed, and what depends on it.",
    ),
    "resume": LazyCommand(
        "ops.cli.run_actions:resume",
        "Resume a paused run where it was; completed nodes and memoized steps are not run again.",
    ),
    "retry": LazyCommand(
        "ops.cli.run_actions:retry", "Resume a failed run from its failed nodes; completed nodes are kept."
    ),
    "signal": LazyCommand(
        "ops.cli.run_actions:signal_run",
        "Send signal NAME to a run: the node waiting for it (`ctx.wait_for_signal`) gets --data; sent before "
        "a node waits, it is kept for the first that does.",
    ),
    "wait": LazyCommand(
        "ops.cli.run_wait:wait",
        "Wait until a run ends; exit status 0 if it succeeded, 1 if it failed or was cancelled, 2 on "
        "timeout, 3 if it continued as a new run (its successor is printed; `--follow` waits for the "
        "chain's last run).",
    ),
}
