"""Claims after a burst: a worker session that first claimed from a small queue, then a backlog arrives.

Run by hand (it is not a test):

    python -m bench.claim_after_burst [--rows 20000] [--claims 500] [--rounds 3]

A claim's plans are made once per session (migration 0080) against the queue's statistics of that moment,
and kept until autovacuum analyses the queue again, up to a minute later. Here one session claims from a
queue of three runs (as a worker does at its start, or after a quiet moment), then `--rows` ready one-node
runs are queued at once (fair_claims' seed) and the session claims `--claims` nodes one at a time, as the
claim at a run's end does: nodes claimed per second. As a control, the same with the burst queued and
analysed before the session's first claim, where the plans were right before the change too. `now` is
the claim as migrated; `before` is the same database with the planner settings of migration 0086 taken
off the claim again (what every database had before it), on an identical queue, in alternating order.
Results go to bench/results/claim_after_burst-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench._common import default_admin_url, load_average, median, print_table, quiet_logs, with_database
from bench.fair_claims import SEED, database
from bench.run_load import commit
from eventstore.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
CLAIM = "SELECT count(*) FROM ledgerflow.wf_claim('bench', 'i1', 'bench/1', ARRAY['busy'], ARRAY['1'], 1, 60)"
UNDO_0086 = (
    "ALTER FUNCTION ledgerflow.wf_claim(text, text, text, text[], text[], int, float8)"
    " RESET enable_seqscan RESET enable_hashjoin RESET enable_mergejoin"
)


def claims_per_second(url: str, rows: int, claims: int, *, first_from: int) -> float:
    """Claims per second, one at a time, from a queue of `rows` ready runs, by a session whose first claim
    (when its plans are made) saw `first_from` queued runs; 0: the burst already queued and analysed."""
    with psycopg.connect(url, autocommit=True) as conn:
        if first_from:
            conn.execute(SEED, {"rows": first_from, "tenants": 1})
            conn.execute(CLAIM)
            conn.execute(SEED, {"rows": rows, "tenants": 1})
        else:
            conn.execute(SEED, {"rows": rows, "tenants": 1})
            conn.execute("ANALYZE ledgerflow.workflow_queue")
            conn.execute(CLAIM)
        began = time.perf_counter()
        for _ in range(claims):
            (n,) = conn.execute(CLAIM).fetchone() or (0,)
            assert n == 1, "a claim with rows ready claims one"
        return claims / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=default_admin_url())
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    quiet_logs()
    load_before = load_average()
    #: The session's first claim saw 3 queued runs (its plans made against them), or the whole burst,
    #: analysed (the plans right from the start: what the change must not make slower).
    cases = {"first claim from 3 runs": 3, "first claim after the burst": 0}
    rates: dict[str, dict[str, list[float]]] = {case: {"before": [], "now": []} for case in cases}
    with database(args.url) as template:
        migrate(with_database(args.url, template))
        for round_ in range(args.rounds):
            order = ("before", "now") if round_ % 2 == 0 else ("now", "before")
            for case, first_from in cases.items():
                for label in order:
                    with database(args.url, template) as name:
                        url = with_database(args.url, name)
                        if label == "before":
                            with psycopg.connect(url, autocommit=True) as conn:
                                conn.execute(UNDO_0086)
                        rate = claims_per_second(url, args.rows, args.claims, first_from=first_from)
                        rates[case][label].append(rate)
    medians = {case: {"before": median(r["before"]), "now": median(r["now"])} for case, r in rates.items()}
    print_table(
        ["session", "queued", "claims", "before (claims/s)", "now (claims/s)", "now / before"],
        [
            [
                case,
                f"{args.rows:,}",
                str(args.claims),
                f"{m['before']:.0f}",
                f"{m['now']:.0f}",
                f"{m['now'] / m['before']:.2f}x",
            ]
            for case, m in medians.items()
        ],
    )
    result = {
        "benchmark": "claim_after_burst",
        "at": datetime.now(UTC).isoformat(),
        "commit": commit(),
        "load_average": {"before": load_before, "after": load_average()},
        "rows": args.rows,
        "claims": args.claims,
        "claims_per_second": rates,
        "median": {case: {**m, "ratio": m["now"] / m["before"]} for case, m in medians.items()},
    }
    path = (
        ROOT / "bench" / "results" / f"claim_after_burst-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"saved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
