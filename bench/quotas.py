"""What per-tenant quotas and debounced starts cost.

    python -m bench.quotas [--runs 3] [--starts 300]

Starts of a one-node workflow from one thread, in rounds that alternate, on one database:
- without quotas (the baseline);
- under a runs-in-flight quota (admitted: the tenant's lock and a count of its runs, up to the quota, in
  the start's transaction), for a tenant new each round, and for one that held `--in-flight` runs before
  the first round and holds more each round;
- under a starts-per-second quota (admitted: a process's token bucket);
- without quotas on a second database without the `workflow_queue_by_tenant` index: what the index costs
  starts that no quota bounds.
Then bursts of debounced starts fired by a `DebounceKeeper`: the delay from a burst's due time to its
run's start.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from bench._common import default_admin_url, fresh_database, median, print_table, quiet_logs
from eventstore import EventStore, open_store
from workflows import Debounce, Engine, NodeContext, Quota, TenantQuotas, Workflow, WorkflowRegistry
from workflows.debounce import DebounceKeeper

registry = WorkflowRegistry()
one = Workflow("one")


@one.node()
def only(ctx: NodeContext) -> None:
    return None


registry.register(one)


def rate(start: Callable[[], object], n: int) -> float:
    began = time.perf_counter()
    for _ in range(n):
        start()
    return n / (time.perf_counter() - began)


def starts(store: EventStore, bare: EventStore, args: argparse.Namespace) -> dict[str, list[float]]:
    """Rounds of each mode in turn, so that the machine's drift falls on every mode alike. `bare`: a
    database without the tenant index."""
    plain = Engine(store, registry)
    limited = TenantQuotas(store, Quota(max_runs_in_flight=args.quota))
    in_flight = Engine(store, registry, quotas=limited)
    per_second = Engine(store, registry, quotas=TenantQuotas(store, Quota(starts_per_second=10**9)))
    for _ in range(args.in_flight):  # the tenant's runs before the rounds: each start counts them
        plain.start("one", tenant="busy")
    fresh = iter(range(10**6))  # a new tenant each round: it holds only that round's runs
    tenant = ["t0"]

    def in_flight_fresh() -> object:
        return in_flight.start("one", tenant=tenant[0])

    modes: dict[str, Callable[[], object]] = {
        "no quota": lambda: plain.start("one", tenant="other"),
        f"runs in flight (quota {args.quota}), tenant holding 0+": in_flight_fresh,
        f"runs in flight (quota {args.quota}), tenant holding {args.in_flight}+": lambda: in_flight.start(
            "one", tenant="busy"
        ),
        "starts per second": lambda: per_second.start("one", tenant="other"),
        "no quota, no tenant index": lambda: Engine(bare, registry).start("one", tenant="other"),
    }
    found: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        tenant[0] = f"t{next(fresh)}"
        for mode, start in modes.items():
            found[mode].append(rate(start, args.starts))
    return found


def debounce_delays(store: EventStore, bursts: int) -> list[float]:
    engine = Engine(store, registry)
    keeper = DebounceKeeper(engine, ["one"], worker_id="bench")
    keeper.start()
    try:
        due = {}
        for b in range(bursts):
            for _ in range(5):
                s = engine.start("one", tenant="deb", debounce=Debounce(f"b{b}", 0.2))
            due[str(s.run_id)] = s.debounced_until
            threading.Event().wait(0.05)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with store.pool.connection() as conn:
                rows = conn.execute(
                    "SELECT data->>'run_id', recorded_at FROM ledgerflow.events "
                    "WHERE event_type = 'wf.RunStarted' AND tenant = 'deb'"
                ).fetchall()
            if len(rows) == bursts:
                return [(at - due[r]).total_seconds() * 1000 for r, at in rows]
            threading.Event().wait(0.1)
        raise TimeoutError("the bursts did not all fire within 60 s")
    finally:
        keeper.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=200, help="the tenant's runs before the rounds")
    parser.add_argument("--quota", type=int, default=10_000, help="the tenant's quota of runs in flight")
    parser.add_argument("--bursts", type=int, default=40)
    args = parser.parse_args()
    quiet_logs()
    admin = default_admin_url()
    with (
        fresh_database(admin, "bench_quotas") as url,
        open_store(url=url, migrate=True) as store,
        fresh_database(admin, "bench_quotas") as bare_url,
        open_store(url=bare_url, migrate=True) as bare,
    ):
        with bare.pool.connection() as conn:
            conn.execute("DROP INDEX ledgerflow.workflow_queue_by_tenant")
        found = starts(store, bare, args)
        delays = sorted(debounce_delays(store, args.bursts))
    base = median(found["no quota"])
    rows = [[m, f"{median(v):.0f}", f"{median(v) / base:.2f}"] for m, v in found.items()]
    print(f"medians of {args.runs} rounds of {args.starts} starts; each round adds to what a tenant holds:")
    print_table(["mode", "starts/s", "÷ no quota"], rows)

    def p(q: float) -> float:
        return delays[min(len(delays) - 1, int(len(delays) * q))]

    print(
        f"\n{args.bursts} debounced bursts: due time to run start p50 {p(0.5):.0f} ms, p99 {p(0.99):.0f} ms"
    )


if __name__ == "__main__":
    main()
