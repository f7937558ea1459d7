"""Projection throughput (catch-up from zero) and append-to-projected latency of ledgerflow, set against
a raw psycopg read of the same log and against the eventsourcing library's projection runner.

Run by hand (it is not a test):

    python bench/project.py [--runs 3] [--events 100000] [--url postgresql://postgres@127.0.0.1:5432/postgres]

(1) Catch-up throughput. `--events` events over `--streams` streams are bulk-loaded
    (EventStore.import_events), then a counter projection (one `on_batch` upsert per batch, through
    `INSERT ... SELECT FROM unnest(...)`) catches up from zero with a ProjectorWorker, once per batch size
    in `--batch-sizes`. Baselines measured in the same run, on the same database:
      (a) raw read: the same rows, same columns, read with plain psycopg in keyset pages
          (`WHERE position > %s ORDER BY position LIMIT n`): the cost of getting the log out of PostgreSQL
          and into Python tuples, with no projection at all. ledgerflow/raw says what the projector's
          machinery (gap-free horizon, event objects, the batch transaction, the upsert) costs on top;
      (b) eventsourcing: its ProjectionRunner with a PostgresTrackingRecorder-based view that upserts the
          same per-stream count and its tracking record in one transaction per event (the library's
          documented pattern), over the same number of events loaded into its own PostgreSQL recorder.
          eventsourcing is slow enough that a full 100k catch-up would eat the time budget, so it runs
          for `--es-seconds` (default 15 s) from zero over the full log and its rate is events processed
          / elapsed; `--es-seconds 0` processes the whole log instead.

(2) Append-to-projected latency. A ProjectorWorker runs `run()` in a thread (woken by LISTEN/NOTIFY);
    an appender appends single-event appends at `--rate` per second for `--seconds` through
    EventStore.append (which pokes the notifier); the projection keeps a one-row watermark table (the
    highest position applied) updated in the same transaction as its counts; an observer thread polls
    that watermark every millisecond. Latency of an event = first poll that saw it - the moment its
    append call returned. The same is measured beside for eventsourcing (ProjectionRunner, app.save of
    one event at the same rate, its tracking table polled) unless `--no-es-latency`.
    ledgerflow reads only below the log's safe horizon, which only writers of the log hold back
    (migration 0013). In the same run, after the quiet appends, ledgerflow's latency is measured again
    with unrelated long transactions open (`--unrelated-hold`, default 5 s each, begun again as soon as
    they end): one in another database of the server holding an xid (as a report or a CREATE DATABASE
    would), one in the benchmark's database writing a table beside the log. The report gives p50/p99
    without and with them. A watch thread records any transaction holding the log's horizon for 10 ms
    or more, and the report gives percentiles over all samples and over the undisturbed ones.

Every run uses a fresh database (CREATE DATABASE bench_<random>, migrated, dropped WITH (FORCE)
afterwards). Rates are medians over runs; ratios are medians of per-run ratios (both sides measured in the
same run, minutes apart at most), so drift on a shared 2-core machine cancels out.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import importlib.metadata
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import structlog

if __package__ in (None, ""):
    # Run as `python bench/project.py`: make the repository root importable, as bench/append.py does.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Payload,
    fmt_rate,
    fmt_ratio,
    fresh_database,
    make_payloads,
    median,
    print_table,
)
from eventstore import DatabaseSettings, EventStore, NewEvent, RecordedEvent, open_store
from eventstore.migrate import migrate
from projector import ApplyContext, Projection, ProjectorWorker, Table, WorkerSettings

DEFAULT_URL = os.environ.get("LEDGERFLOW_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
THROUGHPUT_TARGET = 10_000.0  # events/s, ledgerflow catch-up
ES_RATIO_TARGET = 7.0  # ledgerflow catch-up / eventsourcing catch-up
P99_TARGET_MS = 100.0
#: With unrelated long transactions open anywhere on the server, append-to-projected p99 stays below this.
UNRELATED_P99_TARGET_MS = 50.0
LATENCY_EVENT = "LatencyProbe"
#: Longest wait for the projection to show an event before the run is declared failed.
WAIT = 120.0
ES_SCHEMA = "bench_es"
ES_LATENCY_SCHEMA = "bench_es_latency"


def quiet() -> None:
    """Projector workers log at INFO per lease, run and catch-up; that would interleave with the
    results (and is work inside the timed sections), so only warnings get through."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("eventsourcing").setLevel(logging.WARNING)


# -- ledgerflow projections ------------------------------------------------------------------------


