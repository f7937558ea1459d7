"""Loading runs at the cost of what changed since their snapshot, not of their whole history.

A snapshot (`ledgerflow.workflow_run_snapshots`, migrations/0030_run_snapshots.sql) is a run's folded
state (`workflows.run_state.RunState`) as of a version of its stream. A load reads the snapshot and folds
only the events after it; the fold itself keeps signals by reference (their stream version), and the
stream read leaves their payloads out, so neither grows with what was sent to the run.

Who writes a snapshot: the `workflow_tables` projection, as it applies a run's events (`keep_up`, in the
batch's transaction): when a batch reaches a run's stream `RunCaps.run_snapshot_every` versions or more
past its snapshot, it folds the snapshot and the events up to there and writes a new one. So every run
that grows has a recent snapshot, paid for by the projector rather than by the first load after a burst
of events; a load folds about `run_snapshot_every` events plus the projection's lag. A load that still
folded `run_snapshot_every` events or more (the projection is behind or stopped) writes one too, in a
statement of its own after the read. Not the node's end: a snapshot is a pure function of the first
`version` events of an append-only stream, so whoever folded them may write it, and the end of a node
(one statement, the engine's hot path: ledgerflow.wf_record_node_end) stays as it is. Every path that
loads a run (the API's reads, cancel, retry, refresh, and the worker's claims, the hand-over of
ledgerflow.wf_record_run_end included) starts from the snapshot. A lost or stale snapshot costs only
time: the rows are a cache.

The JSON is this module's: a version field lets a later format leave older rows unread (they are then
replaced by the next load).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
import structlog

from eventstore import EventStore
from eventstore.spi import EventRow, checked_rows, fetch_value, json_dumps, json_loads, load_queries
from workflows import event_models as em
from workflows import events as ev
from workflows.errors import wrap_exceptions
from workflows.run_fold import apply
from workflows.run_state import NodeState, ReceivedSignal, RunState
from workflows.scheduler import NodeStatus

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "snapshots.sql")
# 2: a node's held bytes (format 1 had none; its rows are left unread and replaced).
# 3: the run's parent link (format 2 had none, so a child's would read as no parent: left unread, replaced).
FORMAT = 3
#: Events read at a time.
PAGE = 5000


# -- the state as JSON ------------------------------------------------------------------------------------


def _at(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _pairs(mapping: dict[str, Any]) -> list[list[Any]]:
    """A mapping as a list of pairs: jsonb reorders object keys, and these orders are the run's."""
    return [[k, v] for k, v in mapping.items()]


def _node_json(n: NodeState) -> dict[str, Any]:
    return {
        "name": n.name,
        "status": str(n.status),
        "attempt": n.attempt,
        "wakes": n.wakes,
        "failures": n.failures,
        "crashes": n.crashes,
        "token": n.token,
        "worker": n.worker,
        "output": n.output,
        "generation": n.generation,
        "error": n.error,
        "progress": list(n.progress) if n.progress is not None else None,
        "checkpoints": _pairs(n.checkpoints),
        "steps": _pairs(n.steps),
        "children": _pairs(n.children),
        "started_at": _at(n.started_at),
        "finished_at": _at(n.finished_at),
        "position": n.position,
        "checkpoints_taken": n.checkpoints_taken,
        "stuck": n.stuck,
        "duration_ms": n.duration_ms,
        "updated_at": _at(n.updated_at),
        "waits": [[k, _at(v)] for k, v in n.waits.items()],
        "taken": _pairs(n.taken),
        "waiting_for": n.waiting_for,
        "wake_at": _at(n.wake_at),
        "held_bytes": n.held_bytes,
    }


def _node_from(d: dict[str, Any]) -> NodeState:
    progress = d["progress"]
    return NodeState(
        name=d["name"],
        status=NodeStatus(d["status"]),
        attempt=d["attempt"],
        wakes=d.get("wakes", 0),  # snapshots written before wakes were counted
        failures=d["failures"],
        crashes=d["crashes"],
        token=d["token"],
        worker=d["worker"],
        output=d["output"],
        generation=d["generation"],
        error=d["error"],
        progress=(progress[0], progress[1], progress[2]) if progress is not None else None,
        checkpoints=dict(d["checkpoints"]),
        steps=dict(d["steps"]),
        children=dict(d["children"]),
        started_at=_when(d["started_at"]),
        finished_at=_when(d["finished_at"]),
        position=d["position"],
        checkpoints_taken=d["checkpoints_taken"],
        stuck=d["stuck"],
        duration_ms=d["duration_ms"],
        updated_at=_when(d["updated_at"]),
        waits={k: _when(v) for k, v in d["waits"]},
        taken=dict(d["taken"]),
        waiting_for=d["waiting_for"],
        wake_at=_when(d["wake_at"]),
        held_bytes=d["held_bytes"],
    )


