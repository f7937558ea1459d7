"""Every test gets a fresh database cloned from a migrated template: fast, isolated, no leftovers.

The server is the one named by LEDGERFLOW_TEST_ADMIN_URL, else PostgreSQL on 127.0.0.1:5432 when something
listens there, else the embedded one. A server that listens but does not yet accept (starting up, or out of
connection slots for a moment) is waited for, never swapped for the embedded one behind the run's back.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

from eventstore import EventStore, open_store
from eventstore.db import redact
from eventstore.migrate import migrate

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("default")

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Seconds before a drill is failed as hung; other tests get the ini's `timeout` (pyproject.toml).
DRILL_TIMEOUT = 900
#: The markers of drills: tests with real processes, which the quick run leaves out.
DRILL_MARKERS = ("drill", "failover", "partition")


def _in_ci() -> bool:
    """CI sets CI (.ci/run sets CI=1, most CI services CI=true)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


#: How long a server that listens on 127.0.0.1:5432 may refuse connections before the run stops.
LOCAL_SERVER_PATIENCE = 60.0


def _listens_locally() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=3):
            return True
    except OSError:
        return False


def _wait_for_local_server() -> str:
    """The local server's URL once it accepts a connection. It listens, so it is the one meant: a refusal
    (starting up, recovering, out of slots) is waited out; one that lasts fails the run with its reason."""
    deadline = time.monotonic() + LOCAL_SERVER_PATIENCE
    pause = 0.2
    while True:
        try:
            with psycopg.connect(LOCAL_SERVER, connect_timeout=10):
                return LOCAL_SERVER
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise pytest.UsageError(
                    "PostgreSQL listens on 127.0.0.1:5432 but refused connections for "
                    f"{LOCAL_SERVER_PATIENCE:.0f} s ({exc}). "
                    "Fix that server, or set LEDGERFLOW_TEST_ADMIN_URL to another one."
                ) from exc
            time.sleep(pause)  # a server's state, not a test's: there is nothing to await but the next try
            pause = min(pause * 2, 5.0)


def _with_db(url: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which PostgreSQL the tests use and whether the browser tests can run, before they start."""
    configured = os.environ.get("LEDGERFLOW_TEST_ADMIN_URL")
    if configured:
        server = f"{redact(configured)} (LEDGERFLOW_TEST_ADMIN_URL)"
    elif _listens_locally():
        server = f"{LOCAL_SERVER} (listens; set LEDGERFLOW_TEST_ADMIN_URL to use another server)"
    else:
        server = "an embedded PostgreSQL (nothing answers on 127.0.0.1:5432)"
    chromium = Path("/usr/bin/chromium")  # the distribution's, as tests/browser uses
    browser = str(chromium) if chromium.exists() else f"no {chromium}: they skip (apt-get install chromium)"
    return [f"ledgerflow tests: PostgreSQL {server}", f"ledgerflow browser tests: {browser}"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Drills get the longer timeout unless they name their own. A `serial` test must be a drill: the
    quick run (`-m "not drill"`) spreads over processes and would run it beside others."""
    for item in items:
        drill = any(item.get_closest_marker(name) for name in DRILL_MARKERS)
        if item.get_closest_marker("serial") and not item.get_closest_marker("drill"):
            raise pytest.UsageError(f"{item.nodeid} is marked serial but not drill")
        if drill and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DRILL_TIMEOUT))


#: What a test costs, roughly, by kind (mean seconds per test in a CI run's parallel half, loaded machine):
#: a drill 77, a CLI acceptance test 33, a browser test 21, the rest a few. Used only to order the run.
_COST_BY_KIND = {"drill": 40, "acceptance": 20, "browser": 20, "migration": 5}


def _cost(item: pytest.Item) -> int:
    if any(item.get_closest_marker(name) for name in DRILL_MARKERS):
        return _COST_BY_KIND["drill"]
    kind = item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else ""
    return _COST_BY_KIND.get(kind, 1)


