"""Crypto-shredding: personal fields sealed at append, readable until their subject is forgotten, then
redacted everywhere (reads, the API's encoded pages, projections rebuilt from the log); everything else
about the events unchanged."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Annotated

import psycopg
import pydantic
import pytest

from eventstore import (
    FORGOTTEN_STREAM,
    REDACTED,
    Cursor,
    DatabaseSettings,
    EventStore,
    EventTypes,
    InvalidInputError,
    LedgerflowError,
    MasterKeyMissingError,
    MasterKeyUnknownError,
    NewEvent,
    Personal,
    RecordedEvent,
    forget_subject,
    generate_master_key,
    open_store,
    personal_fields,
    rotate_master_key,
)
from eventstore.spi import json_loads
from projector import ApplyContext, Projection, ProjectorWorker, Table, WorkerSettings, rebuild
from projector.digest import projection_digest
from tests.waiting import joined

FAST = WorkerSettings(lease_ttl=5, heartbeat_interval=1, batch_size=7)
MASTER = generate_master_key()

personal_fields("TestCustomerMoved", subject="customer_id", fields=["address", "phone"])


class CustomerRegistered(pydantic.BaseModel):
    customer_id: str
    email: Annotated[str, Personal(subject="customer_id")]
    plan: str


TYPES = EventTypes()
TYPES.register("TestCustomerRegistered", CustomerRegistered)


def keyed_store(url: str, master: str | None = MASTER, previous: str | None = None) -> EventStore:
    settings = DatabaseSettings(
        master_key=master,  # type: ignore[arg-type]
        previous_master_keys=previous,  # type: ignore[arg-type]
    )
    return open_store(settings, url=url, migrate=False, types=TYPES)


@pytest.fixture
def shredding(database_url: str) -> Iterator[EventStore]:
    with keyed_store(database_url) as opened:
        yield opened


def registered(customer: str, email: str, plan: str = "basic") -> NewEvent:
    return TYPES.new(CustomerRegistered(customer_id=customer, email=email, plan=plan))


def everything(store: EventStore, tenant: str = "default") -> list[RecordedEvent]:
    """The tenant's whole log as read now (pages until caught up)."""
    found: list[RecordedEvent] = []
    cursor = Cursor()
    while True:
        page = store.read_all(cursor, tenant=tenant)
        found.extend(page.events)
        cursor = page.cursor
        if page.caught_up:
            return found


def stored_text(store: EventStore) -> str:
    """Every event of the log as stored, as one text: what a look at the table would show."""
    with store.pool.connection() as conn:
        rows = conn.execute("SELECT data::text FROM ledgerflow.events ORDER BY position").fetchall()
    return "\n".join(r[0] for r in rows)


def test_personal_fields_are_sealed_in_the_log_and_read_back(shredding: EventStore) -> None:
    shredding.append("customer-1", [registered("c1", "ann@example.com")])
    shredding.append(
        "customer-1",
        [NewEvent("TestCustomerMoved", {"customer_id": "c1", "address": "1 Rue X", "phone": "555"})],
    )
    text = stored_text(shredding)
    assert "ann@example.com" not in text
    assert "1 Rue X" not in text
    assert '"plan": "basic"' in text  # not personal: stored as it is
    first, second = shredding.read_stream("customer-1")
    assert first.data == {"customer_id": "c1", "email": "ann@example.com", "plan": "basic"}
    assert second.data == {"customer_id": "c1", "address": "1 Rue X", "phone": "555"}
    assert isinstance(TYPES.decode(first), CustomerRegistered)
    assert [e.data for e in everything(shredding)] == [first.data, second.data]
    page = shredding.read_stream_page("customer-1")
    assert [json_loads(e.data_json) for e in page.events] == [first.data, second.data]
    assert shredding.read_streams(["customer-1"])["customer-1"][0].data == first.data
    with shredding.pool.connection() as conn:
        keys = conn.execute("SELECT count(*) FROM ledgerflow.subject_keys").fetchone()
    assert keys == (1,)  # one key per subject, not per event or field


