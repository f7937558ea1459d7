"""Reading one's own writes, and what versions and cursor notifications cost.

Run by hand (it is not a test):

    python bench/read_your_writes.py [--runs 3] [--appends 300] [--url postgresql://postgres@127.0.0.1:5432/postgres]

Each run on a fresh database, every figure beside its baseline measured in the same run:

  (a) `projector.wait_for` after each of `--appends` one-event appends, with a projector worker (a thread
      of this process, as `serve` runs one) following the catalogue: the wait's p50/p99, one append
      followed by its wait against one append alone, and the wait against looking for the catalogue's
      row every millisecond (the projector's own delay, found by brute force).
  (b) the NOTIFY that every cursor advance sends (migration 0017): a projector applying `--events` events
      one per batch (a commit each, the worst case), with the trigger enabled and disabled, alternately.
  (c) the queue's version (migration 0016): `--rows` queue rows inserted with the version filled by the
      trigger from each run's RunStarted event, against the same rows with the version given.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

import psycopg

from bench._common import default_admin_url, fresh_database, quiet_logs
from eventstore import NewEvent, open_store
from projector import ProjectorWorker, WorkerSettings, stream_catalogue, wait_for


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def read_your_writes(url: str, appends: int) -> tuple[float, float, float, float]:
    """(wait p50 ms, wait p99 ms, append+wait ÷ append alone, wait ÷ polling every millisecond)."""
    with open_store(url=url) as store:
        worker = ProjectorWorker(store, [stream_catalogue], WorkerSettings(poll_interval=5))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        wait_for(store, stream_catalogue, store.append("warm-0", [NewEvent("Warm", {})]), timeout=30)
        alone, waits, together, polled = [], [], [], []
        for i in range(appends):
            # The baseline: looking for the row every millisecond (what wait_for spares the database).
            store.append(f"poll-{i}", [NewEvent("Placed", {"i": i})])
            appended = time.perf_counter()
            with store.pool.connection() as conn:
                while not conn.execute(
                    "SELECT 1 FROM ledgerflow.stream_catalogue WHERE stream_id = %s", (f"poll-{i}",)
                ).fetchone():
                    time.sleep(0.001)
            polled.append(time.perf_counter() - appended)
            began = time.perf_counter()
            store.append(f"alone-{i}", [NewEvent("Placed", {"i": i})])
            alone.append(time.perf_counter() - began)
            began = time.perf_counter()
            result = store.append(f"ryw-{i}", [NewEvent("Placed", {"i": i})])
            appended = time.perf_counter()
            wait_for(store, stream_catalogue, result, timeout=30)
            waits.append(time.perf_counter() - appended)
            together.append(time.perf_counter() - began)
        worker.stop()
        thread.join(10)
    return (
        _pct(waits, 0.5) * 1000,
        _pct(waits, 0.99) * 1000,
        statistics.median(together) / statistics.median(alone),
        statistics.median(waits) / statistics.median(polled),
    )


def notify_cost(url: str, events: int) -> float:
    """Seconds per batch with the trigger ÷ without (median of alternating catch-ups)."""
    with open_store(url=url) as store:
        store.import_events((f"s-{i % 50}", NewEvent("Placed", {"i": i})) for i in range(events))
        timings: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(4):
            notify = round_ % 2 == 0
            with psycopg.connect(url, autocommit=True) as conn:
                action = "ENABLE" if notify else "DISABLE"
                conn.execute(
                    f"ALTER TABLE ledgerflow.projection_cursors {action} TRIGGER projection_cursor_advanced"
                )
                conn.execute("DELETE FROM ledgerflow.projection_cursors")
                conn.execute("DELETE FROM ledgerflow.projection_leases")
                conn.execute("DROP TABLE IF EXISTS ledgerflow.stream_catalogue")
            worker = ProjectorWorker(store, [stream_catalogue], WorkerSettings(batch_size=1))
            began = time.perf_counter()
            worker.run_until_caught_up(timeout=600)
            timings[notify].append(time.perf_counter() - began)
            worker.release_all()
    return statistics.median(timings[True]) / statistics.median(timings[False])


def version_fill_cost(url: str, rows: int) -> float:
    """Insert time with the version filled from the log ÷ with it given."""
    with open_store(url=url) as store:
        runs = [uuid.uuid4() for _ in range(rows)]
        store.import_events(
            (f"wf-{r}", NewEvent("wf.RunStarted", {"run_id": str(r), "version": "2"})) for r in runs
        )
    timings: dict[bool, list[float]] = {True: [], False: []}
    with psycopg.connect(url, autocommit=True) as conn:
        for round_ in range(6):
            filled = round_ % 2 == 0
            conn.execute("DELETE FROM ledgerflow.workflow_queue")
            began = time.perf_counter()
            conn.execute(
                "INSERT INTO ledgerflow.workflow_queue (run_id, node, tenant, workflow, max_crashes, version)"
                " SELECT r, 'n', 'default', 'w', 5, CASE WHEN %s THEN NULL ELSE '2' END"
                " FROM unnest(%s::uuid[]) r",
                (filled, runs),
            )
            timings[filled].append(time.perf_counter() - began)
        wrong = conn.execute("SELECT count(*) FROM ledgerflow.workflow_queue WHERE version <> '2'").fetchone()
        assert wrong == (0,), wrong
    return statistics.median(timings[True]) / statistics.median(timings[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    found: dict[str, list[float]] = {}
    for run in range(args.runs):
        with fresh_database(args.url, "bench_ryw") as url:
            p50, p99, ratio, polling = read_your_writes(url, args.appends)
        with fresh_database(args.url, "bench_ryw") as url:
            notify = notify_cost(url, args.events)
        with fresh_database(args.url, "bench_ryw") as url:
            fill = version_fill_cost(url, args.rows)
        for key, value in (
            ("wait p50 ms", p50),
            ("wait p99 ms", p99),
            ("append+wait ÷ append", ratio),
            ("wait ÷ polling the row every ms", polling),
            ("projector, 1-event batches: NOTIFY ÷ none", notify),
            ("queue insert: version from the log ÷ given", fill),
        ):
            found.setdefault(key, []).append(value)
        print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in found.items()), flush=True)
    print("medians over runs:")
    for key, values in found.items():
        print(f"  {key}: {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
