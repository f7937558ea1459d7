"""The event log's partitions: created ahead of need, archived to files, restored for a rebuild.

`ledgerflow.events` is partitioned by position range (migrations/0020_partitioned_event_log.sql). A full
partition that every projection has read past can be archived: its rows are written with COPY to
`DIR/NAME.copy`, described by `DIR/NAME.manifest.json` (position range, event count, SHA-256), and the
partition is detached and dropped. Restoring checks the file against its manifest, loads it into a new
table shaped as a partition and attaches it; its event ids never left `ledgerflow.event_ids`, so a
restored log refuses the same reused ids as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import structlog
from psycopg import sql

from eventstore.db import wrap_exceptions
from eventstore.errors import ArchiveRefusedError, InvalidInputError, NotFoundError
from eventstore.rows import fetch_all, fetch_one, fetch_value
from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)
Q = load_queries("eventstore", "partitions.sql")

MANIFEST_FORMAT = "ledgerflow-log-partition/1"
#: The columns an archive holds, in its order (`category` is generated from stream_id).
COLUMNS = (
    "position",
    "transaction_id",
    "tenant",
    "stream_id",
    "stream_version",
    "event_id",
    "event_type",
    "data",
    "metadata",
    "correlation_id",
    "causation_id",
    "recorded_at",
)
_LOCK_TIMEOUT = "2s"


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of the log: positions from_position <= p < to_position."""

    name: str
    from_position: int
    to_position: int
    state: str  # 'attached' or 'archived'
    events: int | None  # attached: the catalogue's estimate; archived: the exact count archived
    bytes: int | None  # attached: size on disk with its indexes
    sha256: str | None
    archived_to: str | None
    archived_at: datetime | None


@dataclass(frozen=True, slots=True)
class Manifest:
    """What `DIR/NAME.manifest.json` says about the archive `DIR/NAME.copy`."""

    format: str
    partition: str
    from_position: int
    to_position: int
    events: int
    bytes: int
    sha256: str
    columns: list[str]
    archived_at: str
    data_file: str

    @classmethod
    def read(cls, path: Path) -> Manifest:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            manifest = cls(**raw)
        except (OSError, ValueError, TypeError) as exc:
            raise InvalidInputError(f"{path} is not a ledgerflow partition manifest: {exc}") from exc
        if manifest.format != MANIFEST_FORMAT or tuple(manifest.columns) != COLUMNS:
            raise InvalidInputError(f"{path}: unknown manifest format {manifest.format!r}")
        return manifest


@dataclass(frozen=True, slots=True)
class LogEnd:
    """Where the last partition ends, and how wide new partitions are."""

    end: int
    partition_size: int


def ensure_partitions(conn: psycopg.Connection[Any], *, headroom: int | None = None) -> LogEnd:
    """Create partitions until the last one reaches `headroom` positions (default: one partition) past
    the last position handed out. Cheap when nothing is missing (one statement, no lock)."""
    with wrap_exceptions():
        end = fetch_one(conn, LogEnd, Q["ensure"], {"headroom": headroom})
    assert end is not None
    return end


def list_partitions(conn: psycopg.Connection[Any]) -> list[Partition]:
    with wrap_exceptions():
        return fetch_all(conn, Partition, Q["list"])


def _partition(conn: psycopg.Connection[Any], name: str) -> Partition:
    found = fetch_one(conn, Partition, Q["partition"], {"name": name})
    if found is None:
        raise NotFoundError(f"the log has no partition {name!r} (`ledgerflow log partitions` lists them)")
    return found


def _table(name: str) -> sql.Identifier:
    return sql.Identifier("ledgerflow", name)


