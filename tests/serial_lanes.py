"""The serial half of the full run, in two lanes at once: `python -m tests.serial_lanes [pytest options]`.

A `serial` drill times or measures something (a takeover, a latency, a pool's idle timer, memory), so it
never runs beside the parallel half. Most of its time is spent waiting (for a lease to lapse, a standby to
be promoted, TCP to give up, a pool to close what is idle): run one after another, the 13 kept a 2-core
machine a third busy for three and a half minutes. So they run in two lanes, one pytest process each, side
by side: the drills that bring servers or a network of their own (`own_servers`: a throwaway cluster, a
failover cluster, network namespaces) in one, the drills on the shared server in the other. Within a lane
the drills run one after another, as before. (xdist's `--dist loadgroup` would do this, but it stopped
grouping under pytest 9.2: pytest-dev/pytest-xdist#1386.)

Each lane's lines are printed as they come, prefixed with its name; the exit status is the first lane's
failure, else 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import IO

#: Lane name -> the `-m` expression that selects its drills.
LANES = {
    "own servers": "serial and own_servers",
    "shared server": "serial and not own_servers",
}


def _relay(name: str, out: IO[str], lock: threading.Lock) -> None:
    for line in out:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()


def main(pytest_args: list[str]) -> int:
    lock = threading.Lock()
    lanes: dict[str, subprocess.Popen[str]] = {}
    relays: list[threading.Thread] = []
    for name, expression in LANES.items():
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-m", expression, *pytest_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        lanes[name] = process
        relay = threading.Thread(target=_relay, args=(name, process.stdout, lock), daemon=True)
        relay.start()
        relays.append(relay)
    try:
        codes = {name: process.wait() for name, process in lanes.items()}
    except KeyboardInterrupt:
        # A deadline's SIGINT (.ci/run): each lane prints its summary (what failed, the durations), then ends.
        for process in lanes.values():
            process.send_signal(signal.SIGINT)
        codes = {name: process.wait() for name, process in lanes.items()}
    for relay in relays:
        relay.join()
    for name, code in codes.items():
        print(f"serial lane '{name}': {'passed' if code == 0 else f'failed (exit {code})'}")
    return next((code for code in codes.values() if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
