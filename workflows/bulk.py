"""Bulk operator actions: cancel, retry, pause or resume every run a search filter keeps, as a recorded
action.

An action is a row of ledgerflow.bulk_actions (who, when, the filter, the tenant, the kind, how many runs
matched, its counts and the keyset position of the last run it processed). It walks the tenant's runs
that the filter keeps, newest first, by keyset (`workflows.run_search`), from the newest run matched when
it was recorded downwards, so runs started later are not its business. Each run is acted on under an
idempotency key made of the action's id and the run's id, so a resumed action (after a crash, or run by
two processes) never acts on a run twice: a run whose key is already recorded counts as done. One
process works an action's page at a time: a transaction lock taken in the transaction that counts the page
(or one run), on that transaction's connection, so that working a page never holds a second connection
(the lock's) beside the one working it. A process that finds the lock taken, or finds that another process
counted the page it worked, leaves the action to that process (`_Busy`).

Every kind works a page at a time instead (`_batch`, with the kind's entry of `BATCHES`:
`workflows.cancelling`, `workflows.retrying`, `workflows.pausing`, `workflows.releases`): the page's queue
rows (one statement), its runs' events (one append, each run's stream at the version it was read at) and
the action's progress in one transaction, so a resumed action meets none of a committed page again and
all of an uncommitted one. A page is counted once even when two processes work the action in turns (the
lock is held for a page's transaction only): the progress counts it only while the action's position is
above it, and the page of the one refused is rolled back. A page whose runs changed after they
were read is read again (`_BATCH_ATTEMPTS` times), then worked one run at a time (`KINDS`), as is a page
the kind cannot take as one (BatchUnfit).

Kinds are the entries of `KINDS` (and of `BATCHES` for a page at a time): a new kind is one function and
one entry.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Literal, NoReturn

import psycopg
import structlog
from psycopg.types.json import Jsonb

from eventstore import (
    EventStore,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    NotFoundError,
    WrongExpectedVersionError,
)
from eventstore.spi import check_tenant, fetch_all, fetch_one, fetch_value, load_queries
from workflows import releases
from workflows.cancelling import cancel_batch
from workflows.engine import Engine
from workflows.errors import BatchUnfit, RunStateError, wrap_exceptions
from workflows.pausing import pause_batch, resume_batch
from workflows.retrying import retry_batch
from workflows.run_search import MAX_PAGE, RunFilter, cursor_at, search_runs
from workflows.run_state import RunState

log = structlog.get_logger("workflows.bulk")
Q = load_queries("workflows", "bulk.sql")

#: The most runs one action takes unless the caller (the `bulk_max_runs` setting) says otherwise.
MAX_BULK_RUNS = 10_000
#: Runs read per page of the walk.
_PAGE = 200
#: Tries of a page (each reading its runs afresh) before it is worked one run at a time.
_BATCH_ATTEMPTS = 3

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


def _cancel_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    _: RunFilter,
) -> Outcome:
    return cancel_batch(engine.store, conn, runs, tenant=tenant, actor=actor)


def _retry_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    _: RunFilter,
) -> Outcome:
    return retry_batch(engine.store, engine.registry, conn, runs, tenant=tenant, actor=actor)


def _pause_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    _: RunFilter,
) -> Outcome:
    return pause_batch(engine.store, conn, runs, tenant=tenant, actor=actor)


def _resume_many(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    tenant: str,
    actor: str,
    _: RunFilter,
) -> Outcome:
    return resume_batch(engine.store, conn, runs, tenant=tenant, actor=actor)


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
    "cancel": _cancel_many,
    "retry": _retry_many,
    "pause": _pause_many,
    "resume": _resume_many,
    "release": _release_many,
}

KINDS: Mapping[str, Act] = {
    "cancel": _cancel,
    "retry": _retry,
    "pause": _pause,
    "resume": _resume,
    "release": _release,
}


class BulkLimitError(InvalidInputError):
    """More runs match than one bulk action may take; nothing was recorded. The HTTP API answers 422."""

    code = "bulk_limit"

    def __init__(self, matched: int, limit: int) -> None:
        self.matched, self.limit = matched, limit
        super().__init__(
            f"more than {limit} runs match (at least {matched}); one bulk action takes at most {limit} "
            "(setting LEDGERFLOW_BULK_MAX_RUNS): narrow the filter, e.g. by start time, and act in parts"
        )

    def details(self) -> dict[str, Any]:
        return {"matched_at_least": self.matched, "limit": self.limit, "setting": "LEDGERFLOW_BULK_MAX_RUNS"}


@dataclass(frozen=True)
class BulkAction:
    """A bulk action's record and progress (a row of ledgerflow.bulk_actions)."""

    id: uuid.UUID
    tenant: str
    kind: str
    actor: str
    #: The filter as JSON (`filter_to_json`).
    filter: dict[str, Any]
    #: running, completed or failed.
    state: str
    matched: int
    max_runs: int
    done: int
    failed: int
    skipped: int
    last_run_id: uuid.UUID | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.skipped