def to_json(run: RunState) -> str:
    return json_dumps(
        {
            "format": FORMAT,
            "workflow": run.workflow,
            "key": run.key,
            "input": run.input,
            "input_fingerprint": run.input_fingerprint,
            "fingerprints": _pairs(run.fingerprints),
            "triggered_by": run.triggered_by.model_dump() if run.triggered_by is not None else None,
            "workflow_version": run.workflow_version,
            "status": run.status,
            "cancel_requested": run.cancel_requested,
            "error": run.error,
            "nodes": [_node_json(n) for n in run.nodes.values()],
            "version": run.version,
            "started_at": _at(run.started_at),
            "finished_at": _at(run.finished_at),
            "current_node": run.current_node,
            "updated_at": _at(run.updated_at),
            "signals": [[s.name, _at(s.at), s.version] for s in run.signals],
            "signals_taken": sorted(run.signals_taken),
            "tags": _pairs(run.tags),
            "parent": run.parent.model_dump() if run.parent is not None else None,
            "continued_as": run.continued_as,
            "continued_from": run.continued_from,
        }
    )


def from_json(run_id: uuid.UUID, tenant: str, text: str) -> RunState | None:
    """The state a snapshot holds; None for a format this code does not know."""
    d = json_loads(text)
    if d.get("format") != FORMAT:
        return None
    triggered = d["triggered_by"]
    return RunState(
        run_id,
        tenant,
        workflow=d["workflow"],
        key=d["key"],
        input=d["input"],
        input_fingerprint=d["input_fingerprint"],
        fingerprints=dict(d["fingerprints"]),
        triggered_by=em.TriggeringEvent.model_validate(triggered) if triggered is not None else None,
        workflow_version=d["workflow_version"],
        status=d["status"],
        cancel_requested=d["cancel_requested"],
        error=d["error"],
        nodes={n["name"]: _node_from(n) for n in d["nodes"]},
        version=d["version"],
        started_at=_when(d["started_at"]),
        finished_at=_when(d["finished_at"]),
        current_node=d["current_node"],
        updated_at=_when(d["updated_at"]),
        signals=[ReceivedSignal(name, datetime.fromisoformat(at), v) for name, at, v in d["signals"]],
        signals_taken=set(d["signals_taken"]),
        # Absent from snapshots written before runs had tags, when no run had any.
        tags=dict(d.get("tags", [])),
        parent=em.ParentLink.model_validate(d["parent"]) if d["parent"] is not None else None,
        # Absent from snapshots written before runs could continue as new, when no run had these links.
        continued_as=d.get("continued_as"),
        continued_from=d.get("continued_from"),
    )


# -- loading -----------------------------------------------------------------------------------------------


def load_runs(
    store: EventStore, run_ids: Sequence[uuid.UUID], *, tenant: str, snapshot_every: int
) -> dict[uuid.UUID, RunState]:
    """The current state of each run found (those with no event are left out): its snapshot, if any, with
    the events after it folded in. Writes a new snapshot for each run that folded `snapshot_every` events
    or more."""
    if not run_ids:
        return {}
    with wrap_exceptions(), store.pool.connection() as conn:
        found = conn.execute(Q["read_snapshots"], {"tenant": tenant, "run_ids": list(run_ids)}).fetchall()
    runs: dict[uuid.UUID, RunState] = {}
    for run_id, _version, text in found:
        state = from_json(run_id, tenant, text)
        if state is not None:
            runs[run_id] = state
    base = {r: runs[r].version if r in runs else 0 for r in run_ids}
    fresh: dict[uuid.UUID, RunState] = {r: runs.get(r) or RunState(r, tenant) for r in run_ids}
    catch_up(store, fresh.values())
    for r in run_ids:
        run = fresh[r]
        if run.version - base[r] >= snapshot_every:
            write(store, run)
    return {r: run for r, run in fresh.items() if run.version > 0}


def catch_up(store: EventStore, runs: Iterable[RunState]) -> None:
    """Advance each of `runs` (of one tenant), in place, with the events after the version it knows, read
    without signal payloads."""
    by_stream = {ev.run_stream(run.run_id): run for run in runs}
    while by_stream:
        with wrap_exceptions(), store.pool.connection() as conn:
            more = _fold_page(conn, by_stream, {})
        if not more:
            return


