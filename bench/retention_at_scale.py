"""A real retention pass over a million ended runs: the fill, its projection, the pass the `ledgerflow serve`
retention role makes, the projection of the releases, and checks of what was and was not released.

Run by hand (it is not a test), at low priority beside other work (its PostgreSQL backends are reniced
too, see below):

    nice -n 19 python -m bench.retention_at_scale [--runs 1000000] [--kept 1000] [--chunk 1000]
        [--threads 2] [--batch 10000] [--fill-budget 900] [--until 2026-11-28T00:00:00+00:00]
        [--ticks 3] [--progress-every 15] [--url postgresql://postgres@127.0.0.1:5432/postgres]

Prove it small first (`--runs 10000`). One fresh database, dropped at the end.

Fill. `--runs` runs of `scale_released` (retention: a microsecond), each ended as `Engine.start` and
`Engine.cancel` end a run with no worker: the start's events (RunStarted, NodesReady of its one node) in
one append, then the cancel's (RunCancelRequested by `operator`, NodeCancelled of the ready node,
RunCancelled) in another at the version the start left, through `EventStore.append_many`, `--chunk` runs
per append (one tag each, `customer`, 1,000 values), on `--threads` connections. The same events in the
same streams as the engine writes; what is skipped is the node queue row that the start inserts and the
cancel deletes in the next transaction (its net effect is none, and retention never reads the queue),
and a transaction per run: the runs of one append share a start time (`recorded_at` is the transaction's),
where the engine's would each have their own. A retention action walks runs newest first by (start time,
run id) and the role's next pass continues below the start time the previous one reached
(`workflows.retention.reached`), so `--batch` should be a multiple of `--chunk` (the defaults are) for
every pass to end on a whole append. The fill stops at `--fill-budget` seconds (then fewer runs are
measured, and the results say so). `--kept` runs are kept: half are `scale_released` runs still going
(started by `Engine.start`, no worker), half are `scale_young` runs (retention: a day) started and
cancelled by the engine, half of each before the fill and half after it. Then the `workflow_tables`
projection (`ProjectorWorker`) applies everything: the run tables hold every run.

The pass. `RetentionWorker.tick()`, what the `ledgerflow serve` retention role runs every
LEDGERFLOW_RETENTION_INTERVAL: every tenant, retention passes of `--batch` runs per workflow
(LEDGERFLOW_RETENTION_BATCH, the product's default 10,000) one after another while they fill their batch,
each a recorded bulk action of kind `release`. Its progress is read from ledgerflow.bulk_actions every
`--progress-every` seconds, on another connection. Then the projector applies the releases (the rows go)
and that is timed too. While due runs are still in the run tables afterwards (runs a pass left for the
next tick), another tick and projection follow, up to `--ticks` in all.

Checks: the kept runs' streams are at the versions they had before the pass and none holds a release,
their rows are in the run tables; no ended `scale_released` run is left in the run tables, nor tag or
node rows of released runs; the log holds exactly one RunReleased per released run and as many as the
actions counted done; one released run is still found by id (`Engine.load`, `release_of`), and
`restore_run` brings its rows back once projected.

Low priority: this process sets its own nice value to 19, and a thread renices every backend connected
to the benchmark's database (pool, projector and autovacuum alike) to 19 as they appear. `--until` is a
hard end: the fill stops, the role is stopped between passes, and the results say what was done. The
load averages of each phase, the commit and every figure go to JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench._common import default_admin_url, fresh_database, quiet_logs
from eventstore import NO_STREAM, EventStore, StreamAppend, open_store
from projector import ProjectorWorker
from workflows import (
    Engine,
    NodeContext,
    RetentionSettings,
    RetentionWorker,
    Workflow,
    WorkflowRegistry,
    release_of,
    restore_run,
    workflow_tables,
)
from workflows import events as ev
from workflows import new_events as new
from workflows.run_starts import fingerprint

ROOT = Path(__file__).resolve().parents[1]
RELEASED = "scale_released"
YOUNG = "scale_young"
registry = WorkflowRegistry()
_released = Workflow(RELEASED, retention=timedelta(microseconds=1))
_young = Workflow(YOUNG, retention=timedelta(days=1))


@_released.node()
def released_node(ctx: NodeContext) -> None:
    return None


@_young.node()
def young_node(ctx: NodeContext) -> None:
    return None


registry.register(_released)
registry.register(_young)


def say(text: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {text}", flush=True)


def git_commit() -> tuple[str, bool]:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return commit.stdout.strip(), bool(status.stdout.strip())


class Renicer:
    """Renices every backend of one database to 19 as it appears (a poll every `every` seconds), so that
    the benchmark's server work yields to the machine's other work as its client does."""

    def __init__(self, url: str, every: float = 2.0) -> None:
        self._conn = psycopg.connect(url, autocommit=True, application_name="bench-renicer")
        self._every = every
        self._stop = threading.Event()
        self.reniced: set[int] = set()
        self._renice()
        self._thread = threading.Thread(target=self._loop, name="renicer", daemon=True)
        self._thread.start()

    def _renice(self) -> None:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
        for (pid,) in rows:
            if pid in self.reniced:
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            except OSError:
                continue  # gone meanwhile
            self.reniced.add(pid)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self._renice()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


@contextmanager
def watching(url: str, every: float, line: str, query: str) -> Iterator[list[dict[str, Any]]]:
    """Poll `query` (one row) on a connection of its own every `every` seconds while the block runs; each
    answer is printed (`line` formats it) and kept with its second since the start."""
    seen: list[dict[str, Any]] = []
    stop = threading.Event()
    began = time.perf_counter()

    def loop() -> None:
        with psycopg.connect(url, autocommit=True, application_name="bench-progress") as conn:
            while not stop.wait(every):
                try:
                    row = conn.execute(query).fetchone()
                except psycopg.errors.UndefinedTable:
                    continue
                if row is None:
                    continue
                at = round(time.perf_counter() - began, 1)
                seen.append({"second": at, "values": list(row), "load1": round(os.getloadavg()[0], 2)})
                say(line.format(*row, second=at))

    thread = threading.Thread(target=loop, name="progress", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


ACTIONS = """
SELECT count(*), coalesce(sum(done), 0), coalesce(sum(skipped), 0), coalesce(sum(failed), 0),
       count(*) FILTER (WHERE state = 'running')
  FROM ledgerflow.bulk_actions WHERE kind = 'release'
