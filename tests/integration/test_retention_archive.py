"""A released run whose events left the database with the log's partitions: still found by id (asked for,
it is named as archived, with how many of its events and the commands that bring it back), refused a
restore while its events are away, and restored, equal to what it was, once its partitions are back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from eventstore import (
    EventStore,
    NewEvent,
    NotFoundError,
    archive_partition,
    list_partitions,
    open_store,
    restore_partition,
)
from tests.narrow_partitions import narrow_partitions
from workflows import Engine, RunStateError, Workflow, WorkflowRegistry, release_of, release_run, restore_run
from workflows import events as ev

registry = WorkflowRegistry()
reports = Workflow("archived_reports", retention=timedelta(days=30))


@reports.node()
def render(ctx: object) -> str:
    return "rendered"


registry.register(reports)


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    narrow_partitions(database_url, 10)  # so that the run's events sit in partitions of their own
    with open_store(url=database_url) as opened:
        yield opened


def test_an_archived_run_is_found_by_id_and_restored_once_its_partitions_are_back(
    store: EventStore, tmp_path: Path
) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("archived_reports").run_id
    engine.cancel(run_id)  # it ends at once: nothing ran
    release_run(engine, run_id, now=datetime.now(UTC) + timedelta(days=31))
    before = engine.load(run_id)
    positions = [e.position for e in store.read_stream(ev.run_stream(run_id))]
    for i in range(30):  # the partitions holding the run's events stop receiving appends
        store.append(f"filler-{i % 3}", [NewEvent("Filler", {"i": i})])

    with store.connection() as conn:
        partitions = list_partitions(conn)
    holding = [p for p in partitions if any(p.from_position <= x < p.to_position for x in positions)]
    manifests = []
    for partition in holding:
        archive_partition(store.url, partition.name, tmp_path)
        manifests.append(tmp_path / f"{partition.name}.manifest.json")
    assert store.read_stream(ev.run_stream(run_id)) == [], "its events left the database"

    with pytest.raises(NotFoundError, match=rf"{before.version} of run {run_id}'s events are in archived"):
        engine.load(run_id)  # found by id: archived, and how to bring it back
    with pytest.raises(RunStateError, match=r"archived partitions .*ledgerflow log restore"):
        restore_run(engine, run_id)
    assert store.read_stream(ev.run_stream(run_id)) == [], "the refused restore wrote nothing"

    for manifest in manifests:
        restore_partition(store.url, manifest)
    restore_run(engine, run_id)
    assert release_of(store, run_id) is None
    after = engine.load(run_id)
    assert (after.status, after.nodes.keys(), after.input) == (
        before.status,
        before.nodes.keys(),
        before.input,
    )
    assert after.version == before.version + 1  # its RunRestored, after everything it had


def test_a_run_whose_first_events_are_archived_is_named_archived_not_folded_from_the_rest(
    store: EventStore, tmp_path: Path
) -> None:
    """Partitions leave oldest first, so a run can keep its last events in the log while its first ones,
    its start among them, are archived. With no snapshot to start from, the rest alone would fold into a
    run that never was (no workflow, no input): it is named archived instead, as a wholly archived run is."""
    engine = Engine(store, registry)
    run_id = engine.start("archived_reports").run_id
    for i in range(12):  # the run's later events land in a later partition than its start
        store.append(f"filler-{i % 3}", [NewEvent("Filler", {"i": i})])
    engine.cancel(run_id)
    events = store.read_stream(ev.run_stream(run_id))
    first, last = events[0].position, events[-1].position
    with store.connection() as conn:
        partitions = list_partitions(conn)
    starting = next(p for p in partitions if p.from_position <= first < p.to_position)
    assert not starting.from_position <= last < starting.to_position, "the run spans two partitions"
    for i in range(30):  # the start's partition stops receiving appends
        store.append(f"filler-{i % 3}", [NewEvent("Filler", {"i": i})])
    archive_partition(store.url, starting.name, tmp_path)
    kept = store.read_stream(ev.run_stream(run_id))
    assert kept, "some of its events are still in the log"
    assert ev.RUN_STARTED not in [e.type for e in kept]

    with pytest.raises(NotFoundError, match=rf"of run {run_id}'s events are in archived partitions"):
        engine.load(run_id)
