"""The README's tour, run as a user would type it, so that it cannot drift from what the code does.

Every fenced `sh` block is run step by step (one logical line each) in one bash, with aliases expanded
and job control on, as in an interactive shell: background jobs get their own process group and keep
Ctrl-C (SIGINT) working, which is what the tour's `kill -INT $TAIL` relies on. The `python` block is saved
under the name its first line gives (`# myflows.py`) in the directory the shell runs in. That directory
holds `.venv`, pointing at this checkout's virtual environment, so `alias lf=.venv/bin/ledgerflow` works
as written.

What differs from typing it, and why:
- the install and test commands at the top are skipped: they are what runs this test;
- the database is a fresh one from the test fixtures (`LEDGERFLOW_DATABASE_URL`), as the tour allows;
- `lf serve` gets a free port and `localhost:8000` becomes that port, since other tests may hold 8000;
- each step's output goes to its own files, read back for the assertions below.
A step whose comment starts with `# error:` must fail (exit status 1); every other step must succeed.
Background processes are stopped (SIGTERM, then SIGKILL) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventstore import open_store
from tests.acceptance.cli_runs import invoke_cli
from tests.waiting import wait_until
from workflows.read import list_runs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Commands the tour starts from that install ledgerflow or run the tests (this test among them).
SETUP_COMMANDS = ("pip install",)
STEP_TIMEOUT = 90.0


@dataclass(frozen=True)
class Block:
    language: str
    text: str


@dataclass(frozen=True)
class Step:
    number: int
    command: str
    returncode: int
    out: str
    err: str
    seconds: float


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks, in order."""
    return [
        Block(m["language"], m["body"])
        for m in re.finditer(r"^```(?P<language>\w*)\n(?P<body>.*?)^```", text, re.MULTILINE | re.DOTALL)
    ]


def shell_steps(block: str) -> list[str]:
    """One command per logical line (backslash continuations joined); blank and comment lines left out."""
    steps: list[str] = []
    pending = ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.strip()[:-1].strip() + " "
            continue
        command = (pending + line.strip()).strip()
        pending = ""
        if command and not command.startswith("#"):
            steps.append(command)
    return steps


def expected_to_fail(command: str) -> bool:
    return re.search(r"\s#\s*error:", command) is not None


def test_the_readme_blocks_are_found() -> None:
    blocks = readme_blocks(README.read_text())
    python = [b for b in blocks if b.language == "python"]
    assert len(python) == 1
    assert python[0].text.startswith("# myflows.py\n")
    assert any("lf serve" in b.text for b in blocks if b.language == "sh")
    assert shell_steps("a \\\n  b # c\n# only a comment\n\nd") == ["a b # c", "d"]


def test_ci_runs_the_readmes_full_run_exactly() -> None:
    """The README names the full run; .ci/run must run that command, not a variant of it."""
    full_run = r"`(\.venv/bin/python -m pytest [^`]*-m tests\.serial_lanes[^`]*)`"
    named = re.findall(full_run, README.read_text())
    assert len(named) == 1, named
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and line[0] != "#"]
    assert ci[-1] == named[0], f".ci/run ends with {ci[-1]!r}; the README's full run is {named[0]!r}"
    # The quick run is the full run's first half without the drills that may run beside other tests.
    assert '.venv/bin/python -m pytest -n 3 -m "not drill"' in README.read_text()
    assert named[0].startswith('.venv/bin/python -m pytest -n 3 -m "not serial"')


