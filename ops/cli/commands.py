"""The `ledgerflow` command line: the root group, with its table of the commands other modules define
(imported when used, see `ops.cli.lazy`), `serve`, and `main`, the entry point. Product packages are imported
inside the commands, so that `--help` loads none of them."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Any

import click

from ops.cli import structlog_without_rich
from ops.cli.command_table import COMMANDS
from ops.cli.common import settings_of
from ops.cli.lazy import LazyGroup


class LedgerflowGroup(LazyGroup):
    """Turns ledgerflow errors, an unreachable database and invalid settings into a line or two that say
    what to do, and exit status 1, instead of a traceback (`--debug` adds it)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors, --help and exit statuses
        except Exception as exc:
            # Imported once something failed: the error module brings the driver and pydantic.
            from ops.cli.common import err_console
            from ops.cli.errors import REPORTED, explain

            if not isinstance(exc, REPORTED):
                raise
            if ctx.params.get("debug"):
                err_console.print_exception()
            explained = explain(exc, os.environ.get("LEDGERFLOW_DATABASE_URL"))
            if explained is None:
                code = getattr(exc, "code", type(exc).__name__)
                err_console.print(f"[bold red]error[/] ({code}): {exc}", highlight=False, soft_wrap=True)
            else:
                what, todo = explained
                err_console.print(f"[bold red]error[/]: {what}\n  {todo}", highlight=False, soft_wrap=True)
            sys.exit(1)


@click.group(cls=LedgerflowGroup, lazy=COMMANDS)
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """ledgerflow: an event-sourced workflow engine on PostgreSQL.

    Uses LEDGERFLOW_DATABASE_URL, or an embedded PostgreSQL when it is unset.
    """
    # The settings are read (and logging set up) when the command first asks for them: settings_of.
    # `kill -USR1 <pid>` prints every thread's stack to stderr and the process goes on: what an operator
    # (or a drill) needs to see where a process that does not stop, or does not progress, is waiting.
    # The process's own stderr: a host that swapped sys.stderr for a buffer (a test runner) has no fd there.
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


@cli.command()
@click.option("--api", "api_role", is_flag=True, help="Run the HTTP API and console.")
@click.option("--projector", "projector_role", is_flag=True, help="Run projector workers.")
@click.option("--worker", "worker_role", is_flag=True, help="Run a workflow worker.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.pass_context
def serve(
    ctx: click.Context, api_role: bool, projector_role: bool, worker_role: bool, host: str, port: int
) -> None:
    """Run the API, console, projector and workflow workers in one process (all of them unless some
    roles are named). Stops gracefully on SIGTERM."""
    from ops.serve import serve as run_serve

    everything = not (api_role or projector_role or worker_role)
    run_serve(
        settings_of(ctx),
        api=everything or api_role,
        projector=everything or projector_role,
        worker=everything or worker_role,
        host=host,
        port=port,
    )


def main() -> None:
    structlog_without_rich.install()
    cli()