def test_forget_redacts_the_subject_and_keeps_everything_else(shredding: EventStore) -> None:
    shredding.append("customer-1", [registered("c1", "ann@example.com")])
    shredding.append("customer-2", [registered("c2", "bob@example.com")])
    before = everything(shredding)
    done = forget_subject(shredding, "c1", tenant="default", by="test")
    assert not done.already
    after = everything(shredding)
    ann, bob, record = after
    assert ann.data == {"customer_id": "c1", "email": REDACTED, "plan": "basic"}
    assert bob.data == before[1].data
    for old, new in zip(before, after, strict=False):
        assert (old.event_id, old.position, old.stream_version, old.type) == (
            new.event_id,
            new.position,
            new.stream_version,
            new.type,
        )
    # The forgetting is recorded in the tenant's log, once.
    assert (record.stream_id, record.type, record.data["subject"], record.data["by"]) == (
        FORGOTTEN_STREAM,
        "SubjectForgotten",
        "c1",
        "test",
    )
    again = forget_subject(shredding, "c1", tenant="default", by="test")
    assert again.already
    assert again.key_id == done.key_id
    assert shredding.stream_version(FORGOTTEN_STREAM) == 1
    # The key is gone from the table: only a tombstone remains.
    with shredding.pool.connection() as conn:
        row = conn.execute(
            "SELECT wrapped_key, forgotten_by FROM ledgerflow.subject_keys WHERE subject = 'c1'"
        ).fetchone()
    assert row == (None, "test")


def test_a_retried_append_answers_as_the_original_after_forget(shredding: EventStore) -> None:
    event = registered("c1", "ann@example.com")
    first = shredding.append("customer-1", [event], idempotency_key="k-1")
    forget_subject(shredding, "c1", tenant="default", by="test")
    retried = shredding.append("customer-1", [event], idempotency_key="k-1")
    assert retried.duplicate
    assert retried.events == first.events
    # New personal data of a forgotten subject is forgotten as it is written.
    shredding.append("customer-1", [registered("c1", "ann@new.example")])
    assert [e.data["email"] for e in shredding.read_stream("customer-1")] == [REDACTED, REDACTED]
    assert "ann@new.example" not in stored_text(shredding)


def _email_book() -> Projection:
    book = Projection(
        name="test_email_book",
        version=1,
        tables=[
            Table(
                "email_book",
                "CREATE TABLE {table} (customer_id text PRIMARY KEY, email text NOT NULL,"
                " plan text NOT NULL)",
            )
        ],
    )

    @book.on("TestCustomerRegistered")
    def add(ctx: ApplyContext, event: RecordedEvent) -> None:
        ctx.execute(
            "INSERT INTO {email_book} (customer_id, email, plan) VALUES (%s, %s, %s)",
            (event.data["customer_id"], event.data["email"], event.data["plan"]),
        )

    return book


def _plans() -> Projection:
    plans = Projection(
        name="test_plans",
        version=1,
        tables=[Table("plans", "CREATE TABLE {table} (customer_id text PRIMARY KEY, plan text NOT NULL)")],
    )

    @plans.on("TestCustomerRegistered")
    def add(ctx: ApplyContext, event: RecordedEvent) -> None:
        ctx.execute("INSERT INTO {plans} VALUES (%s, %s)", (event.data["customer_id"], event.data["plan"]))

    return plans


def test_a_projection_rebuilt_after_forget_holds_no_trace(shredding: EventStore) -> None:
    for i in range(10):
        shredding.append(f"customer-{i}", [registered(f"c{i}", f"person{i}@example.com", plan=f"p{i % 3}")])
    book, plans = _email_book(), _plans()
    worker = ProjectorWorker(shredding, [book, plans], FAST)
    worker.run_until_caught_up()
    with shredding.pool.connection() as conn:
        plans_before = projection_digest(conn, plans, plans.schema)
        assert "person3@example.com" in _table_text(conn, "email_book")
    forget_subject(shredding, "c3", tenant="default", by="test")
    rebuild(shredding, book)
    rebuild(shredding, plans)
    worker.run_until_caught_up()
    with shredding.pool.connection() as conn:
        text = _table_text(conn, "email_book")
        plans_after = projection_digest(conn, plans, plans.schema)
    assert "person3@example.com" not in text
    assert f"(c3,{REDACTED},p0)" in text
    assert "person4@example.com" in text
    assert plans_after == plans_before  # the digest of non-personal fields still holds
    worker.release_all()