def counter_projection(
    name: str, *, watermark: bool = False, event_types: Sequence[str] | None = None
) -> Projection:
    """Counts events per stream. One statement per batch: the batch is folded into one row per stream in
    Python, then upserted through unnest of parallel arrays (one round trip, one set of parameters; cheaper
    than executemany's per-row statements for batches of hundreds of streams).

    With `watermark`, a one-row table also records the highest position applied, in the same transaction,
    so an observer can tell exactly when an event became visible in the projection.
    """
    tables = [
        Table(
            "counts",
            """CREATE TABLE {table} (
                   stream_id text PRIMARY KEY, n bigint NOT NULL, last_position bigint NOT NULL
               )""",
        )
    ]
    if watermark:
        tables.append(
            Table("watermark", "CREATE TABLE {table} (id int PRIMARY KEY, position bigint NOT NULL)")
        )
    # Its own schema per projection: several counters (one per batch size) catch up side by side in one
    # database, each from zero into empty tables.
    projection = Projection(name=name, version=1, schema=name, tables=tables, event_types=event_types)

    @projection.on_batch
    def apply(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
        if not events:
            return
        counts: dict[str, int] = {}
        last: dict[str, int] = {}
        for e in events:
            counts[e.stream_id] = counts.get(e.stream_id, 0) + 1
            last[e.stream_id] = e.position
        ctx.execute(
            """INSERT INTO {counts} AS c (stream_id, n, last_position)
               SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[])
               ON CONFLICT (stream_id) DO UPDATE
                  SET n = c.n + excluded.n,
                      last_position = greatest(c.last_position, excluded.last_position)""",
            (list(counts), list(counts.values()), list(last.values())),
        )
        if watermark:
            ctx.execute(
                """INSERT INTO {watermark} AS w (id, position) VALUES (1, %s)
                   ON CONFLICT (id) DO UPDATE SET position = greatest(w.position, excluded.position)""",
                (max(e.position for e in events),),
            )

    return projection


def open_bench_store(url: str) -> EventStore:
    # The default pool (10) is plenty: one worker uses one connection at a time, plus the heartbeat.
    return open_store(DatabaseSettings(database_url=url), url=url, migrate=False, name="ledgerflow-bench")


def stream_of(i: int, streams: int) -> str:
    return f"order-{i % streams}"


def load_ledgerflow(store: EventStore, payloads: Sequence[Payload], streams: int) -> None:
    # Interleaved over the streams, as a busy system's global log would be.
    store.import_events(
        (stream_of(i, streams), NewEvent(p.type, dict(p.data), dict(p.metadata)))
        for i, p in enumerate(payloads)
    )


def ledgerflow_catch_up(store: EventStore, name: str, batch_size: int, expected: int) -> float:
    """Seconds for a fresh counter projection to catch up from zero over the whole log."""
    projection = counter_projection(name)
    # run_until_caught_up does not start the heartbeat thread, and batches check (not renew) the lease,
    # so the lease must outlive the catch-up: a long TTL instead of a heartbeat.
    settings = WorkerSettings(batch_size=batch_size, lease_ttl=3600.0)
    worker = ProjectorWorker(store, [projection], settings)
    start = time.perf_counter()
    worker.run_until_caught_up(timeout=1800.0)
    elapsed = time.perf_counter() - start
    worker.release_all()
    with store.pool.connection() as conn:
        row = conn.execute(f'SELECT coalesce(sum(n), 0)::bigint FROM "{name}".counts').fetchone()
    counted = int(row[0]) if row else 0
    if counted != expected:
        # A fast wrong answer is not a result.
        raise RuntimeError(f"{name}: counted {counted} events, expected {expected}")
    return elapsed


# -- the raw read baseline -------------------------------------------------------------------------

# The same columns read_all returns (so the same jsonb decoding, uuid and timestamptz parsing happen), in
# plain keyset pages by position: the cheapest correct-looking way to stream a table into Python.
RAW_READ = """
SELECT position, transaction_id::text::bigint, tenant, stream_id, stream_version, event_id, event_type,
       data, metadata, correlation_id, causation_id, recorded_at
  FROM ledgerflow.events
 WHERE position > %s
 ORDER BY position
 LIMIT %s
"""


def raw_read(url: str, page: int) -> tuple[int, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        after, total = 0, 0
        while True:
            rows = conn.execute(RAW_READ, (after, page)).fetchall()
            total += len(rows)
            if len(rows) < page:
                break
            after = rows[-1][0]
        return total, time.perf_counter() - start


# -- eventsourcing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EsKit:
    """eventsourcing's classes for this benchmark, built on first use so the module imports without it."""

    app_class: type[Any]
    order_class: type[Any]
    projection_class: type[Any]
    view_class: type[Any]
    runner_class: type[Any]


_ES_KIT: EsKit | None = None


def es_kit() -> EsKit:
    """The eventsourcing application, aggregate, projection and materialised view, written the way its
    documentation (docs/topics/projection.rst) writes them: a Projection whose process_event calls a
    command on a PostgresTrackingRecorder subclass, which updates the view and inserts the tracking
    record in one transaction."""
    global _ES_KIT
    if _ES_KIT is not None:
        return _ES_KIT
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event
    from eventsourcing.persistence import Tracking
    from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
    from eventsourcing.projection import Projection as EsProjection
    from eventsourcing.projection import ProjectionRunner
    from psycopg.sql import SQL, Identifier

    class BenchApp(Application[uuid.UUID]):
        pass

    class Order(Aggregate):
        # The payload rides in the events, as in ledgerflow (data and metadata dicts, JSON-encoded).
        def __init__(self, kind: str, data: dict[str, Any], metadata: dict[str, Any]) -> None:
            self.events = 1

        @event("Recorded")
        def record(self, kind: str, data: dict[str, Any], metadata: dict[str, Any]) -> None:
            self.events += 1

    class CountsView(PostgresTrackingRecorder):
        def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
            super().__init__(datastore, **kwargs)
            self.counts = Identifier(self.datastore.schema, f"{self.tracking_table_name}_counts")
            self.sql_create_statements.append(
                SQL(
                    "CREATE TABLE IF NOT EXISTS {0} (stream_id uuid PRIMARY KEY, n bigint NOT NULL, "
                    "last_position bigint NOT NULL)"
                ).format(self.counts)
            )
            self.upsert = SQL(
                "INSERT INTO {0} AS c (stream_id, n, last_position) VALUES (%s, 1, %s) "
                "ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, last_position = excluded.last_position"
            ).format(self.counts)

        def count(self, stream_id: uuid.UUID, tracking: Tracking) -> None:
            with self.datastore.transaction(commit=True) as curs:
                self._insert_tracking(curs, tracking)
                curs.execute(self.upsert, (stream_id, tracking.notification_id), prepare=True)

    class Counter(EsProjection[CountsView]):
        name = "counter"

        def process_event(self, domain_event: Any, tracking: Tracking) -> None:
            self.view.count(domain_event.originator_id, tracking)

    _ES_KIT = EsKit(BenchApp, Order, Counter, CountsView, ProjectionRunner)
    return _ES_KIT


def es_env(url: str, schema: str) -> dict[str, str]:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(info.get("dbname", "")),
        "POSTGRES_HOST": str(info.get("host", "127.0.0.1")),
        "POSTGRES_PORT": str(info.get("port", "5432")),
        "POSTGRES_USER": str(info.get("user", "postgres")),
        "POSTGRES_PASSWORD": str(info.get("password", "")),
        "POSTGRES_SCHEMA": schema,
    }


def es_status() -> str | None:
    """None when eventsourcing's PostgreSQL support is importable, else why not."""
    try:
        es_kit()
    except ImportError as exc:
        return f"not measured: {exc} (install with `pip install -e '.[bench]'`)"
    return None


def load_es(url: str, payloads: Sequence[Payload], streams: int) -> int:
    """Load the same events into eventsourcing's recorder; return the last notification id.

    Rounds of one event per aggregate, each round one app.save of all aggregates (one insert_events
    transaction of `streams` events): the same interleaving over streams as the ledgerflow import, in
    about as many transactions as a bulk load can get away with in eventsourcing (it has no COPY path).
    """
    kit = es_kit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ES_SCHEMA}")
    app = kit.app_class(env=es_env(url, ES_SCHEMA))
    try:
        aggregates: list[Any] = []
        last = 0
        for start in range(0, len(payloads), streams):
            chunk = payloads[start : start + streams]
            for k, p in enumerate(chunk):
                if len(aggregates) <= k:
                    aggregates.append(kit.order_class(p.type, dict(p.data), dict(p.metadata)))
                else:
                    aggregates[k].record(p.type, dict(p.data), dict(p.metadata))
            recordings = app.save(*aggregates[: len(chunk)])
            last = recordings[-1].notification.id
        return last
    finally:
        app.close()


