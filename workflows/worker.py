"""Workflow workers: claim runnable nodes, run them in a thread pool, keep their leases alive.

Any number of workers, in any number of processes or hosts, share the queue. A worker's name is stable
across restarts (hostname by default; give each worker on a host its own `--name`): on start-up it takes
back, at once, the nodes its previous process held, instead of waiting for their leases to lapse.
On stop it claims nothing more, lets running nodes reach their next context call, and hands them back
so another worker resumes them at once.

Node leases are renewed, and the claim loop woken, by the keepalive that projector workers use too
(`eventstore.keepalive`). A worker never ends because of the database: an outage is logged once and
waited out with back-off. A node interrupted by an outage (its own writes, or the recording of its end,
could not reach the database) is not counted as a failed attempt: once the database answers, the node
is recorded as it ended if its lease still holds, or handed back to be run again.
"""

from __future__ import annotations

import copy
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import structlog
from opentelemetry import trace

from eventstore import ConflictError, NotFoundError
from eventstore.spi import (
    Beat,
    Keepalive,
    Outage,
    OutageState,
    bounded_once_stopping,
    bounded_waits,
    end_frozen_sessions,
    is_unavailable,
    span_if_traced,
    wait_until_available,
)
from workflows import limits, metrics, node_queue, versions
from workflows.aio import Body, Kinds, NodeLoop, StartedTogether, is_async, run_in_thread
from workflows.context import NodeContext
from workflows.debounce import DebounceKeeper
from workflows.definition import NodeSpec, WorkflowRegistry
from workflows.engine import Engine
from workflows.errors import (
    ContinueAsNew,
    NodeLeaseLost,
    NodeSuspended,
    RunCancelled,
    WorkerStopping,
    wrap_exceptions,
)
from workflows.interrupts import InterruptBackoff
from workflows.lifecycle import Lifecycle, record_appended
from workflows.node_queue import Claim, Claimant
from workflows.presence import Presence
from workflows.quotas import TenantQuotas
from workflows.recovery import take_back
from workflows.run_state import RunState
from workflows.schedules import ScheduleKeeper
from workflows.triggers import TriggerConsumer

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("ledgerflow.workflows")
T = TypeVar("T")


class _DatabaseGone(Exception):
    """The database stayed unavailable until the worker stopped; the node's lease lapses and recovery
    takes it back."""


class _EmptyClaims:
    """Spacing of claims that keep finding nothing. Every append anywhere wakes the claim loop (one
    notification channel for all events), so a worker with free slots would claim again after each of the
    other workers' node ends, finding nothing while they drain the queue: a transaction each time, for
    nothing. After each empty claim in a row the next one waits a little longer (2 ms, doubling up to
    20 ms); a claim that finds work resets the spacing, and a first claim after a quiet spell is never
    delayed."""

    def __init__(self, first: float = 0.002, longest: float = 0.02) -> None:
        self._first = first
        self._longest = longest
        self._spacing = 0.0
        self._last = 0.0

    def wait(self, stopping: threading.Event) -> None:
        pause = self._last + self._spacing - time.monotonic()
        if pause > 0:
            stopping.wait(pause)

    def record(self, found: bool) -> None:
        self._last = time.monotonic()
        self._spacing = 0.0 if found else min(max(self._spacing * 2, self._first), self._longest)


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 4
    lease_ttl: float = 10.0
    heartbeat_interval: float = 2.0
    recovery: bool = True
    recovery_interval: float = 2.0
    poll_interval: float = 0.5
    #: On stop, how long running nodes get to reach a context call before their leases are handed back.
    shutdown_grace: float = 10.0
    #: On stop, how long the steps that need the database (a last heartbeat, handing nodes back) may wait
    #: for it past the grace; skipped after that: the leases lapse by themselves, and peers take over.
    shutdown_database_timeout: float = 3.0
    #: `async def` nodes run at once on the worker's event loop, apart from the `concurrency` threads.
    async_concurrency: int = 100
    #: Threads that make the database calls of `async def` nodes, so the event loop never waits for one.
    async_io_threads: int = 4