@dataclass(frozen=True)
class BulkPlan:
    """What a dry run answers: how many runs an action with this filter would touch."""

    kind: str
    tenant: str
    matched: int
    #: The most one action takes; `matched` stops counting one past it.
    limit: int

    @property
    def over_limit(self) -> bool:
        return self.matched > self.limit


def filter_to_json(wanted: RunFilter) -> dict[str, Any]:
    """The filter as JSON (times in ISO 8601, ids as text), as the action's record keeps it."""
    value: dict[str, Any] = json.loads(json.dumps(asdict(wanted), default=str))
    return value


def filter_from_json(value: Mapping[str, Any]) -> RunFilter:
    known = {f.name for f in fields(RunFilter)}
    unknown = set(value) - known
    if unknown:
        raise InvalidInputError(f"unknown filter fields {sorted(unknown)}: use {', '.join(sorted(known))}")
    given: dict[str, Any] = dict(value)
    try:
        for name in ("started_after", "started_before", "ended_after", "ended_before"):
            if given.get(name) is not None:
                given[name] = datetime.fromisoformat(given[name])
        if given.get("parent") is not None:
            given["parent"] = uuid.UUID(str(given["parent"]))
        given["statuses"] = tuple(given.get("statuses") or ())
        given["tags"] = tuple((str(k), str(v)) for k, v in given.get("tags") or ())
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"invalid bulk filter: {exc}") from exc
    return RunFilter(**given)


def plan_bulk(
    store: EventStore, *, kind: str, tenant: str, filter: RunFilter, limit: int = MAX_BULK_RUNS
) -> BulkPlan:
    """A dry run: how many of the tenant's runs `filter` keeps (counted up to one past `limit`)."""
    _check(kind, tenant, limit)
    matched, _ = _count(store, tenant, filter, limit)
    return BulkPlan(kind, tenant, matched, limit)


def create_bulk_action(
    store: EventStore,
    *,
    kind: str,
    tenant: str,
    filter: RunFilter,
    actor: str,
    limit: int = MAX_BULK_RUNS,
    cap: bool = False,
) -> BulkAction:
    """Record an action over the runs `filter` keeps now; `run_bulk_action` works it. More than `limit`
    matching runs raise BulkLimitError and record nothing, unless `cap`: then the action takes the newest
    `limit` of them (a retention pass leaves the rest to the next)."""
    _check(kind, tenant, limit)
    matched, top = _count(store, tenant, filter, limit)
    if matched > limit:
        if not cap:
            raise BulkLimitError(matched, limit)
        matched = limit
    params = {
        "id": uuid.uuid4(),
        "tenant": tenant,
        "kind": kind,
        "actor": actor,
        "filter": Jsonb(filter_to_json(filter)),
        "matched": matched,
        "max_runs": limit,
        "top_created_at": top[0] if top else None,
        "top_run_id": top[1] if top else None,
    }
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, _action_row, Q["insert"], params)
    assert row is not None
    action = row.action
    log.info("bulk_action_recorded", bulk_id=str(action.id), kind=kind, tenant=tenant, matched=matched)
    return action


def bulk_action(store: EventStore, action_id: uuid.UUID, *, tenant: str) -> BulkAction:
    """An action's record and progress; another tenant's action is not found."""
    return _row(store, action_id, tenant).action


def unfinished_bulk_actions(store: EventStore, *, idle_seconds: float, limit: int = 100) -> list[BulkAction]:
    """Running actions of every tenant that nothing has advanced for `idle_seconds` (a server administrator's
    view, for the process that resumes them): oldest first, at most `limit`."""
    params = {"idle_seconds": idle_seconds, "limit": limit}
    with wrap_exceptions(), store.pool.connection() as conn:
        return [row.action for row in fetch_all(conn, _action_row, Q["unfinished"], params)]


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
        return _work(engine, _row(store, action_id, tenant), progress)
    except _Busy:
        log.info("bulk_action_busy", bulk_id=str(action_id))
        return bulk_action(store, action_id, tenant=tenant)


