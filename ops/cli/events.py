"""`ledgerflow events ...`: the declared event types, their versions and upcasters, and how many events
of each type and version the log holds."""

from __future__ import annotations

from typing import Any

import click

from ops.cli.common import emit_json, settings_of


@click.group("events")
def events_group() -> None:
    """Event types: versions, upcasters and counts."""


@events_group.command("types")
@click.option("--tenant", default=None, help="Count only this tenant's events (default: every tenant's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def types_command(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """List event types: declared versions and upcasters (from LEDGERFLOW_EVENT_TYPES), and the events
    per type and stored version, from the event_type_catalogue projection (never a count of the log)."""
    from rich.table import Table

    from eventstore import DEFAULT_TYPES, open_store
    from ops.cli.common import console
    from projector import event_type_catalogue, type_counts

    with open_store(settings_of(ctx)) as store, store.connection() as conn:
        counts = type_counts(conn, tenant)
    declared = {d.name: d for d in DEFAULT_TYPES.declarations()}
    per_type: dict[str, dict[int, int]] = {}
    for c in counts or []:
        per_type.setdefault(c.event_type, {})[c.schema_version] = c.events
    rows: list[dict[str, Any]] = []
    for name in sorted(set(declared) | set(per_type)):
        d = declared.get(name)
        rows.append(
            {
                "type": name,
                "latest": d.latest if d else None,
                "versions": sorted(d.models) if d else [],
                "upcasters": [
                    {"from": u.from_version, "to": u.to_version, "function": u.name} for u in d.upcasters
                ]
                if d
                else [],
                # Version 0: stored without a version (before the type was declared); read as version 1.
                "events": {str(v): n for v, n in sorted(per_type.get(name, {}).items())},
            }
        )
    note = None
    if counts is None:
        note = (
            f"no counts: the {event_type_catalogue.name} projection has not run; add "
            "projector.type_catalogue:event_type_catalogue to LEDGERFLOW_PROJECTIONS and run a projector"
        )
    if as_json:
        emit_json({"types": rows, "counted": counts is not None, "note": note})
        return
    table = Table("type", "latest", "declared versions", "events per stored version", "upcasters")
    for r in rows:
        table.add_row(
            r["type"],
            "-" if r["latest"] is None else str(r["latest"]),
            ", ".join(map(str, r["versions"])) or "-",
            ", ".join(f"v{'-' if v == '0' else v}: {n:,}" for v, n in r["events"].items()) or "-",
            ", ".join(f"{u['from']}->{u['to']} {u['function']}" for u in r["upcasters"]) or "-",
        )
    console.print(table)
    if note:
        console.print(note, highlight=False)
