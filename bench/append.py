"""Append throughput of ledgerflow against a plain table written by raw psycopg, and against eventsourcing.

Run by hand (it is not a test):

    python bench/append.py [--runs 5] [--workloads abced] [--url postgresql://postgres@127.0.0.1:5432/postgres]

Five workloads, each measured for every system in every run, the systems in rotating order:

  (a) one event per append, one connection, sequential appends;
  (b) 8 connections (threads) appending concurrently, each to its own streams, one event per append;
  (c) 100 events per append, one connection;
  (e) 100 events per append, 8 connections;
  (d) a bulk import of 100k events (ledgerflow: EventStore.import_events; raw: COPY).

The headline baseline is `plain`: what a user would write instead of ledgerflow. One ordinary table,
`bench_plain.events`, with the log's columns, defaults, identity, generated column and checks and every
index the log keeps (position, resume order, the unique stream version, the unique (tenant, event_id) that
the partitioned log holds in ledgerflow.event_ids), no partitions and no triggers, written through
psycopg's ordinary `execute` on connections held for the whole run, stream versions computed by the
client. `plain-executemany` writes batches to another such table with `executemany` in a transaction, the
obvious way (the batch target is set against it); `plain` writes them with one INSERT ... SELECT FROM
unnest, the fastest plain SQL measured here.

The second line is `twin`: the same raw psycopg into a twin of the partitioned log (`bench_twin.events`:
same partitions, indexes and event-id trigger). ledgerflow/twin isolates what ledgerflow's client and
statements add; twin/plain is what the partitioned log itself costs. ledgerflow's appending threads hold
pool connections (eventstore/pinning.py) and send one-event appends through libpq directly
(eventstore/direct.py): the bench measures the store as a user gets it. Absolute numbers on a shared machine
drift; the ratios are taken per run and the median over runs is reported. Results are printed and written
to bench/results/append-<UTC time>.json with the commit and the load average.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from eventstore import DatabaseSettings, EventStore, NewEvent, open_store
from eventstore.migrate import migrate

if __package__ in (None, ""):
    # Run as `python bench/append.py`: make the repository root importable so `bench._common` resolves
    # the same way as under `python -m bench.append`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Payload,
    ServerCpu,
    create_plain_table,
    create_twin_table,
    default_admin_url,
    dump_json,
    fmt_rate,
    fmt_ratio,
    fresh_database,
    load_average,
    make_payloads,
    median,
    print_table,
    quiet_logs,
)

TENANT = "default"
RESULTS = Path(__file__).resolve().parent / "results"
#: The headline baseline: a plain table, what a user would write instead (bench._common.create_plain_table).
PLAIN_SCHEMA = "bench_plain"
#: The same plain table again, for the batches written with executemany.
EXECUTEMANY_SCHEMA = "bench_plain_em"
#: The second line: the partitioned log's twin with its event-id trigger (bench._common.create_twin_table).
TWIN_SCHEMA = "bench_twin"
ES_SCHEMA = "bench_es"
# Events per insert_events call in eventsourcing's bulk import (see EventsourcingSystem.bulk).
ES_BULK_CHUNK = 10_000

# -- raw psycopg -------------------------------------------------------------------------------------

_RAW_COLUMNS = (
    "tenant, stream_id, stream_version, event_id, event_type, data, metadata, correlation_id, causation_id"
)


@dataclass(frozen=True)
class RawQueries:
    """The plain SQL a user would write, aimed at one table."""

    #: (a), (b), and each row of an executemany batch: one plain INSERT per event.
    one: str
    #: (c), (e): one INSERT ... SELECT FROM unnest(arrays) per append: one statement, one round trip,
    #: one transaction. The arrays go in binary (%b): psycopg then sends them without quoting every
    #: element, which JSON text (full of '"') otherwise needs, one regex substitution per element in
    #: Python. Of the plain-SQL ways to write 100 rows this was the fastest when measured here (events/s,
    #: medians of 9 x 4000 events: unnest of binary arrays 10.7k, executemany in a transaction 7.6k,
    #: multi-row VALUES 7.1k, unnest of text arrays 5.8k); executemany, the obvious way, is measured too.
    many: str
    #: (d): COPY, the fastest way into PostgreSQL, with the same columns ledgerflow's import copies.
    copy: str

    @classmethod
    def on(cls, schema: str) -> RawQueries:
        return cls(
            one=f"INSERT INTO {schema}.events ({_RAW_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            many=f"""
