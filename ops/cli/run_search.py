"""`ledgerflow workflows list` (search runs by their filters, a page at a time) and
`ledgerflow workflows history RUN` (a run's events, from its own stream)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from ops.cli.common import emit_json, settings_of
from ops.cli.run_args import run_id_arg

if TYPE_CHECKING:
    from workflows import HistoryEntry, RunFilter

_AGO = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
#: `history` reads this many events at most (in pages); past it, it says where to go on from.
HISTORY_MOST = 100_000


def when(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time (UTC unless it names a zone) or an age such as `30m`, `2h`, `7d` (that long ago)."""
    if text is None:
        return None
    ago = _AGO.fullmatch(text)
    if ago:
        return datetime.now(UTC) - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give an ISO 8601 time (2026-01-31T12:00:00+00:00) or an age (30m, 2h, 7d)",
            param_hint=option,
        ) from None
    return at if at.utcoffset() is not None else at.replace(tzinfo=UTC)


def _run_id(text: str | None) -> uuid.UUID | None:
    return None if text is None else run_id_arg(text)


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The run filters every listing takes (`list`, `bulk`), in the order `--help` shows them; the
    command builds its RunFilter with `run_filter(...)`."""
    for option in reversed(
        (
            click.option(
                "--status",
                multiple=True,
                help="running, paused, succeeded, failed or cancelled (repeatable: any of them).",
            ),
            click.option("--workflow", default=None),
            click.option(
                "--version", "version", default=None, help="The definition's version the runs started with."
            ),
            click.option("--tag", multiple=True, help="KEY=VALUE (repeatable): runs carrying every one."),
            click.option(
                "--since", default=None, help="Started at or after: ISO 8601, or an age (30m, 2h, 7d)."
            ),
            click.option("--until", default=None, help="Started before: ISO 8601, or an age."),
            click.option("--ended-since", default=None, help="Ended at or after: ISO 8601, or an age."),
            click.option("--ended-until", default=None, help="Ended before: ISO 8601, or an age."),
            click.option("--parent", default=None, help="Children started by this run."),
            click.option("--triggered-by", default=None, help="Started by the log event with this id."),
            click.option("--tenant", default="default", show_default=True),
        )
    ):
        command = option(command)
    return command


def run_filter(
    status: tuple[str, ...],
    workflow: str | None,
    version: str | None,
    tag: tuple[str, ...],
    since: str | None,
    until: str | None,
    ended_since: str | None,
    ended_until: str | None,
    parent: str | None,
    triggered_by: str | None,
) -> RunFilter:
    """The RunFilter of `filter_options`' values."""
    from workflows import RunFilter, tag_filter

    return RunFilter(
        workflow=workflow,
        version=version,
        statuses=status,
        tags=tag_filter(tag),
        started_after=when(since, "--since"),
        started_before=when(until, "--until"),
        ended_after=when(ended_since, "--ended-since"),
        ended_before=when(ended_until, "--ended-until"),
        parent=_run_id(parent),
        triggered_by=triggered_by,
    )


@click.command("list")
@filter_options
@click.option("--limit", default=30, show_default=True, type=click.IntRange(1, 500), help="Runs per page.")
@click.option("--after", default=None, help="The cursor a previous page printed, for the next page.")
@click.option("--json", "as_json", is_flag=True, help='One JSON object: {"runs": [...], "next": cursor}.')
@click.pass_context
def list_runs(
    ctx: click.Context,
    status: tuple[str, ...],
    workflow: str | None,
    version: str | None,
    tag: tuple[str, ...],
    since: str | None,
    until: str | None,
    ended_since: str | None,
    ended_until: str | None,
    parent: str | None,
    triggered_by: str | None,
    tenant: str,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """Runs, newest first, that every given filter keeps, from the workflow_runs projection (kept by
    `ledgerflow projector` or `serve`, so a moment behind); a page at a time (--after the printed cursor)."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from workflows import search_runs

    wanted = run_filter(
        status, workflow, version, tag, since, until, ended_since, ended_until, parent, triggered_by
    )
    with open_store(settings_of(ctx)) as store:
        page = search_runs(store, tenant=tenant, filter=wanted, limit=limit, after=after)
    if as_json:
        emit_json({"runs": page.runs, "next": page.next})
        return
    table = Table("run", "workflow", "key", "status", "nodes", "current", "created", "tags")
    for r in page.runs:
        table.add_row(
            str(r["run_id"]),
            r["workflow"],
            r["key"] or "",
            r["status"] + (f" (waiting: {r['waiting']})" if r.get("waiting") else ""),
            f"{r['nodes_done']}/{r['nodes_total']}",
            r["current_node"] or "",
            str(r["created_at"])[:19],
            " ".join(f"{k}={v}" for k, v in sorted(r["tags"].items())),
        )
    console.print(table)
    if page.next is not None:
        console.print(f"more: --after {page.next}", highlight=False, soft_wrap=True)


@click.command("history")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.option(
    "--after", default=0, show_default=True, type=click.IntRange(0), help="Events after this version."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event, a line each.")
@click.pass_context
def history(ctx: click.Context, run_id: str, tenant: str, after: int, as_json: bool) -> None:
    """Every event of a run, oldest first, from its own stream: time, node, attempt, worker and a summary
    of its payload."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from workflows import run_history

    wanted = uuid.UUID(int=0)
    found = _run_id(run_id)
    if found is not None:
        wanted = found
    shown = 0
    table = Table("version", "time", "event", "node", "attempt", "worker", "summary")
    with open_store(settings_of(ctx)) as store:
        cursor: int | None = after
        claims: dict[str, tuple[int, str]] = {}  # carried from page to page
        while cursor is not None and shown < HISTORY_MOST:
            page = run_history(store, wanted, tenant=tenant, after=cursor, limit=1000, claims=claims)
            for e in page.entries:
                if as_json:
                    click.echo(_json_line(e))
                else:
                    table.add_row(*_cells(e))
            shown += len(page.entries)
            cursor = page.next
    if not as_json:
        console.print(table)
    if cursor is not None:
        click.echo(f"stopped after {shown} events: go on with --after {cursor}", err=True)


def _cells(e: HistoryEntry) -> tuple[str, ...]:
    return (
        str(e.version),
        e.at.astimezone(UTC).isoformat(timespec="milliseconds"),
        e.type,
        e.node or "",
        str(e.attempt) if e.attempt is not None else "",
        e.worker or "",
        e.summary,
    )


def _json_line(e: HistoryEntry) -> str:
    value: dict[str, Any] = {**e.__dict__, "at": e.at.isoformat()}
    return json.dumps(value, default=str)
