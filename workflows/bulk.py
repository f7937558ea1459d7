"""Working a bulk action (`workflows.bulk_records`): cancel, retry, pause, resume or release every run its
filter kept, from where it stopped.

It walks the tenant's runs that the filter keeps, newest first, by keyset (`workflows.run_search`), from
the newest run matched when it was recorded downwards, so runs started later are not its business. Each
run is acted on under an idempotency key made of the action's id and the run's id, so a resumed action
(after a crash, or run by two processes) never acts on a run twice: a run whose key is already recorded
counts as done. One process works an action's page at a time: a transaction lock taken in the
transaction that counts the page (or one run), on that transaction's connection, so that working a page
never holds a second connection (the lock's) beside the one working it. A process that finds the lock
taken, or finds that another process counted the page it worked, leaves the action to that process
(`_Busy`).

Every kind works a page at a time instead (`_batch`, with the kind's entry of `bulk_kinds.BATCHES`:
`workflows.cancelling`, `workflows.retrying`, `workflows.pausing`, `workflows.releases`): the page's queue
rows (one statement), its runs' events (one append, each run's stream at the version it was read at) and
the action's progress in one transaction, so a resumed action meets none of a committed page again and
all of an uncommitted one. A page is counted once even when two processes work the action in turns (the
lock is held for a page's transaction only): the progress counts it only while the action's position is
above it, and the page of the one refused is rolled back. A page whose runs changed after they
were read is read again (`_BATCH_ATTEMPTS` times), then worked one run at a time (`bulk_kinds.KINDS`), as
is a page the kind cannot take as one (BatchUnfit).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, NoReturn

import psycopg
import structlog

from eventstore import (
    EventStore,
    IdempotencyConflictError,
    LedgerflowError,
    WrongExpectedVersionError,
)
from eventstore.spi import fetch_one, fetch_value, load_queries
from workflows import bulk_kinds
from workflows.bulk_kinds import Act, ActMany
from workflows.bulk_records import (
    ActionRow,
    BulkAction,
    action_row,
    bulk_action,
    filter_from_json,
    read_action_row,
)
from workflows.engine import Engine
from workflows.errors import BatchUnfit, RunStateError, wrap_exceptions
from workflows.run_search import RunFilter, cursor_at, search_runs

log = structlog.get_logger("workflows.bulk")

Q = load_queries("workflows", "bulk.sql")

#: Runs read per page of the walk.
_PAGE = 200

#: Tries of a page (each reading its runs afresh) before it is worked one run at a time.
_BATCH_ATTEMPTS = 3


def run_bulk_action(
    engine: Engine,
    action_id: uuid.UUID,
    *,
    tenant: str,
    progress: Callable[[BulkAction], None] | None = None,
) -> BulkAction:
    """Work the action to its end, from where it stopped; `progress` hears of it after every page.
    While another process works it, this returns its record as it stands (state `running`)."""
    store = engine.store
    try:
        return _work(engine, read_action_row(store, action_id, tenant), progress)
    except _Busy:
        log.info("bulk_action_busy", bulk_id=str(action_id))
        return bulk_action(store, action_id, tenant=tenant)


def _work(engine: Engine, row: ActionRow, progress: Callable[[BulkAction], None] | None) -> BulkAction:
    store, tenant, action_id = engine.store, row.action.tenant, row.action.id
    if row.action.state != "running":  # ended already: nothing to work
        return row.action
    act, wanted, actor = (
        bulk_kinds.KINDS[row.action.kind],
        filter_from_json(row.action.filter),
        f"bulk:{action_id}",
    )
    top = (row.top_created_at, row.top_run_id)
    processed = row.action.done + row.action.failed + row.action.skipped
    after = (
        cursor_at(tenant, wanted, row.last_created_at, row.action.last_run_id)
        if row.last_created_at is not None and row.action.last_run_id is not None
        else None
    )
    while top[1] is not None and processed < row.action.max_runs:
        page = search_runs(store, tenant=tenant, filter=wanted, limit=_PAGE, after=after)
        # Its runs on this page: none started after the action was recorded, at most `max_runs` in all.
        batch = [(r["created_at"], r["run_id"]) for r in page.runs if (r["created_at"], r["run_id"]) <= top]
        batch = batch[: row.action.max_runs - processed]
        many = bulk_kinds.BATCHES.get(row.action.kind)
        counted = _batch(engine, many, row, batch, actor) if many is not None and batch else None
        if counted is not None:
            row = counted
        else:  # another kind, or a run of the batch changed meanwhile: one run at a time
            for position in batch:
                outcome, error = _act_once(engine, act, position[1], tenant, actor, action_id, wanted)
                row = _progress(store, action_id, tenant, position, outcome, error)
        processed += len(batch)
        if progress is not None:
            progress(row.action)
        if page.next is None:
            break
        after = page.next
    return _finish(store, action_id, tenant, "completed", None)


def _batch(
    engine: Engine, many: ActMany, row: ActionRow, batch: list[tuple[datetime, uuid.UUID]], actor: str
) -> ActionRow | None:
    """Act on a page's runs in one transaction (`many`, the kind's entry of BATCHES), which also counts
    them: a crash before it commits leaves the whole batch to the resumed action, one after it none. Runs
    already acted on under their key (by a one-run pass of this action before a crash) count as done, as
    `_act_once` counts them. None, and nothing written, when runs kept changing since they were read, or
    the kind cannot take the page as one: the caller then takes the batch one run at a time, as one-run
    actions decide afresh."""
    for _ in range(_BATCH_ATTEMPTS):
        counted = _batch_once(engine, many, row, batch, actor)
        if counted is not False:
            return counted
    log.info("bulk_action_batch_changed", bulk_id=str(row.action.id), runs=len(batch))
    return None


def _batch_once(
    engine: Engine, many: ActMany, row: ActionRow, batch: list[tuple[datetime, uuid.UUID]], actor: str
) -> ActionRow | Literal[False] | None:
    """One try of `_batch`: False when a run changed after it was read (nothing was written)."""
    store, tenant, action_id = engine.store, row.action.tenant, row.action.id
    keys = {run_id: f"bulk:{action_id}:{run_id}" for _, run_id in batch}
    used = store.idempotency_keys_used(list(keys.values()), tenant=tenant)
    pending = [run_id for run_id, key in keys.items() if key not in used]
    runs = engine.load_many(pending, tenant=tenant)
    if len(runs) != len(pending):
        return None  # a run is gone (not found): the one-run path says so per run
    try:
        with wrap_exceptions(), engine.transaction() as conn:
            _lock_page(conn, action_id)
            outcome = many(engine, conn, runs, tenant, actor, filter_from_json(row.action.filter))
            skipped = [why for why in outcome.values() if why is not None]
            params = {
                "id": action_id,
                "tenant": tenant,
                "done": len(batch) - len(skipped),
                "failed": 0,
                "skipped": len(skipped),
                "created_at": batch[-1][0],
                "run_id": batch[-1][1],
                "first_created_at": batch[0][0],
                "first_run_id": batch[0][1],
                "error": None,
            }
            counted = fetch_one(conn, action_row, Q["progress"], params)
            if counted is None:
                raise _NotCounted  # rolls the page back: it was counted already, or the action ended
    except _NotCounted:
        _counted_elsewhere(action_id, len(batch))
    except WrongExpectedVersionError:
        return False  # a run changed after it was read (a node's claim or end, say): read again
    except BatchUnfit as exc:
        log.info("bulk_action_batch_unfit", bulk_id=str(action_id), runs=len(batch), why=str(exc))
        return None
    return counted


class _NotCounted(Exception):
    """The action's progress refused a page's or a run's count (see `_counted_elsewhere`)."""