class WorkflowWorker:
    def __init__(
        self,
        engine: Engine,
        registry: WorkflowRegistry,
        settings: WorkerSettings | None = None,
        *,
        name: str | None = None,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.engine = engine
        #: The tenants' quotas a debounced burst's run is admitted under when it fires (None: none).
        self.quotas = quotas
        self.registry = registry
        self.settings = settings or WorkerSettings()
        self.name = name or socket.gethostname()
        self.instance = uuid.uuid4().hex[:12]
        self.lifecycle = Lifecycle(engine, quotas=quotas)
        self.stopping = threading.Event()
        self.outage = Outage(worker=self.id, role="workflow_worker")
        self._wake = threading.Event()
        self._running: dict[int, tuple[Claim, NodeContext | None]] = {}
        #: Tokens of nodes whose end is being recorded: their rows may be gone before they leave _running.
        self._ending: set[int] = set()
        self._lock = threading.Lock()
        #: Held while claiming and starting, by the claim loop and by recovery alike (see `_take_back`).
        self._claiming = threading.Lock()
        self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="ledgerflow-node")
        self._loop = NodeLoop(io_threads=self.settings.async_io_threads)
        #: Tokens of the nodes in _running that run (or are about to run) on the event loop.
        self._on_loop: set[int] = set()
        self._kinds = Kinds.of(registry)
        self._empty_claims = _EmptyClaims()
        #: Pushes claims back after nodes were interrupted by the database (see workflows.interrupts).
        self._interrupts = InterruptBackoff()
        self._claimant = Claimant(
            self.name,
            self.instance,
            self.id,
            self.settings.lease_ttl,
            workflows=tuple(registry.name_versions()),
        )
        # A session the database holds for this process: peers see at once when a crash closes it and
        # take its nodes back without waiting for their leases to lapse (see workflows.presence).
        self.presence = Presence(
            engine.store.url,
            worker_name=self.name,
            instance=self.instance,
            on_orphans=lambda: self._periodic_recovery("presence"),
        )

    @property
    def id(self) -> str:
        return f"{self.name}/{self.instance}"

    @staticmethod
    def dedicated_connections(registry: WorkflowRegistry, settings: WorkerSettings) -> dict[str, int]:
        """The connections a worker opens beside its store's pool, by purpose: everything else (node
        threads, claims, heartbeats, recovery, schedules, `async def` nodes' database calls) shares the
        pool, and no thread holds one pooled connection while it waits for another."""
        wanted = {"listener": 1, "notifier": 1}
        if settings.recovery:
            wanted["presence"] = 1  # and, for a moment when it registers, a second one to check it
        # The projector worker of the trigger projections and of the children's (workflows.children).
        wanted["trigger_listener"] = 1
        return wanted

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Work until `stop()`. Whether the database answers or not, the stop ends within the grace plus
        the database's allowance: from the stop on, no step waits longer than that allowance for a pooled
        connection (a database that answers hands one out in milliseconds; one that is away would keep
        each step waiting the pool's timeout)."""
        seconds = self.settings.shutdown_database_timeout
        with bounded_once_stopping(self.engine.store.pool, self.stopping, seconds):
            self._run()

    def _run(self) -> None:
        log.info("workflow_worker_started", worker=self.id, workflows=self.registry.names())
        self._start_threads()
        with self.engine.transaction() as conn:  # before the first claim: its limits are the ones enforced
            limits.declare(conn, self.registry, worker=self.id)
            versions.advertise(conn, self.instance, self.registry.name_versions())  # for doctor
        if self.settings.recovery:
            self.presence.start()  # before the first claim: no node of this process without its presence
            self.recover("startup")
        beats = [Beat("workflow_heartbeat", self.settings.heartbeat_interval, self.heartbeat)]
        if self.settings.recovery:
            beats.append(Beat("workflow_recovery", self.settings.recovery_interval, self._periodic_recovery))
        keepalive = Keepalive(
            self.engine.store.url,
            self._wake,
            self.outage,
            beats,
            application_name="ledgerflow-workflow-listener",
            make_room=self.engine.store.shed_idle_connections,
        )
        keepalive.start()
        # Runs started by events of the log, by schedules and by debounced bursts: each in its own thread,
        # shared with peers.
        starts: list[TriggerConsumer | ScheduleKeeper | DebounceKeeper] = [
            TriggerConsumer(
                self.engine,
                self.registry,
                worker_id=self.id,
                lease_ttl=self.settings.lease_ttl,
                outage=self.outage,
            ),
            ScheduleKeeper(self.engine, self.registry, worker_id=self.id),
            DebounceKeeper(
                self.engine, self.registry.names(), worker_id=self.id, quotas=self.quotas, outage=self.outage
            ),
        ]
        for s in starts:
            s.start()
        try:
            while not self.stopping.is_set():
                if self.outage.failing() and not self._wait_for_database():
                    break
                if not self.claim_and_start():
                    self._wake.wait(self._idle_wait())
                    self._wake.clear()
        finally:
            began = time.monotonic()
            self.stopping.set()  # before the starts stop: nothing new is claimed meanwhile
            for s in starts:
                s.stop(timeout=self.settings.shutdown_database_timeout)
            self._shutdown()
            keepalive.stop()
            if self.settings.recovery:
                self.presence.stop()  # after the hand-back: a clean stop is not read as a crash
            log.info("workflow_worker_stop_took", worker=self.id, seconds=round(time.monotonic() - began, 3))

    def _start_threads(self) -> None:
        """Start every node thread now, before any node is claimed. The pool would otherwise start one per
        node as nodes come, and starting a thread waits until it runs: after a restart, among hundreds of
        node threads already busy, that wait cost about a switch interval (5 ms) per node, seconds for a
        thousand taken back at once. Idle threads cost a stack each and no CPU."""
        started = threading.Barrier(self.settings.concurrency + 1)
        for _ in range(self.settings.concurrency):
            self._pool.submit(started.wait, 30)  # each waits for the others: no thread is reused
        started.wait(30)

    def _idle_wait(self) -> float:
        """How long to wait for work when there is none: the poll interval, or less when a waiting node of
        this worker's workflows (a timer, a signal wait's timeout, a retry) comes due sooner, so that it
        wakes on time rather than up to a poll interval late. (Appends wake the worker anyway.)"""
        poll = self.settings.poll_interval
        if not self._budgets():  # no room, in its threads or on its event loop
            return poll
        try:
            with self.engine.store.pool.connection() as conn:
                due = node_queue.seconds_to_next_due(conn, self.registry.names(), within=poll)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self.outage.failed(exc)
            return poll
        return poll if due is None else min(poll, max(due, 0.0))

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def database_state(self) -> OutageState:
        """Whether this worker is waiting for the database, for health reports."""
        return self.outage.snapshot()

    def _wait_for_database(self) -> bool:
        return wait_until_available(self.engine.store.pool, self.outage, self.stopping)

    def _through_outage(self, fn: Callable[[], T]) -> T:
        """`fn()`, tried again after each outage until it gets through; _DatabaseGone if the worker
        stops first."""
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.outage.failed(exc)
            if not self._wait_for_database():
                raise _DatabaseGone

    def claim_and_start(self) -> bool:
        """Claim as many nodes as there are free slots and start them; True if any was claimed."""
        if not self._budgets() or self.stopping.is_set():
            return False
        self._empty_claims.wait(self.stopping)
        self._interrupts.wait(self.stopping)
        if self.stopping.is_set():
            return False
        try:
            with self._claiming:
                claims = self._claim(budgets=self._budgets())
                self._empty_claims.record(bool(claims))
                self._start_claimed(claims)
        except Exception as exc:
            if is_unavailable(exc):
                self.outage.failed(exc)  # the loop waits for the database before claiming again
            elif isinstance(exc, ConflictError):
                # Expected contention with other workers (a run changed under the claim): claim again.
                log.debug("workflow_claim_conflict", error=str(exc))
            else:
                log.exception("workflow_claim_failed", error=str(exc))
                self.stopping.wait(self.settings.poll_interval)
            return False
        return bool(claims)

    def _start_claimed(self, claims: list[Claim]) -> None:
        """Start nodes claimed for this worker, their runs' states read in one query per tenant."""
        if not claims:
            return
        try:
            states = self._load_claimed(claims)
        except Exception as exc:
            if is_unavailable(exc):
                self.outage.failed(exc)
            else:
                log.warning("workflow_claimed_runs_not_loaded", error=str(exc))
            states = {}  # each node loads its own
        # Their bodies all start before any of their ends is recorded (see StartedTogether).
        together = StartedTogether(len(claims)) if len(claims) > 1 else None
        for claim, state in zip(claims, self._own_copies(claims, states), strict=True):
            self._start(claim, state, together)

    def _budgets(self) -> list[tuple[list[str], int]]:
        """What to claim now, for the free threads and the free places on the event loop."""
        with self._lock:
            on_loop = len(self._on_loop)
            in_threads = len(self._running) - on_loop
        return self._kinds.budgets(
            self.settings.concurrency - in_threads, self.settings.async_concurrency - on_loop
        )

    def _claim(self, limit: int = 0, *, budgets: list[tuple[list[str], int]] | None = None) -> list[Claim]:
        """Claim up to `limit` ready nodes of any of the worker's workflows, or, with `budgets`, up to so
        many of each group of workflows; one statement per group."""
        if budgets is None:
            budgets = [(self.registry.names(), limit)]
        store = self.engine.store
        claims: list[Claim] = []
        # One statement per group, in autocommit: the claim and its NodeClaimed events (see `claim` in
        # queries.sql), one round trip, one transaction.
        with wrap_exceptions(), store.pool.connection() as conn:
            for workflows, group_limit in budgets:
                began = time.perf_counter()
                got, appended = node_queue.claim_later(
                    conn,
                    worker_name=self.name,
                    instance=self.instance,
                    worker_id=self.id,
                    # Every version it has of each: a run goes on with the version it started with.
                    workflows=[(n, v) for n in workflows for v in self.registry.versions(n)],
                    limit=group_limit,
                    ttl=self.settings.lease_ttl,
                )()
                record_appended(store, got, appended, began)
                claims += got
        # No wake-up when nothing was claimed: this worker's own listener would take it and claim
        # again at once, spinning on empty claims.
        if claims:
            store.notify_appended()
            metrics.nodes_claimed.add(len(claims))
        return claims

    # -- running one node ----------------------------------------------------------------------------

    def _load_claimed(self, claims: list[Claim]) -> dict[uuid.UUID, RunState]:
        """The claimed runs' states, one query per tenant rather than one per node (after a restart a
        worker may claim a thousand nodes at once)."""
        by_tenant: dict[str, list[uuid.UUID]] = {}
        for c in claims:
            by_tenant.setdefault(c.tenant, []).append(c.run_id)
        states: dict[uuid.UUID, RunState] = {}
        for tenant, run_ids in by_tenant.items():
            states.update(self.engine.load_many(run_ids, tenant=tenant))
        return states

    @staticmethod
    def _own_copies(claims: list[Claim], states: dict[uuid.UUID, RunState]) -> list[RunState | None]:
        """Each claimed node's own copy of its run's state: every node's thread advances its copy with
        what it writes, so two nodes of one run never share one."""
        seen: set[uuid.UUID] = set()
        copies: list[RunState | None] = []
        for c in claims:
            state = states.get(c.run_id)
            copies.append(copy.deepcopy(state) if state is not None and c.run_id in seen else state)
            seen.add(c.run_id)
        return copies

    def _track(self, claim: Claim) -> bool:
        """Count a claimed node as running (heartbeats cover it from now on), in a thread or on the event
        loop; True if it is an `async def` node, for the loop. A node this worker does not know goes to a
        thread, and fails there as it always did."""
        try:
            spec = self.registry.get(claim.workflow, claim.version).nodes.get(claim.node)
        except NotFoundError:
            spec = None
        on_loop = spec is not None and is_async(spec.fn)
        with self._lock:
            self._running[claim.token] = (claim, None)
            if on_loop:
                self._on_loop.add(claim.token)
        return on_loop

    def _start(self, claim: Claim, run: RunState | None, together: StartedTogether | None = None) -> None:
        """Run a claimed node: an `async def` one on the event loop, any other in a thread of the pool.
        `together`: the nodes started with it, whose ends wait until all their bodies were entered (an
        `async def` body never waits: it counts as entered at once)."""
        if self._track(claim):
            if together is not None:
                together.entered()
            self._loop.submit(lambda: self._execute_async(claim, run))
        else:
            self._pool.submit(self._execute, claim, run, together)

    def _execute(
        self, claim: Claim, run: RunState | None = None, together: StartedTogether | None = None
    ) -> None:
        """Run the claimed node, then, as long as finishing one hands this worker another (its successor,
        or, when it finished the run, a ready node of another run), that one. A run's state is read once,
        when the worker starts on it: each end advances it with the events it recorded."""
        next_claim: Claim | None = claim
        while next_claim is not None:
            next_claim, run = run_in_thread(self._node_steps(next_claim, run), together=together)
            together = None  # the nodes it goes on with were not started with the others
            if next_claim is not None and self._track(next_claim):
                self._start(next_claim, run)  # to the event loop; this thread is free
                return

    async def _execute_async(self, claim: Claim, run: RunState | None = None) -> None:
        """`_execute` for `async def` nodes, on the event loop."""
        next_claim: Claim | None = claim
        while next_claim is not None:
            next_claim, run = await self._loop.run(self._node_steps(next_claim, run))
            if next_claim is not None and not self._track(next_claim):
                self._start(next_claim, run)  # to a thread of the pool
                return

    def _node_steps(
        self, claim: Claim, loaded: RunState | None = None
    ) -> Generator[Body, object, tuple[Claim | None, RunState | None]]:
        """Everything around one node's body, which it yields to its driver (workflows/aio.py) and gets
        back as the body's output or exception. Returns the successor this worker claimed at its end,
        with the run's state."""
        successor: Claim | None = None
        run = loaded
        bound = structlog.contextvars.bound_contextvars(
            run_id=str(claim.run_id), node=claim.node, attempt=claim.attempt, worker=self.id
        )
        started = time.monotonic()
        outcome = "succeeded"
        span = span_if_traced(
            _tracer,
            "ledgerflow.node",
            lambda: {
                "ledgerflow.run_id": str(claim.run_id),
                "ledgerflow.node": claim.node,
                "ledgerflow.workflow": claim.workflow,
                "ledgerflow.attempt": claim.attempt,
            },
        )
        with bound, span as current:
            try:
                wf = self.registry.get(claim.workflow, claim.version)
                if claim.cancel_requested:
                    outcome = "cancelled"
                    self._mark_ending(claim)
                    self._through_outage(lambda: self.lifecycle.cancelled(claim, wf, run=run))
                    return None, None
                if run is None:
                    run = self._through_outage(lambda: self.engine.load(claim.run_id, tenant=claim.tenant))
                held = run
                spec = wf.nodes[claim.node]
                ctx = NodeContext(self.engine, held, claim, spec, worker=self.id, stopping=self.stopping)
                with self._lock:
                    self._running[claim.token] = (claim, ctx)
                try:
                    output = yield Body(spec.fn, ctx, claim.token)
                    ctx.check()
                    # An output that cannot be recorded is the node's failure, not the worker's crash. A
                    # None output is no output: the state holds nothing for it (workflows.run_state).
                    in_state = held.held_bytes if output is not None else 0
                    self.engine.caps.check_output(f"output of node {claim.node!r}", output, in_state)
                except (NodeLeaseLost, RunCancelled, WorkerStopping):
                    raise
                except NodeSuspended as suspended:
                    # The node waits for a timer or a signal: its row becomes due when the wait ends, and
                    # this thread is free for other nodes meanwhile.
                    outcome = "waiting"
                    self._mark_ending(claim)
                    wait = suspended
                    self._through_outage(lambda: self.lifecycle.suspend(claim, wf, wait, run=held))
                    return None, None
                except ContinueAsNew as continuing:
                    # The run ends and its successor starts, together (see Lifecycle.continued).
                    outcome = "continued"
                    self._mark_ending(claim)
                    signal, took = continuing, time.monotonic() - started
                    self._through_outage(lambda: self.lifecycle.continued(claim, wf, signal, took, run=held))
                    self._interrupts.progressed()
                    return None, None
                except Exception as exc:
                    if is_unavailable(exc):
                        outcome = self._interrupted(claim, exc)
                        return None, None
                    self._mark_ending(claim)
                    try:
                        outcome = "retry" if self.lifecycle.failed(claim, wf, exc, run=held) else "failed"
                    except Exception as recording:
                        if not is_unavailable(recording):
                            raise
                        # The failure cannot be recorded: most likely the outage made the node fail.
                        outcome = self._interrupted(claim, recording)
                        return None, None
                    self._interrupts.progressed()
                    if outcome == "retry":
                        metrics.node_retries.add(1, {"workflow": wf.name, "node": claim.node})
                    return None, None
                duration = time.monotonic() - started
                self._mark_ending(claim)
                successor = self._through_outage(
                    lambda: self.lifecycle.succeeded(
                        claim,
                        wf,
                        output,
                        duration,
                        claim_next=self._claimant if self._may_take_successor(spec) else None,
                        run=held,
                    )
                )
                self._interrupts.progressed()
                if successor is not None:
                    self._track(successor)
                    metrics.nodes_claimed.add(1)
            except NodeLeaseLost:
                outcome = "lease_lost"
                log.warning("workflow_node_lease_lost")
            except RunCancelled:
                outcome = "cancelled"
                self._mark_ending(claim)
                # The run's copy may be behind by what the node wrote: the end reads what it misses.
                wf_then = self.registry.get(claim.workflow, claim.version)
                self._through_outage(lambda: self.lifecycle.cancelled(claim, wf_then, run=run))
            except WorkerStopping:
                outcome = "released"
                try:
                    self.lifecycle.release(claim, self.id)
                    log.info("workflow_node_released")
                except Exception as exc:
                    if not is_unavailable(exc):
                        raise
                    self.outage.failed(exc)  # the lease lapses and recovery takes it back
            except _DatabaseGone:
                outcome = "database_unavailable"  # the lease lapses and recovery takes it back
            except Exception as exc:
                outcome = "error"
                if is_unavailable(exc):
                    self.outage.failed(exc)  # the lease lapses and recovery takes it back
                else:
                    log.exception("workflow_node_crashed")  # the lease lapses and recovery takes it back
            finally:
                with self._lock:
                    self._running.pop(claim.token, None)
                    self._ending.discard(claim.token)
                    self._on_loop.discard(claim.token)
                elapsed_ms = (time.monotonic() - started) * 1000
                current.set_attribute("ledgerflow.outcome", outcome)
                metrics.nodes_finished.add(1, {"outcome": outcome})
                metrics.node_duration.record(elapsed_ms, {"workflow": claim.workflow, "node": claim.node})
                if successor is None:
                    self._wake.set()  # a slot is free, and other nodes may be ready now
        if successor is not None and run is not None and successor.run_id != run.run_id:
            # Another run: read by the statement that claimed it, else when its node starts.
            return successor, successor.loaded
        return successor, run

    def _may_take_successor(self, spec: NodeSpec) -> bool:
        """Whether a node's end may claim the next node for this worker: not when it stops, nor when the
        next node could be of the other kind (sync or `async def`) and that kind has no room."""
        if self.stopping.is_set():
            return False
        with self._lock:
            on_loop = len(self._on_loop)
            in_threads = len(self._running) - on_loop
        if is_async(spec.fn):
            return in_threads < self.settings.concurrency or not self._kinds.threaded
        return on_loop < self.settings.async_concurrency or not self._kinds.any_async

    def _mark_ending(self, claim: Claim) -> None:
        with self._lock:
            self._ending.add(claim.token)

    def _interrupted(self, claim: Claim, exc: BaseException) -> str:
        """The database went away under a running node: once it answers, hand the node back so it runs
        again (in this worker or another), without counting a failed attempt. Its memoized steps and
        checkpoints are kept."""
        self.outage.failed(exc)
        self._through_outage(lambda: self.lifecycle.release(claim, self.id))
        log.info("workflow_node_interrupted", error=str(exc))
        self._interrupts.interrupted(exc)
        return "interrupted"

    # -- leases and recovery --------------------------------------------------------------------------

    def heartbeat(self, timeout: float | None = None) -> None:
        """Renew the leases of the running nodes; `timeout`: the longest wait for a connection."""
        with self._lock:
            tokens = list(self._running)
        if not tokens:
            return
        with self.engine.store.pool.connection(timeout=timeout) as conn:
            alive = node_queue.heartbeat(conn, self.instance, tokens, self.settings.lease_ttl)
        with self._lock:
            still_running = set(self._running) - self._ending
        # A node that finished meanwhile has no queue row to renew: only running ones count as lost. (One
        # whose end is being recorded finds out at its fence, and says so, if its lease was really lost.)
        for token in (set(tokens) - alive) & still_running:
            log.warning("workflow_lease_lost", token=token)
            # An `async def` body stops at once, at whatever it awaits: it must not go on working.
            self._loop.interrupt(token, NodeLeaseLost(f"the lease of claim {token} was lost"))

    def recover(self, trigger: str = "periodic") -> None:
        try:
            if trigger == "periodic":
                # Here, every recovery interval, not in the heartbeat (the shutdown loop beats every 50 ms).
                with self.engine.store.pool.connection() as conn:
                    end_frozen_sessions(conn, self.settings.lease_ttl)
            self._take_back(trigger)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self.outage.failed(exc)

    def _take_back(self, trigger: str) -> None:
        """Sweep, claiming for this worker as many of the nodes taken back as it has room for, in the
        sweep's own statements, and starting each batch as it commits: a restarted worker, or one taking
        a dead peer over, runs them without a claim of its own (the rest are ready for any worker).
        Under the claim lock: the claim loop and the recovery threads never both fill the same room."""
        with self._claiming:
            budgets = [] if self.stopping.is_set() else self._budgets()
            # One kind of room: the threads' (or the event loop's, when every workflow is `async def`).
            # Nodes of the other kind taken back are ready, and the claim loop takes them at once.
            workflows, slots = budgets[0] if budgets else ([], 0)
            take_back(
                self.engine,
                self.registry,
                self._claimant,
                slots=slots,
                workflows=[(n, v) for n in workflows for v in self.registry.versions(n)],
                trigger=trigger,
                start=self._start_claimed,
            )

    def _periodic_recovery(self, trigger: str = "periodic") -> None:
        self.recover(trigger)
        self._wake.set()

    def _shutdown(self) -> None:
        """Stop claiming; give running nodes the grace period to reach a context call (which raises
        WorkerStopping and hands them back); hand back whatever is still running after it."""
        self.stopping.set()
        deadline = time.monotonic() + self.settings.shutdown_grace
        while self._running and time.monotonic() < deadline:
            try:
                # Never past the grace, and never for longer than the database's allowance.
                wait = min(self.settings.shutdown_database_timeout, max(deadline - time.monotonic(), 0.05))
                self.heartbeat(timeout=wait)
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.outage.failed(exc)
            self._wake.wait(0.05)
            self._wake.clear()
        # Async bodies still running stop where they are and hand their nodes back themselves.
        self._loop.interrupt_all(lambda: WorkerStopping(f"worker {self.id} stopped after its grace period"))
        with self._lock:
            leftover = [claim for claim, _ in self._running.values()]
        with bounded_waits(self.engine.store.pool, self.settings.shutdown_database_timeout):
            for claim in leftover:
                try:
                    self.lifecycle.release(claim, self.id)
                except Exception as exc:
                    if not is_unavailable(exc):
                        raise
                    # Its lease lapses by itself; a peer (or this worker's next start) takes it back.
                    log.warning("workflow_node_not_released", run_id=str(claim.run_id), node=claim.node)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.stop(timeout=self.settings.shutdown_grace)
        log.info("workflow_worker_stopped", worker=self.id, released=len(leftover))
