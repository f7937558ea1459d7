"""A bulk cancel against the same cancels made one by one, in the same run.

Run by hand (it is not a test):

    python -m bench.bulk_actions [--runs 1000] [--rounds 5] [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database. Each round starts 2 x `--runs` runs of a one-node workflow (no worker: they stay
running), projects them, then cancels one half two ways, in alternating order from round to round:

  loop   `Engine.cancel` on each run id, one after the other (the baseline: what a script would do);
  bulk   `create_bulk_action` + `run_bulk_action` with a tag filter: the search pages, the idempotency
         key per run and the recorded progress per run on top of the same cancels.

Medians of the rounds (ms per run and runs per second) and the ratio bulk ÷ loop; JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
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
    create_bulk_action,
    run_bulk_action,
    workflow_tables,
)

registry = WorkflowRegistry()
_flow = Workflow("bench_bulk")


@_flow.node()
def only(ctx: NodeContext) -> None:
    return None


registry.register(_flow)


def _project(store: EventStore) -> None:
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()


def _round(engine: Engine, index: int, runs: int) -> dict[str, float]:
    ids = {
        way: [
            engine.start("bench_bulk", input=None, tags={"round": f"{index}-{way}"}).run_id
            for _ in range(runs)
        ]
        for way in ("loop", "bulk")
    }
    _project(engine.store)
    seconds: dict[str, float] = {}
    for way in ("loop", "bulk") if index % 2 == 0 else ("bulk", "loop"):
        began = time.perf_counter()
        if way == "loop":
            for run_id in ids["loop"]:
                engine.cancel(run_id)
        else:
            wanted = RunFilter(tags=(("round", f"{index}-bulk"),))
            action = create_bulk_action(
                engine.store, kind="cancel", tenant="default", filter=wanted, actor="bench", limit=runs
            )
            ended = run_bulk_action(engine, action.id, tenant="default")
            assert ended.done == runs, ended
        seconds[way] = time.perf_counter() - began
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    load_before = os.getloadavg()
    with fresh_database(args.url, "bench_bulk") as url, open_store(url=url) as store:
        engine = Engine(store, registry)
        rounds = [_round(engine, i, args.runs) for i in range(args.rounds)]
    load_after = os.getloadavg()
    med = {w: statistics.median(r[w] for r in rounds) for w in ("loop", "bulk")}
    ratios = [r["bulk"] / r["loop"] for r in rounds]
    print(f"medians of {args.rounds} rounds of {args.runs} runs each way")
    for way in ("loop", "bulk"):
        print(f"{way:6} {med[way] * 1000 / args.runs:8.2f} ms/run {args.runs / med[way]:10.0f} runs/s")
    print(f"bulk ÷ loop: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"bulk_actions-{stamp}.json").write_text(
        json.dumps(
            {
                "runs": args.runs,
                "rounds": rounds,
                "median_seconds": med,
                "ratio_bulk_over_loop": {"median": statistics.median(ratios), "all": ratios},
                "load_average": {"before": load_before, "after": load_after},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
