"""Opening the event store from settings: database URL (or the embedded server), migrations, pool."""

from __future__ import annotations

import structlog

from eventstore.db import open_pool, redact, resolve_database_url
from eventstore.eventtypes import EventTypes
from eventstore.importing import import_modules
from eventstore.migrate import migrate as apply_migrations
from eventstore.notify import Notifier
from eventstore.settings import DatabaseSettings
from eventstore.store import EventStore

log = structlog.get_logger(__name__)


def open_store(
    settings: DatabaseSettings | None = None,
    *,
    url: str | None = None,
    migrate: bool = True,
    types: EventTypes | None = None,
    name: str = "ledgerflow",
) -> EventStore:
    """An EventStore ready to use; close it (or use it as a context manager) when done.

    The URL is, in order: `url`, LEDGERFLOW_DATABASE_URL, else an embedded PostgreSQL started for it.
    Pending migrations are applied first unless `migrate=False`. A database that cannot be reached raises
    DatabaseUnavailableError; one that refuses the connection (no such database, a refused login),
    DatabaseRefusedError. Without `types`, the store uses the
    types declared with the module-level decorators, after importing the modules `settings.event_types`
    names.
    """
    settings = settings or DatabaseSettings()
    if types is None and settings.event_types:
        # Their decorators declare the types in DEFAULT_TYPES, which the store then uses.
        import_modules(settings.event_types, "event types")
    url = url or resolve_database_url(settings)
    if migrate:
        apply_migrations(url)
    pool = open_pool(url, settings, name=name)
    # At debug: every CLI call opens a store, and its answer should come first. Long-running roles say it
    # at info (ops.services.open_store_when_available).
    log.debug("event_store_opened", database=redact(url), pool_max=settings.pool_max_size)
    return EventStore(
        pool,
        url=url,
        types=types,
        max_event_bytes=settings.max_event_bytes,
        max_events_per_append=settings.max_events_per_append,
        max_page_bytes=settings.max_page_bytes,
        notifier=Notifier(url, max_idle=settings.pool_max_idle),
        pinned_connections=settings.pinned_connections,
        master_keys=settings.master_keys(),
    )
