"""`ledgerflow workflows wait RUN`: wait until a run ends, and exit as it ended."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import click

from ops.cli.common import settings_of
from ops.cli.run_args import registry_of, run_id_arg

if TYPE_CHECKING:
    from workflows import Engine, RunState


@click.command("wait")
@click.argument("run_id")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait at most.")
@click.option(
    "--follow",
    is_flag=True,
    help="If the run continues as a new run (continue_as_new), wait for its successors too, to the last "
    "run of the chain, and exit as that one ended.",
)
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def wait(ctx: click.Context, run_id: str, timeout: float, follow: bool, tenant: str) -> None:
    """Wait until a run ends; exit status 0 if it succeeded, 1 if it failed or was cancelled, 2 on timeout,
    3 if it continued as a new run (its successor is printed; `--follow` waits for the chain's last run).

    Handy in scripts: start a run, wait for it, then refresh or read its outputs."""
    from eventstore import open_store
    from ops.cli.common import console, err_console
    from workflows import Engine

    settings = settings_of(ctx)
    wanted = run_id_arg(run_id)
    with open_store(settings) as store:
        engine = Engine(store, registry_of(settings))
        run = _wait_for_end(engine, wanted, tenant, timeout, follow=follow)
    console.print(f"run {run.run_id} ({run.workflow}) [bold]{run.status}[/]", highlight=False)
    if run.continued_from is not None and follow and run.run_id != wanted:
        console.print(f"continued_from: {run.continued_from}", highlight=False)
    if run.active:
        err_console.print(f"still {run.status} after {timeout:g}s", highlight=False)
        ctx.exit(2)
    if run.error:
        console.print(f"[red]{run.error}[/]", highlight=False)
    if run.continued_as is not None:  # it handed over to its successor: wait for that one next
        console.print(f"continued_as: {run.continued_as}", highlight=False)
    ctx.exit(_WAIT_EXITS.get(run.status, 1))


#: `workflows wait`'s exit status per status of the run it ends with (any other: 1).
_WAIT_EXITS = {"succeeded": 0, "continued": 3}


def _wait_for_end(
    engine: Engine, run_id: uuid.UUID, tenant: str, timeout: float, *, follow: bool
) -> RunState:
    """The run once it has ended, or as it is when `timeout` runs out; with `follow`, the last run of its
    continue_as_new chain once that has ended (one deadline for the chain). The run's stream is read now and
    then, only its events after those already read (`Engine.catch_up`), at first every 50 ms and less often
    as the wait goes on (up to once a second): a wait over a long run with a long history costs the
    database a short read a second, not a read of the whole history each second. It needs no listener of
    its own.

    Not the API's wait (ops/api/run_waits.py, `workflows.run_end_watch`): that one is woken by the run
    table, which only a projector keeps (`ledgerflow projector` or `serve`); next to a lone `ledgerflow
    worker`, as in docs/first-workflow.md, nothing would announce the end and this command would answer
    only at its timeout. The stream has the end as soon as it is recorded."""
    deadline = time.monotonic() + timeout
    delay = _FIRST_DELAY
    run = engine.load(run_id, tenant=tenant)
    while True:
        if follow and run.continued_as is not None:
            # Its successor started with its end.
            run, delay = engine.load(uuid.UUID(run.continued_as), tenant=tenant), _FIRST_DELAY
            continue
        if not run.active or time.monotonic() >= deadline:
            return run
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, _LONGEST_DELAY)
        engine.catch_up(run)


#: Seconds between two reads of the run's stream: at first, and at most.
_FIRST_DELAY, _LONGEST_DELAY = 0.05, 1.0