def es_catch_up(url: str, last_id: int, seconds: float) -> tuple[int, float]:
    """(events processed, seconds) for eventsourcing's ProjectionRunner from zero: until it has processed
    `last_id`, or for `seconds` if that is > 0 (its per-event cost does not change along the log)."""
    kit = es_kit()
    env = es_env(url, ES_SCHEMA)
    start = time.perf_counter()
    runner = kit.runner_class(
        application_class=kit.app_class,
        projection_class=kit.projection_class,
        view_class=kit.view_class,
        env=env,
    )
    with runner:
        view = runner.projection.view
        app_name = runner.app_name
        table = f"{ES_SCHEMA}.{kit.projection_class.name.lower()}_tracking"
        done = 0
        while True:
            # Our own 10 ms poll, not runner.wait(): its backoff grows to 800 ms and would blur the end.
            done = view.max_tracking_id(app_name) or 0
            elapsed = time.perf_counter() - start
            if done >= last_id or (seconds > 0 and elapsed >= seconds):
                break
            runner.run_forever(timeout=0.01)  # also re-raises an error of the processing thread
    # The runner went on processing until it stopped: check the counts against its final tracking record,
    # both read in one statement (one snapshot).
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT (SELECT notification_id FROM {table} WHERE application_name = %s), "
            f"(SELECT coalesce(sum(n), 0)::bigint FROM {table}_counts)",
            (app_name,),
        ).fetchone()
    if row is None or row[0] != row[1] or row[0] < done:
        raise RuntimeError(f"eventsourcing: tracking and counts disagree: {row}")
    return done, elapsed


# -- latency ---------------------------------------------------------------------------------------


@dataclass
class Observer:
    """Polls a high-water mark every `interval` seconds on its own connection, recording when each value
    was first seen."""

    url: str
    query: str
    params: tuple[Any, ...] = ()
    interval: float = 0.001
    times: list[float] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    try:
                        row = conn.execute(self.query, self.params, prepare=True).fetchone()
                    except psycopg.errors.UndefinedTable:
                        # The projector creates its tables when it takes the lease, maybe after we start.
                        row = None
                    # The time after the answer arrived: an upper bound on when the value became visible.
                    seen = time.perf_counter()
                    mark = int(row[0]) if row and row[0] is not None else 0
                    if not self.marks or mark > self.marks[-1]:
                        self.times.append(seen)
                        self.marks.append(mark)
                    time.sleep(self.interval)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def visible_at(self, position: int) -> float | None:
        """When a mark >= position was first seen (marks only grow: one appender, commit order = position
        order for the measured events, and the projection's high-water mark only moves forward)."""
        i = bisect.bisect_left(self.marks, position)
        return self.times[i] if i < len(self.marks) else None


