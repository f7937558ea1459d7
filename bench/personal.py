"""The cost of personal fields: appends whose events carry a sealed field (AES-GCM, a data key per
subject) and reads that reveal them, against the same events with no personal field, in the same run.

Run by hand (it is not a test):

    python bench/personal.py [--runs 5] [--events 2000] [--subjects 500]

Each run uses a fresh database and alternates the two kinds in chunks of 50 appends (which goes first
alternating too), and reads of each kind in turn. Appends, one event per append, one thread, the store's
ordinary path, in two phases:
`first`, one append per subject of `--subjects` (a sealed one creates the subject's key: one statement more,
once per subject), then `append`, `--events` appends over those subjects (their keys known). Reads:
`read_all` of each kind's events (one type filter), pages of 1000; revealing asks the key table once per
page. Reported: medians over runs of events per second and of the per-run ratio sealed ÷ plain, and the
load average.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import default_admin_url, fresh_database, load_average, median, quiet_logs
from eventstore import (
    Cursor,
    DatabaseSettings,
    EventStore,
    NewEvent,
    generate_master_key,
    open_store,
    personal_fields,
)
from eventstore.migrate import migrate

personal_fields("BenchSealed", subject="customer_id", fields=["email"])
KINDS = ("BenchPlain", "BenchSealed")
CHUNK = 50


def _append(store: EventStore, kind: str, events: int, subjects: int, run: int, start: int = 0) -> float:
    began = time.perf_counter()
    for i in range(start, start + events):
        data = {"customer_id": f"c{i % subjects}", "email": f"person{i}@example.com", "plan": "basic"}
        store.append(f"{kind}-{run}-{i % 100}", [NewEvent(kind, data)])
    return events / (time.perf_counter() - began)


def _interleaved(
    store: EventStore, order: tuple[str, ...], events: int, subjects: int, run: int, start: int, phase: str
) -> dict[str, dict[str, float]]:
    """Both kinds' appends in alternating chunks of `CHUNK` (the first kind alternating too), so that the
    machine's load swings hit both alike; events per second of each kind over its own time."""
    seconds = dict.fromkeys(KINDS, 0.0)
    for n, at in enumerate(range(start, start + events, CHUNK)):
        size = min(CHUNK, start + events - at)
        for kind in order if n % 2 == 0 else order[::-1]:
            seconds[kind] += size / _append(store, kind, size, subjects, run, at)
    return {kind: {phase: events / seconds[kind]} for kind in KINDS}


def _read(store: EventStore, kind: str) -> float:
    began, count, cursor = time.perf_counter(), 0, Cursor()
    while True:
        page = store.read_all(cursor, types=[kind], limit=1000)
        count += len(page.events)
        cursor = page.cursor
        if page.caught_up:
            break
    return count / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    settings = DatabaseSettings(master_key=generate_master_key())  # type: ignore[arg-type]
    phases = ("first", "append", "read")
    rates: dict[str, dict[str, list[float]]] = {k: {p: [] for p in phases} for k in KINDS}
    ratios: dict[str, list[float]] = {p: [] for p in phases}
    loads = [load_average()]
    for run in range(args.runs):
        with fresh_database(args.url, "bench_personal") as url:
            migrate(url)
            with open_store(settings, url=url, migrate=False) as store:
                order = KINDS if run % 2 == 0 else KINDS[::-1]
                got = _interleaved(store, order, args.subjects, args.subjects, run, 0, "first")
                later = _interleaved(store, order, args.events, args.subjects, run, args.subjects, "append")
                for kind in KINDS:
                    got[kind].update(later[kind])
                for kind in order:
                    got[kind]["read"] = _read(store, kind)
        for kind in KINDS:
            for what in phases:
                rates[kind][what].append(got[kind][what])
        for what in phases:
            ratios[what].append(got["BenchSealed"][what] / got["BenchPlain"][what])
        shown = ", ".join(
            f"{what} plain {got['BenchPlain'][what]:.0f}/s sealed {got['BenchSealed'][what]:.0f}/s"
            for what in phases
        )
        print(f"run {run + 1}: {shown}", flush=True)
    loads.append(load_average())
    result = {
        "events_per_kind": args.events,
        "subjects": args.subjects,
        "runs": args.runs,
        "median_rates": {k: {w: median(v) for w, v in r.items()} for k, r in rates.items()},
        "median_ratio_sealed_over_plain": {w: median(v) for w, v in ratios.items()},
        "ratios": ratios,
        "load_average": loads,
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results" / f"personal-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