INSERT INTO {schema}.events ({_RAW_COLUMNS})
SELECT %(tenant)s, %(stream_id)s, u.v, u.e, u.t, u.d::jsonb, u.m::jsonb, NULL, NULL
  FROM unnest(%(versions)b::bigint[], %(event_ids)b::uuid[], %(types)b::text[], %(data)b::text[],
              %(metadata)b::text[]) AS u(v, e, t, d, m)
""",
            copy=f"COPY {schema}.events ({_RAW_COLUMNS}) FROM STDIN",
        )


class Session(Protocol):
    """One thread's handle on a system: appends to streams that no other session touches."""

    def append(self, stream_id: str, payloads: Sequence[Payload]) -> None: ...


class System(Protocol):
    name: str
    #: The workloads (keys) this system takes part in; empty: all of them.
    keys: str

    def sessions(self, count: int) -> list[Session]:
        """`count` sessions for `count` threads. With count 1, the system uses exactly one connection: (a),
        (c) and (d) are single-connection workloads for every system."""
        ...

    def bulk(self, rows: Sequence[tuple[str, Payload]]) -> None: ...

    def close(self) -> None: ...


class RawSession:
    def __init__(self, conn: psycopg.Connection[Any], queries: RawQueries, executemany: bool) -> None:
        self.conn = conn
        self.queries = queries
        self.executemany = executemany
        # The client knows its streams' versions (each stream is written by one session only), which is
        # the cheapest possible way to number events: no read, no lock, the unique index still guards.
        self.versions: dict[str, int] = {}

    def append(self, stream_id: str, payloads: Sequence[Payload]) -> None:
        base = self.versions.get(stream_id, 0)
        self.versions[stream_id] = base + len(payloads)
        if len(payloads) == 1 or self.executemany:
            rows = [
                (
                    TENANT,
                    stream_id,
                    base + 1 + i,
                    uuid.uuid4(),
                    p.type,
                    dump_json(p.data),
                    dump_json(p.metadata),
                    None,
                    None,
                )
                for i, p in enumerate(payloads)
            ]
            if len(rows) == 1:
                self.conn.execute(self.queries.one, rows[0])
            else:
                # executemany in a transaction: psycopg pipelines the INSERTs, one commit for the batch.
                with self.conn.transaction():
                    self.conn.cursor().executemany(self.queries.one, rows)
            return
        self.conn.execute(
            self.queries.many,
            {
                "tenant": TENANT,
                "stream_id": stream_id,
                "versions": list(range(base + 1, base + 1 + len(payloads))),
                "event_ids": [uuid.uuid4() for _ in payloads],
                "types": [p.type for p in payloads],
                "data": [dump_json(p.data) for p in payloads],
                "metadata": [dump_json(p.metadata) for p in payloads],
            },
        )


class RawSystem:
    """Plain psycopg on long-lived autocommit connections, as a user would write it, into one table."""

    def __init__(
        self, name: str, schema: str, url: str, connections: int, *, executemany: bool = False, keys: str = ""
    ) -> None:
        self.name = name
        self.keys = keys
        self.queries = RawQueries.on(schema)
        self.executemany = executemany
        # Opened (and warmed) outside the timed sections, as the pools of the other systems are.
        self.conns = [
            psycopg.connect(url, autocommit=True, application_name=f"bench-{name}")
            for _ in range(connections)
        ]

    def sessions(self, count: int) -> list[Session]:
        return [RawSession(conn, self.queries, self.executemany) for conn in self.conns[:count]]

    def bulk(self, rows: Sequence[tuple[str, Payload]]) -> None:
        versions: dict[str, int] = {}
        conn = self.conns[0]
        with conn.transaction(), conn.cursor().copy(self.queries.copy) as copy:
            for stream_id, p in rows:
                version = versions.get(stream_id, 0) + 1
                versions[stream_id] = version
                copy.write_row(
                    (
                        TENANT,
                        stream_id,
                        version,
                        uuid.uuid4(),
                        p.type,
                        dump_json(p.data),
                        dump_json(p.metadata),
                        None,
                        None,
                    )
                )

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


