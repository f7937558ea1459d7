"""`ledgerflow quotas set|clear|list`: a tenant's own quotas, over the settings' defaults.

Every process reads them within `LEDGERFLOW_TENANT_QUOTAS_REFRESH` seconds; see workflows.quotas.
"""

from __future__ import annotations

import click

from ops.cli.common import emit_json, settings_of


@click.group("quotas")
def quotas_group() -> None:
    """Per-tenant quotas: runs in flight, starts and appends per second."""


@quotas_group.command("set")
@click.argument("tenant")
@click.option("--runs-in-flight", type=click.IntRange(min=1), default=None, help="Runs in flight at most.")
@click.option("--starts-per-second", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--appends-per-second", type=click.FloatRange(min=0, min_open=True), default=None)
@click.pass_context
def set_command(
    ctx: click.Context,
    tenant: str,
    runs_in_flight: int | None,
    starts_per_second: float | None,
    appends_per_second: float | None,
) -> None:
    """Give TENANT quotas of its own; an option left out keeps the setting's default for that quota."""
    from eventstore import open_store
    from ops.cli.common import console
    from workflows import Quota, set_tenant_quota

    with open_store(settings_of(ctx)) as store:
        set_tenant_quota(store, tenant, Quota(runs_in_flight, starts_per_second, appends_per_second))
    console.print(f"quotas of tenant {tenant} set", highlight=False)


@quotas_group.command("clear")
@click.argument("tenant")
@click.pass_context
def clear_command(ctx: click.Context, tenant: str) -> None:
    """TENANT goes back to the settings' quotas."""
    from eventstore import open_store
    from ops.cli.common import console
    from workflows import clear_tenant_quota

    with open_store(settings_of(ctx)) as store:
        clear_tenant_quota(store, tenant)
    console.print(f"quotas of tenant {tenant} cleared", highlight=False)


@quotas_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """The tenants with quotas of their own (empty: the setting applies)."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from workflows import tenant_quota_rows

    with open_store(settings_of(ctx)) as store:
        rows = tenant_quota_rows(store)
    if as_json:
        emit_json({tenant: q.__dict__ for tenant, q in rows.items()})
        return
    table = Table("tenant", "runs in flight", "starts/s", "appends/s")
    for tenant, q in sorted(rows.items()):
        table.add_row(
            tenant,
            *(
                str(v) if v is not None else ""
                for v in (q.max_runs_in_flight, q.starts_per_second, q.appends_per_second)
            ),
        )
    console.print(table)
