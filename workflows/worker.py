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

The worker is built in layers (see workflows.worker_state): running claimed nodes (`node_runs`), claiming
them (`node_claims`), and here its loop, the leases of its nodes, recovery and its stop.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import structlog

from eventstore.spi import (
    Beat,
    Keepalive,
    Outage,
    OutageState,
    bounded_once_stopping,
    bounded_waits,
    end_frozen_sessions,
    is_unavailable,
)
from workflows import limits, queue_claims, versions
from workflows.aio import Kinds, NodeLoop
from workflows.debounce import DebounceKeeper
from workflows.engine import Engine
from workflows.errors import NodeLeaseLost, WorkerStopping
from workflows.interrupts import InterruptBackoff
from workflows.lifecycle import Lifecycle
from workflows.node_claims import EmptyClaims, NodeClaims
from workflows.presence import Presence
from workflows.queue_claims import Claimant
from workflows.quotas import TenantQuotas
from workflows.recovery import take_back
from workflows.schedules import ScheduleKeeper
from workflows.triggers import TriggerConsumer
from workflows.worker_settings import WorkerSettings
from workflows.workflow_registry import WorkflowRegistry

log = structlog.get_logger(__name__)


class WorkflowWorker(NodeClaims):
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
        self.quotas = quotas
        self.registry = registry
        self.settings = settings or WorkerSettings()
        self.name = name or socket.gethostname()
        self.instance = uuid.uuid4().hex[:12]
        self.lifecycle = Lifecycle(engine, quotas=quotas)
        self.stopping = threading.Event()
        self.outage = Outage(worker=self.id, role="workflow_worker")
        # Each field is declared, with what it holds, in WorkerState (workflows.worker_state).
        self._wake = threading.Event()
        self._running = {}
        self._ending = set()
        self._lock = threading.Lock()
        self._claiming = threading.Lock()
        self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="ledgerflow-node")
        self._loop = NodeLoop(io_threads=self.settings.async_io_threads)
        self._on_loop = set()
        self._kinds = Kinds.of(registry)
        self._empty_claims = EmptyClaims()
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
                due = queue_claims.seconds_to_next_due(conn, self.registry.names(), within=poll)
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

    # -- leases and recovery --------------------------------------------------------------------------

    def heartbeat(self, timeout: float | None = None) -> None:
        """Renew the leases of the running nodes; `timeout`: the longest wait for a connection."""
        with self._lock:
            tokens = list(self._running)
        if not tokens:
            return
        with self.engine.store.pool.connection(timeout=timeout) as conn:
            alive = queue_claims.heartbeat(conn, self.instance, tokens, self.settings.lease_ttl)
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
