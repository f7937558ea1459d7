"""`ledgerflow demo`: the extraction pipeline with live progress, a worker killed mid-node, and a review
run that waits for its approval."""

from __future__ import annotations

import click

from ops.cli.common import settings_of


@click.command("demo")
@click.option("--tables", default=38, show_default=True, help="Tables in the sample schema.")
@click.option("--llm-delay", default=0.15, show_default=True, help="Seconds per simulated LLM call.")
@click.option(
    "--crash-at",
    default=26,
    show_default=True,
    help="Kill the worker when column enrichment reaches this item (0: no crash).",
)
@click.option(
    "--approve-after",
    default=2.0,
    show_default=True,
    help="Seconds the review run waits for its approval before the demo sends it.",
)
@click.pass_context
def demo(ctx: click.Context, tables: int, llm_delay: float, crash_at: int, approve_after: float) -> None:
    """Run the six-node extraction pipeline with live progress; kill its worker mid-node and watch the
    run resume at the right item. Then an event starts a review run, which waits for an approval."""
    from ops.demo import run_demo

    run_demo(
        settings_of(ctx), tables=tables, llm_delay=llm_delay, crash_at=crash_at, approve_after=approve_after
    )