"""
PROJECTED = """
SELECT coalesce(sum(events_applied), 0) FROM ledgerflow.projection_cursors
 WHERE projection LIKE 'workflow_tables%'
"""


def _start_appends(run_ids: list[uuid.UUID], first: int) -> list[StreamAppend]:
    """What `Engine.start` appends for each run of `scale_released` (its `_start`), tagged as the fill's."""
    spec = _released
    out = []
    for n, run_id in enumerate(run_ids):
        started = new.run_started(
            run_id=run_id,
            workflow=spec.name,
            version=spec.version,
            key=None,
            input=None,
            input_fingerprint=fingerprint(None),
            nodes=spec.topological_order(),
            fingerprints={name: s.fingerprint for name, s in spec.nodes.items()},
            priority=spec.priority,
            tags={"customer": f"c{(first + n) % 1000:03d}"},
        )
        ready = new.nodes_ready(run_id=run_id, nodes=spec.roots())
        out.append(StreamAppend(ev.run_stream(run_id), [started, ready], NO_STREAM))
    return out


def _cancel_appends(run_ids: list[uuid.UUID]) -> list[StreamAppend]:
    """What `Engine.cancel` appends for a run with its one node ready and none running
    (`cancelling.cancel_appends`): at version 2, where the start left the stream."""
    node = _released.roots()[0]
    return [
        StreamAppend(
            ev.run_stream(run_id),
            [
                new.run_cancel_requested(run_id=run_id, actor="operator"),
                new.node_cancelled(run_id=run_id, node=node),
                new.run_cancelled(run_id=run_id),
            ],
            2,
        )
        for run_id in run_ids
    ]


