"""Database settings, read from the environment (LEDGERFLOW_*) and validated by pydantic."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveInt, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from eventstore.masterkeys import MasterKeys


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERFLOW_", extra="ignore")

    #: A libpq URL. When unset, ledgerflow starts an embedded PostgreSQL (see `eventstore.embedded`).
    database_url: str | None = None
    #: Where the embedded PostgreSQL keeps its data; a per-user directory by default.
    embedded_data_dir: Path | None = None
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: PositiveInt = 10
    #: Seconds after which a pooled connection no thread has used is closed, down to `pool_min_size` (a
    #: connection an appending thread keeps, within 1.5 times this): after a burst, a process gives its
    #: server slots back rather than keep them from other processes (see `eventstore.pooling`).
    pool_max_idle: float = Field(default=10.0, gt=0)
    #: How many of the pool's connections appending threads may keep between appends (see
    #: `eventstore.pinning`); by default half the pool, so other work always finds connections. A process
    #: that does little but append may let every connection be pinned; 0 checks out per append.
    pinned_connections: int | None = Field(default=None, ge=0)
    #: Seconds to wait for a first connection before saying the database is unavailable.
    connect_timeout: float = Field(default=10.0, gt=0)
    #: The server ends a transaction left idle this long (seconds): a frozen process (SIGSTOP, a debugger)
    #: must not hold locks, or the log's safe horizon, for ever. Workers lower it to their lease length.
    idle_in_transaction_timeout: float = Field(default=60.0, gt=0)
    #: The largest serialised data + metadata of one event.
    max_event_bytes: PositiveInt = 1024 * 1024
    #: A page read from the log or a stream stops once its events pass this many bytes of JSON (always with
    #: at least one event), so a reader's memory is bounded by size, not only by count.
    max_page_bytes: PositiveInt = 4 * 1024 * 1024
    #: The most events one append may carry (bulk imports have no such limit).
    max_events_per_append: PositiveInt = 10_000
    #: Modules that declare event types and upcasters (`@event_type`, `@upcaster`), comma-separated;
    #: imported when a store opens, so that every process reads events in the same shapes.
    event_types: str = ""
    #: The master key that wraps the subjects' data keys (personal fields, see eventstore.personal): the
    #: base64 of 32 random bytes (`ledgerflow keys generate`). Or a file holding it. Without either, an
    #: append of personal fields is refused.
    master_key: SecretStr | None = None
    master_key_file: Path | None = None
    #: Master keys replaced by `master_key`, comma-separated: they still unwrap data keys until
    #: `ledgerflow keys rotate-master` has re-wrapped them all under the current one.
    previous_master_keys: SecretStr | None = None

    def master_keys(self) -> MasterKeys:
        return MasterKeys.from_settings(
            self.master_key.get_secret_value() if self.master_key else None,
            self.master_key_file,
            self.previous_master_keys.get_secret_value() if self.previous_master_keys else None,
        )
