"""`ledgerflow tokens create|revoke|list`: API tokens, each bound to one tenant and to scopes.

`--server-admin` makes a server administrator's token; `--expires-in 30d` limits a token's lifetime.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import click

from ops.cli.common import emit_json, settings_of

_DURATION = re.compile(r"([1-9][0-9]{0,6})([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    """A lifetime such as `90m`, `12h`, `30d` or `2w`."""
    if value is None:
        return None
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise click.BadParameter(
            f"{value!r} is not a duration: write a number and a unit (s, m, h, d, w), e.g. 30d"
        )
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


@click.group("tokens")
def tokens_group() -> None:
    """API tokens: each bound to one tenant and to scopes (append, read, operate, admin)."""


@tokens_group.command("create")
@click.option("--tenant", default="default", show_default=True)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["append", "read", "operate", "admin"]),
    help="Repeat for several. [default: read; admin with --server-admin]",
)
@click.option("--name", default="cli", show_default=True, help="What the token is for.")
@click.option(
    "--server-admin",
    is_flag=True,
    help="A server administrator's token: rebuild, replay and verify every projection, see every "
    "tenant's failures, read /metrics.",
)
@click.option(
    "--expires-in", callback=_duration, metavar="DURATION", help="Lifetime, e.g. 90m, 12h, 30d, 2w."
)
@click.option(
    "--print-secret",
    is_flag=True,
    help="Print only the secret, e.g. for TOKEN=$(ledgerflow tokens create ...).",
)
@click.pass_context
def tokens_create(
    ctx: click.Context,
    tenant: str,
    scopes: tuple[str, ...],
    name: str,
    server_admin: bool,
    expires_in: timedelta | None,
    print_secret: bool,
) -> None:
    """Create a token; its secret is shown once (only its hash is stored)."""
    from eventstore import open_store
    from ops.auth import create_token
    from ops.cli.common import console

    chosen = list(scopes) or (["admin"] if server_admin else ["read"])
    with open_store(settings_of(ctx)) as store:
        token_id, secret = create_token(
            store, tenant=tenant, scopes=chosen, name=name, server_admin=server_admin, expires_in=expires_in
        )
    if print_secret:
        click.echo(secret)
        return
    role = "server administrator's token" if server_admin else "token"
    lifetime = f", expires in {_lifetime(expires_in)}" if expires_in else ""
    console.print(
        f"{role} {token_id} for tenant {tenant!r}, scopes {', '.join(chosen)}{lifetime}:", highlight=False
    )
    click.echo(secret)


@tokens_group.command("revoke")
@click.argument("token_id")
@click.pass_context
def tokens_revoke(ctx: click.Context, token_id: str) -> None:
    from eventstore import InvalidInputError, open_store
    from ops.auth import revoke_token
    from ops.cli.common import console

    with open_store(settings_of(ctx)) as store:
        if not revoke_token(store, token_id):
            raise InvalidInputError(f"no active token {token_id!r}; see `ledgerflow tokens list`")
    console.print(f"token {token_id} revoked")


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else "-"


def _lifetime(duration: timedelta) -> str:
    if duration.seconds == 0 and duration.microseconds == 0:
        return f"{duration.days} day{'s' if duration.days != 1 else ''}"
    return str(duration)


@tokens_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def tokens_list(ctx: click.Context, as_json: bool) -> None:
    """Every token (never a secret): id, name, tenant, role, scopes, status and when it was last used."""
    from rich.table import Table
    from rich.text import Text

    from eventstore import open_store
    from ops.auth import list_tokens
    from ops.cli.common import console

    with open_store(settings_of(ctx)) as store:
        tokens = list_tokens(store)
    if as_json:
        emit_json(
            [
                {
                    "id": t.id,
                    "name": t.name,
                    "tenant": t.tenant,
                    "role": t.role,
                    "scopes": list(t.scopes),
                    "status": t.status,
                    "created_at": t.created_at.isoformat(),
                    "expires_at": t.expires_at.isoformat() if t.expires_at else None,
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                    "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
                }
                for t in tokens
            ]
        )
        return
    if not tokens:
        console.print("no tokens; create one with `ledgerflow tokens create`")
        return
    table = Table(show_lines=False)
    table.add_column("id", no_wrap=True)  # whole: it is what `tokens revoke` takes
    for header in ("name", "tenant", "role", "scopes", "status", "created", "expires", "last used"):
        table.add_column(header, overflow="fold")
    for t in tokens:
        table.add_row(
            t.id,
            Text(t.name),
            t.tenant,
            "server admin" if t.server_admin else "tenant",
            ", ".join(t.scopes),
            t.status,
            _when(t.created_at),
            _when(t.expires_at),
            _when(t.last_used_at),
        )
    console.print(table)
