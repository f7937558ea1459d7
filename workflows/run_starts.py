"""Starting runs: a plain start (its events and first nodes queued in one statement), with a run key (at
most one active run per key), an idempotency key, in the caller's transaction, under a tenant's quotas,
debounced (one run per burst of starts), or as a run's continue_as_new successor.

Every start appends with optimistic concurrency on the run's and the key's stream versions: a concurrent
start that claimed the key first makes the loser read it again and return the active run.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog

from eventstore import (
    NO_STREAM,
    AppendResult,
    ConflictError,
    Cursor,
    IdempotencyConflictError,
    InvalidInputError,
    StreamAppend,
    WrongExpectedVersionError,
)
from eventstore.spi import check_tenant
from workflows import event_models as em
from workflows import events as ev
from workflows import new_events as new
from workflows import pipelined_transactions, queue_enqueue
from workflows.cancelling import release_key_appends
from workflows.debounce import Debounce, record_start
from workflows.debounce import idempotency_key as debounce_idempotency_key
from workflows.definition import Workflow, check_priority
from workflows.engine_core import OCC_ATTEMPTS, EngineCore
from workflows.errors import wrap_exceptions
from workflows.run_state import RunState

log = structlog.get_logger(__name__)

_RUN_IDS = uuid.UUID("5b1f0c1e-8d4e-4d59-9a57-6c2f3b1d7e10")  # namespace of idempotent run ids
_MAX_KEY = 200


def fingerprint(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"workflow input must be plain JSON: {exc}") from None
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Started:
    run_id: uuid.UUID
    #: False when an active run for the key, or an earlier start with the idempotency key, was returned.
    #: A debounced start: True for the start that opened its burst.
    created: bool
    #: Where the start landed in the log: `projector.wait_for(store, workflow_tables, started.cursor)`
    #: waits until the run tables show the run. None when an existing run was returned (its start is
    #: older: `store.committed_so_far()` lies beyond it).
    cursor: Cursor | None = None
    #: A debounced start (`debounce=`): when the burst's run starts at the earliest, as of this start (its
    #: id is `run_id`; it exists once a worker fires the burst). None for other starts.
    debounced_until: datetime | None = None


def run_id_for(tenant: str, idempotency_key: str) -> uuid.UUID:
    """The id of the run started with `idempotency_key`."""
    return uuid.uuid5(_RUN_IDS, f"{tenant}\x00{idempotency_key}")


class RunStarts(EngineCore):
    def start(
        self,
        workflow: str,
        *,
        input: Any = None,
        key: str | None = None,
        idempotency_key: str | None = None,
        tenant: str = "default",
        triggered_by: em.TriggeringEvent | None = None,
        conn: psycopg.Connection[Any] | None = None,
        priority: int | None = None,
        debounce: Debounce | None = None,
        tags: dict[str, str] | None = None,
        parent: em.ParentLink | None = None,
    ) -> Started:
        """Start a run. With `key`, at most one run per key is active: a second start returns the active
        run. With `idempotency_key`, a repeat returns the first run; other input under it conflicts.
        `triggered_by`: the log event that started it (`workflows.triggers`), recorded in RunStarted.
        `conn`: start inside the caller's transaction (in a savepoint), so that the run exists if and only
        if that transaction commits; the caller wakes the workers after its commit (see
        `EventStore.notify_appended`). `priority`: higher is claimed first among the tenant's ready nodes
        (default: the workflow's); recorded in RunStarted.
        `debounce`: one run per burst of starts with its key, after the burst (see workflows.debounce);
        the run has the workflow's priority.
        `tags`: key/value strings recorded in RunStarted, to find the run by (`workflows.search_runs`);
        bounded (workflows.tags: TagLimitError, nothing written). Not with `debounce`.
        `parent`: the run and node that start this one as their child (`NodeContext.start_workflow`),
        recorded in RunStarted (see workflows.children).
        With `quotas`, a start over the tenant's quota raises QuotaExceededError, having written nothing."""
        check_tenant(tenant)
        wf = self.registry.get(workflow)
        priority = wf.priority if priority is None else check_priority(priority)
        input_fp = fingerprint(input)
        self.caps.check_input(input)
        checked_tags = {k: v for k, v in self.tag_limits.check(tags or {}).items() if v is not None}
        if checked_tags and debounce is not None:
            raise InvalidInputError("a debounced start takes no tags: tag the run from its nodes instead")
        if self.quotas is not None:
            self.quotas.take_start(tenant)
        if debounce is not None and parent is not None:
            raise InvalidInputError("a child run cannot be debounced: its parent starts it once")
        if debounce is not None:
            return self._debounce(wf, input, key, idempotency_key, tenant, triggered_by, conn, debounce)
        if key is not None and (
            not isinstance(key, str) or not 0 < len(key) <= _MAX_KEY or not key.isprintable()
        ):
            raise InvalidInputError(f"run key must be 1-{_MAX_KEY} printable characters")
        if idempotency_key is not None:
            run_id = run_id_for(tenant, idempotency_key)
            existing = self.store.read_stream(ev.run_stream(run_id), tenant=tenant, limit=1)
            if existing:
                return self._same_request(
                    existing[0].data, run_id, workflow, input_fp, idempotency_key, tenant
                )
        else:
            run_id = uuid.uuid4()
        for _ in range(OCC_ATTEMPTS):
            key_version = None
            if key is not None:
                last = self.store.read_stream(
                    ev.key_stream(workflow, key), tenant=tenant, backward=True, limit=1
                )
                if last and last[0].type == ev.KEY_CLAIMED:
                    return Started(uuid.UUID(last[0].data["run_id"]), created=False)
                key_version = last[0].stream_version if last else None
            try:
                return self._start(
                    wf,
                    run_id,
                    input,
                    input_fp,
                    key,
                    key_version,
                    idempotency_key,
                    tenant,
                    triggered_by,
                    conn,
                    priority,
                    checked_tags,
                    parent,
                )
            except WrongExpectedVersionError as exc:
                if exc.stream_id == ev.run_stream(run_id):  # a concurrent idempotent start won
                    return Started(run_id, created=False)
                continue  # another start claimed the key first: read it again
        raise ConflictError(f"could not start {workflow!r} for key {key!r}: too much contention; retry")

    def _start(
        self,
        wf: Workflow,
        run_id: uuid.UUID,
        input: Any,
        input_fp: str,
        key: str | None,
        key_version: int | None,
        idempotency_key: str | None,
        tenant: str,
        triggered_by: em.TriggeringEvent | None = None,
        caller_conn: psycopg.Connection[Any] | None = None,
        priority: int = 0,
        tags: dict[str, str] | None = None,
        parent: em.ParentLink | None = None,
        continued_from: uuid.UUID | None = None,
    ) -> Started:
        roots = wf.roots()
        started = new.run_started(
            run_id=run_id,
            workflow=wf.name,
            version=wf.version,
            key=key,
            input=input,
            input_fingerprint=input_fp,
            nodes=wf.topological_order(),
            fingerprints={n: s.fingerprint for n, s in wf.nodes.items()},
            # Each written only when set: every other start writes the same payload as before.
            triggered_by=triggered_by,
            priority=priority,
            tags=tags,
            parent=parent,
            continued_from=continued_from,
        )
        appends = [
            StreamAppend(
                ev.run_stream(run_id), [started, new.nodes_ready(run_id=run_id, nodes=roots)], NO_STREAM
            )
        ]
        if key is not None:
            appends.append(
                StreamAppend(
                    ev.key_stream(wf.name, key),
                    [new.key_claimed(run_id=run_id)],
                    key_version if key_version is not None else NO_STREAM,
                )
            )
        # A continue_as_new successor is not admitted again: it replaces its run, which was admitted, in
        # the transaction that ends that run (workflows.quotas).
        in_flight = (
            self.quotas.max_runs_in_flight(tenant)
            if self.quotas is not None and continued_from is None
            else None
        )
        if len(appends) == 1 and idempotency_key is None and caller_conn is None:
            result = self._start_alone(wf, run_id, appends[0], roots, tenant, priority, in_flight)
        else:
            result = self._start_with(
                wf, run_id, appends, roots, idempotency_key, tenant, caller_conn, priority, in_flight
            )
        if not result.duplicate:
            log.info("workflow_started", run_id=str(run_id), workflow=wf.name, key=key, tenant=tenant)
        if result.duplicate:
            return Started(run_id, created=False)
        return Started(
            run_id, created=True, cursor=max(Cursor(e.transaction_id, e.position) for e in result.events)
        )

    def _start_alone(
        self,
        wf: Workflow,
        run_id: uuid.UUID,
        append: StreamAppend,
        roots: list[str],
        tenant: str,
        priority: int,
        in_flight: int | None = None,
    ) -> AppendResult:
        """The commonest start, without a run key or an idempotency key: its events and its first nodes
        queued in one statement, so one transaction and one round trip (see ledgerflow.wf_start_run).
        Under a quota of runs in flight (`in_flight`), the admission goes first, in a pipelined
        transaction with that statement: one round trip too."""
        params = self.store.one_stream_params(append.stream_id, append.events, NO_STREAM, tenant)
        specs = [wf.nodes[r] for r in roots]
        began = time.perf_counter()
        if in_flight is None:
            with wrap_exceptions(), self.store.statement_connection() as conn:
                rows = queue_enqueue.start_run(
                    conn, run_id, wf.name, wf.version, specs, params, priority=priority
                )
        else:
            assert self.quotas is not None
            with (
                self.quotas.refusal(tenant, in_flight),  # outermost: a pipeline's error surfaces late
                wrap_exceptions(),
                self.store.pool.connection() as conn,
            ):
                with pipelined_transactions.pipelined_transaction(conn):
                    self.quotas.admit_run(conn, tenant, in_flight)
                    sent = queue_enqueue.send_start_run(
                        conn, run_id, wf.name, wf.version, specs, params, priority=priority
                    )
                rows = sent.fetchall()  # once committed: BEGIN to COMMIT in one round trip
        self.store.notify_appended()
        return self.store.appended(rows, tenant, began)

    def _start_with(
        self,
        wf: Workflow,
        run_id: uuid.UUID,
        appends: list[StreamAppend],
        roots: list[str],
        idempotency_key: str | None,
        tenant: str,
        caller_conn: psycopg.Connection[Any] | None,
        priority: int,
        in_flight: int | None = None,
    ) -> AppendResult:
        """Any other start: with a key (its stream is appended to as well), an idempotency key, in the
        caller's transaction, or under a quota of runs in flight (`in_flight`: admitted first, in the
        same transaction, which a refusal rolls back)."""
        # In the caller's transaction, a savepoint: a lost race (WrongExpectedVersionError) undoes this
        # start alone and leaves the caller's transaction usable.
        refusal = self.quotas.refusal(tenant, in_flight) if self.quotas and in_flight else nullcontext()
        with (
            refusal,  # outermost: a pipeline's error surfaces late
            self.pipelined_transaction() if caller_conn is None else _savepoint(caller_conn) as conn,
        ):
            if self.quotas is not None and in_flight is not None:
                self.quotas.admit_run(conn, tenant, in_flight)
            result = self.store.append_many(
                appends, idempotency_key=idempotency_key, tenant=tenant, conn=conn
            )
            if not result.duplicate:
                queue_enqueue.enqueue(
                    conn, run_id, tenant, wf.name, wf.version, [wf.nodes[r] for r in roots], priority=priority
                )
        return result

    def start_successor(
        self, conn: psycopg.Connection[Any], run: RunState, input: Any, tags: dict[str, str] | None
    ) -> uuid.UUID:
        """In the caller's transaction (the one that ends `run`): start `run`'s successor, of the same
        workflow (its current definition), tenant, key (released by `run` and claimed by the successor here,
        so no other start takes it between them) and tags unless `tags` is given. Its id derives from
        `run`'s, and it is started under an idempotency key of `run`'s: a repeat starts nothing more."""
        wf = self.registry.get(run.workflow)
        input_fp = fingerprint(input)
        self.caps.check_input(input)
        checked = self.tag_limits.check(dict(run.tags) if tags is None else tags)
        kept = {k: v for k, v in checked.items() if v is not None}
        idempotency_key = f"continue:{run.run_id}"
        key_version: int | None = None
        if run.key is not None:
            released = self.store.append_many(release_key_appends(run), tenant=run.tenant, conn=conn)
            key_version = released.events[-1].stream_version
        started = self._start(
            wf,
            run_id_for(run.tenant, idempotency_key),
            input,
            input_fp,
            run.key,
            key_version,
            idempotency_key,
            run.tenant,
            caller_conn=conn,
            priority=run.priority,
            tags=kept,
            continued_from=run.run_id,
        )
        return started.run_id

    def _debounce(
        self,
        wf: Workflow,
        input: Any,
        key: str | None,
        idempotency_key: str | None,
        tenant: str,
        triggered_by: em.TriggeringEvent | None,
        conn: psycopg.Connection[Any] | None,
        debounce: Debounce,
    ) -> Started:
        """A debounced start: recorded in its burst; the run starts when a worker fires the burst."""
        if key is not None or idempotency_key is not None or triggered_by is not None or conn is not None:
            raise InvalidInputError(
                "a debounced start takes no run key, idempotency key, trigger or connection: "
                "the burst's debounce key already makes its starts one run"
            )
        if not isinstance(debounce, Debounce):
            raise InvalidInputError("debounce must be a workflows.Debounce")
        burst = record_start(self.store, tenant, wf.name, input, debounce)
        run_id = run_id_for(tenant, debounce_idempotency_key(burst.burst))
        log.info(
            "workflow_start_debounced",
            run_id=str(run_id),
            workflow=wf.name,
            debounce_key=debounce.key,
            starts=burst.starts,
            due_at=burst.due_at.isoformat(),
            tenant=tenant,
        )
        return Started(run_id, created=burst.starts == 1, debounced_until=burst.due_at)

    def _same_request(
        self,
        started: dict[str, Any],
        run_id: uuid.UUID,
        workflow: str,
        input_fp: str,
        idempotency_key: str,
        tenant: str,
    ) -> Started:
        if started.get("workflow") != workflow or started.get("input_fingerprint") != input_fp:
            raise IdempotencyConflictError(tenant, idempotency_key)
        return Started(run_id, created=False)


@contextmanager
def _savepoint(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    with conn.transaction():
        yield conn