# The oldest transaction holding the log's safe horizon back (ledgerflow.log_holders: writers of this
# database's log, or a transaction that ended just as it was looked at), other than the benchmark's own
# one-statement appends, whose commit is part of the latency measured. Transactions that do not write the
# log, here or in any other database of the server, are never among them.
LOG_HOLDERS = """
SELECT extract(epoch FROM clock_timestamp() - a.xact_start)::float8, a.backend_xid::text,
       coalesce(a.datname, ''), coalesce(a.application_name, ''), left(coalesce(a.query, ''), 60)
  FROM pg_stat_activity a
  JOIN ledgerflow.log_holders() AS h ON h::xid = a.backend_xid
 WHERE a.pid <> pg_backend_pid() AND a.application_name IS DISTINCT FROM 'ledgerflow-bench'
 ORDER BY a.xact_start
 LIMIT 1
"""
#: A holder at least this old when seen counts as a disturbance.
HELD_AFTER = 0.010


@dataclass
class HorizonWatch:
    """Records the intervals during which a transaction held the log's safe horizon back for
    `HELD_AFTER` or more: a writer of the log, other than the benchmark's one-statement appends, that
    kept its transaction open. The report shows latencies with and without the samples they overlap, so
    a reader can tell the projector's own latency from the writers'."""

    conn: psycopg.Connection[Any]
    interval: float = 0.005
    held: list[tuple[float, float]] = field(default_factory=list)
    #: xid -> (longest age seen in seconds, "database application: query")
    holders: dict[str, tuple[float, str]] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: Set if the watch stopped early (e.g. the server dropped its connection); see `overlaps`.
    lost_at: float | None = None

    def run(self) -> None:
        try:
            with self.conn:
                while not self.stopping.is_set():
                    row = self.conn.execute(LOG_HOLDERS, prepare=True).fetchone()
                    now = time.perf_counter()
                    if row is not None and float(row[0]) >= HELD_AFTER:
                        age = float(row[0])
                        # Held from its start until at least now, and maybe until just before the next poll.
                        self.held.append((now - age, now + self.interval))
                        self.holders[row[1]] = (age, f"{row[2]} {row[3]}: {row[4]}".strip())
                    time.sleep(self.interval)
        except psycopg.Error:
            self.lost_at = time.perf_counter()

    def overlaps(self, start: float, end: float) -> bool:
        # Unwatched time counts as disturbed: "undisturbed" must mean "seen to be undisturbed".
        if self.lost_at is not None and end > self.lost_at:
            return True
        return any(a < end and b > start for a, b in self.held)


@dataclass(frozen=True)
class Sample:
    ms: float
    #: A transaction held the log's horizon back while this event waited.
    disturbed: bool


def paced(rate: float, seconds: float, append: Callable[[int], int]) -> list[tuple[int, float]]:
    """Call `append(i)` at `rate` per second for `seconds`, on an absolute schedule (a slow append does not
    push the later ones back, so the offered load stays steady); return (position, completion time)."""
    out: list[tuple[int, float]] = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        position = append(i)
        out.append((position, time.perf_counter()))
    return out


def wait_for(
    observer: Observer, position: int, timeout: float, *, url: str, worker: threading.Thread
) -> None:
    deadline = time.perf_counter() + timeout
    while observer.visible_at(position) is None:
        if observer.error is not None:
            raise observer.error
        if not worker.is_alive():
            raise RuntimeError(f"the projector thread {worker.name} died (its traceback is above)")
        if time.perf_counter() > deadline:
            # Say who held the horizon back, if anyone did.
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(LOG_HOLDERS).fetchone()
            raise TimeoutError(
                f"position {position} not projected within {timeout}s; oldest holder of the log: {row}"
            )
        time.sleep(0.005)


def latencies(
    observer: Observer, watch: HorizonWatch, appended: Sequence[tuple[int, float]], warmup: int
) -> list[Sample]:
    """From each append's completion to the first poll that saw it projected."""
    out = []
    for position, done in appended[warmup:]:
        seen = observer.visible_at(position)
        if seen is None:
            raise RuntimeError(f"position {position} never became visible")
        # A poll can see the event before the appender thread reads the clock (thread scheduling): 0 then.
        out.append(Sample(max(0.0, seen - done) * 1000, watch.overlaps(done, seen)))
    return out


#: Every horizon holder seen by any watch in this process: xid -> (longest age, description).
HOLDERS_SEEN: dict[str, tuple[float, str]] = {}


def start_watching(url: str) -> tuple[HorizonWatch, threading.Thread]:
    # Connect here, before the timed appends, retrying: on a shared server max_connections runs out at
    # times, and a watch that silently never started would call every sample undisturbed.
    for attempt in range(10):
        try:
            conn = psycopg.connect(url, autocommit=True)
            break
        except psycopg.OperationalError:
            if attempt == 9:
                raise
            time.sleep(1.0)
    watch = HorizonWatch(conn)
    thread = threading.Thread(target=watch.run, name="bench-horizon-watch", daemon=True)
    thread.start()
    return watch, thread


