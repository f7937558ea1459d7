"""Operator actions on runs: cancel, terminate, pause, resume, retry and refresh.

Each reads the run, decides, and appends with optimistic concurrency on the run stream's version, its
queue rows changed in the same transaction; a run changed meanwhile is read again and decided again
(`EngineCore._with_occ`). Under an idempotency key an action is recorded once: a repeat does nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog

from eventstore import NewEvent, StreamAppend
from workflows import cancelling, pausing, queue_run_changes, retrying
from workflows import events as ev
from workflows import new_events as new
from workflows.cancelling import release_key_appends
from workflows.definition import Workflow
from workflows.engine_core import EngineCore
from workflows.errors import RunStateError
from workflows.run_starts import fingerprint
from workflows.run_state import RunState
from workflows.scheduler import nodes_to_rerun, retry_from_failed

log = structlog.get_logger(__name__)


class OperatorActions(EngineCore):
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
                running, dropped = queue_run_changes.cancel_run(conn, run_id)
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
                queue_run_changes.lock_run_nodes(conn, run_id, tenant)
                dropped = queue_run_changes.terminate_run(conn, run_id)
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
                queue_run_changes.lock_run_nodes(conn, run_id, tenant)
                running, held = queue_run_changes.pause_run(conn, run_id, tenant, interrupt=interrupt_running)
                if run.paused and not running:
                    return  # paused already, and nothing left to interrupt
                paused = new.run_paused(
                    run_id=run_id,
                    actor=actor,
                    interrupt_running=interrupt_running,
                    parent_run_id=parent_run_id,
                )
                self._record_action(conn, run, paused, idempotency_key=idempotency_key)
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
                queue_run_changes.lock_run_nodes(conn, run_id, tenant)
                ready = queue_run_changes.resume_run(conn, run_id)
                resumed = new.run_resumed(
                    run_id=run_id,
                    actor=actor,
                    parent_run_id=parent_run_id,
                )
                self._record_action(conn, run, resumed, idempotency_key=idempotency_key)
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
