"""A drill of debounced starts on real `ledgerflow worker` processes killed with SIGKILL mid-burst and
around the moment a burst is due (when a worker fires it): every burst starts exactly one run, with its
last start's input, and every run completes."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import kill
from tests.acceptance.drill_workers import start_worker as drill_worker
from tests.acceptance.test_starts_drills import completions, create_calls_table, started
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Debounce, Engine, Started, pending_debounces

pytestmark = pytest.mark.drill
WINDOW = 2.0  # far above a start's latency on a loaded machine: a burst never pauses that long
BURSTS = 8
STARTS = 25


def test_sigkill_mid_burst_starts_one_run_per_burst(store: EventStore, tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    create_calls_table(store)
    engine = Engine(store, registry)
    rng = random.Random(21)
    names = ("d1", "d2")
    workers = {n: drill_worker(store.url, n, log) for n in names}
    answers: dict[str, list[tuple[dict[str, Any], Started]]] = {}
    kills = 0

    def burst(b: int) -> None:
        key = f"burst-{b}"
        answers[key] = []
        for i in range(STARTS):
            x = {"n": b * 1000 + i}
            answers[key].append((x, engine.start("linear", input=x, debounce=Debounce(key, WINDOW))))
            threading.Event().wait(0.01)

    def kill_one() -> None:
        nonlocal kills
        name = rng.choice(names)
        kill(workers[name])
        kills += 1
        workers[name] = drill_worker(store.url, name, log)

    try:
        for b in range(BURSTS):
            # Bursts overlap: this one runs while the one before is due and fired.
            bursting = threading.Thread(target=burst, args=(b,))
            bursting.start()
            threading.Event().wait(rng.uniform(0.05, 0.3))
            kill_one()  # mid-burst
            bursting.join(timeout=60)
            assert not bursting.is_alive()
            # Around the moment the burst is due, when a worker takes its row and starts its run.
            threading.Event().wait(WINDOW + rng.uniform(-0.3, 0.6))
            kill_one()
        wait_until(lambda: not pending_debounces(store), timeout=60, what="every burst to fire")
        wait_until(lambda: len(completions(store)) >= BURSTS, timeout=120, what="every run to complete")
    finally:
        for w in workers.values():
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers.values():
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill(w)

    runs = started(store, "linear")
    assert len(runs) == BURSTS, f"{len(runs)} runs for {BURSTS} bursts ({kills} kills)"
    by_id = {r["run_id"]: r for r in runs}
    for key, sent in answers.items():
        [run_id] = {str(s.run_id) for _, s in sent}  # every start of a burst names the same run
        assert by_id[run_id]["input"] == sent[-1][0], key  # the last start's input
    assert set(completions(store).values()) == {1}
    assert kills == 2 * BURSTS
