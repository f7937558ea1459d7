"""Releasing one ended run from the run tables, and restoring it (see `workflows.retention` for the pass).

A run is released by one event in its own stream (`wf.RunReleased`), which the `workflow_tables` and
`workflow_children` projections apply by deleting the run's rows. The log says what the tables hold, so a
replay or rebuild of them leaves a released run out, as the live tables do. `restore_run` appends
`wf.RunRestored`, which the projections apply by folding the run's rows again from its stream: the same
rows as before its release. A released run's stream stays in the log until its partitions are archived;
a run whose events are partly archived is restored once its partitions are (`restore_run` says so).

How long ended runs stay: `Workflow(retention=)`, else the setting LEDGERFLOW_RUN_RETENTION (a duration
such as `30d`, `12h` or ISO 8601 `P30D`; unset: for ever). The check is made where the event is written,
from the run's folded state (never from the tables, which may lag): a run still going, or ended less than
its retention ago, is never released.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import structlog
from pydantic import Field, TypeAdapter, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from eventstore import EventStore, InvalidInputError, NewEvent, StreamAppend, WrongExpectedVersionError
from eventstore.spi import check_tenant
from workflows import events as ev
from workflows import new_events as new
from workflows import release_marks
from workflows.engine import Engine
from workflows.errors import RunStateError, wrap_exceptions
from workflows.release_marks import Release
from workflows.run_state import TERMINAL_RUN, RunState

log = structlog.get_logger("workflows.releases")

#: The most runs one release action of a pass takes unless LEDGERFLOW_RETENTION_BATCH says otherwise.
RETENTION_BATCH = 10_000
#: Seconds between the passes of the retention role unless LEDGERFLOW_RETENTION_INTERVAL says otherwise: a
#: pass with nothing due costs a skip scan per tenant and a count per workflow.
RETENTION_INTERVAL = 600.0
_DURATION = re.compile(r"\s*(\d+)\s*([smhdw]?)\s*")
_UNITS = {"": "seconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_TIMEDELTA = TypeAdapter(timedelta)
#: Attempts at an append whose run changed under it before the answer is "retry".
_ATTEMPTS = 5


def parse_duration(value: object) -> timedelta | None:
    """A retention as written in a setting or on the command line: `30d`, `12h`, `90m`, `45s`, `2w`, ISO
    8601 (`P30D`), a number of seconds, or empty / `forever` (None). Anything else: InvalidInputError."""
    if value is None or isinstance(value, timedelta):
        return value
    text = str(value).strip()
    if text.lower() in ("", "forever", "none"):
        return None
    match = _DURATION.fullmatch(text)
    try:
        duration = (
            timedelta(**{_UNITS[match[2]]: int(match[1])}) if match else _TIMEDELTA.validate_python(text)
        )
    except (ValueError, OverflowError, ValidationError) as exc:
        raise InvalidInputError(f"invalid retention {text!r}: use e.g. 30d, 12h, P30D or forever") from exc
    if duration <= timedelta(0):
        raise InvalidInputError(f"invalid retention {text!r}: a retention is longer than zero")
    return duration


class RetentionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERFLOW_", extra="ignore")

    #: How long ended runs of a workflow without its own retention stay in the run tables (None: for ever).
    run_retention: timedelta | None = None
    #: The most runs one release action of a pass takes (the rest wait for the next pass).
    retention_batch: int = Field(default=RETENTION_BATCH, ge=1, le=1_000_000)
    #: Seconds between the retention passes of `ledgerflow serve`'s retention role (0: no passes but those
    #: asked for, `ledgerflow workflows retention`).
    retention_interval: float = Field(default=RETENTION_INTERVAL, ge=0, le=7 * 86_400)

    @field_validator("run_retention", mode="before")
    @classmethod
    def _duration(cls, value: object) -> timedelta | None:
        try:
            return parse_duration(value)
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from exc


def retention_of(engine: Engine, workflow: str, default: timedelta | None) -> timedelta | None:
    """The retention of `workflow`'s ended runs: its definition's (newest version), else `default`."""
    own = _own_retention(engine, workflow)
    return own if own is not None else default


def _own_retention(engine: Engine, workflow: str) -> timedelta | None:
    return engine.registry.get(workflow).retention if workflow in engine.registry.names() else None


def release_cutoff(
    engine: Engine,
    workflow: str,
    *,
    default: timedelta | None,
    now: datetime,
    ended_before: datetime | None = None,
) -> datetime | None:
    """The latest end a run of `workflow` may have to be released now (None: its runs are kept for ever).
    A workflow's own retention always holds; `ended_before` (a release action's cutoff, recorded when the
    action was) takes the place of the setting's `default`."""
    own = _own_retention(engine, workflow)
    cutoffs = [now - own] if own is not None else []
    if ended_before is not None:
        cutoffs.append(ended_before)
    elif own is None and default is not None:
        cutoffs.append(now - default)
    return min(cutoffs) if cutoffs else None


