"""`ledgerflow subjects forget` and `ledgerflow keys generate|rotate-master|status`: crypto-shredding's
operator commands (see eventstore.personal)."""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING

import click

from ops.cli.common import emit_json, settings_of

if TYPE_CHECKING:
    from eventstore import RotationProgress


@click.group("subjects")
def subjects_group() -> None:
    """Subjects of personal data: forget one (its personal fields then read as [forgotten])."""


@subjects_group.command("forget")
@click.argument("subject")
@click.option("--tenant", default="default", show_default=True, help="The subject's tenant.")
@click.option("--reason", default="", help="Why, recorded with the forgetting.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def forget_command(
    ctx: click.Context, subject: str, tenant: str, reason: str, yes: bool, as_json: bool
) -> None:
    """Delete SUBJECT's data key: its personal fields read as [forgotten] from now on, in every read
    and every projection rebuilt from the log. It cannot be undone. Recorded in the tenant's log (stream
    subjects-forgotten)."""
    from eventstore import forget_subject, open_store
    from ops.cli.common import console

    if not yes:
        click.confirm(
            f"Forget subject {subject!r} of tenant {tenant!r}? Its personal data cannot be read again",
            abort=True,
            err=True,
        )
    with open_store(settings_of(ctx)) as store:
        done = forget_subject(store, subject, tenant=tenant, by=f"cli:{getpass.getuser()}", reason=reason)
    if as_json:
        emit_json(
            {
                "tenant": done.tenant,
                "subject": done.subject,
                "key_id": str(done.key_id),
                "forgotten_at": done.forgotten_at.isoformat(),
                "already": done.already,
            }
        )
        return
    when = "already forgotten" if done.already else "forgotten"
    console.print(f"subject {subject} of tenant {tenant} {when} ({done.forgotten_at:%Y-%m-%d %H:%M:%S %Z})")


@click.group("keys")
def keys_group() -> None:
    """The master key that wraps the subjects' data keys."""


@keys_group.command("generate")
def generate_command() -> None:
    """Print a new master key (for LEDGERFLOW_MASTER_KEY or the file of LEDGERFLOW_MASTER_KEY_FILE)."""
    from eventstore import generate_master_key

    click.echo(generate_master_key())


@keys_group.command("rotate-master")
@click.option("--batch", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.pass_context
def rotate_command(ctx: click.Context, batch: int) -> None:
    """Re-wrap every data key under LEDGERFLOW_MASTER_KEY; the old keys go in
    LEDGERFLOW_PREVIOUS_MASTER_KEYS meanwhile. The log is not rewritten. Safe to stop and run again."""
    from eventstore import open_store, rotate_master_key
    from ops.cli.common import console, err_console

    def progress(step: RotationProgress) -> None:
        if step.rewrapped:
            err_console.print(f"re-wrapped {step.rewrapped}, {step.remaining} left", highlight=False)

    with open_store(settings_of(ctx)) as store:
        total = rotate_master_key(store, batch=batch, progress=progress)
    console.print(f"{total} data keys re-wrapped under the current master key", highlight=False)


@keys_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool) -> None:
    """Data keys per master key ('forgotten': subjects whose key was deleted)."""
    from eventstore import open_store
    from ops.cli.common import console

    with open_store(settings_of(ctx)) as store:
        counts = store.personal.keys.key_counts()
        current = store.personal.keys.masters.current
    shown = {("forgotten" if k == "" else k): n for k, n in sorted(counts.items())}
    if as_json:
        emit_json({"current": current.key_id if current else None, "keys": shown})
        return
    console.print(f"current master key: {current.key_id if current else 'none configured'}", highlight=False)
    for master, n in shown.items():
        console.print(f"  {master}: {n}", highlight=False)
