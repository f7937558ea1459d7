"""`ledgerflow workflows bulk KIND [filters]`: an operator action over every run the `list` filters keep
(cancel, retry, pause, resume: one command per kind of `workflows.BULK_KINDS`), recorded, with a dry run
and progress; `bulk show ID` and `bulk continue ID` (work an action that stopped, e.g. with its process
killed). An action under way waits out a restart of the database (up to LEDGERFLOW_OUTAGE_WAIT) and goes
on where it stopped."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from eventstore import DatabaseUnavailableError, EventStore, InvalidInputError, open_store
from eventstore.spi import Outage, through_outages
from ops.cli.bulk_reports import print_action, print_progress
from ops.cli.common import console, emit_json, settings_of
from ops.cli.run_args import registry_of
from ops.cli.run_search import filter_options, run_filter
from workflows import (
    BULK_KINDS,
    BulkAction,
    Engine,
    bulk_action,
    create_bulk_action,
    plan_bulk,
    run_bulk_action,
)

if TYPE_CHECKING:
    from ops.settings import Settings

T = TypeVar("T")


@click.group("bulk")
def bulk_group() -> None:
    """Act on every run a filter keeps (the filters of `workflows list`), as one recorded action."""


def _kind_command(kind: str) -> click.Command:
    @click.command(kind)
    @filter_options
    @click.option("--dry-run", is_flag=True, help="Only say how many runs the action would touch.")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
    @click.option("--json", "as_json", is_flag=True, help="The action's record as one JSON object.")
    @click.pass_context
    def command(ctx: click.Context, /, dry_run: bool, yes: bool, as_json: bool, **filters: Any) -> None:
        tenant = filters.pop("tenant")
        wanted = run_filter(**filters)
        settings = settings_of(ctx)
        limit = settings.bulk_max_runs
        with open_store(settings) as store:
            plan = plan_bulk(store, kind=kind, tenant=tenant, filter=wanted, limit=limit)
            if dry_run:
                if as_json:
                    emit_json({**dataclasses.asdict(plan), "over_limit": plan.over_limit})
                    return
                count = f"more than {limit}" if plan.over_limit else str(plan.matched)
                console.print(f"{kind} would touch {count} runs of tenant {tenant!r} (dry run: nothing done)")
                if plan.over_limit:
                    console.print(f"one action takes at most {limit} (LEDGERFLOW_BULK_MAX_RUNS)")
                return
            if not yes and plan.matched and not plan.over_limit:
                click.confirm(f"{kind} {plan.matched} runs of tenant {tenant!r}?", abort=True, err=True)
            action = create_bulk_action(
                store, kind=kind, tenant=tenant, filter=wanted, actor="cli", limit=limit
            )
            click.echo(f"bulk action {action.id}: {kind} of {action.matched} runs", err=True)
            ended = _work(Engine(store, registry_of(settings)), action, settings)
        print_action(ended, as_json)

    command.help = (
        f"{kind.capitalize()} every run the filters keep, as one recorded action (see `bulk show`); "
        f"it asks first unless --yes, and --dry-run only counts."
    )
    return command


@bulk_group.command("show")
@click.argument("action_id")
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx: click.Context, action_id: str, tenant: str, as_json: bool) -> None:
    """A bulk action's record and progress."""
    with open_store(settings_of(ctx)) as store:
        action = bulk_action(store, _action_id(action_id), tenant=tenant)
    print_action(action, as_json, exit_on_failure=False)


@bulk_group.command("continue")
@click.argument("action_id")
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def continue_action(ctx: click.Context, action_id: str, tenant: str, as_json: bool) -> None:
    """Work a bulk action that stopped (its process was killed) from where it stopped; a run it already
    acted on is not acted on again."""
    settings = settings_of(ctx)
    with open_store(settings) as store:
        action = bulk_action(store, _action_id(action_id), tenant=tenant)
        ended = _work(Engine(store, registry_of(settings)), action, settings)
    print_action(ended, as_json)


def _work(engine: Engine, action: BulkAction, settings: Settings) -> BulkAction:
    """Work the action to its end, with progress on stderr, waiting out an outage of the database."""
    last = [action]

    def progress(now: BulkAction) -> None:
        last[0] = now
        print_progress(now)

    def stopped() -> str:
        return (
            f"bulk action {action.id} stopped at {last[0].processed}/{action.matched} runs: run "
            f"`ledgerflow workflows bulk continue {action.id}` once it answers (an API server, `ledgerflow "
            "serve`, takes it up by itself); no run is acted on twice"
        )

    return through_outages_said(
        engine.store,
        settings,
        lambda: run_bulk_action(engine, action.id, tenant=action.tenant, progress=progress),
        what=f"bulk action {action.id}",
        stopped=stopped,
    )


def through_outages_said(
    store: EventStore, settings: Settings, work: Callable[[], T], *, what: str, stopped: Callable[[], str]
) -> T:
    """`work()`, work that resumes from what it recorded (a bulk action, a retention pass), waiting out
    an outage of the database for up to LEDGERFLOW_OUTAGE_WAIT seconds and saying so on stderr. Past that
    it says `stopped()` (where the work stopped, how to carry on) and raises the outage's error: exit 1,
    with the error's own lines."""
    wait = settings.outage_wait

    def waiting(exc: DatabaseUnavailableError) -> None:
        click.echo(
            f"the database is unavailable ({_reason(exc)}): {what} waits for it, up to {wait:g}s "
            "(LEDGERFLOW_OUTAGE_WAIT), and goes on where it stopped; no run is acted on twice",
            err=True,
        )

    def resumed(seconds: float) -> None:
        click.echo(f"the database answers again after {seconds:.1f}s: {what} goes on", err=True)

    outage = Outage(command=what)
    try:
        return through_outages(
            work, store.pool, outage, threading.Event(), patience=wait, waiting=waiting, resumed=resumed
        )
    except DatabaseUnavailableError:
        click.echo(f"the database stayed unavailable for {wait:g}s: {stopped()}", err=True)
        raise


def _reason(exc: DatabaseUnavailableError) -> str:
    """The driver's reason, in a line: why the connection failed."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _action_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not a bulk action id (a UUID)") from None


for _kind in BULK_KINDS:
    bulk_group.add_command(_kind_command(_kind))