def is_due(status: str, since: datetime | None, cutoff: datetime | None) -> bool:
    """Whether retention may release a run: it has ended, its runs are not kept for ever, and it ended (or
    was restored) at or before `cutoff`."""
    return status in TERMINAL_RUN and since is not None and cutoff is not None and since <= cutoff


def release_run(
    engine: Engine,
    run_id: uuid.UUID,
    *,
    tenant: str = "default",
    actor: str = "operator",
    default: timedelta | None = None,
    ended_before: datetime | None = None,
    now: datetime | None = None,
    idempotency_key: str | None = None,
) -> Release:
    """Release one ended run whose retention has passed: its workflow's, else `default` (or, for a release
    action, the action's `ended_before` cutoff). A run still going, ended within its retention, or whose
    runs are kept for ever raises RunStateError; a run released already is answered with its release (with
    an `idempotency_key`: RunStateError, unless that key released it)."""
    check_tenant(tenant)
    moment = now if now is not None else datetime.now(UTC)
    for _ in range(_ATTEMPTS):
        if idempotency_key is not None and engine.store.idempotency_key_used(idempotency_key, tenant=tenant):
            break
        run = engine.load(run_id, tenant=tenant)
        with wrap_exceptions(), engine.store.pool.connection() as conn:
            mark = release_marks.last_mark(conn, run_id, tenant)
        if mark is not None and not mark.restored and idempotency_key is None:
            return mark
        marker = release_event(
            engine, run, mark, actor=actor, default=default, ended_before=ended_before, now=moment
        )
        # Written at the version the checks read: a retry or refresh that lands in between (the run goes
        # on) makes this append fail, and the checks run again on the run as it is now.
        try:
            with engine.transaction() as conn:
                engine.store.append(
                    ev.run_stream(run_id),
                    [marker],
                    expected_version=run.version,
                    tenant=tenant,
                    idempotency_key=idempotency_key,
                    conn=conn,
                )
        except WrongExpectedVersionError:
            continue
        log.info("workflow_run_released", run_id=str(run_id), tenant=tenant, actor=actor)
        break
    found = release_of(engine.store, run_id, tenant=tenant)
    if found is None:
        raise RunStateError(f"run {run_id} changed while it was released; run the pass again")
    return found


def release_event(
    engine: Engine,
    run: RunState,
    mark: Release | None,
    *,
    actor: str,
    default: timedelta | None,
    ended_before: datetime | None,
    now: datetime,
) -> NewEvent:
    """The RunReleased event that releases `run` (whose latest release or restore is `mark`) at `now`, to
    be appended at the run's version; RunStateError when it is not to be released: released already, still
    going, within its retention, or kept for ever."""
    if mark is not None and not mark.restored:
        raise RunStateError(f"run {run.run_id} was released already, at {mark.released_at.isoformat()}")
    cutoff = release_cutoff(engine, run.workflow, default=default, now=now, ended_before=ended_before)
    # A restored run stays for another retention from its restore, to be inspected.
    since = max(run.finished_at, mark.released_at) if mark and run.finished_at else run.finished_at
    if not is_due(run.status, since, cutoff):
        raise RunStateError(_why_not(run.run_id, run.status, since, run.workflow, cutoff))
    assert cutoff is not None  # is_due
    return new.run_released(run_id=run.run_id, retention_seconds=(now - cutoff).total_seconds(), actor=actor)