# -- ledgerflow -------------------------------------------------------------------------------------


class LedgerflowSession:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    def append(self, stream_id: str, payloads: Sequence[Payload]) -> None:
        # The default path a user takes: pool connection, expected version ANY, subscriber wake-up.
        self.store.append(stream_id, [NewEvent(p.type, p.data, p.metadata) for p in payloads])


class LedgerflowSystem:
    name = "ledgerflow"
    keys = ""

    def __init__(self, url: str, connections: int) -> None:
        # Two stores. `single` has the default pool (one connection opened, more only when a caller has to
        # wait), which a sequential caller never grows past one connection: the single-connection
        # workloads. `pooled` opens `connections` up front, as a deployment expecting that many concurrent
        # writers would configure it; otherwise (b) would time connection setup. One store for both would
        # be unfair to ledgerflow in (a): psycopg_pool hands out idle connections first-in first-out, so
        # sequential appends would rotate over all 8 backends and find each one's caches cold (measured:
        # about +150 us of server CPU per append against a pool of one).
        self.single = open_store(
            DatabaseSettings(database_url=url, pool_min_size=1),
            url=url,
            migrate=True,
            name="bench-ledgerflow",
        )
        # Every connection of `pooled` may be pinned by an appending thread (by default half the pool may):
        # this process does nothing but append, so no other work waits for a connection. It then uses the
        # same 8 connections as raw, each held by one thread.
        self.pooled = open_store(
            DatabaseSettings(
                database_url=url,
                pool_min_size=connections,
                pool_max_size=connections,
                pinned_connections=connections,
            ),
            url=url,
            migrate=False,
            name="bench-ledgerflow-pool",
        )

    def sessions(self, count: int) -> list[Session]:
        store = self.single if count == 1 else self.pooled
        return [LedgerflowSession(store) for _ in range(count)]

    def bulk(self, rows: Sequence[tuple[str, Payload]]) -> None:
        self.single.import_events((s, NewEvent(p.type, p.data, p.metadata)) for s, p in rows)

    def close(self) -> None:
        self.single.close()
        self.pooled.close()


# -- eventsourcing ----------------------------------------------------------------------------------


def eventsourcing_status() -> str | None:
    """None when eventsourcing's PostgreSQL persistence can be used, else why not."""
    if importlib.util.find_spec("eventsourcing") is None:
        return "eventsourcing is not installed (pip install -e '.[bench]' to measure it beside ledgerflow)"
    try:
        import eventsourcing.postgres  # noqa: F401
    except ImportError as exc:
        return f"eventsourcing is installed but its PostgreSQL persistence cannot be imported: {exc}"
    return None


def _es_state(p: Payload) -> bytes:
    # eventsourcing stores one opaque `state` per event and has no metadata column: both dicts go in, with
    # the same serialisation calls as the other systems.
    return ('{"data":' + dump_json(p.data) + ',"metadata":' + dump_json(p.metadata) + "}").encode()


class EventsourcingSession:
    def __init__(self, recorder: Any, stored_event: type[Any]) -> None:
        self.recorder = recorder
        self.stored_event = stored_event
        # eventsourcing numbers events in the client too (aggregate versions); it relies on the primary
        # key (originator_id, originator_version) for optimistic concurrency, like the raw baseline.
        self.versions: dict[str, int] = {}

    def append(self, stream_id: str, payloads: Sequence[Payload]) -> None:
        base = self.versions.get(stream_id, 0)
        self.versions[stream_id] = base + len(payloads)
        self.recorder.insert_events(
            [
                self.stored_event(
                    originator_id=stream_id, originator_version=base + 1 + i, topic=p.type, state=_es_state(p)
                )
                for i, p in enumerate(payloads)
            ]
        )