def stop_watching(watch: HorizonWatch, thread: threading.Thread) -> None:
    watch.stopping.set()
    thread.join(timeout=10)
    HOLDERS_SEEN.update(watch.holders)


@dataclass
class UnrelatedTransactions:
    """Keeps a transaction that never touches the log open on each connection of `work` (a URL and the
    statement the transaction runs), each for `hold` seconds, then commits it and begins the next at once,
    until stopped: what a long report, a batch job or a CREATE DATABASE elsewhere on the server looks like
    to the log. Each statement leaves its transaction holding an xid: a transaction without one never held
    any horizon back."""

    work: Sequence[tuple[str, str]]
    hold: float
    #: Set once every transaction holds its xid.
    opened: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            conns = [
                (psycopg.connect(url, application_name="bench-unrelated"), stmt) for url, stmt in self.work
            ]
            try:
                while not self.stopping.is_set():
                    for conn, stmt in conns:
                        conn.execute(stmt.encode())
                    self.opened.set()
                    self.stopping.wait(self.hold)  # holding the transactions open is the point
                    for conn, _ in conns:
                        conn.commit()
            finally:
                for conn, _ in conns:
                    conn.close()
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.opened.set()


@dataclass(frozen=True)
class LatencyRun:
    """One run's latency samples: quiet, then with unrelated long transactions open."""

    quiet: list[Sample]
    unrelated: list[Sample]


def ledgerflow_latency(
    url: str, admin_url: str, rate: float, seconds: float, batch_size: int, warmup: int, hold: float
) -> LatencyRun:
    name = "bench_latency"
    # event_types: the probe projection skips the bulk-loaded log in one read instead of projecting it.
    projection = counter_projection(name, watermark=True, event_types=[LATENCY_EVENT])
    # Appender and projector in separate stores (pools, notifier), as two services would be.
    appender = open_bench_store(url)
    projector_store = open_bench_store(url)
    worker = ProjectorWorker(projector_store, [projection], WorkerSettings(batch_size=batch_size))
    observer = Observer(url, f"SELECT max(position) FROM {name}.watermark")
    threads = [
        threading.Thread(target=worker.run, name="bench-projector", daemon=True),
        threading.Thread(target=observer.run, name="bench-observer", daemon=True),
    ]
    try:
        for t in threads:
            t.start()

        def append(i: int) -> int:
            result = appender.append(
                f"probe-{i % 50}", [NewEvent(LATENCY_EVENT, {"i": i, "sent_at": time.time()})]
            )
            return result.last_position

        # Ready when a first probe has gone all the way through (lease taken, tables made, listener up).
        wait_for(observer, append(-1), timeout=WAIT, url=url, worker=threads[0])
        watch, watching = start_watching(url)
        try:
            appended = paced(rate, seconds, append)
            wait_for(observer, appended[-1][0], timeout=WAIT, url=url, worker=threads[0])
            quiet = latencies(observer, watch, appended, warmup)
            # The same again with unrelated long transactions open: one in another database of the server
            # (the admin URL's), one in this database writing a table beside the log.
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS public.bench_unrelated (n int)")
            unrelated = UnrelatedTransactions(
                [
                    (admin_url, "SELECT pg_current_xact_id()"),
                    (url, "INSERT INTO public.bench_unrelated VALUES (1)"),
                ],
                hold,
            )
            holder = threading.Thread(target=unrelated.run, name="bench-unrelated", daemon=True)
            holder.start()
            try:
                unrelated.opened.wait()
                if unrelated.error is not None:
                    raise unrelated.error
                appended = paced(rate, seconds, append)
                wait_for(observer, appended[-1][0], timeout=WAIT, url=url, worker=threads[0])
            finally:
                unrelated.stopping.set()
                holder.join(timeout=10)
            if unrelated.error is not None:
                raise unrelated.error
            return LatencyRun(quiet, latencies(observer, watch, appended, warmup))
        finally:
            stop_watching(watch, watching)
    finally:
        observer.stopping.set()
        worker.stop()
        for t in threads:
            t.join(timeout=10)
        # worker.run() does not join its LISTEN thread, which notices the stop within 0.5 s; wait for it,
        # or dropping the database kills its connection and it logs a warning into the results.
        for t in threading.enumerate():
            if t.name == "projector-listener":
                t.join(timeout=5)
        appender.close()
        projector_store.close()


