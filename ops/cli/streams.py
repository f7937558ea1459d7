"""`ledgerflow append` and `ledgerflow read`: one event into a stream, a stream's events out. Product packages
are imported inside the commands, so that `--help` loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ops.cli.common import store_of

if TYPE_CHECKING:
    from eventstore import ExpectedVersion


def _expected(text: str) -> ExpectedVersion:
    from eventstore import ANY, NO_STREAM, STREAM_EXISTS

    named = {"any": ANY, "no-stream": NO_STREAM, "exists": STREAM_EXISTS}
    if text in named:
        return named[text]
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter("use any, no-stream, exists or a version number") from None


@click.command()
@click.argument("stream_id")
@click.option("--type", "event_type", required=True, help="The event type, e.g. OrderPlaced.")
@click.option("--data", default="{}", help="The event data, a JSON object.")
@click.option("--metadata", default="{}", help="Metadata, a JSON object.")
@click.option("--expected", default="any", help="any, no-stream, exists, or the stream's current version.")
@click.option("--idempotency-key", default=None, help="Makes retries of this append safe.")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def append(
    ctx: click.Context,
    stream_id: str,
    event_type: str,
    data: str,
    metadata: str,
    expected: str,
    idempotency_key: str | None,
    tenant: str,
) -> None:
    """Append one event to a stream."""
    from eventstore import NewEvent
    from eventstore.spi import json_loads

    try:
        # Numbers keep their exact decimal value (1.00000000000000000001 stays so).
        parsed_data, parsed_metadata = json_loads(data), json_loads(metadata)
    except ValueError as exc:
        raise click.BadParameter(f"--data and --metadata take JSON objects: {exc}") from None
    with store_of(ctx) as store:
        result = store.append(
            stream_id,
            [NewEvent(event_type, parsed_data, parsed_metadata)],
            expected_version=_expected(expected),
            idempotency_key=idempotency_key,
            tenant=tenant,
        )
    event = result.events[0]
    note = " (duplicate: the original append's result)" if result.duplicate else ""
    # Plain text, not rich's: the most frequent call in scripts loads no table drawing, and a stream id
    # with brackets is printed as it is, not read as markup.
    click.echo(f"{stream_id} is at version {event.stream_version}, position {event.position}{note}")


@click.command()
@click.argument("stream_id")
@click.option("--tenant", default="default", show_default=True)
@click.option("--backward", is_flag=True, help="Newest first.")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--upcast", is_flag=True, help="Declared types in their latest shape (LEDGERFLOW_EVENT_TYPES).")
@click.pass_context
def read(
    ctx: click.Context, stream_id: str, tenant: str, backward: bool, limit: int, as_json: bool, upcast: bool
) -> None:
    """Print a stream's events, as stored unless --upcast."""
    from eventstore.spi import json_dumps

    with store_of(ctx) as store:
        events = store.read_stream(stream_id, tenant=tenant, backward=backward, limit=limit, upcast=upcast)
    if as_json:
        for e in events:
            click.echo(
                json_dumps(
                    {
                        "version": e.stream_version,
                        "position": e.position,
                        "type": e.type,
                        "data": e.data,
                        "metadata": e.metadata,
                        "event_id": str(e.event_id),
                    }
                )
            )
        return
    from rich.table import Table

    from ops.cli.common import console

    table = Table("version", "position", "type", "data", "recorded")
    for e in events:
        table.add_row(
            str(e.stream_version),
            str(e.position),
            e.type,
            json_dumps(e.data)[:80],
            e.recorded_at.isoformat(timespec="seconds"),
        )
    console.print(table)