def archive_partition(url: str, name: str, directory: Path) -> Manifest:
    """Write partition `name` to `directory` and drop it from the log.

    Refused while the partition can still change (positions in its range not all handed out, a
    transaction that wrote into it still running) or while some projection's cursor has not passed all
    its events: those events would vanish from under the projection.
    """
    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{name}.copy"
    manifest_path = directory / f"{name}.manifest.json"
    with wrap_exceptions(), psycopg.connect(url, autocommit=True) as conn:
        part = _partition(conn, name)
        if part.state == "archived":
            raise ArchiveRefusedError(f"partition {name} is already archived to {part.archived_to}")
        # Phase 1, without any lock that appends or reads wait for: check, then copy out. The partition
        # is full and every transaction that wrote to it has ended, so its content no longer changes.
        try:
            digest, events, size = _copy_out_once_writers_ended(conn, part, data_path)
        except psycopg.errors.UndefinedTable:
            # Another archive of it dropped the table after this one read the partition's state.
            if _partition(conn, name).state != "archived":
                raise
            raise ArchiveRefusedError(
                f"partition {name} was archived by another archive while this one started"
            ) from None
        manifest = Manifest(
            format=MANIFEST_FORMAT,
            partition=name,
            from_position=part.from_position,
            to_position=part.to_position,
            events=events,
            bytes=size,
            sha256=digest.hexdigest(),
            columns=list(COLUMNS),
            archived_at=datetime.now(UTC).isoformat(),
            data_file=data_path.name,
        )
        _write_durably(manifest_path, json.dumps(asdict(manifest), indent=2) + "\n")
        # Phase 2: detach and drop, briefly holding the log's lock. The count taken again under that
        # lock proves the file holds every row the partition had.
        with conn.transaction():
            conn.execute(Q["lock_timeout"], {"timeout": _LOCK_TIMEOUT})
            locked = fetch_one(conn, Partition, Q["partition_for_update"], {"name": name})
            if locked is None or locked.state == "archived":
                # Another archive of it committed while this one copied: one archive stands.
                raise ArchiveRefusedError(
                    f"partition {name} was archived by another archive while this one copied it; "
                    f"{data_path} and {manifest_path} are a second copy of the same rows"
                )
            conn.execute(sql.SQL("ALTER TABLE ledgerflow.events DETACH PARTITION {}").format(_table(name)))
            now = fetch_value(conn, sql.SQL("SELECT count(*) FROM {}").format(_table(name)))
            if now != events:
                raise ArchiveRefusedError(
                    f"partition {name} changed while it was archived ({events} rows written, "
                    f"{now} now); nothing was dropped: run the archive again"
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(_table(name)))
            conn.execute(
                Q["mark_archived"],
                {
                    "name": name,
                    "events": events,
                    "sha256": manifest.sha256,
                    "archived_to": str(manifest_path.resolve()),
                },
            )
    log.info("log_partition_archived", partition=name, events=events, to=str(manifest_path))
    return manifest


class _WriterRunning(ArchiveRefusedError):
    """A transaction that may still write into the partition was running when the check looked."""


#: Looks at the partition's writers before a running one refuses the archive. The log's horizon also
#: counts, for gap-freedom, a transaction (of any database on the server) that ended between its snapshot
#: and its look at the lock table: on a busy server a look can thus see a writer that has just ended. The
#: next look, a moment later, does not; a writer that really runs refuses every look.
_WRITER_LOOKS = 3


def _copy_out_once_writers_ended(
    conn: psycopg.Connection[Any], part: Partition, data_path: Path
) -> tuple[Any, int, int]:
    for look in range(1, _WRITER_LOOKS + 1):
        try:
            return _copy_out(conn, part, data_path)
        except _WriterRunning:
            if look == _WRITER_LOOKS:
                raise
    raise AssertionError("unreachable")


