"""The workflow engine's public API: start, inspect, cancel, retry and refresh runs.

Every state change is an event in the run's stream, appended with optimistic concurrency on the
stream version; the scheduler's queue changes in the same transaction. A conflicting concurrent change
makes the loser re-read the run and decide again.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import structlog

from eventstore import (
    NO_STREAM,
    AppendResult,
    ConflictError,
    Cursor,
    EventStore,
    IdempotencyConflictError,
    InvalidInputError,
    NewEvent,
    NotFoundError,
    RecordedEvent,
    StreamAppend,
    WrongExpectedVersionError,
)
from eventstore.spi import check_idempotency_key, check_tenant, json_dumps, json_loads
from workflows import cancelling, node_queue, pausing, release_marks, retrying, snapshots
from workflows import events as ev
from workflows import new_events as new
from workflows.cancelling import release_key_appends
from workflows.caps import RunCaps
from workflows.debounce import Debounce, record_start
from workflows.debounce import idempotency_key as debounce_idempotency_key
from workflows.definition import Workflow, WorkflowRegistry, check_priority
from workflows.errors import RunSignalLimitError, RunStateError, wrap_exceptions
from workflows.quotas import TenantQuotas
from workflows.run_state import RunState, apply
from workflows.scheduler import nodes_to_rerun, retry_from_failed
from workflows.tags import TagLimits

log = structlog.get_logger(__name__)
T = TypeVar("T")

_RUN_IDS = uuid.UUID("5b1f0c1e-8d4e-4d59-9a57-6c2f3b1d7e10")  # namespace of idempotent run ids
_MAX_KEY = 200
_OCC_ATTEMPTS = 50
#: Events read from a run stream at a time.
RUN_PAGE = 5000


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


@dataclass(frozen=True)
class SignalSent:
    run_id: uuid.UUID
    name: str
    #: The log position of the SignalReceived event (of the first send, for a repeat).
    position: int
    #: True when the idempotency key matched an earlier send: nothing new was recorded.
    duplicate: bool


def run_id_for(tenant: str, idempotency_key: str) -> uuid.UUID:
    """The id of the run started with `idempotency_key`."""
    return uuid.uuid5(_RUN_IDS, f"{tenant}\x00{idempotency_key}")


class Engine:
    def __init__(
        self,
        store: EventStore,
        registry: WorkflowRegistry,
        caps: RunCaps | None = None,
        *,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        #: What one run may hold (LEDGERFLOW_MAX_SIGNALS_PER_RUN, ...): from the environment by default.
        self.caps = caps if caps is not None else RunCaps()
        #: Per-tenant quotas on starts (None: none); see workflows.quotas.
        self.quotas = quotas
        #: Bounds on run tags (LEDGERFLOW_MAX_TAGS_PER_RUN, ...): from the environment.
        self.tag_limits = TagLimits()

    # -- reading --------------------------------------------------------------------------------------

    def load(self, run_id: uuid.UUID, *, tenant: str = "default") -> RunState:
        """The run's current state: its snapshot with the events after it folded in (workflows.snapshots),
        signals by reference."""
        check_tenant(tenant)
        run = snapshots.load_runs(
            self.store, [run_id], tenant=tenant, snapshot_every=self.caps.run_snapshot_every
        ).get(run_id)
        if run is None:
            raise NotFoundError(
                f"no run {run_id} (tenant {tenant!r}); list runs with `ledgerflow workflows list`"
            )
        return run

    def catch_up(self, run: RunState) -> RunState:
        """Advance `run`, in place, with the events appended to its stream after the version it knows:
        a worker that holds a run reads only what it has not seen."""
        snapshots.catch_up(self.store, [run])
        return run

    def load_many(
        self, run_ids: Sequence[uuid.UUID], *, tenant: str = "default"
    ) -> dict[uuid.UUID, RunState]:
        """Several runs' states in one query each for snapshots and events (runs not found are left out)."""
        unique = list(dict.fromkeys(run_ids))
        every = self.caps.run_snapshot_every
        return snapshots.load_runs(self.store, unique, tenant=tenant, snapshot_every=every)

    def signal_payload(self, run: RunState, index: int) -> Any:
        """The payload of the run's `index`-th signal: the fold keeps signals by reference."""
        return snapshots.signal_payload(self.store, run, index)

    # -- starting -------------------------------------------------------------------------------------

    def start(
        self,
        workflow: str,
        *,
        input: Any = None,
        key: str | None = None,
        idempotency_key: str | None = None,
        tenant: str = "default",
        triggered_by: ev.TriggeringEvent | None = None,
        conn: psycopg.Connection[Any] | None = None,
        priority: int | None = None,
        debounce: Debounce | None = None,
        tags: dict[str, str] | None = None,
        parent: ev.ParentLink | None = None,
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
        for _ in range(_OCC_ATTEMPTS):
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
        triggered_by: ev.TriggeringEvent | None = None,
        caller_conn: psycopg.Connection[Any] | None = None,
        priority: int = 0,
        tags: dict[str, str] | None = None,
        parent: ev.ParentLink | None = None,
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
                rows = node_queue.start_run(
                    conn, run_id, wf.name, wf.version, specs, params, priority=priority
                )
        else:
            assert self.quotas is not None
            with (
                self.quotas.refusal(tenant, in_flight),  # outermost: a pipeline's error surfaces late
                wrap_exceptions(),
                self.store.pool.connection() as conn,
            ):
                with node_queue.pipelined_transaction(conn):
                    self.quotas.admit_run(conn, tenant, in_flight)
                    sent = node_queue.send_start_run(
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
                node_queue.enqueue(
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
        triggered_by: ev.TriggeringEvent | None,
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

    # -- signals --------------------------------------------------------------------------------------

    def signal(
        self,
        run_id: uuid.UUID,
        name: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        tenant: str = "default",
        actor: str | None = None,
    ) -> SignalSent:
        """Send signal `name` with `payload` to a run: the earliest wait for `name` that has not taken a
        signal yet gets it (`NodeContext.wait_for_signal`), now if a node waits for it, or later when one
        does. A repeat with the same `idempotency_key` is recorded once."""
        check_tenant(tenant)
        ev.check_signal_name(name)
        self.caps.check_signal(payload)
        stream = ev.run_stream(run_id)
        received = new.signal_received(run_id=run_id, name=name, payload=payload, actor=actor)
        key = None
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
            # Scoped to the run (the same key may be used for every run), at a fixed length.
            key = "signal:" + hashlib.sha256(f"{run_id}\x00{idempotency_key}".encode()).hexdigest()
        with self.pipelined_transaction() as conn:
            # The run's queue rows first (the order every node end takes too): see node_queue.lock_run_nodes.
            active = node_queue.lock_run_nodes(conn, run_id, tenant)
            if active:
                result = self.store.append(stream, [received], idempotency_key=key, tenant=tenant, conn=conn)
                if not result.duplicate:
                    limit = self.caps.max_signals_per_run
                    if not snapshots.count_signal(conn, run_id, tenant, limit):
                        # Raised inside the transaction: the append above rolls back with it.
                        raise RunSignalLimitError(str(run_id), limit, "LEDGERFLOW_MAX_SIGNALS_PER_RUN")
                    node_queue.wake_waiting(conn, run_id, name)
        if not active:
            # A repeat of a send whose answer was lost may come after the signal let the run end: it gets
            # the first send's answer, not a refusal.
            repeated = self._repeated_send(stream, received, key, tenant) if key is not None else None
            if repeated is not None:
                return SignalSent(run_id, name, repeated.last_position, duplicate=True)
            last = self.store.read_stream(stream, tenant=tenant, backward=True, limit=1)
            if not last:
                raise NotFoundError(
                    f"no run {run_id} (tenant {tenant!r}); list runs with `ledgerflow workflows list`"
                )
            raise RunStateError(
                f"run {run_id} has ended ({last[0].type}); no node would ever take the signal"
            )
        log.info("workflow_signal_sent", run_id=str(run_id), signal=name, duplicate=result.duplicate)
        return SignalSent(run_id, name, result.last_position, result.duplicate)

    def _repeated_send(self, stream: str, received: NewEvent, key: str, tenant: str) -> AppendResult | None:
        """The first send's result if `key` already recorded this signal, else None: a read of the key's
        record, which writes nothing. A key used for other content (another name or payload) raises
        IdempotencyConflictError, as the append would."""
        first = [StreamAppend(stream, [received])]
        return self.store.earlier_append(first, idempotency_key=key, tenant=tenant)

    # -- operator actions ------------------------------------------------------------------------------

    def cancel(
        self,
        run_id: uuid.UUID,
        *,
        tenant: str = "default",
        actor: str = "operator",
        idempotency_key: str | None = None,
    ) -> RunState:
        """Cancel cooperatively: waiting nodes never start; a running node stops at its next context call.
        With `idempotency_key`, the cancel is recorded under it: a repeat does nothing."""

        def attempt() -> None:
            if self._repeated(idempotency_key, tenant):
                return
            run = self.load(run_id, tenant=tenant)
            if not cancelling.cancel_needed(run):
                return
            with self.transaction() as conn:
                running, dropped = node_queue.cancel_run(conn, run_id)
                appends = cancelling.cancel_appends(run, running, dropped, actor)
                self.store.append_many(appends, idempotency_key=idempotency_key, tenant=tenant, conn=conn)
            log.info("workflow_cancel_requested", run_id=str(run_id), running=running, actor=actor)

        self._with_occ(attempt)
        return self.load(run_id, tenant=tenant)

    def terminate(self, run_id: uuid.UUID, *, tenant: str = "default", actor: str = "operator") -> RunState:
        """Cancel at once, without letting running nodes finish: the run's queue rows go, so a running node's
        next write finds its claim gone (NodeLeaseLost) and stops without recording anything, and the run is
        cancelled now. What running nodes did before (checkpoints, memoized steps) stays in the log, and
        Retry can run the run again from there. A run being cancelled is ended at once too."""

        def attempt() -> None:
            run = self.load(run_id, tenant=tenant)
            if not run.active:
                raise RunStateError(f"run {run_id} already {run.status}; nothing to terminate")
            with self.transaction() as conn:
                node_queue.lock_run_nodes(conn, run_id, tenant)
                dropped = node_queue.terminate_run(conn, run_id)
                events = (
                    [] if run.cancel_requested else [new.run_cancel_requested(run_id=run_id, actor=actor)]
                )
                events += [new.node_cancelled(run_id=run_id, node=n) for n in dropped]
                events.append(new.run_cancelled(run_id=run_id))
                appends = [
                    StreamAppend(ev.run_stream(run_id), events, run.version),
                    *release_key_appends(run),
                ]
                self.store.append_many(appends, tenant=tenant, conn=conn)
            log.info("workflow_terminated", run_id=str(run_id), nodes=dropped, actor=actor)

        self._with_occ(attempt)
        return self.load(run_id, tenant=tenant)

    def pause(
        self,
        run_id: uuid.UUID,
        *,
        interrupt_running: bool = False,
        tenant: str = "default",
        actor: str = "operator",
        parent_run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> RunState:
        """Pause the run: it starts no new node until `resume`. Its running nodes finish (their successors
        wait), or, with `interrupt_running`, stop at their next context call and are handed back, to go on
        from their checkpoints once resumed. Pausing a paused run changes nothing (unless it now interrupts
        nodes the first pause let run). An ended run, or one being cancelled, raises RunStateError. With
        `idempotency_key`, the pause is recorded under it: a repeat does nothing (even after a resume)."""

        def attempt() -> None:
            if self._repeated(idempotency_key, tenant):
                return
            run = self.load(run_id, tenant=tenant)
            if not pausing.pause_needed(run, interrupt=interrupt_running):
                return
            with self.transaction() as conn:
                # Every row of the run first (the order a node's end and a signal take too): see `pause_run`.
                node_queue.lock_run_nodes(conn, run_id, tenant)
                running, held = node_queue.pause_run(conn, run_id, tenant, interrupt=interrupt_running)
                if run.paused and not running:
                    return  # paused already, and nothing left to interrupt
                paused = new.run_paused(
                    run_id=run_id,
                    actor=actor,
                    interrupt_running=interrupt_running,
                    parent_run_id=parent_run_id,
                )
                self.store.append(
                    ev.run_stream(run_id),
                    [paused],
                    expected_version=run.version,
                    idempotency_key=idempotency_key,
                    tenant=tenant,
                    conn=conn,
                )
            log.info(
                "workflow_paused",
                run_id=str(run_id),
                running=running,
                held=held,
                interrupt_running=interrupt_running,
                actor=actor,
            )

        self._with_occ(attempt)
        return self.load(run_id, tenant=tenant)

    def resume(
        self,
        run_id: uuid.UUID,
        *,
        tenant: str = "default",
        actor: str = "operator",
        parent_run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> RunState:
        """Resume a paused run where it was: its ready nodes are claimable again (in their old place), its
        nodes handed back by the pause go on from their checkpoints; completed nodes and memoized steps are
        never run again. Resuming a run that is not paused changes nothing; an ended run raises
        RunStateError. With `idempotency_key`, the resume is recorded under it: a repeat does nothing."""

        def attempt() -> None:
            if self._repeated(idempotency_key, tenant):
                return
            run = self.load(run_id, tenant=tenant)
            if not pausing.resume_needed(run):
                return
            with self.transaction() as conn:
                node_queue.lock_run_nodes(conn, run_id, tenant)
                ready = node_queue.resume_run(conn, run_id)
                resumed = new.run_resumed(
                    run_id=run_id,
                    actor=actor,
                    parent_run_id=parent_run_id,
                )
                self.store.append(
                    ev.run_stream(run_id),
                    [resumed],
                    expected_version=run.version,
                    idempotency_key=idempotency_key,
                    tenant=tenant,
                    conn=conn,
                )
            log.info("workflow_resumed", run_id=str(run_id), ready=ready, actor=actor)

        self._with_occ(attempt)
        return self.load(run_id, tenant=tenant)

    def retry(
        self,
        run_id: uuid.UUID,
        *,
        tenant: str = "default",
        actor: str = "operator",
        idempotency_key: str | None = None,
    ) -> RunState:
        """Run a failed or cancelled run again from its failed nodes; completed nodes are kept, and so are
        the failed nodes' checkpoints and memoized steps. With `idempotency_key`, the retry is recorded
        under it: a repeat (even one that raced the first) does nothing."""

        def attempt() -> None:
            if self._repeated(idempotency_key, tenant):
                return
            run = self.load(run_id, tenant=tenant)
            retrying.check_retryable(run)
            self._refuse_released(run_id, tenant, "retry")
            wf = self.registry.get(run.workflow, run.workflow_version)  # the version it started with
            reset = retry_from_failed(wf, run.statuses)
            retried = new.run_retried(run_id=run_id, nodes=sorted(reset), actor=actor)
            self._reopen(run, wf, retried, reset, tenant, idempotency_key)
            log.info("workflow_retried", run_id=str(run_id), nodes=sorted(reset), actor=actor)

        self._with_occ(attempt)
        return self.load(run_id, tenant=tenant)

    def refresh(
        self, run_id: uuid.UUID, *, input: Any = None, tenant: str = "default", actor: str = "operator"
    ) -> set[str]:
        """Re-run a completed run with new input, only the nodes whose fingerprint or input changed and
        their descendants. Returns the nodes that run again (empty: nothing changed)."""
        self.caps.check_input(input)
        rerun: set[str] = set()

        def attempt() -> None:
            nonlocal rerun
            run = self.load(run_id, tenant=tenant)
            if run.status != "succeeded":
                raise RunStateError(f"run {run_id} is {run.status}; only completed runs can be refreshed")
            self._refuse_released(run_id, tenant, "refresh")
            wf = self.registry.get(run.workflow, run.workflow_version)  # the version it started with
            new_fps = {n: s.fingerprint for n, s in wf.nodes.items()}
            input_fp = fingerprint(input)
            rerun = nodes_to_rerun(wf, run.fingerprints, new_fps, input_fp != run.input_fingerprint)
            if not rerun:
                return
            refreshed = new.run_refreshed(
                run_id=run_id,
                input=input,
                input_fingerprint=input_fp,
                fingerprints=new_fps,
                nodes=sorted(rerun),
                actor=actor,
            )
            self._reopen(run, wf, refreshed, rerun, tenant)
            log.info("workflow_refreshed", run_id=str(run_id), nodes=sorted(rerun), actor=actor)

        self._with_occ(attempt)
        return rerun

    def _reopen(
        self,
        run: RunState,
        wf: Workflow,
        cause: NewEvent,
        reset: set[str],
        tenant: str,
        idempotency_key: str | None = None,
    ) -> None:
        ready = retrying.ready_after_reset(wf, run, reset)
        appends = [
            StreamAppend(
                ev.run_stream(run.run_id),
                [cause, new.nodes_ready(run_id=run.run_id, nodes=ready)],
                run.version,
            )
        ]
        if run.key is not None and not run.active:
            claim = retrying.key_claim(self.store, run, tenant, set())
            if claim is not None:
                appends.append(claim)
        with self.transaction() as conn:
            written = self.store.append_many(
                appends, idempotency_key=idempotency_key, tenant=tenant, conn=conn
            )
            if written.duplicate:  # a repeat under the idempotency key: the first one enqueued the nodes
                return
            retrying.requeue(conn, run, wf, ready, tenant)

    # -- plumbing -------------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, notify: Callable[[], bool] | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A transaction for appends plus queue changes; subscribers are woken after it commits (unless
        `notify` says there is nothing to wake them for)."""
        with self.store.pool.connection() as conn, conn.transaction():
            yield conn
        if notify is None or notify():
            self.store.notify_appended()

    @contextmanager
    def pipelined_transaction(
        self, notify: Callable[[], bool] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """`transaction()`, with its statements sent in a pipeline: two round trips when one result is
        fetched midway (see `node_queue.pipelined_transaction`)."""
        with self.store.pool.connection() as conn, node_queue.pipelined_transaction(conn):
            yield conn
        if notify is None or notify():
            self.store.notify_appended()

    def _refuse_released(self, run_id: uuid.UUID, tenant: str, action: str) -> None:
        """A released run is not in the run tables: reopened, it would run unseen. Its append still names
        the version this check read, so a release that lands in between makes the append fail and the
        check run again."""
        with wrap_exceptions(), self.store.pool.connection() as conn:
            release = release_marks.current_release(conn, run_id, tenant)
        if release is not None:
            raise RunStateError(
                f"run {run_id} was released by retention at {release.released_at.isoformat()}; "
                f"restore it first (`ledgerflow workflows restore {run_id}`), then {action} it"
            )

    def _repeated(self, idempotency_key: str | None, tenant: str) -> bool:
        """Whether an operator action under `idempotency_key` was already recorded: its repeat does
        nothing (whatever the run's state is now, e.g. a retried run that failed again)."""
        return idempotency_key is not None and self.store.idempotency_key_used(idempotency_key, tenant=tenant)

    @staticmethod
    def _with_occ(attempt: Callable[[], None]) -> None:
        for _ in range(_OCC_ATTEMPTS):
            try:
                attempt()
                return
            except WrongExpectedVersionError:
                continue  # the run changed under us: read it again and decide again
        raise ConflictError("the run changed too often to apply the request; retry")


@dataclass(frozen=True)
class WrittenJson:
    """The JSON texts an append sent for its events' data and metadata, in the events' order."""

    data: Sequence[str]
    metadata: Sequence[str]


def advance(
    run: RunState,
    events: Sequence[NewEvent],
    result: AppendResult,
    recorded_at: datetime,
    written: WrittenJson | None = None,
) -> bool:
    """Apply to `run`, in place, the `events` its holder just appended to the run's stream, as the log
    now holds them (`result`: where they landed; `recorded_at`: their transaction's timestamp), so that the
    holder never reads back what it wrote. Only when they directly follow the version `run` knows: True
    then; otherwise `run` is left as it was, and `Engine.catch_up` brings it up to date when needed.
    `written`: the JSON texts of the events' data and metadata as the append sent them, in order, so that
    they are not serialised a second time."""
    stream = ev.run_stream(run.run_id)
    landed = [a for a in result.events if a.stream_id == stream]
    if len(landed) != len(events) or not landed or landed[0].stream_version != run.version + 1:
        return False
    if written is None:
        written = WrittenJson(
            [json_dumps(dict(e.data)) for e in events],
            [json_dumps(dict(e.metadata)) for e in events],
        )
    for pending, at, data, metadata in zip(events, landed, written.data, written.metadata, strict=True):
        apply(
            run,
            RecordedEvent(
                at.position,
                at.transaction_id,
                run.tenant,
                stream,
                at.stream_version,
                pending.event_id,
                pending.type,
                # As a reader would get it back: JSON values, not the Python objects that were written.
                json_loads(data),
                json_loads(metadata),
                pending.correlation_id,
                pending.causation_id,
                recorded_at,
            ),
        )
    return True


@contextmanager
def _savepoint(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    with conn.transaction():
        yield conn