def fill(store: EventStore, runs: int, chunk: int, threads: int, stop_at: float) -> dict[str, Any]:
    """Write `runs` ended runs, `chunk` per append, on `threads` threads, until `stop_at` (monotonic)."""
    chunks = (runs + chunk - 1) // chunk
    lock = threading.Lock()
    state = {"next": 0, "runs": 0, "events": 0}
    sample: list[uuid.UUID] = []
    began = time.perf_counter()

    def work() -> None:
        while True:
            with lock:
                index = state["next"]
                if index >= chunks or time.monotonic() >= stop_at:
                    return
                state["next"] += 1
            size = min(chunk, runs - index * chunk)
            run_ids = sorted(uuid.uuid4() for _ in range(size))  # run streams in run order, as the engine
            store.append_many(_start_appends(run_ids, index * chunk))
            store.append_many(_cancel_appends(run_ids))
            with lock:
                state["runs"] += size
                state["events"] += 5 * size
                if len(sample) < 100:
                    sample.extend(run_ids[: 100 - len(sample)])
                done = state["runs"]
            if done % (50 * chunk) < size:
                rate = done / (time.perf_counter() - began)
                say(f"fill: {done:,} runs ({rate:,.0f} runs/s, load {os.getloadavg()[0]:.1f})")

    pool = [threading.Thread(target=work, name=f"fill-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - began
    return {
        "runs": state["runs"],
        "events": state["events"],
        "seconds": seconds,
        "runs_per_second": state["runs"] / seconds if seconds else None,
        "events_per_second": state["events"] / seconds if seconds else None,
        "stopped_early": state["runs"] < runs,
        "sample": sample,
    }


def kept_runs(engine: Engine, count: int, offset: int) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """`count` runs of `scale_released` left going and `count` of `scale_young` ended now, by the engine."""
    going = [engine.start(RELEASED, tags={"customer": f"k{offset + i:03d}"}).run_id for i in range(count)]
    young = []
    for i in range(count):
        run_id = engine.start(YOUNG, tags={"customer": f"y{offset + i:03d}"}).run_id
        engine.cancel(run_id)
        young.append(run_id)
    return going, young


def project(store: EventStore, url: str, every: float, timeout: float) -> dict[str, Any]:
    """The `workflow_tables` projection brought up to date by the projector's own worker."""
    began = time.perf_counter()
    worker = ProjectorWorker(store, [workflow_tables])
    line = "projector: {0:,} events applied in all ({second:.0f} s)"
    caught_up = True
    with watching(url, every, line, PROJECTED) as seen:
        try:
            worker.run_until_caught_up(timeout=max(timeout, 1.0))
        except TimeoutError:
            caught_up = False
        finally:
            worker.release_all()
    return {"seconds": time.perf_counter() - began, "caught_up": caught_up, "progress": seen}


def table_counts(store: EventStore) -> dict[str, int]:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ledgerflow.workflow_runs),"
            " (SELECT count(*) FROM ledgerflow.workflow_run_tags),"
            " (SELECT count(*) FROM ledgerflow.workflow_nodes),"
            " (SELECT count(*) FROM ledgerflow.workflow_runs"
            "   WHERE workflow = %s AND finished_at IS NOT NULL)",
            (RELEASED,),
        ).fetchone()
    assert row is not None
    return {"runs": row[0], "tags": row[1], "nodes": row[2], "due_in_tables": row[3]}


def tick(engine: Engine, url: str, batch: int, every: float, stop_at: float) -> dict[str, Any]:
    """One tick of the retention role, timed, stopped between passes at `stop_at` (monotonic)."""
    settings = RetentionSettings(run_retention=None, retention_batch=batch, retention_interval=600)
    worker = RetentionWorker(engine, settings)
    timer = threading.Timer(max(stop_at - time.monotonic(), 0.0), worker.stop)
    timer.start()
    line = "retention: {0} actions, {1:,} released, {2} skipped, {3} failed, {4} running ({second:.0f} s)"
    began = time.perf_counter()
    try:
        with watching(url, every, line, ACTIONS) as seen:
            done = worker.tick()
    finally:
        timer.cancel()
    seconds = time.perf_counter() - began
    actions = done.actions or []
    return {
        "seconds": seconds,
        "actions": len(actions),
        "released": done.released,
        "skipped": sum(a.skipped for a in actions),
        "failed": sum(a.failed for a in actions),
        "states": sorted({a.state for a in actions}),
        "released_per_second": done.released / seconds if seconds else None,
        "stopped": worker.stopping.is_set(),
        "progress": seen,
    }


