"""What eventstore offers the packages built on it (projector, workflows, ops) and no application needs:
connections and pooling, connections of their own, the type of a connection, row factories and named
rows (so that no package above names the driver), error translation, the check of a database URL, SQL
files, outage handling, keepalives, array parameters and input checks. Applications use `eventstore`
itself; its siblings use this module and `eventstore`, never another of its modules (an import contract
holds them to it), so the store's insides can move freely."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg.rows import class_row, kwargs_row

    from eventstore._guard import require_ledgerflow_packages
    from eventstore._validation import check_idempotency_key, check_tenant, dump_json_object
    from eventstore.arrays import FloatArray, IntArray, TextArray
    from eventstore.db import Connection, Translation, connect, pipelined, synced, translate, wrap_exceptions
    from eventstore.event_rows import EventRow, checked_rows
    from eventstore.frozen import end_frozen_sessions
    from eventstore.importing import import_object
    from eventstore.jsonvalue import dumps as json_dumps
    from eventstore.jsonvalue import loads as json_loads
    from eventstore.keepalive import Beat, Keepalive
    from eventstore.outage import (
        Outage,
        OutageState,
        backoff,
        is_unavailable,
        retry_delay,
        sleeper,
        slots_full,
        through_outages,
        wait_until_available,
    )
    from eventstore.own_connection import OwnConnection, try_connect
    from eventstore.pooling import bounded_once_stopping, bounded_waits
    from eventstore.refusals import check_database_url
    from eventstore.rows import fetch_all, fetch_one, fetch_value, fetch_values, sent
    from eventstore.sqlfile import load_queries
    from eventstore.telemetry import span_if_traced
else:
    from eventstore._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "eventstore._guard": ("require_ledgerflow_packages",),
            "eventstore._validation": (
                "check_idempotency_key",
                "check_tenant",
                "dump_json_object",
            ),
            "eventstore.arrays": (
                "FloatArray",
                "IntArray",
                "TextArray",
            ),
            "eventstore.event_rows": (
                "EventRow",
                "checked_rows",
            ),
            "eventstore.db": (
                "Connection",
                "Translation",
                "connect",
                "pipelined",
                "synced",
                "translate",
                "wrap_exceptions",
            ),
            "eventstore.frozen": ("end_frozen_sessions",),
            "eventstore.importing": ("import_object",),
            "eventstore.jsonvalue": (
                "json_dumps=dumps",
                "json_loads=loads",
            ),
            "eventstore.keepalive": (
                "Beat",
                "Keepalive",
            ),
            "eventstore.outage": (
                "Outage",
                "OutageState",
                "backoff",
                "is_unavailable",
                "retry_delay",
                "sleeper",
                "slots_full",
                "through_outages",
                "wait_until_available",
            ),
            "eventstore.own_connection": (
                "OwnConnection",
                "try_connect",
            ),
            "eventstore.pooling": (
                "bounded_once_stopping",
                "bounded_waits",
            ),
            "eventstore.refusals": ("check_database_url",),
            "eventstore.rows": (
                "fetch_all",
                "fetch_one",
                "fetch_value",
                "fetch_values",
                "sent",
            ),
            "eventstore.sqlfile": ("load_queries",),
            "eventstore.telemetry": ("span_if_traced",),
            "psycopg.rows": (
                "class_row",
                "kwargs_row",
            ),
        },
    )

__all__ = [
    "Beat",
    "Connection",
    "EventRow",
    "FloatArray",
    "IntArray",
    "Keepalive",
    "Outage",
    "OutageState",
    "OwnConnection",
    "TextArray",
    "Translation",
    "backoff",
    "bounded_once_stopping",
    "bounded_waits",
    "check_database_url",
    "check_idempotency_key",
    "check_tenant",
    "checked_rows",
    "class_row",
    "connect",
    "dump_json_object",
    "end_frozen_sessions",
    "fetch_all",
    "fetch_one",
    "fetch_value",
    "fetch_values",
    "import_object",
    "is_unavailable",
    "json_dumps",
    "json_loads",
    "kwargs_row",
    "load_queries",
    "pipelined",
    "require_ledgerflow_packages",
    "retry_delay",
    "sent",
    "sleeper",
    "slots_full",
    "span_if_traced",
    "synced",
    "through_outages",
    "translate",
    "try_connect",
    "wait_until_available",
    "wrap_exceptions",
]
