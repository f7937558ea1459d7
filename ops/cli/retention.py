"""`ledgerflow workflows retention [--dry-run]`: release a tenant's ended runs older than their workflow's
retention, as recorded bulk actions; `ledgerflow workflows restore RUN`: bring a released run back into
the run tables for inspection (see workflows.releases)."""

from __future__ import annotations

import dataclasses
import uuid

import click

from ops.cli.common import emit_json, settings_of
from ops.cli.run_args import registry_of


@click.command("retention")
@click.option("--tenant", default="default", show_default=True)
@click.option("--dry-run", is_flag=True, help="Only say how many runs of each workflow are due.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array: the plans, or the actions worked.")
@click.pass_context
def retention(ctx: click.Context, tenant: str, dry_run: bool, as_json: bool) -> None:
    """Release the tenant's ended runs older than their workflow's retention (`Workflow(retention=)`, else
    LEDGERFLOW_RUN_RETENTION; unset: runs are kept for ever) from the run tables, as recorded bulk actions
    (see `workflows bulk show`), at most LEDGERFLOW_RETENTION_BATCH runs per workflow a pass. A pass first
    finishes what a killed pass left, and waits out a restart of the database (LEDGERFLOW_OUTAGE_WAIT).
    Released runs are still found by id and can be restored."""
    from eventstore import open_store
    from ops.cli.bulk import through_outages_said
    from ops.cli.bulk_reports import print_action, print_progress
    from ops.cli.common import console
    from workflows import BulkAction, Engine, RetentionSettings, plan_retention, retention_pass

    settings = settings_of(ctx)
    kept = RetentionSettings()
    with open_store(settings) as store:
        engine = Engine(store, registry_of(settings))
        if dry_run:
            plans = plan_retention(engine, tenant=tenant, settings=kept)
            if as_json:
                emit_json(
                    [{**dataclasses.asdict(p), "retention": p.retention.total_seconds()} for p in plans]
                )
                return
            for p in plans:
                due = f"more than {p.limit}" if p.due > p.limit else str(p.due)
                console.print(f"{p.workflow}: {due} runs ended over {p.retention} ago", highlight=False)
            console.print(f"dry run: nothing released (tenant {tenant!r})", highlight=False)
            return
        # A pass the database's outage stopped is run again once it answers, and first finishes the
        # actions it left: each action is reported once, as it ended, in the order the passes ended them
        # (one another process finished meanwhile, as last seen).
        ended: dict[uuid.UUID, BulkAction] = {}
        seen: dict[uuid.UUID, BulkAction] = {}

        def progress(action: BulkAction) -> None:
            seen[action.id] = action
            print_progress(action)

        def one_pass() -> None:
            for action in retention_pass(engine, tenant=tenant, settings=kept, progress=progress):
                ended[action.id] = action

        through_outages_said(
            store,
            settings,
            one_pass,
            what="the retention pass",
            stopped=lambda: (
                "the next pass (`ledgerflow workflows retention`, or the retention role of "
                "`ledgerflow serve`) finishes what it left; no run is released twice"
            ),
        )
        actions = [*ended.values(), *(a for i, a in seen.items() if i not in ended)]
    if as_json:
        emit_json([dataclasses.asdict(a) for a in actions])
        return
    for action in actions:
        print_action(action, False, exit_on_failure=False)
    if not actions:
        console.print(f"no run of tenant {tenant!r} is due for release", highlight=False)
    if any(a.failed for a in actions):
        raise SystemExit(1)


@click.command("restore")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def restore(ctx: click.Context, run_id: str, tenant: str) -> None:
    """Bring a run that retention released back into the run tables, equal to what it was (folded again
    from its stream by the projector). It stays for another retention from now."""
    from eventstore import InvalidInputError, open_store
    from ops.cli.common import console
    from workflows import Engine, restore_run

    settings = settings_of(ctx)
    try:
        wanted = uuid.UUID(run_id)
    except ValueError:
        raise InvalidInputError(f"{run_id!r} is not a run id (a UUID)") from None
    with open_store(settings) as store:
        restore_run(Engine(store, registry_of(settings)), wanted, tenant=tenant, actor="cli")
    console.print(
        f"run {wanted} restored: its rows are back once the projector has applied it", highlight=False
    )
