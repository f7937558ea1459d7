"""Waiting for a run to end over HTTP: `GET /api/v1/runs/{run_id}/wait?timeout=SECONDS[&follow=true]`.

The answer is the run's status as soon as it ends, read from its own stream (exact), or, once `timeout`
seconds (at most 30) have passed, the run as it is then with `"ended": false`: 200 either way, so a client
loops on one answer (`ended`) and keeps errors for what went wrong. A run of another tenant is not found.

The wait is the min_cursor wait's, bounded the same way (`read_your_writes`): it holds no thread and no
database connection while it waits, and is not one of the tenant's requests in flight then; the server's
shared listener (`projector.ProjectionWaiters`) wakes it when the run table shows the run ended
(`workflows.run_end_watch`: one query per projector batch answers every waited run), and it counts under the
waiters' caps (429 `too_many_waiters` beyond). Only its reads of the run's stream (one before the wait,
one after) take a thread and a pool connection, each as one of the tenant's requests in flight: to read
after its wait it takes a place again through the tenant's line (`RequestsInFlight.set_aside`), so many
waits ending together read a share at a time (429 `too_many_requests` if the line is full). Where no
projector keeps the run table, nothing announces the end: the wait then answers at its timeout, from the
stream, which has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import datetime
from typing import Annotated, Final

import structlog
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from ops.api.deps import Reader, ServicesDep
from ops.api.errors import NOT_FOUND, ErrorBody, Responses
from ops.api.in_flight import NoPlaceAgain, RequestsInFlight
from ops.api.read_your_writes import (
    MAX_WAIT_SECONDS,
    ClientGone,
    client_gone,
    too_many_waiters,
    unless_disconnected,
)
from ops.services import Services
from projector import ProjectionWaiters, TooManyWaitersError
from workflows import RunEnd, RunState, run_end_watch

log = structlog.get_logger(__name__)
router = APIRouter(tags=["runs"])

#: Links of a continue_as_new chain one request follows at most: each costs a read of a run's stream.
#: Past them the answer is the `continued` run reached, and the client asks again with its `continued_as`.
MAX_FOLLOWED: Final = 50

WAITERS_FULL: Responses = {
    429: {
        "model": ErrorBody,
        "description": "The run has not ended, and as many requests already wait as the server allows (in "
        "total or for the tenant: `too_many_waiters`, details name the setting), or, back from its wait, "
        "the request found the tenant's requests in flight and its line full (`too_many_requests`); ask "
        "again after Retry-After seconds.",
    }
}


class RunEndOut(BaseModel):
    run_id: uuid.UUID = Field(
        description="The run answered for: the one asked for or, with `follow`, the run of its chain "
        "the wait reached."
    )
    workflow: str
    ended: bool = Field(
        description="Whether the run has ended (succeeded, failed, cancelled or continued); false when the "
        "timeout came first: ask again."
    )
    status: str = Field(
        description="`succeeded`, `failed`, `cancelled`, `continued` (see `continued_as`); while it has not "
        "ended, `running` or `paused`."
    )
    error: str | None
    cancel_requested: bool
    continued_from: uuid.UUID | None = Field(description="The run this one continues; null otherwise.")
    continued_as: uuid.UUID | None = Field(
        description="The run this one continued as (status `continued`); null otherwise."
    )
    version: int = Field(description="The run stream's version the answer was read at.")
    started_at: datetime | None
    finished_at: datetime | None


def _answer(run: RunState) -> RunEndOut:
    return RunEndOut(
        run_id=run.run_id,
        workflow=run.workflow,
        ended=not run.active,
        status=run.status,
        error=run.error,
        cancel_requested=run.cancel_requested,
        continued_from=uuid.UUID(run.continued_from) if run.continued_from is not None else None,
        continued_as=uuid.UUID(run.continued_as) if run.continued_as is not None else None,
        version=run.version,
        started_at=run.started_at,
        finished_at=run.finished_at,
    )


@router.get(
    "/runs/{run_id}/wait",
    response_model=RunEndOut,
    responses={**NOT_FOUND, **WAITERS_FULL},
)
async def wait_for_run(
    request: Request,
    run_id: uuid.UUID,
    principal: Reader,
    services: ServicesDep,
    timeout: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_SECONDS,
            description="Seconds to wait at most (at most 30; 0: answer at once). At the timeout the answer "
            "is 200 with `ended` false.",
        ),
    ] = MAX_WAIT_SECONDS,
    follow: Annotated[
        bool,
        Query(
            description="If the run continued as a new run (continue_as_new), wait for its successors too, "
            "to the last run of the chain (one timeout for the chain)."
        ),
    ] = False,
) -> RunEndOut | JSONResponse:
    """The run's status and outcome as soon as it ends (exact: read from its stream), or as it is at the
    timeout, with `ended` false. To wait longer than 30 s, ask again: with `follow`, ask with `run_id` when
    `ended` is false and with `continued_as` when the status is `continued`."""
    tenant = principal.tenant
    waiters, in_flight = request.app.state.waiters, request.app.state.in_flight
    assert isinstance(waiters, ProjectionWaiters)
    assert isinstance(in_flight, RequestsInFlight)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    run = await _load(services, run_id, tenant)
    followed, stale = 0, None
    while True:
        if follow and run.continued_as is not None and followed < MAX_FOLLOWED:
            # Its successor started in the transaction that ended it: its stream is there to read.
            run = await _load(services, uuid.UUID(run.continued_as), tenant)
            followed, stale = followed + 1, None
            continue
        left = deadline - loop.time()
        if not run.active or left <= 0:
            return _answer(run)
        try:
            # While it waits it holds no thread and no connection: not one of the tenant's requests in
            # flight; it reads again once it has a place among them (the tenant's line, its share).
            async with in_flight.set_aside(tenant):
                end = RunEnd(tenant, run.run_id, stale)
                # At the timeout its stream is read once more below: the end may have come unannounced.
                with contextlib.suppress(TimeoutError):
                    stale = await unless_disconnected(
                        request, waiters.wait_until(run_end_watch, end, timeout=left, tenant=tenant)
                    )
        except NoPlaceAgain:
            return in_flight.refusal(tenant)
        except TooManyWaitersError as exc:
            return too_many_waiters(exc)
        except ClientGone:  # nobody is left to read the answer
            log.info("run_wait_abandoned", run_id=str(run.run_id))
            return client_gone()
        # Woken by the run table, which trails the stream; a row left behind by a retry since (the stream
        # says active) is passed as `stale` to the next wait, which then waits for a newer row.
        run = await _load(services, run.run_id, tenant)


async def _load(services: Services, run_id: uuid.UUID, tenant: str) -> RunState:
    """The run from its stream (NotFoundError, 404, for a run of another tenant as for a missing one)."""
    return await run_in_threadpool(lambda: services.engine.load(run_id, tenant=tenant))
