"""Helpers shared by the API tests."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

Headers = dict[str, str]
#: `make_token("read", tenant="acme")` -> headers carrying a fresh token with those scopes.
MakeToken = Callable[..., Headers]


def event_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert row is not None
    return int(row[0])


def events_body(*types: str, data: dict[str, object] | None = None) -> dict[str, object]:
    return {"events": [{"type": t, "data": data or {"n": i}} for i, t in enumerate(types or ("Happened",))]}