class EventsourcingSystem:
    """eventsourcing's PostgresApplicationRecorder: the recorder behind an Application, which (like
    ledgerflow) keeps a global, gap-free notification log beside the per-aggregate sequences."""

    name = "eventsourcing"
    keys = ""

    def __init__(self, url: str, connections: int) -> None:
        from eventsourcing.persistence import StoredEvent
        from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

        info = psycopg.conninfo.conninfo_to_dict(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {ES_SCHEMA}")

        def datastore(pool_size: int) -> PostgresDatastore:
            return PostgresDatastore(
                dbname=str(info.get("dbname", "")),
                host=str(info.get("host", "")),
                port=str(info.get("port", "5432")),
                user=str(info.get("user", "")),
                password=str(info.get("password", "")),
                schema=ES_SCHEMA,
                # Text ids, so it appends to the same stream names as the others.
                originator_id_type="text",
                pool_size=pool_size,
            )

        # One connection for the single-connection workloads and a pool for (b), as for ledgerflow (its
        # pool is psycopg_pool too, with the same first-in first-out rotation).
        self.datastores = [datastore(1), datastore(connections)]
        self.recorder = PostgresApplicationRecorder(self.datastores[0])
        self.recorder.create_table()
        # Created once the table and its composite type exist, so it registers the type adapters.
        self.pooled_recorder = PostgresApplicationRecorder(self.datastores[1])
        self.stored_event = StoredEvent

    def sessions(self, count: int) -> list[Session]:
        recorder = self.recorder if count == 1 else self.pooled_recorder
        return [EventsourcingSession(recorder, self.stored_event) for _ in range(count)]

    def bulk(self, rows: Sequence[tuple[str, Payload]]) -> None:
        # eventsourcing has no COPY path; its bulk write is insert_events (one INSERT ... SELECT FROM
        # unnest of a composite array, sent in psycopg pipeline mode). One call with all 100k events
        # never returns: with psycopg 3.3.9 / libpq 18, a pipelined statement carrying more than about
        # 6 MB of parameters is never completely sent (the server waits in ClientRead, the client in
        # Pipeline.sync; reproduced with a bare `select cardinality(%s::bytea[])` of 25k x 230 bytes,
        # so it is the driver, not eventsourcing). The import is therefore split into calls of
        # ES_BULK_CHUNK events, as a user would have to, which are separate transactions.
        versions: dict[str, int] = {}
        events = []
        for stream_id, p in rows:
            version = versions.get(stream_id, 0) + 1
            versions[stream_id] = version
            events.append(
                self.stored_event(
                    originator_id=stream_id, originator_version=version, topic=p.type, state=_es_state(p)
                )
            )
        for start in range(0, len(events), ES_BULK_CHUNK):
            self.recorder.insert_events(events[start : start + ES_BULK_CHUNK])

    def close(self) -> None:
        for d in self.datastores:
            d.close()


# -- workloads --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    appends: int
    threads: int
    appends_per_thread: int
    batches: int
    batch_size: int
    import_events: int
    streams: int
    batches_per_thread: int

    @property
    def payloads_needed(self) -> int:
        return max(
            self.appends,
            self.threads * self.appends_per_thread,
            self.batches * self.batch_size,
            self.threads * self.batches_per_thread * self.batch_size,
            self.import_events,
        )


def sequential(system: System, prefix: str, payloads: Sequence[Payload], s: Settings) -> tuple[int, float]:
    (session,) = system.sessions(1)
    start = time.perf_counter()
    for i in range(s.appends):
        # Round-robin over a set of streams, so appends both create streams and extend them.
        session.append(f"{prefix}-{i % s.streams}", payloads[i : i + 1])
    return s.appends, time.perf_counter() - start


def concurrent(system: System, prefix: str, payloads: Sequence[Payload], s: Settings) -> tuple[int, float]:
    return _in_threads(system, prefix, payloads, s, s.appends_per_thread, 1)


def concurrent_batches(
    system: System, prefix: str, payloads: Sequence[Payload], s: Settings
) -> tuple[int, float]:
    return _in_threads(system, prefix, payloads, s, s.batches_per_thread, s.batch_size)


def _in_threads(
    system: System, prefix: str, payloads: Sequence[Payload], s: Settings, appends: int, size: int
) -> tuple[int, float]:
    sessions = system.sessions(s.threads)
    # Threads start together on a barrier; the clock runs from the release to the last one finishing.
    barrier = threading.Barrier(s.threads + 1)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        mine = payloads[k * appends * size : (k + 1) * appends * size]
        barrier.wait()
        try:
            for i in range(appends):
                # Each thread has its own streams: this measures writers that do not conflict.
                sessions[k].append(f"{prefix}-t{k}-{i % s.streams}", mine[i * size : (i + 1) * size])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,), name=f"bench-writer-{k}") for k in range(s.threads)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return s.threads * appends * size, elapsed