class _Busy(Exception):
    """Another process works the action: this one leaves it to that one (`run_bulk_action`)."""


def _lock_page(conn: psycopg.Connection[Any], action_id: uuid.UUID) -> None:
    """Take the action's page lock in the connection's transaction (`_Busy` when another process holds
    it): on the page's own connection, so a page never needs two at once."""
    if not fetch_value(conn, Q["try_lock"], {"id": action_id}):
        raise _Busy


def _counted_elsewhere(action_id: uuid.UUID, runs: int) -> NoReturn:
    """When the action's progress refused to count `runs` runs: another process working the action
    counted them first (the page this one worked is rolled back; its runs were acted on once, by the
    other), or counted the rest and ended it. Either way this one leaves the action to it (`_Busy`), and
    `run_bulk_action` returns the record as it stands: still running, or ended by the other."""
    log.info("bulk_action_counted_elsewhere", bulk_id=str(action_id), runs=runs)
    raise _Busy


def _act_once(
    engine: Engine,
    act: Act,
    run_id: uuid.UUID,
    tenant: str,
    actor: str,
    action_id: uuid.UUID,
    wanted: RunFilter,
) -> tuple[str, str | None]:
    # A run acted on before a crash, before its outcome was counted, is met again: the kind's repeat under
    # the same key does nothing, and the run counts as done.
    key = f"bulk:{action_id}:{run_id}"
    try:
        act(engine, run_id, tenant, actor, key, wanted)
    except IdempotencyConflictError:
        return "done", None  # another worker of this action recorded it first
    except RunStateError as exc:
        return "skipped", str(exc)
    except LedgerflowError as exc:
        log.warning("bulk_action_run_failed", bulk_id=str(action_id), run_id=str(run_id), error=str(exc))
        return "failed", f"run {run_id}: {exc}"
    return "done", None


def _progress(
    store: EventStore,
    action_id: uuid.UUID,
    tenant: str,
    position: tuple[datetime, uuid.UUID],
    outcome: str,
    error: str | None,
) -> ActionRow:
    params = {
        "id": action_id,
        "tenant": tenant,
        "done": int(outcome == "done"),
        "failed": int(outcome == "failed"),
        "skipped": int(outcome == "skipped"),
        "created_at": position[0],
        "run_id": position[1],
        "first_created_at": position[0],
        "first_run_id": position[1],
        "error": error if outcome == "failed" else None,
    }
    with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
        _lock_page(conn, action_id)
        row = fetch_one(conn, action_row, Q["progress"], params)
    if row is None:
        _counted_elsewhere(action_id, 1)
    return row


def _finish(
    store: EventStore, action_id: uuid.UUID, tenant: str, state: str, error: str | None
) -> BulkAction:
    params = {"id": action_id, "tenant": tenant, "state": state, "error": error}
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, action_row, Q["finish"], params)
    action = row.action if row is not None else bulk_action(store, action_id, tenant=tenant)
    log.info(
        "bulk_action_ended",
        bulk_id=str(action_id),
        state=action.state,
        done=action.done,
        failed=action.failed,
        skipped=action.skipped,
    )
    return action