def _work(engine: Engine, row: _ActionRow, progress: Callable[[BulkAction], None] | None) -> BulkAction:
    store, tenant, action_id = engine.store, row.action.tenant, row.action.id
    if row.action.state != "running":  # ended already: nothing to work
        return row.action
    act, wanted, actor = KINDS[row.action.kind], filter_from_json(row.action.filter), f"bulk:{action_id}"
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
        many = BATCHES.get(row.action.kind)
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
    engine: Engine, many: ActMany, row: _ActionRow, batch: list[tuple[datetime, uuid.UUID]], actor: str
) -> _ActionRow | None:
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
    engine: Engine, many: ActMany, row: _ActionRow, batch: list[tuple[datetime, uuid.UUID]], actor: str
) -> _ActionRow | Literal[False] | None:
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
            counted = fetch_one(conn, _action_row, Q["progress"], params)
            if counted is None:
                raise _NotCounted  # rolls the page back: it was counted already, or the action ended
    except _NotCounted:
        _counted_elsewhere(store, action_id, tenant, len(batch))
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


def _counted_elsewhere(store: EventStore, action_id: uuid.UUID, tenant: str, runs: int) -> NoReturn:
    """When the action's progress refused to count `runs` runs: another process working the action
    counted them first (the page this one worked is rolled back; its runs were acted on once, by the
    other), and this one leaves the action to it (`_Busy`); or the action ended meanwhile (NotFoundError)."""
    row = _row(store, action_id, tenant)
    if row.action.state != "running":
        raise NotFoundError(f"bulk action {action_id} is no longer running")
    log.warning("bulk_action_counted_elsewhere", bulk_id=str(action_id), runs=runs)
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
) -> _ActionRow:
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
        row = fetch_one(conn, _action_row, Q["progress"], params)
    if row is None:
        _counted_elsewhere(store, action_id, tenant, 1)
    return row


def _finish(
    store: EventStore, action_id: uuid.UUID, tenant: str, state: str, error: str | None
) -> BulkAction:
    params = {"id": action_id, "tenant": tenant, "state": state, "error": error}
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, _action_row, Q["finish"], params)
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


def _count(
    store: EventStore, tenant: str, wanted: RunFilter, limit: int
) -> tuple[int, tuple[datetime, uuid.UUID] | None]:
    """How many runs `wanted` keeps, counted up to one past `limit`, and the newest of them."""
    matched, top, after = 0, None, None
    while matched <= limit:
        page = search_runs(store, tenant=tenant, filter=wanted, limit=MAX_PAGE, after=after)
        if top is None and page.runs:
            top = (page.runs[0]["created_at"], page.runs[0]["run_id"])
        matched += len(page.runs)
        if page.next is None:
            break
        after = page.next
    return min(matched, limit + 1), top


def _check(kind: str, tenant: str, limit: int) -> None:
    check_tenant(tenant)
    if kind not in KINDS:
        raise InvalidInputError(f"unknown bulk action {kind!r}: use {', '.join(sorted(KINDS))}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError("a bulk action's limit is a count of at least 1")


def _row(store: EventStore, action_id: uuid.UUID, tenant: str) -> _ActionRow:
    check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, _action_row, Q["get"], {"id": action_id, "tenant": tenant})
    if row is None:
        raise NotFoundError(
            f"no bulk action {action_id} for tenant {tenant!r}; an action is read by the tenant that made it"
        )
    return row


@dataclass(frozen=True, slots=True)
class _ActionRow:
    """A row of ledgerflow.bulk_actions: the action's record, and where its work stands (the newest run it
    may act on, and the creation time of the last run it counted, with `action.last_run_id`)."""

    action: BulkAction
    top_created_at: datetime | None
    top_run_id: uuid.UUID | None
    last_created_at: datetime | None


def _action_row(
    *,
    top_created_at: datetime | None,
    top_run_id: uuid.UUID | None,
    last_created_at: datetime | None,
    **columns: Any,
) -> _ActionRow:
    """Each of the table's other columns is a field of `BulkAction`: a column added without one fails here."""
    return _ActionRow(BulkAction(**columns), top_created_at, top_run_id, last_created_at)