def _xdist_slices(count: int, workers: int) -> list[int]:
    """The sizes of the slices xdist's `load` and `worksteal` schedulers hand the workers at the start,
    contiguous and in collection order (`len(pending) // nodes_remaining` each)."""
    sizes = []
    for k in range(workers):
        sizes.append(count // (workers - k))
        count -= sizes[-1]
    return sizes


class _SpreadTheSlowTests:
    """Under xdist each worker is handed a contiguous slice of the collection at the start, and takes more
    only once it runs dry. In collection order the drills and CLI tests (tests/acceptance) all fall in the
    first slice: one process ran them one after another while the others went through the quick tests,
    and the slow ones stolen last made the run's tail. So the run is reordered: the slow tests are dealt
    out over the slices (the slowest kinds first, each to the slice with the least cost so far), and each
    slice starts with its slow tests; the quick ones, in collection order, fill the slices and end them.
    Which tests run, and how, is unchanged; only the order is."""

    @pytest.hookimpl(trylast=True)  # after `-m` has deselected what this run leaves out
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
        if workers < 2 or len(items) < workers:
            return
        sizes = _xdist_slices(len(items), workers)
        slices: list[list[pytest.Item]] = [[] for _ in range(workers)]
        loads = [0] * workers
        # Stable sorts: within a kind, collection order.
        for item in sorted((i for i in items if _cost(i) > 1), key=_cost, reverse=True):
            k = min((k for k in range(workers) if len(slices[k]) < sizes[k]), key=lambda k: (loads[k], k))
            slices[k].append(item)
            loads[k] += _cost(item)
        quick = iter(i for i in items if _cost(i) == 1)  # in collection order: a module's tests together
        for k in range(workers):
            slices[k].extend(itertools.islice(quick, sizes[k] - len(slices[k])))
        items[:] = [item for s in slices for item in s]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SpreadTheSlowTests(), "ledgerflow-spread-the-slow-tests")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Under CI a skip is a failure: a missing tool (a browser, PgBouncer, pg_auto_failover, curl) must
    turn CI red, not leave a guarantee quietly unchecked. An expected failure (xfail) stays what it is."""
    report: pytest.TestReport = yield
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (a skip is a failure when CI is set): {reason}"
    return report


@pytest.fixture(scope="session")
def admin_url() -> str:
    configured = os.environ.get("LEDGERFLOW_TEST_ADMIN_URL")
    if configured:
        return configured
    if _listens_locally():
        return _wait_for_local_server()
    from eventstore.embedded import start_embedded

    # Not under pytest's temporary root: as root that is private (0700), and the embedded server, which
    # then runs as another user, refuses a data directory it cannot reach. /tmp itself is traversable.
    data_dir = Path(tempfile.mkdtemp(prefix="ledgerflow-test-pgdata-"))
    return _with_db(start_embedded(data_dir), "postgres")


def _create_database(admin_url: str, name: str, template: str | None = None) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )


def _drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


class _Dropper:
    """Drops the tests' databases in batches, in the background. Each DROP DATABASE asks for an immediate
    checkpoint, which writes every dirty page of every test database then open: dropped one by one, 284
    API tests on three processes asked for 267 checkpoints and took 189 s, against 15 checkpoints and
    144 s with drops in batches (and every page touched after a checkpoint goes to the WAL again whole).
    No test waits for a drop (each database has a name of its own and nothing reads it again), so drops
    wait until `BATCH` have queued and then go together, on as many threads: their checkpoint requests
    share a few checkpoints, and the pages of the databases they drop are thrown away unwritten. At most
    `BATCH` finished tests' databases wait on disk per process. The session drops what is left and waits
    for every drop at its end; a drop that failed fails the session there."""

    #: Drops per batch, each on its own connection while it waits for the checkpoint (the server's 100
    #: connections are shared with the tests of three processes).
    BATCH = 12

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.BATCH, thread_name_prefix="test-db-drop"
        )
        self._queued: list[tuple[str, str]] = []
        self._pending: list[concurrent.futures.Future[None]] = []

    def drop(self, admin_url: str, name: str) -> None:
        self._queued.append((admin_url, name))
        if len(self._queued) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        # Drops that ended well are forgotten; a failed one stays to be reported at the end.
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending += [self._pool.submit(_drop_database, url, name) for url, name in self._queued]
        self._queued.clear()

    def close(self, timeout: float = 300.0) -> list[str]:
        """Drop what is queued and wait for every drop (bounded); return what failed or is still pending."""
        self._flush()
        done, pending = concurrent.futures.wait(self._pending, timeout=timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        failures = [repr(f.exception()) for f in done if f.exception() is not None]
        return failures + ([f"{len(pending)} drops still pending after {timeout} s"] if pending else [])


@pytest.fixture(scope="session")
def _dropper() -> Iterator[_Dropper]:
    dropper = _Dropper()
    yield dropper
    failures = dropper.close()
    assert not failures, f"test databases not dropped: {failures}"


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    name = f"lf_template_{uuid.uuid4().hex[:12]}"
    _create_database(admin_url, name)
    try:
        migrate(_with_db(admin_url, name))
        yield name
    finally:
        _drop_database(admin_url, name)


@pytest.fixture
def fresh_database(admin_url: str) -> Iterator[str]:
    """An empty database without ledgerflow's schema (for migration tests)."""
    name = f"lf_empty_{uuid.uuid4().hex[:12]}"
    _create_database(admin_url, name)
    try:
        yield _with_db(admin_url, name)
    finally:
        _drop_database(admin_url, name)


@pytest.fixture
def database_url(admin_url: str, template_db: str, _dropper: _Dropper) -> Iterator[str]:
    """A fresh, migrated database for this test alone (dropped in the background after it)."""
    name = f"lf_test_{uuid.uuid4().hex[:12]}"
    _create_database(admin_url, name, template=template_db)
    try:
        yield _with_db(admin_url, name)
    finally:
        _dropper.drop(admin_url, name)


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    with open_store(url=database_url, migrate=False) as opened:
        yield opened