def es_latency(url: str, rate: float, seconds: float, warmup: int) -> list[Sample]:
    """The same for eventsourcing, on its own (empty) application log, so its runner starts caught up."""
    kit = es_kit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ES_LATENCY_SCHEMA}")
    env = es_env(url, ES_LATENCY_SCHEMA)
    runner = kit.runner_class(
        application_class=kit.app_class,
        projection_class=kit.projection_class,
        view_class=kit.view_class,
        env=env,
    )
    with runner:
        # The appender is a separate application object, as a separate service would be.
        app = kit.app_class(env=env)
        table = f"{ES_LATENCY_SCHEMA}.{kit.projection_class.name.lower()}_tracking"
        observer = Observer(
            url, f"SELECT max(notification_id) FROM {table} WHERE application_name = %s", (runner.app_name,)
        )
        thread = threading.Thread(target=observer.run, name="bench-es-observer", daemon=True)
        thread.start()
        orders: list[Any] = []
        try:

            def append(i: int) -> int:
                k = i % 50
                data = {"i": i, "sent_at": time.time()}
                if k >= len(orders) or i < 0:
                    order = kit.order_class(LATENCY_EVENT, data, {})
                    if i >= 0:
                        orders.append(order)
                else:
                    order = orders[k]
                    order.record(LATENCY_EVENT, data, {})
                return int(app.save(order)[-1].notification.id)

            # A private attribute, read only to notice if the processing thread dies.
            processing = runner._processing_thread
            wait_for(observer, append(-1), timeout=WAIT, url=url, worker=processing)
            watch, watching = start_watching(url)
            try:
                appended = paced(rate, seconds, append)
                wait_for(observer, appended[-1][0], timeout=WAIT, url=url, worker=processing)
            finally:
                stop_watching(watch, watching)
            return latencies(observer, watch, appended, warmup)
        finally:
            observer.stopping.set()
            thread.join(timeout=10)
            app.close()


# -- running and reporting ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    events: int
    streams: int
    batch_sizes: tuple[int, ...]
    es_seconds: float
    rate: float
    seconds: float
    warmup: int
    with_es: bool
    es_latency: bool
    unrelated_hold: float


@dataclass
class Results:
    #: batch size -> events/s, one per run
    ledgerflow: dict[int, list[float]] = field(default_factory=dict)
    raw: dict[int, list[float]] = field(default_factory=dict)
    es: list[float] = field(default_factory=list)
    es_events: list[int] = field(default_factory=list)
    #: batch size -> per-run ratios
    to_raw: dict[int, list[float]] = field(default_factory=dict)
    to_es: dict[int, list[float]] = field(default_factory=dict)
    #: per run: latency samples
    lf_latency: list[list[Sample]] = field(default_factory=list)
    #: per run: latency samples of the same run with unrelated long transactions open
    lf_latency_unrelated: list[list[Sample]] = field(default_factory=list)
    es_latency: list[list[Sample]] = field(default_factory=list)
    latency_batch: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    #: per run: seconds waited for foreign transactions to release the horizon before timing catch-ups
    horizon_waits: list[float] = field(default_factory=list)


