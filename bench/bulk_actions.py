"""A bulk action worked a page per transaction against the same action worked one run at a time, and
against the same changes made one by one through the engine, in the same run.

Run by hand (it is not a test):

    python -m bench.bulk_actions [--kind cancel|retry|pause|resume|all] [--runs 1000] [--rounds 5]
                                 [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database. Each round of a kind starts 3 x `--runs` runs of a one-node workflow (no worker: they
stay running), projects them, brings them into the state the kind acts on (paused for `resume`, cancelled
for `retry`, with a bulk action not timed), then acts on a third of them each way, in an order that turns
from round to round:

  loop   `Engine.cancel` / `retry` / `pause` / `resume` on each run id, one after the other (what a script
         would do);
  one    `create_bulk_action` + `run_bulk_action` with a tag filter, every run on its own (the bulk path
         before pages: `workflows.bulk_kinds.BATCHES` emptied for the call);
  page   the same bulk action, a page of runs per transaction (`workflows.bulk_kinds.BATCHES`).

Medians of the rounds (ms per run and runs per second) and the ratios page ÷ one; JSON under
bench/results/. The process's CPU time per run is printed beside the wall time (the server's is not).
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
    bulk_kinds,
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


KINDS = ("cancel", "retry", "pause", "resume")
WAYS = ("loop", "one", "page")


def _act_loop(engine: Engine, kind: str, run_ids: list) -> None:  # type: ignore[type-arg]
    act = {"cancel": engine.cancel, "retry": engine.retry, "pause": engine.pause, "resume": engine.resume}[
        kind
    ]
    for run_id in run_ids:
        act(run_id)


def _act_bulk(engine: Engine, kind: str, tag: str, runs: int, *, pages: bool) -> None:
    wanted = RunFilter(tags=(("round", tag),))
    action = create_bulk_action(
        engine.store, kind=kind, tenant="default", filter=wanted, actor="bench", limit=runs
    )
    kept = bulk_kinds.BATCHES
    if not pages:
        bulk_kinds.BATCHES = {}
    try:
        ended = run_bulk_action(engine, action.id, tenant="default")
    finally:
        bulk_kinds.BATCHES = kept
    assert ended.done == runs, ended


def _round(engine: Engine, kind: str, index: int, runs: int) -> dict[str, float]:
    ids = {
        way: [
            engine.start("bench_bulk", input=None, tags={"round": f"{kind}-{index}-{way}"}).run_id
            for _ in range(runs)
        ]
        for way in WAYS
    }
    _project(engine.store)
    before = {"resume": "pause", "retry": "cancel"}.get(kind)
    if before is not None:  # the state the kind acts on, not timed
        for way in WAYS:
            _act_bulk(engine, before, f"{kind}-{index}-{way}", runs, pages=True)
    seconds: dict[str, float] = {}
    order = WAYS[index % 3 :] + WAYS[: index % 3]
    for way in order:
        began, cpu = time.perf_counter(), time.process_time()
        if way == "loop":
            _act_loop(engine, kind, ids["loop"])
        else:
            _act_bulk(engine, kind, f"{kind}-{index}-{way}", runs, pages=way == "page")
        seconds[way] = time.perf_counter() - began
        seconds[f"{way}_cpu"] = time.process_time() - cpu
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", choices=(*KINDS, "all"), default="all")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    kinds = KINDS if args.kind == "all" else (args.kind,)
    load_before = os.getloadavg()
    report: dict[str, object] = {"runs": args.runs, "kinds": {}}
    with fresh_database(args.url, "bench_bulk") as url, open_store(url=url) as store:
        engine = Engine(store, registry)
        for kind in kinds:
            rounds = [_round(engine, kind, i, args.runs) for i in range(args.rounds)]
            med = {w: statistics.median(r[w] for r in rounds) for w in WAYS}
            cpu = {w: statistics.median(r[f"{w}_cpu"] for r in rounds) for w in WAYS}
            ratios = [r["one"] / r["page"] for r in rounds]
            print(f"{kind}: medians of {args.rounds} rounds of {args.runs} runs each way")
            for way in WAYS:
                print(
                    f"  {way:5} {med[way] * 1000 / args.runs:8.2f} ms/run {args.runs / med[way]:8.0f} runs/s"
                    f"  (client CPU {cpu[way] * 1000 / args.runs:.2f} ms/run)"
                )
            print(
                f"  page speed-up over one: median {statistics.median(ratios):.1f}x "
                f"(range {min(ratios):.1f}-{max(ratios):.1f})"
            )
            report["kinds"][kind] = {  # type: ignore[index]
                "rounds": rounds,
                "median_seconds": med,
                "median_client_cpu_seconds": cpu,
                "speedup_page_over_one": {"median": statistics.median(ratios), "all": ratios},
            }
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    report["load_average"] = {"before": load_before, "after": load_after}
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"bulk_actions-{stamp}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