def batched(system: System, prefix: str, payloads: Sequence[Payload], s: Settings) -> tuple[int, float]:
    (session,) = system.sessions(1)
    start = time.perf_counter()
    for b in range(s.batches):
        session.append(f"{prefix}-{b % s.streams}", payloads[b * s.batch_size : (b + 1) * s.batch_size])
    return s.batches * s.batch_size, time.perf_counter() - start


def bulk(system: System, prefix: str, payloads: Sequence[Payload], s: Settings) -> tuple[int, float]:
    # 100 events per stream on average, interleaved as an export of a global log would deliver them.
    n_streams = max(1, s.import_events // 100)
    rows = [(f"{prefix}-{i % n_streams}", payloads[i]) for i in range(s.import_events)]
    start = time.perf_counter()
    system.bulk(rows)
    return len(rows), time.perf_counter() - start


@dataclass(frozen=True)
class Workload:
    key: str
    #: A str.format template over Settings' fields, so the printed label says what was measured.
    template: str
    #: The issue's target for ledgerflow, as a ratio to this baseline's events/s.
    baseline: str
    target: float
    measure: Callable[[System, str, Sequence[Payload], Settings], tuple[int, float]]

    def title(self, s: Settings) -> str:
        return f"({self.key}) " + self.template.format(**vars(s))


PLAIN, TWIN, EXECUTEMANY = "plain", "twin", "plain-executemany"
WORKLOADS = (
    Workload("a", "1 event/append, 1 conn", PLAIN, 0.85, sequential),
    Workload("b", "1 event/append, {threads} conns", PLAIN, 0.80, concurrent),
    Workload("c", "{batch_size} events/append, 1 conn", EXECUTEMANY, 0.75, batched),
    Workload("e", "{batch_size} events/append, {threads} conns", EXECUTEMANY, 0.75, concurrent_batches),
    Workload("d", "bulk import {import_events:,}", PLAIN, 0.60, bulk),
)
#: The ratios reported, numerator over denominator, each taken per run (both measured minutes apart at
#: most, in rotating order) and summarised by the median over runs. The first is the headline: ledgerflow
#: against the plain table a user would write instead. ledgerflow/twin isolates what the client adds
#: (both write the same partitioned log with its trigger); twin/plain is what the partitioned log costs.
RATIOS = (
    ("ledgerflow", PLAIN),
    ("ledgerflow", EXECUTEMANY),
    ("ledgerflow", TWIN),
    (TWIN, PLAIN),
    ("eventsourcing", PLAIN),
)


def warm_up(system: System, payloads: Sequence[Payload], s: Settings) -> None:
    """Run every path a little before timing: opens and warms every connection, lets psycopg prepare the
    repeated statements (after 5 executions) and PostgreSQL cache the plpgsql function's plans."""
    small = Settings(
        appends=50,
        threads=s.threads,
        appends_per_thread=20,
        batches=5,
        batch_size=min(100, s.batch_size),
        import_events=500,
        streams=5,
        batches_per_thread=2,
    )
    for key, run in (
        ("b", concurrent),
        ("a", sequential),
        ("c", batched),
        ("e", concurrent_batches),
        ("d", bulk),
    ):
        if not system.keys or key in system.keys:
            run(system, f"warm-{key}", payloads, small)


# -- running and reporting ----------------------------------------------------------------------------


@dataclass
class Results:
    #: workload key -> system name -> events/s, one per run
    rates: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: workload key -> "a/b" -> a's events/s over b's, one per run in which both succeeded
    ratios: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: workload key -> system name -> what went wrong (first failure)
    failures: dict[str, dict[str, str]] = field(default_factory=dict)
    #: workload key -> system name -> (client, server) CPU microseconds per event, one per run
    cpu: dict[str, dict[str, list[tuple[float, float | None]]]] = field(default_factory=dict)


def open_systems(url: str, threads: int, with_es: bool) -> list[System]:
    systems: list[System] = [
        RawSystem(PLAIN, PLAIN_SCHEMA, url, threads),
        RawSystem(TWIN, TWIN_SCHEMA, url, threads),
        # The obvious way to write a batch, for the batch target; only in the batch workloads.
        RawSystem(EXECUTEMANY, EXECUTEMANY_SCHEMA, url, threads, executemany=True, keys="ce"),
        LedgerflowSystem(url, threads),
    ]
    if with_es:
        systems.append(EventsourcingSystem(url, threads))
    return systems


def one_run(
    admin_url: str, run: int, s: Settings, with_es: bool, results: Results, workloads: Sequence[Workload]
) -> None:
    payloads = make_payloads(s.payloads_needed, seed=run)
    with fresh_database(admin_url, prefix="bench_append") as url:
        migrate(url)
        differences = create_plain_table(url, "ledgerflow.events", "ledgerflow.event_ids", PLAIN_SCHEMA)
        differences += create_plain_table(
            url, "ledgerflow.events", "ledgerflow.event_ids", EXECUTEMANY_SCHEMA
        )
        differences += create_twin_table(url, "ledgerflow.events", TWIN_SCHEMA)
        if differences:
            # A baseline on a cheaper table would make every ratio meaningless: stop rather than mislead.
            raise SystemExit("a baseline table is not what it should be:\n" + "\n".join(differences))
        systems = open_systems(url, s.threads, with_es)
        server_cpu = ServerCpu(url)
        try:
            for system in systems:
                warm_up(system, payloads, s)
            for w_index, w in enumerate(workloads):
                # Rotate who goes first, per run and per workload, so that drift (autovacuum, checkpoints,
                # other tenants of the machine) does not always fall on the same system.
                taking_part = [x for x in systems if not x.keys or w.key in x.keys]
                shift = (run + w_index) % len(taking_part)
                run_rates: dict[str, float] = {}
                for system in taking_part[shift:] + taking_part[:shift]:
                    # CPU of this whole process (the system's own threads included: pool, notifier) and
                    # of every backend of the run's database; the systems not being measured sit idle.
                    client_before, server_before = time.process_time(), server_cpu.seconds()
                    try:
                        events, seconds = w.measure(system, f"{w.key}{run}", payloads, s)
                    except Exception as exc:
                        results.failures.setdefault(w.key, {}).setdefault(
                            system.name, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                        )
                        continue
                    client_us = (time.process_time() - client_before) / events * 1e6
                    server_after = server_cpu.seconds()
                    server_us = (
                        None
                        if server_before is None or server_after is None
                        else (server_after - server_before) / events * 1e6
                    )
                    results.cpu.setdefault(w.key, {}).setdefault(system.name, []).append(
                        (client_us, server_us)
                    )
                    run_rates[system.name] = events / seconds
                    results.rates.setdefault(w.key, {}).setdefault(system.name, []).append(events / seconds)
                for top, bottom in RATIOS:
                    if top in run_rates and bottom in run_rates:
                        results.ratios.setdefault(w.key, {}).setdefault(f"{top}/{bottom}", []).append(
                            run_rates[top] / run_rates[bottom]
                        )
        finally:
            server_cpu.close()
            for system in systems:
                system.close()


def report(results: Results, names: Sequence[str], s: Settings, workloads: Sequence[Workload]) -> None:
    headers = ["workload", *(f"{n} ev/s" for n in names), "ledgerflow/plain", "target", "verdict"]
    rows: list[list[str]] = []
    for w in workloads:
        rates = results.rates.get(w.key, {})
        failures = results.failures.get(w.key, {})
        row = [w.title(s)]
        for n in names:
            row.append(fmt_rate(median(rates[n])) if n in rates else "FAILED" if n in failures else "-")
        row.append(fmt_ratio(results.ratios.get(w.key, {}).get(f"ledgerflow/{PLAIN}", [])))
        got = results.ratios.get(w.key, {}).get(f"ledgerflow/{w.baseline}")
        row.append(f">= {w.target:.2f} of {w.baseline}")
        row.append("-" if not got else "PASS" if median(got) >= w.target else "MISS")
        rows.append(row)
    print_table(headers, rows)
    print("\nev/s: median events per second over runs. Ratios: median of per-run ratios (min-max over runs).")

    print("\nRatios, median (min-max) over runs:")
    ratio_rows = []
    for w in workloads:
        per = results.ratios.get(w.key, {})
        ratio_rows.append([w.title(s), *(fmt_ratio(per.get(f"{t}/{b}", [])) for t, b in RATIOS)])
    print_table(["workload", *(f"{t}/{b}" for t, b in RATIOS)], ratio_rows)

    print("\nPer-run ratios:")
    for w in workloads:
        for key, got in results.ratios.get(w.key, {}).items():
            print(f"  {w.title(s):36} {key:30} " + " ".join(f"{r:.2f}" for r in got))

    report_cpu(results, names, s, workloads)

    a, b = results.rates.get("a", {}), results.rates.get("b", {})
    scaling = [f"{n} x{median(b[n]) / median(a[n]):.2f}" for n in names if n in a and n in b]
    if scaling:
        print(f"\nScaling from 1 to {s.threads} connections ((b) ev/s over (a) ev/s): " + ", ".join(scaling))
    if "eventsourcing" in names:
        print(
            "  eventsourcing's PostgresApplicationRecorder takes LOCK TABLE ... IN EXCLUSIVE MODE and sends\n"
            "  NOTIFY in every insert transaction (to keep its notification log gap-free), so its writers\n"
            "  are serialised: extra connections queue on the table lock instead of adding throughput."
        )
    for key, failed in results.failures.items():
        for n, message in failed.items():
            print(f"\n({key}) {n} failed: {message}")


def report_cpu(results: Results, names: Sequence[str], s: Settings, workloads: Sequence[Workload]) -> None:
    """CPU microseconds per event: a second view that holds up when other work competes for the cores."""
    have_server = all(
        server is not None for per in results.cpu.values() for runs in per.values() for _, server in runs
    )
    print(
        "\nCPU per event, microseconds (median over runs): client process + PostgreSQL backends"
        + ("" if have_server else " (server CPU unavailable: PostgreSQL is not local)")
    )
    rows: list[list[str]] = []
    for w in workloads:
        per = results.cpu.get(w.key, {})
        row = [w.title(s)]
        for n in names:
            runs = per.get(n)
            if not runs:
                row.append("-")
                continue
            client = median([c for c, _ in runs])
            server = median([sv for _, sv in runs if sv is not None]) if have_server else None
            row.append(f"{client:.0f}" + ("" if server is None else f" + {server:.0f}"))
        rows.append(row)
    print_table(["workload", *names], rows)


def summary(results: Results, s: Settings, workloads: Sequence[Workload]) -> dict[str, Any]:
    """Everything measured, per workload: per-run values and their medians."""
    out: dict[str, Any] = {}
    for w in workloads:
        cpu = results.cpu.get(w.key, {})
        out[w.key] = {
            "title": w.title(s),
            "target": {"ratio": f"ledgerflow/{w.baseline}", "at_least": w.target},
            "events_per_second": {
                n: {"runs": r, "median": median(r)} for n, r in results.rates.get(w.key, {}).items()
            },
            "ratios": {k: {"runs": r, "median": median(r)} for k, r in results.ratios.get(w.key, {}).items()},
            "cpu_us_per_event": {
                n: {
                    "client": median([c for c, _ in runs]),
                    "server": median([sv for _, sv in runs if sv is not None])
                    if all(sv is not None for _, sv in runs)
                    else None,
                }
                for n, runs in cpu.items()
            },
            "failures": results.failures.get(w.key, {}),
        }
    return out


def git_commit() -> tuple[str, bool]:
    root = Path(__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    )
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=False
    )
    return commit.stdout.strip(), bool(status.stdout.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="runs, each on a fresh database (default 5)")
    parser.add_argument(
        "--url",
        default=default_admin_url(),
        help="server to use; a database is created and dropped per run (default: "
        "$LEDGERFLOW_BENCH_URL or the local server)",
    )
    # Slices of a few seconds each: CPU is read from /proc in 10 ms ticks per process, and a one-second
    # slice of (b) over nine backends could be off by about 30 us per event, the size of what is measured.
    parser.add_argument("--appends", type=int, default=6000, help="(a) sequential single-event appends")
    parser.add_argument("--threads", type=int, default=8, help="(b), (e) concurrent connections")
    parser.add_argument("--appends-per-thread", type=int, default=1200, help="(b) appends per connection")
    parser.add_argument("--batches", type=int, default=100, help="(c) appends of --batch-size events")
    parser.add_argument("--batches-per-thread", type=int, default=20, help="(e) batches per connection")
    parser.add_argument("--batch-size", type=int, default=100, help="(c), (e) events per append")
    parser.add_argument("--import-events", type=int, default=100_000, help="(d) events imported")
    parser.add_argument("--streams", type=int, default=50, help="streams per writer, appended round-robin")
    parser.add_argument("--no-eventsourcing", action="store_true", help="skip the eventsourcing peer")
    parser.add_argument(
        "--workloads", default="abced", help="which workloads to measure, by key (default abced: all)"
    )
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS if w.key in args.workloads]
    if not workloads:
        parser.error(f"--workloads {args.workloads!r} names none of " + "".join(w.key for w in WORKLOADS))
    s = Settings(
        appends=args.appends,
        threads=args.threads,
        appends_per_thread=args.appends_per_thread,
        batches=args.batches,
        batch_size=args.batch_size,
        import_events=args.import_events,
        streams=args.streams,
        batches_per_thread=args.batches_per_thread,
    )
    quiet_logs()
    # A `kill` (SIGTERM) unwinds like Ctrl-C, so the per-run database is still dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    es_problem = "skipped (--no-eventsourcing)" if args.no_eventsourcing else eventsourcing_status()
    names = [PLAIN, TWIN, EXECUTEMANY, "ledgerflow"] + ([] if es_problem else ["eventsourcing"])
    with psycopg.connect(args.url) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
            "current_setting('fsync')"
        ).fetchone()
    server = {
        "postgresql": row[0] if row else "?",
        "synchronous_commit": row[1] if row else "?",
        "fsync": row[2] if row else "?",
    }
    print(
        f"PostgreSQL {server['postgresql']} (synchronous_commit={server['synchronous_commit']}, "
        f"fsync={server['fsync']}), {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"psycopg {psycopg.__version__}"
    )
    es_version = None if es_problem else importlib.metadata.version("eventsourcing")
    if es_problem:
        print(f"eventsourcing: {es_problem}")
    else:
        print(
            f"eventsourcing {es_version}: PostgresApplicationRecorder, "
            f"schema {ES_SCHEMA}, text originator ids; its table is narrower than ledgerflow's (4 columns "
            "+ notification_id, 2 indexes, no jsonb; metadata travels inside its state bytes); "
            f"(d) is {ES_BULK_CHUNK:,}-event insert_events calls (one call with 100k hangs, see bulk())"
        )
    print(
        f"{args.runs} runs, each on a fresh database. plain: {PLAIN_SCHEMA}.events, one table with the log's "
        "columns and every index (its own and the id table's), no partitions, no triggers; twin: "
        f"{TWIN_SCHEMA}.events, the partitioned log's twin with its event-id trigger"
    )
    load_start = load_average()
    print(f"load average at start: {load_start}")
    print(
        f"(a) {s.appends} appends | (b) {s.threads} x {s.appends_per_thread} appends | "
        f"(c) {s.batches} x {s.batch_size} events | (e) {s.threads} x {s.batches_per_thread} x "
        f"{s.batch_size} events | (d) {s.import_events} events; payload ~150 B data + ~50 B metadata\n"
    )

    results = Results()
    started = time.perf_counter()
    for run in range(args.runs):
        t0 = time.perf_counter()
        one_run(args.url, run, s, not es_problem, results, workloads)
        print(f"run {run + 1}/{args.runs} done in {time.perf_counter() - t0:.1f}s", flush=True)
    load_end = load_average()
    print(f"\nTotal {time.perf_counter() - started:.0f}s; load average at end: {load_end}")
    print("(a load above the CPU count means other work competed: expect wider per-run ranges)\n")
    report(results, names, s, workloads)

    commit, dirty = git_commit()
    saved = {
        "benchmark": "append",
        "commit": commit,
        "dirty": dirty,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "psycopg": psycopg.__version__}
        | server,
        "eventsourcing": es_version or es_problem,
        "load_average": {"start": load_start, "end": load_end},
        "settings": vars(args) | {"url": re.sub(r"//[^@]*@", "//", args.url)},
        "workloads": summary(results, s, workloads),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"append-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