class Shell:
    """One bash fed a step at a time, as a terminal would; each step's output and status kept apart."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.logs = directory / ".steps"
        self.logs.mkdir()
        self.count = 0
        self.shell_err = (self.logs / "bash.err").open("w")
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=directory,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self.shell_err,
            text=True,
            start_new_session=True,  # everything it starts stays in this session, to be stopped at the end
        )
        self._send("set -m\nshopt -s expand_aliases\n")

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def run(self, command: str) -> Step:
        self.count += 1
        n, logs = self.count, self.logs
        # The newline before `}` ends a trailing comment; stdin from /dev/null keeps commands off the
        # shell's own input. The status file appears (renamed into place) once the step has finished.
        self._send(
            f"{{ {command}\n}} </dev/null >{logs}/{n}.out 2>{logs}/{n}.err; "
            f"echo $? >{logs}/{n}.tmp; mv {logs}/{n}.tmp {logs}/{n}.rc\n"
        )
        rc_file = logs / f"{n}.rc"
        began = time.monotonic()

        def finished() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the shell exited during step {n}: {command}")
            return rc_file.exists()

        wait_until(finished, timeout=STEP_TIMEOUT, what=f"step {n} to finish: {command}")
        seconds = time.monotonic() - began
        return Step(n, command, int(rc_file.read_text()), self.out(n), self.err(n), seconds)

    def out(self, n: int) -> str:
        return (self.logs / f"{n}.out").read_text(errors="replace")

    def err(self, n: int) -> str:
        return (self.logs / f"{n}.err").read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to every process of the session, SIGKILL to those still there after 15 s."""
        members = _session_members(self.process.pid)
        for pid in members:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in members):
            self.process.poll()  # reap the shell itself
            time.sleep(0.05)
        for pid in members:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        self.process.wait(timeout=15)
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.shell_err.close()


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError):
                if os.getsid(int(entry.name)) == sid:
                    members.append(int(entry.name))
    return members


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _alive(pid: int) -> bool:
    """Running, not merely waiting to be reaped by its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ledgerflow_environment(directory: Path) -> None:
    """`.venv` in the tour's directory: this checkout's own, or one whose `ledgerflow` runs this Python."""
    venv = ROOT / ".venv"
    if (venv / "bin" / "ledgerflow").exists():
        (directory / ".venv").symlink_to(venv)
        return
    script = directory / ".venv" / "bin" / "ledgerflow"
    script.parent.mkdir(parents=True)
    # -P: like the installed script, the current directory is not importable unless PYTHONPATH says so.
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -P -m ops.cli "$@"\n')
    script.chmod(0o755)


@pytest.fixture
def shell(tmp_path: Path, database_url: str) -> Iterator[Shell]:
    _ledgerflow_environment(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_") and k != "PYTHONPATH"}
    env |= {"LEDGERFLOW_DATABASE_URL": database_url, "COLUMNS": "200"}
    opened = Shell(tmp_path, env)
    try:
        yield opened
    finally:
        opened.stop()


# Some forty CLI processes in a row: on a loaded 2-core machine more than the default five minutes.
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("curl") is None,
    reason="the tour is typed in bash and uses curl",
)
def test_the_tour_runs_as_written(shell: Shell, database_url: str) -> None:
    port = _free_port()
    steps: list[Step] = []
    for block in readme_blocks(README.read_text()):
        if block.language == "python":
            name = block.text.splitlines()[0].removeprefix("#").strip()
            (shell.directory / name).write_text(block.text)
            continue
        if block.language != "sh" or any(s in block.text for s in SETUP_COMMANDS):
            continue
        for command in shell_steps(block.text):
            typed = re.sub(r"\blf serve\b", f"lf serve --port {port}", command)
            typed = typed.replace("localhost:8000", f"localhost:{port}")
            _before(command, database_url)
            step = shell.run(typed)
            steps.append(step)
            wanted = 1 if expected_to_fail(command) else 0
            assert step.returncode == wanted, (
                f"step {step.number} `{command}` exited {step.returncode}, not {wanted}\n"
                f"stdout:\n{step.out}\nstderr:\n{step.err}"
            )
            _after(step, shell, steps)
    for step in steps:  # shown when the test fails, and with -s
        print(f"--- step {step.number} ({step.seconds:.1f} s, exit {step.returncode}): {step.command}")
        print(step.out if step.out.endswith("\n") or not step.out else step.out + "\n", end="")
    _check_outputs(steps, shell)


def _before(command: str, database_url: str) -> None:
    """What a user may have to wait a moment for: the workflow tables follow the run's events."""
    if command.startswith("lf workflows list"):

        def listed_as_succeeded() -> bool:
            with open_store(url=database_url, migrate=False) as store:
                runs = list_runs(store, tenant="default", workflow="summarise")
            return [r["status"] for r in runs] == ["succeeded"]

        wait_until(listed_as_succeeded, timeout=30, what="the workflow tables to show the run")


