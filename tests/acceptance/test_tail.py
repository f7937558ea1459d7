"""`ledgerflow tail` interrupted anywhere resumes without skipping an event; `--from-now` starts at
the head."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import IO

from eventstore import EventStore, NewEvent
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start_tail(database_url: str, out: Path | None, err: Path, *args: str) -> subprocess.Popen[bytes]:
    """The real `ledgerflow tail`, printing into the file `out`, or into a pipe when `out` is None."""
    env = os.environ | {"LEDGERFLOW_DATABASE_URL": database_url, "LEDGERFLOW_LOG_FORMAT": "json"}
    with contextlib.ExitStack() as files:
        stdout = subprocess.PIPE if out is None else files.enter_context(out.open("wb"))
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "tail", *args],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=files.enter_context(err.open("wb")),
        )


def parsed(text: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def printed(out: Path) -> list[dict[str, object]]:
    return parsed(out.read_bytes())


def lines(out: Path) -> int:
    """The whole lines printed so far."""
    return out.read_bytes().count(b"\n")


def interrupt(tail: subprocess.Popen[bytes], err: Path, rest: IO[bytes] | None = None) -> tuple[str, bytes]:
    """SIGINT, then (reading what the tail still prints into its pipe, if it has one) its exit; the
    cursor it says to resume from, and what it printed after the signal."""
    tail.send_signal(signal.SIGINT)
    after = b""
    if rest is not None:
        with rest:
            after = rest.read()  # to the end: the tail may be blocked on a full pipe
    tail.wait(timeout=60)
    found = re.search(r"resume with --after (\S+)", err.read_text())
    assert found, err.read_text()
    return found.group(1), after


def pipe_fill(fd: int) -> int:
    """The bytes written into the pipe whose reading end is `fd` and not read yet."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


def test_the_resume_cursor_is_that_of_the_last_event_printed(store: EventStore, tmp_path: Path) -> None:
    # The tail prints into a pipe that this test leaves unread until it is full (64 KiB, some 700 lines):
    # the tail is then blocked in the middle of printing a line, the moment the resume cursor must get
    # right, and interrupted there, far from the end of the 5,000 events however fast it runs.
    total = 5_000
    store.import_events((f"order-{n // 100}", NewEvent("Placed", {"n": n})) for n in range(total))
    wait_until(lambda: not store.events_beyond_horizon(), what="the events to be readable")

    first_err = tmp_path / "first.err"
    tail = start_tail(store.url, None, first_err)
    assert tail.stdout is not None
    fd = tail.stdout.fileno()
    capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    wait_until(lambda: pipe_fill(fd) > capacity - 1024, timeout=60, what="the tail to fill its pipe")
    assert tail.poll() is None, "the tail follows the log until interrupted"
    resume, out = interrupt(tail, first_err, tail.stdout)
    first = parsed(out)
    assert 0 < len(first) < total, "interrupted mid-way"
    assert resume == first[-1]["cursor"], "the resume cursor is that of the last printed event"

    second_out, second_err = tmp_path / "second.jsonl", tmp_path / "second.err"
    tail = start_tail(store.url, second_out, second_err, "--after", resume)
    # Counting lines, not parsing them, while this polls.
    wait_until(lambda: lines(second_out) >= total - len(first), timeout=120, what="the rest")
    interrupt(tail, second_err)
    numbers = [e["data"]["n"] for e in first + printed(second_out)]  # type: ignore[index]
    assert sorted(numbers) == list(range(total)), "every event exactly once across the two tails"


def test_from_now_shows_only_new_events(store: EventStore, tmp_path: Path) -> None:
    store.append("old-1", [NewEvent("Old", {})])
    wait_until(lambda: not store.events_beyond_horizon(), what="the old event to be readable")
    out, err = tmp_path / "now.jsonl", tmp_path / "now.err"
    tail = start_tail(store.url, out, err, "--from-now")
    try:
        # The tail is following once a new event appended after its start shows up.
        def shown() -> bool:
            store.append("new-1", [NewEvent("New", {})])
            return any(e["type"] == "New" for e in printed(out))

        wait_until(shown, timeout=60, what="a new event to show")
    finally:
        interrupt(tail, err)
    assert {e["type"] for e in printed(out)} == {"New"}