def _table_text(conn: psycopg.Connection[tuple[object, ...]], table: str) -> str:
    query = f"SELECT string_agg(t::text, E'\\n') FROM ledgerflow.{table} t"  # test-only table names
    row = conn.execute(query).fetchone()  # type: ignore[call-overload]
    return str(row[0])


def test_two_appends_for_a_new_subject_create_one_key(database_url: str) -> None:
    # Separate stores: separate pools and key caches, as two processes would have.
    stores = [keyed_store(database_url) for _ in range(4)]
    try:
        for round_ in range(5):
            barrier = threading.Barrier(len(stores))

            def append(store: EventStore, i: int, r: int = round_, b: threading.Barrier = barrier) -> None:
                b.wait()
                store.append(f"customer-{r}-{i}", [registered(f"new-{r}", f"x{i}@example.com")])

            threads = [threading.Thread(target=append, args=(s, i)) for i, s in enumerate(stores)]
            for t in threads:
                t.start()
            joined(*threads)
            with stores[0].pool.connection() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ledgerflow.subject_keys WHERE subject = %s", (f"new-{round_}",)
                ).fetchone()
            assert row == (1,)
            emails = sorted(e.data["email"] for e in everything(stores[0])[-4:])
            assert emails == [f"x{i}@example.com" for i in range(4)]
    finally:
        for s in stores:
            s.close()


def test_forget_racing_appends_leaves_nothing_readable(database_url: str) -> None:
    appenders = [keyed_store(database_url) for _ in range(2)]
    operator = keyed_store(database_url)
    stop = threading.Event()
    failures: list[BaseException] = []

    def append(store: EventStore, n: int) -> None:
        i = 0
        while not stop.is_set() or i < 20:
            try:
                store.append(f"customer-{n}", [registered("racer", f"racer-{n}-{i}@example.com")])
            except LedgerflowError:
                pass  # a typed refusal is allowed; anything else fails the test
            except BaseException as exc:
                failures.append(exc)
                return
            i += 1

    threads = [threading.Thread(target=append, args=(s, n)) for n, s in enumerate(appenders)]
    try:
        for t in threads:
            t.start()
        # Forget once both appenders have written (a condition, not a sleep).
        from tests.waiting import wait_until

        wait_until(lambda: (operator.stream_version("customer-0") or 0) >= 5, what="appends began")
        wait_until(lambda: (operator.stream_version("customer-1") or 0) >= 5, what="appends began")
        forget_subject(operator, "racer", tenant="default", by="test")
        stop.set()
        joined(*threads)
    finally:
        stop.set()
        for s in (*appenders, operator):
            s.close()
    assert failures == []
    with keyed_store(database_url) as reader:
        events = [e for e in everything(reader) if e.type != "SubjectForgotten"]
        assert len(events) >= 40
        assert {e.data["email"] for e in events} == {REDACTED}
        encoded = reader.read_stream_page("customer-0", limit=100_000)
        assert all("example.com" not in e.data_json for e in encoded.events)


def test_no_master_key_is_a_typed_error_and_writes_nothing(database_url: str) -> None:
    with open_store(url=database_url, migrate=False, types=TYPES) as bare:
        with pytest.raises(MasterKeyMissingError, match="LEDGERFLOW_MASTER_KEY"):
            bare.append("customer-1", [registered("c1", "ann@example.com")])
        assert bare.stream_version("customer-1") is None
        # Events without personal fields append as ever.
        bare.append("order-1", [NewEvent("OrderPlaced", {"total": 3})])
    with keyed_store(database_url) as keyed:
        keyed.append("customer-1", [registered("c1", "ann@example.com")])
    with open_store(url=database_url, migrate=False) as bare, pytest.raises(MasterKeyMissingError):
        bare.read_stream("customer-1")