def _after(step: Step, shell: Shell, steps: list[Step]) -> None:
    """What a user would see before typing the next step: the tail prints the new event."""
    if step.command.startswith("lf append order-43"):
        tail = next(s for s in steps if s.command.startswith("lf tail"))
        wait_until(lambda: "order-43" in shell.out(tail.number), timeout=30, what="the tail to print it")


def _find(steps: list[Step], start: str, nth: int = 0) -> Step:
    return [s for s in steps if s.command.startswith(start)][nth]


def _check_outputs(steps: list[Step], shell: Shell) -> None:
    paid = "lf append order-42 --type OrderPaid --data '{}' --expected 1 --idempotency-key pay-42"
    first, again = _find(steps, paid), _find(steps, paid, 1)
    assert "is at version 2" in first.out
    assert again.out.replace(" (duplicate: the original append's result)", "") == first.out
    assert "duplicate" in again.out

    conflict = next(s for s in steps if expected_to_fail(s.command))
    assert "is at version 2, but the append expected version 1; nothing was written" in conflict.err
    assert "Traceback" not in conflict.err

    tail = _find(steps, "lf tail")
    printed = [json.loads(line) for line in shell.out(tail.number).splitlines() if line.startswith("{")]
    # (order-1, appended through the API later, may or may not come before the tail is stopped)
    assert [e["stream"] for e in printed][:3] == ["order-42", "order-42", "order-43"]
    assert re.search(r"resume with --after \d+:\d+", shell.err(tail.number))

    assert "order-42" in _find(steps, "lf psql").out
    assert "stream_catalogue" in _find(steps, "lf projections verify").out

    waited = _find(steps, 'lf workflows wait "$RUN"', 1)
    assert "succeeded" in waited.out
    assert "re-running fetch, summarise" in _find(steps, "lf workflows refresh").out
    assert "summarise" in _find(steps, "lf workflows list").out

    healthz = _find(steps, "curl -i --retry")
    assert re.match(r"HTTP/\S+ 200", healthz.out)
    appended = _find(steps, "curl -i -H")
    assert re.match(r"HTTP/\S+ 201", appended.out), appended.out
    assert "acme" in _find(steps, "lf tokens list").out
    assert "database" in _find(steps, "lf doctor").out


def _cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # In this process: what is checked is what a command prints on stdout, not how a process starts
    # (test_cli_first_hour checks that an answer comes without start-up lines, in a real process).
    return invoke_cli(database_url, *args, LEDGERFLOW_WORKFLOWS="tests.flows:registry")


def test_values_the_tour_captures_are_printed_alone(database_url: str) -> None:
    """`$(...)` takes the whole of stdout: a run id or a secret and nothing else."""
    started = _cli(database_url, "workflows", "start", "linear", "--input", '{"n": 1}', "--print-id")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", run_id)

    token = _cli(database_url, "tokens", "create", "--tenant", "acme", "--print-secret")
    assert token.returncode == 0, token.stderr
    assert re.fullmatch(r"lf_[\w-]+\n", token.stdout)

    # No worker runs here: the run cannot end, and wait says so with its own exit status.
    waited = _cli(database_url, "workflows", "wait", run_id, "--timeout", "0.5")
    assert waited.returncode == 2, waited.stderr
    assert "still running" in waited.stderr