def versions(engine: Engine, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[int, str]]:
    return {run_id: (run.version, run.status) for run_id, run in engine.load_many(run_ids).items()}


def checks(
    engine: Engine,
    kept: list[uuid.UUID],
    kept_before: dict[uuid.UUID, tuple[int, str]],
    released: int,
    sample: list[uuid.UUID],
    url: str,
    every: float,
    timeout: float,
) -> dict[str, Any]:
    store = engine.store
    out: dict[str, Any] = {}
    kept_after = versions(engine, kept)
    out["kept_streams_unchanged"] = kept_after == kept_before
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_runs WHERE run_id = ANY(%s)", (kept,)
        ).fetchone()
        out["kept_rows_present"] = row is not None and row[0] == len(kept)
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.events WHERE tenant = 'default' AND stream_id = ANY(%s)"
            " AND event_type = %s",
            ([ev.run_stream(r) for r in kept], ev.RUN_RELEASED),
        ).fetchone()
        out["kept_releases"] = row[0] if row else None
        row = conn.execute(
            "SELECT count(*), count(DISTINCT stream_id) FROM ledgerflow.events WHERE event_type = %s",
            (ev.RUN_RELEASED,),
        ).fetchone()
        assert row is not None
        out["releases_in_log"], out["runs_released_in_log"] = row[0], row[1]
        out["released_counted_by_actions"] = released
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_run_tags t"
            " WHERE NOT EXISTS (SELECT FROM ledgerflow.workflow_runs r WHERE r.run_id = t.run_id)"
        ).fetchone()
        out["orphan_tag_rows"] = row[0] if row else None
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_nodes n"
            " WHERE NOT EXISTS (SELECT FROM ledgerflow.workflow_runs r WHERE r.run_id = n.run_id)"
        ).fetchone()
        out["orphan_node_rows"] = row[0] if row else None
    out["tables"] = table_counts(store)
    # One released run of the fill: still found by id, and restored.
    one = next((r for r in sample if release_of(store, r) is not None), None)
    if one is None:
        out["restore"] = "no released run in the sample"
        return out
    release = release_of(store, one)
    run = engine.load(one)
    restore: dict[str, Any] = {
        "run_id": str(one),
        "found_by_id": run.workflow == RELEASED and run.status == "cancelled",
        "release_actor": release.actor if release else None,
    }
    began = time.perf_counter()
    restore_run(engine, one, actor="bench")
    restore["restore_seconds"] = time.perf_counter() - began
    restore["projection"] = project(store, url, every, timeout)
    with store.pool.connection() as conn:
        row = conn.execute("SELECT status FROM ledgerflow.workflow_runs WHERE run_id = %s", (one,)).fetchone()
    restore["row_back"] = row is not None and row[0] == "cancelled"
    restore["not_released_after"] = release_of(store, one) is None
    out["restore"] = restore
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--kept", type=int, default=1000, help="kept runs: half going, half young")
    parser.add_argument("--chunk", type=int, default=1000, help="runs per append of the fill")
    parser.add_argument("--threads", type=int, default=2, help="connections the fill appends on")
    parser.add_argument("--batch", type=int, default=RetentionSettings().retention_batch)
    parser.add_argument("--fill-budget", type=float, default=900.0, help="seconds the fill may take")
    parser.add_argument("--until", type=datetime.fromisoformat, default=None, help="hard end (ISO 8601)")
    parser.add_argument("--ticks", type=int, default=3, help="ticks of the role at most")
    parser.add_argument("--progress-every", type=float, default=15.0)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    if args.batch % args.chunk:
        parser.error("--batch should be a multiple of --chunk (see the module's docstring)")
    quiet_logs()
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    end = time.monotonic() + (
        (args.until - datetime.now(UTC)).total_seconds() if args.until is not None else 86_400.0
    )
    commit, dirty = git_commit()
    load: dict[str, tuple[float, ...]] = {"start": os.getloadavg()}
    result: dict[str, Any] = {
        "benchmark": "retention_at_scale",
        "commit": commit,
        "dirty": dirty,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in vars(args).items()},
        "machine_cpus": os.cpu_count(),
        "load_average": load,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results" / f"retention_at_scale-{stamp}.json"

    def save() -> None:
        out.write_text(json.dumps(result, indent=2, default=str))

    with fresh_database(args.url, "bench_retention_scale") as url, open_store(url=url) as store:
        say(f"database {psycopg.conninfo.conninfo_to_dict(url)['dbname']}")
        renicer = Renicer(url)
        try:
            engine = Engine(store, registry)
            quarter = args.kept // 4
            going, young = kept_runs(engine, quarter, 0)
            say(f"fill: {args.runs:,} runs, {args.chunk} per append, {args.threads} threads")
            filled = fill(
                store, args.runs, args.chunk, args.threads, min(end, time.monotonic() + args.fill_budget)
            )
            more_going, more_young = kept_runs(engine, quarter, quarter)
            kept = going + more_going + young + more_young
            sample = filled.pop("sample")
            result["fill"] = filled
            load["after_fill"] = os.getloadavg()
            say(f"fill: {filled['runs']:,} runs in {filled['seconds']:.0f} s; projecting")
            result["projection"] = project(store, url, args.progress_every, end - time.monotonic())
            load["after_projection"] = os.getloadavg()
            result["tables_before"] = table_counts(store)
            say(f"projected in {result['projection']['seconds']:.0f} s: {result['tables_before']}")
            save()
            kept_before = versions(engine, kept)
            ticks: list[dict[str, Any]] = []
            result["ticks"] = ticks
            for n in range(args.ticks):
                if time.monotonic() >= end:
                    break
                one = tick(engine, url, args.batch, args.progress_every, end)
                say(f"tick {n + 1}: {one['released']:,} released in {one['seconds']:.0f} s; projecting")
                load[f"after_tick_{n + 1}"] = os.getloadavg()
                before = table_counts(store)
                one["projection"] = project(store, url, args.progress_every, end - time.monotonic())
                after = table_counts(store)
                one["rows_removed"] = before["runs"] - after["runs"]
                one["tables_after"] = after
                load[f"after_tick_{n + 1}_projection"] = os.getloadavg()
                ticks.append(one)
                say(
                    f"releases projected in {one['projection']['seconds']:.0f} s:"
                    f" {one['rows_removed']:,} rows removed; {after}"
                )
                save()
                if one["released"] == 0 or after["due_in_tables"] == 0 or one["stopped"]:
                    break
            released = sum(t["released"] for t in ticks)
            seconds = sum(t["seconds"] for t in ticks)
            projecting = sum(t["projection"]["seconds"] for t in ticks)
            result["pass"] = {
                "released": released,
                "seconds": seconds,
                "released_per_second": released / seconds if seconds else None,
                "projection_seconds": projecting,
                "rows_removed_per_second": sum(t["rows_removed"] for t in ticks) / projecting
                if projecting
                else None,
                "complete": bool(ticks) and ticks[-1]["tables_after"]["due_in_tables"] == 0,
            }
            say(f"pass: {result['pass']}")
            result["checks"] = checks(
                engine,
                kept,
                kept_before,
                released,
                sample,
                url,
                args.progress_every,
                max(end - time.monotonic(), 60.0),
            )
            say(f"checks: {json.dumps(result['checks'], default=str)[:1500]}")
        finally:
            result["backends_reniced"] = len(renicer.reniced)
            renicer.close()
            load["end"] = os.getloadavg()
            save()
    say(f"results: {out}")


if __name__ == "__main__":
    main()
