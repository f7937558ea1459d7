"""What a per-tenant rate quota costs an append, now that its token bucket lives in the database.

    python -m bench.rate_quotas [--rounds 7] [--appends 500]

One-event appends from one thread, each checked the way the API's append route checks it
(`TenantQuotas.take_append`, then `EventStore.append`), in rounds that alternate on one database:
- no quota (the baseline: the check costs nothing);
- an appends-per-second quota high enough never to refuse, taken one token at a time: every append first
  takes a token from the tenant's bucket row (ledgerflow.take_rate_tokens, one statement on the thread's
  pinned connection), as at rates under 20 a second;
- the same quota as it runs by default: a take asks for 50 ms' worth of the rate (at most 100 tokens),
  and the appends spend them without a statement of their own.
Printed: the medians and the ratio quota ÷ no quota (of appends per second), per round and overall.
Results go to bench/results/rate_quotas-<UTC time>.json with the load average.
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
from eventstore import EventStore, NewEvent, open_store
from workflows import Quota, TenantQuotas


def _rate(store: EventStore, quotas: TenantQuotas, tenant: str, n: int, offset: int) -> float:
    began = time.perf_counter()
    for i in range(n):
        quotas.take_append(tenant)
        store.append(f"bench-{tenant}-{(offset + i) % 50}", [NewEvent("Bench", {"i": i})], tenant=tenant)
    return n / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    load_before = os.getloadavg()
    rounds: list[dict[str, float]] = []
    with fresh_database(args.url, "bench_rate_quotas") as url, open_store(url=url) as store:
        plain = TenantQuotas(store)
        high = Quota(appends_per_second=10.0**6)
        one_by_one = TenantQuotas(store, high, spare_seconds=0.0)
        spared = TenantQuotas(store, high)
        _rate(store, plain, "warm", args.appends // 5, 0)  # caches, the pinned connection
        _rate(store, one_by_one, "warm", args.appends // 5, 0)
        for r in range(args.rounds):
            plans = [
                ("no quota", plain, "free"),
                ("quota, a take per append", one_by_one, "single"),
                ("quota, spare tokens", spared, "spared"),
            ]
            if r % 2:
                plans.reverse()  # no mode always runs first
            rounds.append({m: _rate(store, q, t, args.appends, r * args.appends) for m, q, t in plans})
    load_after = os.getloadavg()
    modes = list(rounds[0])
    med = {m: statistics.median(rd[m] for rd in rounds) for m in modes}
    ratios = {m: [rd[m] / rd["no quota"] for rd in rounds] for m in modes if m != "no quota"}
    print(f"medians of {args.rounds} alternating rounds of {args.appends} one-event appends, one thread")
    for mode, value in med.items():
        print(f"{mode:26} {value:8.0f} appends/s  {1000 / value:6.3f} ms/append")
    for mode, values in ratios.items():
        print(
            f"{mode} ÷ no quota (appends/s): median {statistics.median(values):.2f} "
            f"(range {min(values):.2f}-{max(values):.2f}); "
            f"cost per append {1000 / med[mode] - 1000 / med['no quota']:.3f} ms"
        )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"rate_quotas-{stamp}.json").write_text(
        json.dumps(
            {
                "appends_per_round": args.appends,
                "rounds": rounds,
                "median_appends_per_second": med,
                "ratios_over_no_quota": {
                    m: {"median": statistics.median(v), "all": v} for m, v in ratios.items()
                },
                "load_average": {"before": load_before, "after": load_after, "cpus": os.cpu_count()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