def fold_upto(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str, version: int) -> RunState:
    """The run's state folded from its first event up to `version` of its stream, in `conn` (a projection's
    transaction: a restored run's rows are this fold's, as they were when the run was first projected)."""
    run = RunState(run_id, tenant)
    by_stream = {ev.run_stream(run_id): run}
    while _fold_page(conn, by_stream, {ev.run_stream(run_id): version}):
        pass
    return run


def _fold_page(conn: psycopg.Connection[Any], by_stream: dict[str, RunState], upto: dict[str, int]) -> bool:
    """Apply to the runs of `by_stream` (of one tenant) one page of the events after the version each
    knows (up to `upto[stream]`, if given); whether there may be more."""
    tenant = next(iter(by_stream.values())).tenant
    params = {
        "tenant": tenant,
        "streams": list(by_stream),
        "after": [run.version for run in by_stream.values()],
        "upto": [upto.get(stream) for stream in by_stream],
        "limit": PAGE,
    }
    with conn.cursor(row_factory=checked_rows(EventRow)) as cur:
        rows = cur.execute(Q["read_runs_after"], params).fetchall()
    for e in EventStore.recorded(rows):
        apply(by_stream[e.stream_id], e)
    return len(rows) == PAGE


def write(store: EventStore, run: RunState) -> None:
    """Record `run` as its stream's snapshot at `run.version`, unless a newer one is there. A failure is
    logged, not raised: the load it follows has its answer, and the next load writes one."""
    params = {"tenant": run.tenant, "run_id": run.run_id, "version": run.version, "state": to_json(run)}
    try:
        with wrap_exceptions(), store.pool.connection() as conn:
            conn.execute(Q["write_snapshot"], params)
    except Exception as exc:
        log.warning("workflow_run_snapshot_not_written", run_id=str(run.run_id), error=str(exc))


def keep_up(conn: psycopg.Connection[Any], heads: Mapping[tuple[str, uuid.UUID], int], every: int) -> int:
    """In a `workflow_tables` batch's transaction: for each run whose events the batch reached stream
    version `heads[(tenant, run_id)]`, a snapshot at that version if the run's is `every` versions or more
    behind it (or missing). Each is folded from the run's snapshot and the events after it up to that
    version (no further: a batch's cost is that of its own events), read without signal payloads. Returns
    how many were written. A run whose fold fails (an event or a snapshot this code cannot read) is logged
    and left without one: its loads fold it themselves, and the tables' batch goes on."""
    if not heads:
        return 0
    keys = sorted(heads)
    params = {
        "tenants": [t for t, _ in keys],
        "run_ids": [r for _, r in keys],
        "heads": [heads[k] for k in keys],
        "every": every,
    }
    due = conn.execute(Q["read_snapshots_due"], params).fetchall()
    by_tenant: dict[str, dict[str, RunState]] = {}
    for tenant, run_id, text in due:
        state = from_json(run_id, tenant, text) if text is not None else None
        run = state if state is not None else RunState(run_id, tenant)
        by_tenant.setdefault(tenant, {})[ev.run_stream(run_id)] = run
    done: list[RunState] = []
    for tenant, by_stream in by_tenant.items():
        upto = {ev.run_stream(run.run_id): heads[(tenant, run.run_id)] for run in by_stream.values()}
        try:
            while _fold_page(conn, by_stream, upto):
                pass
        except psycopg.Error:
            raise  # the transaction is lost: the batch is retried
        except Exception as exc:
            log.warning("workflow_run_snapshots_not_kept", tenant=tenant, runs=len(by_stream), error=str(exc))
            continue
        done.extend(by_stream.values())
    done = [run for run in done if run.version > 0]
    if done:
        done.sort(key=lambda run: (run.tenant, run.run_id))
        conn.execute(
            Q["write_snapshots"],
            {
                "tenants": [run.tenant for run in done],
                "run_ids": [run.run_id for run in done],
                "versions": [run.version for run in done],
                "states": [to_json(run) for run in done],
            },
        )
    return len(done)


def signal_payload(store: EventStore, run: RunState, index: int) -> Any:
    """The payload of the run's `index`-th signal, read from the log by its version."""
    signal = run.signals[index]
    params = {"tenant": run.tenant, "stream_id": ev.run_stream(run.run_id), "version": signal.version}
    with wrap_exceptions(), store.pool.connection() as conn:
        payload = fetch_value(conn, Q["read_signal_payload"], params)
    return None if payload is None else json_loads(payload)


def count_signal(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str, limit: int) -> bool:
    """In the signal's transaction: count one more signal for the run; False when it had `limit` already."""
    with wrap_exceptions():
        row = conn.execute(Q["count_signal"], {"tenant": tenant, "run_id": run_id, "limit": limit}).fetchone()
    return row is not None
