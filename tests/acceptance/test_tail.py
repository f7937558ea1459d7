"""`ledgerflow tail` interrupted anywhere resumes without skipping an event; `--from-now` starts at
the head."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from eventstore import EventStore, NewEvent
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start_tail(database_url: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    env = os.environ | {"LEDGERFLOW_DATABASE_URL": database_url, "LEDGERFLOW_LOG_FORMAT": "json"}
    with out.open("wb") as stdout:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "tail", *args],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )


def printed(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def lines(out: Path) -> int:
    """The whole lines printed so far."""
    return out.read_bytes().count(b"\n")


def interrupt(tail: subprocess.Popen[bytes]) -> str:
    tail.send_signal(signal.SIGINT)
    _, err = tail.communicate(timeout=60)
    found = re.search(r"resume with --after (\S+)", err.decode())
    assert found, err.decode()
    return found.group(1)


def test_the_resume_cursor_is_that_of_the_last_event_printed(store: EventStore, tmp_path: Path) -> None:
    # Enough that the tail is still printing when it is interrupted (about 5 s of output at full speed).
    total = 200_000
    store.import_events((f"order-{n // 100}", NewEvent("Placed", {"n": n})) for n in range(total))
    wait_until(lambda: not store.events_beyond_horizon(), what="the events to be readable")

    first_out = tmp_path / "first.jsonl"
    tail = start_tail(store.url, first_out)
    # Interrupt while it is still printing: somewhere in the middle of a page.
    wait_until(lambda: first_out.stat().st_size > 200_000, timeout=60, what="tail to print a good part")
    resume = interrupt(tail)
    first = printed(first_out)
    assert 0 < len(first) < total, "interrupted mid-way"
    assert resume == first[-1]["cursor"], "the resume cursor is that of the last printed event"

    second_out = tmp_path / "second.jsonl"
    tail = start_tail(store.url, second_out, "--after", resume)
    # Counting lines, not parsing them: the file grows to 200,000 events while this polls.
    wait_until(lambda: lines(second_out) >= total - len(first), timeout=120, what="the rest")
    interrupt(tail)
    numbers = [e["data"]["n"] for e in first + printed(second_out)]  # type: ignore[index]
    assert sorted(numbers) == list(range(total)), "every event exactly once across the two tails"


def test_from_now_shows_only_new_events(store: EventStore, tmp_path: Path) -> None:
    store.append("old-1", [NewEvent("Old", {})])
    wait_until(lambda: not store.events_beyond_horizon(), what="the old event to be readable")
    out = tmp_path / "now.jsonl"
    tail = start_tail(store.url, out, "--from-now")
    try:
        # The tail is following once a new event appended after its start shows up.
        def shown() -> bool:
            store.append("new-1", [NewEvent("New", {})])
            return any(e["type"] == "New" for e in printed(out))

        wait_until(shown, timeout=60, what="a new event to show")
    finally:
        interrupt(tail)
    assert {e["type"] for e in printed(out)} == {"New"}
