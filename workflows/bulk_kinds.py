"""The kinds of bulk action (cancel, retry, pause, resume, release): how each acts on one run (`KINDS`)
and on a page of runs in one transaction (`BATCHES`). A new kind is one function and one entry in each;
apart from the walk that works an action (`workflows.bulk`), which knows no kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import psycopg

from eventstore import EventStore
from workflows import releases
from workflows.cancelling import cancel_batch
from workflows.engine import Engine
from workflows.errors import BatchUnfit, RunStateError
from workflows.pausing import pause_batch, resume_batch
from workflows.retrying import retry_batch
from workflows.run_search import RunFilter
from workflows.run_state import RunState

#: How a kind acts on one run: (engine, run id, tenant, actor, idempotency key, the action's filter). It
#: raises RunStateError when the run is not in a state the kind applies to (the run is skipped).
Act = Callable[[Engine, uuid.UUID, str, str, str, RunFilter], object]

#: Per run of a page: None (acted on, or nothing to do) or why it was skipped.
Outcome = dict[uuid.UUID, str | None]


def _cancel(engine: Engine, run_id: uuid.UUID, tenant: str, actor: str, key: str, _: RunFilter) -> object:
    return engine.cancel(run_id, tenant=tenant, actor=actor, idempotency_key=key)


def _retry(engine: Engine, run_id: uuid.UUID, tenant: str, actor: str, key: str, _: RunFilter) -> object:
    return engine.retry(run_id, tenant=tenant, actor=actor, idempotency_key=key)


def _release(
    engine: Engine, run_id: uuid.UUID, tenant: str, actor: str, key: str, wanted: RunFilter
) -> object:
    # Whether the run is due is decided again here, from its stream: ended at or before the action's
    # cutoff (its filter's end bound, recorded with it), and never within its workflow's own retention.
    if wanted.ended_before is None:
        raise RunStateError("a release action names the latest end of its runs (ended_before)")
    return releases.release_run(
        engine, run_id, tenant=tenant, actor=actor, ended_before=wanted.ended_before, idempotency_key=key
    )


def _pause(engine: Engine, run_id: uuid.UUID, tenant: str, actor: str, key: str, _: RunFilter) -> object:
    # Running nodes finish (the operator's default for one run too); a paused run stays as it is.
    return engine.pause(run_id, tenant=tenant, actor=actor, idempotency_key=key)


def _resume(engine: Engine, run_id: uuid.UUID, tenant: str, actor: str, key: str, _: RunFilter) -> object:
    return engine.resume(run_id, tenant=tenant, actor=actor, idempotency_key=key)


#: How a kind acts on a page of runs in the caller's transaction: (engine, connection, the runs as read,
#: tenant, actor, the action's filter) -> per run None (acted on, or nothing to do) or why it was skipped.
#: It raises WrongExpectedVersionError when a run changed after it was read, BatchUnfit when the page must
#: be worked one run at a time; either way having written nothing.
ActMany = Callable[
    [Engine, psycopg.Connection[Any], Mapping[uuid.UUID, RunState], str, str, RunFilter], Outcome
]


class _PageOfRuns(Protocol):
    """A kind's action on a page that needs only the store (cancel, pause, resume)."""

    def __call__(
        self,
        store: EventStore,
        conn: psycopg.Connection[Any],
        runs: Mapping[uuid.UUID, RunState],
        *,
        tenant: str,
        actor: str,
    ) -> Outcome: ...


def _of_store(act: _PageOfRuns) -> ActMany:
    def act_many(
        engine: Engine,
        conn: psycopg.Connection[Any],
        runs: Mapping[uuid.UUID, RunState],
        tenant: str,
        actor: str,
        _: RunFilter,
    ) -> Outcome:
        return act(engine.store, conn, runs, tenant=tenant, actor=actor)

    return act_many


def _retry_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    _: RunFilter,
) -> Outcome:
    return retry_batch(engine.store, engine.registry, conn, runs, tenant=tenant, actor=actor)


def _release_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    wanted: RunFilter,
) -> Outcome:
    if wanted.ended_before is None:
        raise BatchUnfit("a release action names the latest end of its runs (ended_before)")
    return releases.release_batch(
        engine, conn, runs, tenant=tenant, actor=actor, ended_before=wanted.ended_before
    )


BATCHES: Mapping[str, ActMany] = {
    "cancel": _of_store(cancel_batch),
    "retry": _retry_many,
    "pause": _of_store(pause_batch),
    "resume": _of_store(resume_batch),
    "release": _release_many,
}


KINDS: Mapping[str, Act] = {
    "cancel": _cancel,
    "retry": _retry,
    "pause": _pause,
    "resume": _resume,
    "release": _release,
}
