"""SIGKILL of `ledgerflow log archive` and `ledgerflow log restore` at random moments: the partition is
always either attached with every event or archived with a file that matches its manifest, never half."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from eventstore import NewEvent, archive_partition, open_store, restore_partition
from tests.narrow_partitions import narrow_partitions

pytestmark = pytest.mark.drill

_SIZE = 3000
_NAME = "events_p000001"


def _start(database_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = os.environ | {"LEDGERFLOW_DATABASE_URL": database_url, "LEDGERFLOW_LOG_FORMAT": "json"}
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "log", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _state(url: str, directory: Path) -> str:
    """The partition's state, after checking that it is whole in that state."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT state FROM ledgerflow.event_partitions WHERE name = %s", (_NAME,)
        ).fetchone()
        assert row is not None
        table = conn.execute("SELECT to_regclass(%s)", (f"ledgerflow.{_NAME}",)).fetchone()
        if row[0] == "attached":
            assert conn.execute("SELECT count(*) FROM ledgerflow.events_p000001").fetchone() == (_SIZE,)
            return "attached"
    assert table == (None,)
    manifest = json.loads((directory / f"{_NAME}.manifest.json").read_text())
    data = (directory / f"{_NAME}.copy").read_bytes()
    assert hashlib.sha256(data).hexdigest() == manifest["sha256"]
    assert manifest["events"] == _SIZE
    return "archived"


def test_sigkill_of_archive_and_restore_leaves_the_partition_whole(database_url: str, tmp_path: Path) -> None:
    narrow_partitions(database_url, _SIZE)
    with open_store(url=database_url) as store:
        store.import_events(
            (f"doc-{i % 50}", NewEvent("Noted", {"i": i, "text": "x" * 200})) for i in range(4000)
        )
    directory = tmp_path / "archive"
    rng = random.Random(13)
    seen = set()
    for _ in range(8):
        state = _state(database_url, directory)
        seen.add(state)
        args = (
            ("archive", _NAME, "--to", str(directory))
            if state == "attached"
            else ("restore", str(directory / f"{_NAME}.manifest.json"))
        )
        process = _start(database_url, *args)
        try:
            # Python's start and the store's opening take most of a second; the work itself a fraction.
            threading.Event().wait(rng.uniform(0.3, 2.5))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    final = _state(database_url, directory)
    if final == "archived":
        restore_partition(database_url, directory / f"{_NAME}.manifest.json")
    assert _state(database_url, directory) == "attached"
    # Whatever the kills left, the next archive and restore complete.
    archive_partition(database_url, _NAME, directory)
    assert _state(database_url, directory) == "archived"
    restore_partition(database_url, directory / f"{_NAME}.manifest.json")
    assert _state(database_url, directory) == "attached"
    assert seen