def release_batch(
    engine: Engine,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    *,
    tenant: str,
    actor: str,
    ended_before: datetime,
    now: datetime | None = None,
) -> dict[uuid.UUID, str | None]:
    """Release `runs` (a release action's page, cut off at `ended_before`) in the caller's transaction
    `conn`: each run decided as `release_run` decides (`release_event`), their events in one append, each
    run's stream at the version its state was read at, so a run retried or released meanwhile makes the
    whole append fail (WrongExpectedVersionError) and nothing is written. Returns per run None (released)
    or why it was skipped."""
    moment = now if now is not None else datetime.now(UTC)
    marks = release_marks.last_marks(conn, list(runs), tenant)
    outcome: dict[uuid.UUID, str | None] = {}
    appends: list[StreamAppend] = []
    for run_id in sorted(runs):  # run streams in run order
        run = runs[run_id]
        try:
            marker = release_event(
                engine,
                run,
                marks.get(run_id),
                actor=actor,
                default=None,
                ended_before=ended_before,
                now=moment,
            )
        except RunStateError as exc:
            outcome[run_id] = str(exc)
            continue
        appends.append(StreamAppend(ev.run_stream(run_id), [marker], run.version))
        outcome[run_id] = None
    if appends:
        engine.store.append_many(appends, tenant=tenant, conn=conn)
        log.info("workflow_release_batch", runs=len(appends), tenant=tenant, actor=actor)
    return outcome


def restore_run(
    engine: Engine, run_id: uuid.UUID, *, tenant: str = "default", actor: str = "operator"
) -> None:
    """Bring a released run's rows back, folded from its stream (the projector writes them). A run not
    released raises RunStateError; one whose events are (some or all) in archived partitions raises it
    too, naming what to restore first."""
    check_tenant(tenant)
    for _ in range(_ATTEMPTS):
        with wrap_exceptions(), engine.store.pool.connection() as conn:
            released = release_marks.current_release(conn, run_id, tenant)
            missing = release_marks.events_missing(conn, run_id, tenant)
        # Missing events first: a run whose events all left with archived partitions shows no release
        # either (the release is one of them), nor can it be loaded.
        if missing:
            raise RunStateError(release_marks.archived_events_message(run_id, missing))
        if released is None:
            engine.load(run_id, tenant=tenant)  # a run that does not exist says so
            raise RunStateError(f"run {run_id} is not released; its rows are in the run tables")
        run = engine.load(run_id, tenant=tenant)
        try:
            with engine.transaction() as conn:
                engine.store.append(
                    ev.run_stream(run_id),
                    [new.run_restored(run_id=run_id, actor=actor)],
                    expected_version=run.version,
                    tenant=tenant,
                    conn=conn,
                )
        except WrongExpectedVersionError:
            continue
        log.info("workflow_run_restored", run_id=str(run_id), tenant=tenant, actor=actor)
        return
    raise RunStateError(f"run {run_id} changed too often while it was restored; retry")


def release_of(store: EventStore, run_id: uuid.UUID, *, tenant: str = "default") -> Release | None:
    """The run's release, if retention let it go and it was not restored since (None otherwise)."""
    check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn:
        return release_marks.current_release(conn, run_id, tenant)


def _why_not(
    run_id: uuid.UUID, status: str, since: datetime | None, workflow: str, cutoff: datetime | None
) -> str:
    if status not in TERMINAL_RUN or since is None:
        return f"run {run_id} is {status}; only ended runs are released"
    if cutoff is None:
        return f"workflow {workflow!r} keeps its runs for ever; run {run_id} stays"
    return (
        f"run {run_id} ended (or was restored) at {since.isoformat()}, within its retention "
        f"(only runs ended by {cutoff.isoformat()} are released now)"
    )