def _copy_out(conn: psycopg.Connection[Any], part: Partition, data_path: Path) -> tuple[Any, int, int]:
    """Copy the partition's rows to `data_path`, durably: their digest, count and size in bytes."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        _check_archivable(conn, part)
        digest = hashlib.sha256()
        events = 0
        size = 0
        copy_out = sql.SQL("COPY (SELECT {} FROM {} ORDER BY position) TO STDOUT").format(
            sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), _table(part.name)
        )
        with open(data_path, "wb") as out, conn.cursor().copy(copy_out) as copy:
            for chunk in copy:
                data = bytes(chunk)
                out.write(data)
                digest.update(data)
                size += len(data)
                events += data.count(b"\n")
            out.flush()
            os.fsync(out.fileno())
        return digest, events, size


def _check_archivable(conn: psycopg.Connection[Any], part: Partition) -> None:
    bounds = {"from": part.from_position, "to": part.to_position}
    last = fetch_value(conn, Q["last_position"]) or 0
    if last < part.to_position - 1:
        raise ArchiveRefusedError(
            f"partition {part.name} still receives appends (positions up to {part.to_position - 1}; "
            f"the log has reached {last}): only a full partition can be archived"
        )
    if fetch_value(conn, Q["beyond_horizon"], bounds):
        raise _WriterRunning(
            f"partition {part.name} holds events of a transaction still running: try again when it "
            "has ended (`ledgerflow horizon` names it)"
        )
    behind = conn.execute(Q["cursors_behind"], bounds).fetchall()
    if behind:
        names = ", ".join(f"{p} (at {tx}/{pos})" for p, tx, pos in behind)
        raise ArchiveRefusedError(
            f"partition {part.name} (positions {part.from_position}..{part.to_position - 1}) holds events "
            f"that projection(s) {names} have not read yet: archiving would take them from under them. "
            "Let them catch up (`ledgerflow projections status`), or remove a projection that no longer "
            "runs, and archive again"
        )


def restore_partition(url: str, manifest_path: Path) -> Partition:
    """Load an archived partition back into the log (for a rebuild from the start, say)."""
    manifest = Manifest.read(manifest_path)
    data_path = manifest_path.parent / manifest.data_file
    digest = hashlib.sha256()
    try:
        with open(data_path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise InvalidInputError(f"cannot read the archive's data: {exc}") from exc
    if digest.hexdigest() != manifest.sha256:
        raise ArchiveRefusedError(
            f"{data_path} does not match its manifest's SHA-256: the file is damaged or not this archive; "
            "nothing was restored"
        )
    name = manifest.partition
    with wrap_exceptions(), psycopg.connect(url) as conn, conn.transaction():
        conn.execute(Q["lock_timeout"], {"timeout": _LOCK_TIMEOUT})
        row = fetch_one(conn, Partition, Q["partition_for_update"], {"name": name})
        if row is None or (row.from_position, row.to_position) != (
            manifest.from_position,
            manifest.to_position,
        ):
            raise ArchiveRefusedError(
                f"this log has no archived partition {name} for positions "
                f"{manifest.from_position}..{manifest.to_position - 1}: the archive belongs to another log"
            )
        if row.state != "archived":
            raise ArchiveRefusedError(f"partition {name} is attached: there is nothing to restore")
        conn.execute(
            Q["restore_table"], {"name": name, "from": manifest.from_position, "to": manifest.to_position}
        )
        copy_in = sql.SQL("COPY {} ({}) FROM STDIN").format(
            _table(name), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
        )
        with open(data_path, "rb") as f, conn.cursor().copy(copy_in) as copy:
            while block := f.read(1 << 20):
                copy.write(block)
        counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_table(name))).fetchone()
        if counted is None or counted[0] != manifest.events:
            raise ArchiveRefusedError(
                f"{data_path} holds {counted[0] if counted else '?'} events, its manifest says "
                f"{manifest.events}; nothing was restored"
            )
        conn.execute(
            sql.SQL("ALTER TABLE ledgerflow.events ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                _table(name), sql.Literal(manifest.from_position), sql.Literal(manifest.to_position)
            )
        )
        conn.execute(Q["mark_attached"], {"name": name})
        restored = _partition(conn, name)
    log.info("log_partition_restored", partition=name, events=manifest.events)
    return restored


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
