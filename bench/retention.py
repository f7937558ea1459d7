"""A retention pass's releases, a page of runs per transaction and one run at a time, against a bulk cancel
of as many runs, in the same run.

Run by hand (it is not a test):

    python -m bench.retention [--runs 2000] [--rounds 3] [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database. Each round starts 3 x `--runs` runs of two one-node workflows (no worker): `--runs` of
`bench_kept` stay running, 2 x `--runs` of `bench_released` (retention: a microsecond) are cancelled at
once, so they are ended and due; all are projected. Then, in an order that turns from round to round:

  cancel       a bulk cancel of the `bench_kept` runs (the baseline: the same bulk machinery);
  release_one  the release action a retention pass records (`kind="release"`, the workflow's due runs),
               worked one run at a time: each checked against its stream and released by one event
               under its idempotency key, with the recorded progress per run (the path before pages;
               `workflows.bulk_kinds.BATCHES` without `release` for the call);
  release      the same action over the other half, a page of runs per transaction (the pass's path).

Then the projector applies the releases (the rows deleted) and that time is reported too. Medians of the
rounds (ms per run, runs per second), the ratio release ÷ cancel, and how long 1,000,000 runs would take
at the `release` rate; JSON under bench/results/. A real pass over many runs, the role's tick over a
filled backlog: `bench.retention_at_scale`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench._common import default_admin_url, fresh_database, quiet_logs
from eventstore import EventStore, open_store
from projector import ProjectorWorker
from workflows import (
    Engine,
    NodeContext,
    RunFilter,
    Workflow,
    WorkflowRegistry,
    bulk_kinds,
    create_bulk_action,
    run_bulk_action,
    workflow_tables,
)

ENDED = ("cancelled", "continued", "failed", "succeeded")
registry = WorkflowRegistry()
_kept = Workflow("bench_kept")
_released = Workflow("bench_released", retention=timedelta(microseconds=1))


@_kept.node()
def kept_node(ctx: NodeContext) -> None:
    return None


@_released.node()
def released_node(ctx: NodeContext) -> None:
    return None


registry.register(_kept)
registry.register(_released)
WAYS = ("cancel", "release_one", "release")


def _project(store: EventStore) -> float:
    began = time.perf_counter()
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()
    return time.perf_counter() - began


def _round(engine: Engine, index: int, runs: int) -> dict[str, float]:
    for _ in range(runs):
        engine.start("bench_kept", input=None, tags={"round": str(index)})
        for way in ("release_one", "release"):
            tag = {"round": f"{index}-{way}"}
            engine.cancel(engine.start("bench_released", input=None, tags=tag).run_id)
    _project(engine.store)
    seconds: dict[str, float] = {}
    for way in WAYS[index % 3 :] + WAYS[: index % 3]:
        began = time.perf_counter()
        if way == "cancel":
            wanted = RunFilter(workflow="bench_kept", tags=(("round", str(index)),))
            action = create_bulk_action(
                engine.store, kind="cancel", tenant="default", filter=wanted, actor="bench", limit=runs
            )
            ended = run_bulk_action(engine, action.id, tenant="default")
        else:
            # What a retention pass records for the workflow (workflows.retention), over this way's runs.
            wanted = RunFilter(
                workflow="bench_released",
                statuses=ENDED,
                ended_before=datetime.now(UTC),
                tags=(("round", f"{index}-{way}"),),
            )
            action = create_bulk_action(
                engine.store, kind="release", tenant="default", filter=wanted, actor="bench", limit=runs
            )
            kept = bulk_kinds.BATCHES
            if way == "release_one":
                bulk_kinds.BATCHES = {k: v for k, v in kept.items() if k != "release"}
            try:
                ended = run_bulk_action(engine, action.id, tenant="default")
            finally:
                bulk_kinds.BATCHES = kept
        assert ended.done == runs, ended
        seconds[way] = time.perf_counter() - began
    seconds["project_releases"] = _project(engine.store)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    load_before = os.getloadavg()
    with fresh_database(args.url, "bench_retention") as url, open_store(url=url) as store:
        engine = Engine(store, registry)
        rounds = [_round(engine, i, args.runs) for i in range(args.rounds)]
    load_after = os.getloadavg()
    keys = (*WAYS, "project_releases")
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    ratios = [r["release"] / r["cancel"] for r in rounds]
    print(f"medians of {args.rounds} rounds of {args.runs} runs each way")
    for k in keys:
        print(f"{k:17} {med[k] * 1000 / args.runs:8.2f} ms/run {args.runs / med[k]:10.0f} runs/s")
    spread = f"range {min(ratios):.2f}-{max(ratios):.2f}"
    print(f"release ÷ cancel: median {statistics.median(ratios):.2f} ({spread})")
    speedup = [r["release_one"] / r["release"] for r in rounds]
    print(f"release pages ÷ one at a time: {statistics.median(speedup):.1f}x faster")
    million = 1_000_000 * med["release"] / args.runs
    print(
        f"1,000,000 runs at the release rate: {million / 60:.0f} min (+ projecting the releases: "
        f"{1_000_000 * med['project_releases'] / (2 * args.runs) / 60:.0f} min)"
    )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"retention-{stamp}.json").write_text(
        json.dumps(
            {
                "runs": args.runs,
                "rounds": rounds,
                "median_seconds": med,
                "released_per_second": args.runs / med["release"],
                "released_one_at_a_time_per_second": args.runs / med["release_one"],
                "ratio_release_over_cancel": {"median": statistics.median(ratios), "all": ratios},
                "load_average": {"before": load_before, "after": load_after},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
