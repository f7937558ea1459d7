"""A retention pass against a bulk cancel of as many runs, in the same run.

Run by hand (it is not a test):

    python -m bench.retention [--runs 2000] [--rounds 3] [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database. Each round starts 2 x `--runs` runs of two one-node workflows (no worker): the runs of
`bench_kept` stay running, those of `bench_released` (retention: a microsecond) are cancelled at once, so
they are ended and due; both are projected. Then, in alternating order from round to round:

  cancel   a bulk cancel of the `bench_kept` runs (the baseline: the same bulk machinery, one event per run);
  release  `retention_pass`: the `bench_released` runs, each checked against its stream and released by one
           event under its idempotency key, with the recorded progress per run.

Then the projector applies the releases (the rows deleted) and that time is reported too. Medians of the
rounds (ms per run, runs per second) and the ratio release ÷ cancel; JSON under bench/results/.
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
    RetentionSettings,
    RunFilter,
    Workflow,
    WorkflowRegistry,
    create_bulk_action,
    retention_pass,
    run_bulk_action,
    workflow_tables,
)

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
WAYS = ("cancel", "release")


def _project(store: EventStore) -> float:
    began = time.perf_counter()
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()
    return time.perf_counter() - began


def _round(engine: Engine, index: int, runs: int) -> dict[str, float]:
    tag = {"round": str(index)}
    for _ in range(runs):
        engine.start("bench_kept", input=None, tags=tag)
        engine.cancel(engine.start("bench_released", input=None, tags=tag).run_id)
    _project(engine.store)
    seconds: dict[str, float] = {}
    for way in WAYS if index % 2 == 0 else tuple(reversed(WAYS)):
        began = time.perf_counter()
        if way == "cancel":
            wanted = RunFilter(workflow="bench_kept", tags=(("round", str(index)),))
            action = create_bulk_action(
                engine.store, kind="cancel", tenant="default", filter=wanted, actor="bench", limit=runs
            )
            ended = run_bulk_action(engine, action.id, tenant="default")
            assert ended.done == runs, ended
        else:
            settings = RetentionSettings(run_retention=None, retention_batch=runs)
            actions = retention_pass(engine, settings=settings, actor="bench")
            assert sum(a.done for a in actions) == runs, actions
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
                "ratio_release_over_cancel": {"median": statistics.median(ratios), "all": ratios},
                "load_average": {"before": load_before, "after": load_after},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
