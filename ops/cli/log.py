"""`ledgerflow log ...`: the event log's partitions, listed, archived to files and restored."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ops.cli.common import emit_json, settings_of

if TYPE_CHECKING:
    from eventstore import EventStore


@contextmanager
def _store(ctx: click.Context) -> Iterator[EventStore]:
    """The event store, for as long as the command runs. Opening it applies pending migrations, and keeps
    the embedded server running when no URL is set."""
    from eventstore import open_store

    with open_store(settings_of(ctx)) as store:
        yield store


@contextmanager
def _url(ctx: click.Context) -> Iterator[str]:
    """The log's database URL, for as long as the command runs (see `_store`)."""
    with _store(ctx) as store:
        yield store.url


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


@click.group("log")
def log_group() -> None:
    """The event log's partitions: list them, archive old ones to files, restore them for a rebuild."""


@log_group.command("partitions")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.pass_context
def log_partitions(ctx: click.Context, as_json: bool) -> None:
    """List the partitions with their position ranges, sizes, and whether attached or archived."""
    from rich.table import Table

    from eventstore import list_partitions
    from ops.cli.common import console

    with _store(ctx) as store, store.connection() as conn:
        parts = list_partitions(conn)
    if as_json:
        emit_json([dataclasses.asdict(p) for p in parts])
        return
    table = Table("partition", "positions", "state", "events", "size", "archived to")
    for p in parts:
        events = "-" if p.events is None else (f"~{p.events:,}" if p.state == "attached" else f"{p.events:,}")
        table.add_row(
            p.name,
            f"{p.from_position:,} .. {p.to_position - 1:,}",
            p.state,
            events,
            _size(p.bytes),
            p.archived_to or "",
        )
    console.print(table)


@log_group.command("archive")
@click.argument("partition")
@click.option(
    "--to",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for PARTITION.copy and PARTITION.manifest.json (created if missing).",
)
@click.pass_context
def log_archive(ctx: click.Context, partition: str, directory: Path) -> None:
    """Write PARTITION to files (COPY, with a manifest of its range and SHA-256) and drop it from the log.

    Refused while the partition still receives appends or while a projection has not read all of it.
    """
    from eventstore import archive_partition
    from ops.cli.common import console

    with _url(ctx) as url:
        manifest = archive_partition(url, partition, directory)
    console.print(
        f"archived {manifest.partition} (positions {manifest.from_position:,} .. "
        f"{manifest.to_position - 1:,}, {manifest.events:,} events, sha256 {manifest.sha256[:16]}…) "
        f"to {directory / (manifest.partition + '.manifest.json')}"
    )


@log_group.command("restore")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def log_restore(ctx: click.Context, manifest: Path) -> None:
    """Load an archived partition (DIR/PARTITION.manifest.json) back into the log, checked against its
    SHA-256 first; rebuild projections from the start afterwards if they need its events."""
    from eventstore import restore_partition
    from ops.cli.common import console

    with _url(ctx) as url:
        restored = restore_partition(url, manifest)
    console.print(
        f"restored {restored.name} (positions {restored.from_position:,} .. {restored.to_position - 1:,}, "
        f"{restored.events:,} events)"
    )