def vacuum(url: str) -> None:
    """VACUUM ANALYZE after the loads: sets hint bits and the visibility map now rather than during the
    first timed read (which would otherwise pay for writing every page back), and gives the planner
    statistics; autovacuum would do the same at a random moment inside a measurement."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def wait_below_horizon(store: EventStore, timeout: float = 600.0) -> float:
    """Wait until every loaded event is below the log's horizon; return the seconds waited.

    ledgerflow reads only below the horizon, which writers of the log hold back (and, for one read, a
    transaction that ends just as the horizon is computed). Only the import writes this log, so this
    returns at once unless something else writes to it; kept so that a catch-up is never timed across a
    wait. The horizon only moves forward, so once all events are below it, nothing can stall the catch-up.
    """
    start = time.perf_counter()
    while store.events_beyond_horizon():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(
                f"the loaded events stayed beyond the horizon for {timeout}s: {store.horizon()}"
            )
        time.sleep(0.05)
    return time.perf_counter() - start


def one_run(admin_url: str, run: int, payloads: Sequence[Payload], s: Settings, results: Results) -> None:
    with fresh_database(admin_url) as url:
        migrate(url)
        store = open_bench_store(url)
        try:
            load_ledgerflow(store, payloads, s.streams)
            es_last = load_es(url, payloads, s.streams) if s.with_es else 0
            vacuum(url)
            results.horizon_waits.append(wait_below_horizon(store))

            # Rotate the order of the catch-ups per run, so drift does not always land on the same one.
            order: list[int | str] = [*s.batch_sizes, "eventsourcing"] if s.with_es else [*s.batch_sizes]
            shift = run % len(order)
            lf_rates: dict[int, float] = {}
            es_rate: float | None = None
            for item in order[shift:] + order[:shift]:
                gc.collect()  # start each timed section with the same (empty) young generations
                if isinstance(item, int):
                    read, seconds = raw_read(url, item)
                    assert read == s.events, (read, s.events)
                    results.raw.setdefault(item, []).append(read / seconds)
                    seconds = ledgerflow_catch_up(store, f"bench_count_{item}", item, s.events)
                    lf_rates[item] = s.events / seconds
                    results.ledgerflow.setdefault(item, []).append(lf_rates[item])
                    results.to_raw.setdefault(item, []).append(lf_rates[item] / results.raw[item][-1])
                else:
                    try:
                        done, seconds = es_catch_up(url, es_last, s.es_seconds)
                    except Exception as exc:
                        results.failures[f"eventsourcing catch-up, run {run + 1}"] = (
                            f"{type(exc).__name__}: {exc}"
                        )
                        continue
                    es_rate = done / seconds
                    results.es.append(es_rate)
                    results.es_events.append(done)
            if es_rate:
                for b, rate in lf_rates.items():
                    results.to_es.setdefault(b, []).append(rate / es_rate)
        finally:
            store.close()

        # Latency with the batch size that won the catch-up so far (the default to recommend).
        best = best_batch(results) or s.batch_sizes[0]
        results.latency_batch = best
        # A failed latency run (e.g. a neighbour's transaction holding the horizon past WAIT) is reported,
        # not fatal: the catch-up results of the run stand.
        try:
            measured = ledgerflow_latency(url, admin_url, s.rate, s.seconds, best, s.warmup, s.unrelated_hold)
            results.lf_latency.append(measured.quiet)
            results.lf_latency_unrelated.append(measured.unrelated)
        except Exception as exc:
            results.failures[f"ledgerflow latency, run {run + 1}"] = f"{type(exc).__name__}: {exc}"
        if s.with_es and s.es_latency:
            try:
                results.es_latency.append(es_latency(url, s.rate, s.seconds, s.warmup))
            except Exception as exc:
                results.failures[f"eventsourcing latency, run {run + 1}"] = f"{type(exc).__name__}: {exc}"


def best_batch(results: Results) -> int | None:
    if not results.ledgerflow:
        return None
    return max(results.ledgerflow, key=lambda b: median(results.ledgerflow[b]))


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(results: Results, s: Settings) -> None:
    best = best_batch(results)
    print("(1) Catch-up from zero, counter projection (events/s; medians over runs)")
    headers = ["batch", "raw read ev/s", "ledgerflow ev/s", "ledgerflow/raw", "ledgerflow/eventsourcing"]
    rows = []
    for b in s.batch_sizes:
        rows.append(
            [
                f"{b}{' (best)' if b == best else ''}",
                fmt_rate(median(results.raw[b])) if b in results.raw else "-",
                fmt_rate(median(results.ledgerflow[b])) if b in results.ledgerflow else "-",
                fmt_ratio(results.to_raw.get(b, [])),
                fmt_ratio(results.to_es.get(b, [])),
            ]
        )
    print_table(headers, rows)
    if results.es:
        how = "the whole log" if s.es_seconds <= 0 else f"its first {s.es_seconds:g} s from zero"
        print(
            f"eventsourcing ProjectionRunner: {fmt_rate(median(results.es))} ev/s "
            f"(per run: {', '.join(fmt_rate(r) for r in results.es)}; {how}, "
            f"{', '.join(str(n) for n in results.es_events)} events processed)"
        )
    if any(w > 0.1 for w in results.horizon_waits):
        print(
            "Before timing, waited for writers of the log to release the horizon: "
            + ", ".join(f"{w:.1f} s" for w in results.horizon_waits)
        )
    if best is not None:
        rate = median(results.ledgerflow[best])
        print(
            f"\nBest batch size: {best} (ledgerflow default WorkerSettings.batch_size is "
            f"{WorkerSettings().batch_size})"
        )
        print(
            f"  ledgerflow catch-up        {fmt_rate(rate)} ev/s   target >= {THROUGHPUT_TARGET:,.0f}  "
            f"{verdict(rate >= THROUGHPUT_TARGET)}"
        )
        print(f"  ledgerflow / raw read      {fmt_ratio(results.to_raw.get(best, []))}")
        if results.to_es.get(best):
            ratio = median(results.to_es[best])
            print(
                f"  ledgerflow / eventsourcing {fmt_ratio(results.to_es[best])}   "
                f"target >= {ES_RATIO_TARGET:g}x  {verdict(ratio >= ES_RATIO_TARGET)}"
            )

    print(
        f"\n(2) Append-to-projected latency: {s.rate:g} single-event appends/s for {s.seconds:g} s, "
        f"first {s.warmup} appends per run not counted; ms from append returned to visible in the projection"
    )
    headers = [
        "system",
        "samples",
        "n",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "p99 per run",
        "target",
        "verdict",
    ]
    rows = []
    disturbed_any = False
    unrelated_label = f"ledgerflow, unrelated {s.unrelated_hold:g} s transactions open"
    targets = {"ledgerflow": P99_TARGET_MS, unrelated_label: UNRELATED_P99_TARGET_MS}
    for name, per_run in (
        ("ledgerflow", results.lf_latency),
        (unrelated_label, results.lf_latency_unrelated),
        ("eventsourcing", results.es_latency),
    ):
        if not per_run:
            continue
        label = name + (f" (batch {results.latency_batch})" if name == "ledgerflow" else "")
        target = targets.get(name)
        for which in ("all", "undisturbed"):
            runs = [[x.ms for x in r if which == "all" or not x.disturbed] for r in per_run]
            pooled = [x for r in runs for x in r]
            if not pooled:
                continue
            disturbed_any |= which == "all" and any(x.disturbed for r in per_run for x in r)
            p99 = pct(pooled, 0.99)
            rows.append(
                [
                    label if which == "all" else "",
                    which,
                    str(len(pooled)),
                    f"{pct(pooled, 0.50):.1f}",
                    f"{pct(pooled, 0.90):.1f}",
                    f"{p99:.1f}",
                    f"{max(pooled):.1f}",
                    " ".join(f"{pct(r, 0.99):.1f}" if r else "-" for r in runs),
                    f"< {target:g}" if target is not None else "-",
                    verdict(p99 < target) if target is not None else "-",
                ]
            )
    if rows:
        print_table(headers, rows)
    else:
        print("no latency run completed")
    print(
        "Percentiles over all runs' samples pooled; the observer polls every 1 ms, so values are upper "
        "bounds by up to ~1 ms plus one poll round trip.\n"
        f"undisturbed: without the samples during which a transaction held the log's safe horizon back for "
        f">= {HELD_AFTER * 1000:g} ms\n(a writer of the log; ledgerflow's read_all reads only below the "
        "horizon; eventsourcing is not affected by design).\n"
        f"{unrelated_label}: the same runs, right after the quiet appends, with a transaction holding an xid "
        "open in another\ndatabase of the server and one writing a table beside the log in the benchmark's "
        f"database, each for {s.unrelated_hold:g} s and begun again at once."
    )
    quiet = [x.ms for r in results.lf_latency for x in r]
    loaded = [x.ms for r in results.lf_latency_unrelated for x in r]
    if quiet and loaded:
        p99 = pct(loaded, 0.99)
        print(
            f"Unrelated long transactions open: p50 {pct(quiet, 0.50):.1f} -> {pct(loaded, 0.50):.1f} ms, "
            f"p99 {pct(quiet, 0.99):.1f} -> {p99:.1f} ms (same runs); target p99 < "
            f"{UNRELATED_P99_TARGET_MS:g} ms  {verdict(p99 < UNRELATED_P99_TARGET_MS)}"
        )
    if disturbed_any or HOLDERS_SEEN:
        longest = sorted(HOLDERS_SEEN.values(), reverse=True)[:5]
        print(
            f"Transactions seen holding the log's horizon during the latency runs: {len(HOLDERS_SEEN)}; "
            "longest:"
        )
        for age, what in longest:
            print(f"  {age * 1000:7.0f} ms  {what}")
    for what, message in results.failures.items():
        print(f"\n{what} failed: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh database (default 3)")
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="server; a database is created and dropped per run"
    )
    parser.add_argument("--events", type=int, default=100_000, help="events bulk-loaded for catch-up")
    parser.add_argument("--streams", type=int, default=1000, help="streams the events are spread over")
    parser.add_argument("--batch-sizes", default="500,1000,2000", help="ledgerflow batch sizes to try")
    parser.add_argument(
        "--es-seconds",
        type=float,
        default=15.0,
        help="eventsourcing catch-up time box in seconds (0: the whole log)",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="(2) appends per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="(2) seconds of appending")
    parser.add_argument("--warmup", type=int, default=100, help="(2) first appends per run not counted")
    parser.add_argument("--no-eventsourcing", action="store_true", help="skip eventsourcing entirely")
    parser.add_argument("--no-es-latency", action="store_true", help="skip eventsourcing's latency run")
    parser.add_argument(
        "--unrelated-hold",
        type=float,
        default=5.0,
        help="(2) seconds each unrelated transaction stays open in the second latency phase",
    )
    args = parser.parse_args(argv)
    quiet()

    problem = "skipped (--no-eventsourcing)" if args.no_eventsourcing else es_status()
    s = Settings(
        events=args.events,
        streams=args.streams,
        batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")),
        es_seconds=args.es_seconds,
        rate=args.rate,
        seconds=args.seconds,
        warmup=args.warmup,
        with_es=problem is None,
        es_latency=not args.no_es_latency,
        unrelated_hold=args.unrelated_hold,
    )
    with psycopg.connect(args.url) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
            "current_setting('shared_buffers')"
        ).fetchone()
    server = f"PostgreSQL {row[0]} (synchronous_commit={row[1]}, shared_buffers={row[2]})" if row else "?"
    print(f"{server}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, psycopg {psycopg.__version__}")
    print(
        "eventsourcing: "
        + (
            problem
            or f"{importlib.metadata.version('eventsourcing')}, ProjectionRunner + "
            "PostgresTrackingRecorder view, one transaction per event"
        )
    )
    print(
        f"{args.runs} runs, each on a fresh database; {s.events:,} events over {s.streams} streams, "
        "payload ~150 B data + ~50 B metadata\n",
        flush=True,
    )

    payloads = make_payloads(s.events, seed=1)
    # The payloads (about a million small objects) stay alive for the loads of every run. Left in the
    # collector's care, every full collection during a timed section would walk them all (measured: raw
    # reads ~25% slower), a cost no real projector process has. Frozen, the collector skips them.
    gc.collect()
    gc.freeze()
    results = Results()
    started = time.perf_counter()
    for run in range(args.runs):
        t0 = time.perf_counter()
        try:
            one_run(args.url, run, payloads, s, results)
        except (psycopg.OperationalError, TimeoutError) as exc:
            # The server is shared: a run can lose a connection (max_connections) or wait out a neighbour.
            # Report it and go on; the medians come from the runs that completed.
            results.failures[f"run {run + 1}"] = f"{type(exc).__name__}: {exc}"
            print(
                f"run {run + 1}/{args.runs} FAILED after {time.perf_counter() - t0:.1f}s: {exc}", flush=True
            )
            continue
        print(f"run {run + 1}/{args.runs} done in {time.perf_counter() - t0:.1f}s", flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    # The load average says how busy the machine was: other work on the same server moves the latencies.
    print(f"\nTotal {time.perf_counter() - started:.0f}s; load average at the end (1, 5, 15 min): {load}\n")
    report(results, s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