def test_a_tenant_forgets_only_its_own_subject(shredding: EventStore) -> None:
    shredding.append("customer-1", [registered("c1", "ann@example.com")], tenant="acme")
    shredding.append("customer-1", [registered("c1", "ann@other.example")], tenant="globex")
    forget_subject(shredding, "c1", tenant="globex", by="test")
    (acme,) = shredding.read_stream("customer-1", tenant="acme")
    (globex,) = shredding.read_stream("customer-1", tenant="globex")
    assert acme.data["email"] == "ann@example.com"
    assert globex.data["email"] == REDACTED
    assert shredding.stream_version(FORGOTTEN_STREAM, tenant="acme") is None


def test_master_key_rotation_rewraps_without_touching_the_log(database_url: str) -> None:
    with keyed_store(database_url) as old:
        for i in range(7):
            old.append(f"customer-{i}", [registered(f"c{i}", f"p{i}@example.com")])
        logged = stored_text(old)
    new_master = generate_master_key()
    with keyed_store(database_url, new_master, previous=MASTER) as both:
        # Interrupted after one batch: what is left is rotated by the next run.
        step = both.personal.keys.rotate_batch(3)
        assert (step.rewrapped, step.remaining) == (3, 4)
        assert both.read_stream("customer-0")[0].data["email"] == "p0@example.com"
        assert rotate_master_key(both, batch=2) == 4
        assert rotate_master_key(both) == 0  # idempotent: nothing left
        assert stored_text(both) == logged
    with keyed_store(database_url, new_master) as rotated:
        assert [rotated.read_stream(f"customer-{i}")[0].data["email"] for i in range(7)] == [
            f"p{i}@example.com" for i in range(7)
        ]
    with keyed_store(database_url) as stale, pytest.raises(MasterKeyUnknownError):
        stale.read_stream("customer-0")


def test_data_that_looks_sealed_is_refused(shredding: EventStore) -> None:
    forged = {"customer_id": "c1", "note": {"$personal": 1, "subject": "c1", "key": str(uuid.uuid4())}}
    with pytest.raises(InvalidInputError, match="marks sealed personal data"):
        shredding.append("customer-1", [NewEvent("Anything", forged)])
    with pytest.raises(InvalidInputError, match="lacks"):
        shredding.append("customer-1", [NewEvent("TestCustomerMoved", {"address": "x"})])
    assert shredding.stream_version("customer-1") is None


def test_a_key_a_reader_unwrapped_decrypts_nothing_once_another_process_forgets(database_url: str) -> None:
    """Reads keep the data keys they unwrapped (so a page does not unwrap them again), but ask the key
    table at every page: a forgetting by another store (another process's, as far as memory goes) is
    obeyed by the reader's next read, with no wait, and the forgetting store drops its own copies."""
    with keyed_store(database_url) as reader, keyed_store(database_url) as operator:
        reader.append("customer-1", [registered("c1", "ann@example.com")])
        reader.append("customer-2", [registered("c2", "bob@example.com")])
        assert [e.data["email"] for e in reader.read_stream("customer-1")] == ["ann@example.com"]
        assert [e.data["email"] for e in reader.read_stream("customer-2")] == ["bob@example.com"]
        with reader.pool.connection() as conn:
            row = conn.execute("SELECT key_id FROM ledgerflow.subject_keys WHERE subject = 'c1'").fetchone()
        assert row is not None
        cached = reader.personal.keys.unwrapped.get("default", "c1", row[0])
        assert cached is not None  # kept: the case this test is about
        assert cached.cipher is not None
        operator.read_stream("customer-1")  # the operator's store unwraps it too
        forget_subject(operator, "c1", tenant="default", by="test")
        assert [e.data["email"] for e in reader.read_stream("customer-1")] == [REDACTED]
        assert [e.data["email"] for e in everything(reader) if e.type != "SubjectForgotten"] == [
            REDACTED,
            "bob@example.com",
        ]
        assert reader.read_streams(["customer-1"])["customer-1"][0].data["email"] == REDACTED
        assert operator.personal.keys.unwrapped.get("default", "c1", row[0]) is None
