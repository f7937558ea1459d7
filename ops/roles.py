"""The worker roles of `ledgerflow serve`: each runs in its own thread, is restarted with back-off
whenever it dies, and reports its state (running, waiting for the database, restarting) to health.

A worker does not end because of the database (it waits outages out itself); a role restarts one that
ends for any other reason (a bug, a broken projection module), so a role is never silently gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog
import tenacity

from eventstore.spi import Outage, OutageState, is_unavailable, sleeper

log = structlog.get_logger(__name__)

RoleState = Literal["starting", "running", "waiting_for_database", "restarting", "stopped"]
#: The longest wait before a role that keeps dying is started again.
_MAX_BACKOFF = 30.0


class Worker(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def database_state(self) -> OutageState: ...


@dataclass(frozen=True)
class RoleReport:
    name: str
    state: RoleState
    restarts: int
    last_error: str | None
    database: OutageState


class _Ended(Exception):
    """The worker returned from run() although nobody stopped it."""


class Role:
    def __init__(self, name: str, make: Callable[[], Worker]) -> None:
        self.name = name
        self._make = make
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        self._state: RoleState = "starting"
        self._restarts = 0
        self._last_error: str | None = None
        self._outage = Outage(role=name)
        self._thread = threading.Thread(target=self._supervise, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.stop()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def report(self) -> RoleReport:
        with self._lock:
            worker, state = self._worker, self._state
        database = self._outage.snapshot()
        if worker is not None and not database.waiting:
            database = worker.database_state()
        if state == "running" and database.waiting:
            state = "waiting_for_database"
        return RoleReport(self.name, state, self._restarts, self._last_error, database)

    def _supervise(self) -> None:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Exception),
            wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=_MAX_BACKOFF, jitter=0.5),
            stop=tenacity.stop_when_event_set(self._stopping),
            sleep=sleeper(self._stopping),
            before_sleep=self._restarting,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._run_once()  # returns only once the role is stopped
        except Exception:
            log.info("serve_role_stopped_while_restarting", role=self.name)
        with self._lock:
            self._state = "stopped"

    def _run_once(self) -> None:
        try:
            worker = self._make()
        except Exception as exc:
            if not is_unavailable(exc):
                log.exception("serve_role_not_started", role=self.name)
                self._last_error = f"{type(exc).__name__}: {exc}"
            else:
                self._outage.failed(exc)
            raise
        self._outage.succeeded()
        with self._lock:
            self._worker, self._state = worker, "running"
        if self._stopping.is_set():
            return
        try:
            worker.run()
        except Exception as exc:
            log.exception("serve_role_died", role=self.name)
            self._last_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            with self._lock:
                self._worker = None
        if not self._stopping.is_set():
            log.error("serve_role_ended", role=self.name)
            self._last_error = "the worker returned without being stopped"
            raise _Ended

    def _restarting(self, retry_state: tenacity.RetryCallState) -> None:
        with self._lock:
            self._state = "restarting"
            self._restarts += 1
        wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning("serve_role_restarting", role=self.name, restarts=self._restarts, retry_in=round(wait, 3))
