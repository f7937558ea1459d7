"""`ledgerflow tokens create|revoke|list`: API tokens, each bound to one tenant and to scopes."""

from __future__ import annotations

import click
from rich.table import Table

from eventstore import InvalidInputError, open_store
from ops.cli_common import console, emit_json, settings_of


@click.group("tokens")
def tokens_group() -> None:
    """API tokens: each bound to one tenant and to scopes (append, read, operate, admin)."""


@tokens_group.command("create")
@click.option("--tenant", default="default", show_default=True)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    default=["read"],
    show_default=True,
    type=click.Choice(["append", "read", "operate", "admin"]),
)
@click.option("--name", default="cli", show_default=True, help="What the token is for.")
@click.pass_context
def tokens_create(ctx: click.Context, tenant: str, scopes: tuple[str, ...], name: str) -> None:
    """Create a token; its secret is shown once (only its hash is stored)."""
    from ops.auth import create_token

    with open_store(settings_of(ctx)) as store:
        token_id, secret = create_token(store, tenant=tenant, scopes=list(scopes), name=name)
    console.print(f"token {token_id} for tenant {tenant!r}, scopes {', '.join(scopes)}:", highlight=False)
    click.echo(secret)


@tokens_group.command("revoke")
@click.argument("token_id")
@click.pass_context
def tokens_revoke(ctx: click.Context, token_id: str) -> None:
    from ops.auth import revoke_token

    with open_store(settings_of(ctx)) as store:
        if not revoke_token(store, token_id):
            raise InvalidInputError(f"no active token {token_id!r}; see `ledgerflow tokens list`")
    console.print(f"token {token_id} revoked")


@tokens_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def tokens_list(ctx: click.Context, as_json: bool) -> None:
    from ops.auth import list_tokens

    with open_store(settings_of(ctx)) as store:
        tokens = list_tokens(store)
    rows = [t if isinstance(t, dict) else getattr(t, "__dict__", {"token": str(t)}) for t in tokens]
    if as_json:
        emit_json(rows)
        return
    table = Table(*(rows[0].keys() if rows else ["tokens"]))
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


def register(cli: click.Group) -> None:
    cli.add_command(tokens_group)
