"""`ledgerflow workflows signal|cancel|pause|resume|retry|refresh RUN`: send a run a signal, and the
operator's actions on a run (`workflows.Engine`'s)."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from ops.cli.common import emit_json, settings_of
from ops.cli.run_args import json_arg, registry_of, run_id_arg


def _action(ctx: click.Context, run_id: str, tenant: str, action: str, **kwargs: Any) -> Any:
    from eventstore import open_store
    from workflows import Engine

    settings = settings_of(ctx)
    with open_store(settings) as store:
        engine = Engine(store, registry_of(settings))
        return getattr(engine, action)(run_id_arg(run_id), tenant=tenant, **kwargs)


@click.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.option("--data", default=None, help="The signal's payload, JSON (default: null).")
@click.option("--idempotency-key", default=None, help="Makes a retry of this signal safe.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def signal_run(
    ctx: click.Context,
    run_id: str,
    name: str,
    data: str | None,
    idempotency_key: str | None,
    tenant: str,
    as_json: bool,
) -> None:
    """Send signal NAME to a run: the node waiting for it (`ctx.wait_for_signal`) gets --data; sent
    before a node waits, it is kept for the first that does."""
    from eventstore.spi import json_loads
    from ops.cli.common import console

    try:
        # Numbers keep their exact decimal value, as in an append.
        payload = None if data is None else json_loads(data)
    except ValueError as exc:
        raise click.BadParameter(f"--data takes JSON: {exc}") from None
    sent = _action(
        ctx,
        run_id,
        tenant,
        "signal",
        name=name,
        payload=payload,
        idempotency_key=idempotency_key,
        actor="cli",
    )
    if as_json:
        emit_json(dataclasses.asdict(sent))
        return
    note = " (duplicate: the first send's answer; nothing recorded)" if sent.duplicate else ""
    what = f"signal {name} sent to run {sent.run_id} at position {sent.position}"
    console.print(what + note, highlight=False)


@click.command("cancel")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def cancel(ctx: click.Context, run_id: str, tenant: str) -> None:
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "cancel")
    state = "cancelled" if not run.active else "cancel requested; running nodes stop at their next call"
    console.print(f"run {run_id}: {state}")


@click.command("pause")
@click.argument("run_id")
@click.option(
    "--interrupt-running",
    is_flag=True,
    help="Stop the running nodes at their next context call (they go on from their checkpoints on resume).",
)
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def pause(ctx: click.Context, run_id: str, interrupt_running: bool, tenant: str) -> None:
    """Pause a run: it starts no new node until `workflows resume`; its running nodes finish."""
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "pause", interrupt_running=interrupt_running, actor="cli")
    running = [n.name for n in run.nodes.values() if n.status == "running"]
    then = (
        f"; running: {', '.join(running)} ({'stop at their next call' if interrupt_running else 'finish'})"
        if running
        else ""
    )
    console.print(f"run {run_id}: paused{then}", highlight=False)


@click.command("resume")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def resume(ctx: click.Context, run_id: str, tenant: str) -> None:
    """Resume a paused run where it was; completed nodes and memoized steps are not run again."""
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "resume", actor="cli")
    console.print(f"run {run_id}: {run.status}", highlight=False)


@click.command("retry")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def retry(ctx: click.Context, run_id: str, tenant: str) -> None:
    """Resume a failed run from its failed nodes; completed nodes are kept."""
    from ops.cli.common import console

    _action(ctx, run_id, tenant, "retry")
    console.print(f"run {run_id} resumes from its failed nodes")


@click.command("refresh")
@click.argument("run_id")
@click.option("--input", "input_json", default=None, help="The new input, JSON.")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def refresh(ctx: click.Context, run_id: str, input_json: str | None, tenant: str) -> None:
    """Re-run a completed run with new input: only what changed, and what depends on it."""
    from ops.cli.common import console

    rerun = _action(ctx, run_id, tenant, "refresh", input=json_arg(input_json))
    console.print(f"re-running {', '.join(sorted(rerun))}" if rerun else "nothing changed; nothing to re-run")
