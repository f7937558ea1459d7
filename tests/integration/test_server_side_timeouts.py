"""The server ends a vanished client's session within seconds, not hours: every connection of ledgerflow's
sets the server's TCP keepalives and user timeout for its own session (eventstore.db.SERVER_NETWORK_TIMEOUTS),
and a URL's own `options` still win."""

from __future__ import annotations

import psycopg

from eventstore import DatabaseSettings, EventStore, open_store
from eventstore.db import connect

_SETTINGS = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout")


def _shown(conn: psycopg.Connection[object]) -> dict[str, str]:
    return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in _SETTINGS}  # type: ignore[index]


def test_pooled_and_own_connections_carry_the_server_side_timeouts(store: EventStore) -> None:
    expected = {
        "tcp_keepalives_idle": "5",
        "tcp_keepalives_interval": "2",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "10000",
    }
    with store.pool.connection() as pooled:
        assert _shown(pooled) == expected
        # The pool's own setting still applies beside them.
        assert pooled.execute("SHOW idle_in_transaction_session_timeout").fetchone() != ("0",)
    with connect(store.url) as own:
        assert _shown(own) == expected


def test_options_in_the_url_win(store: EventStore) -> None:
    url = psycopg.conninfo.make_conninfo(store.url, options="-c tcp_keepalives_idle=42 -c search_path=public")
    with connect(url) as own:
        assert _shown(own)["tcp_keepalives_idle"] == "42"
        assert own.execute("SHOW search_path").fetchone() == ("public",)
    with open_store(DatabaseSettings(database_url=url), migrate=False) as other, other.pool.connection() as c:
        assert _shown(c)["tcp_keepalives_idle"] == "42"
        assert c.execute("SHOW search_path").fetchone() == ("public",)
