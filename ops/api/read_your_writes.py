"""Reading one's own writes over HTTP: `min_cursor` and `wait` on reads served from a projection's tables.

A read with `min_cursor` answers once the projection has passed that cursor. Its wait holds no worker
thread and no database connection: the server's shared listener (`projector.ProjectionWaiters`, started
with the app) wakes it. Waiting reads are capped in total and per tenant (429 with Retry-After beyond).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, Final, TypeVar

import structlog
from fastapi import Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from eventstore import Cursor
from ops.api.errors import ErrorBody, Responses, error_response
from ops.api.in_flight import NoPlaceAgain, RequestsInFlight
from ops.services import Services
from projector import Projection, ProjectionBehindError, ProjectionWaiters, TooManyWaitersError, wait_for

log = structlog.get_logger(__name__)
T = TypeVar("T")

#: The longest any request of the API waits for something to happen (seconds): a wait holds no thread and
#: no connection, but it holds a place under the waiters' caps.
MAX_WAIT_SECONDS: Final = 30

#: Read your own writes: a read served from a projection's tables waits until they show the write.
MinCursor = Annotated[
    str | None,
    Query(
        max_length=41,
        pattern=r"^[0-9]{1,20}:[0-9]{1,20}$",
        description="Answer only once the tables this read comes from have passed this log cursor (an "
        "append's or a run start's `cursor`), so that they show that write; 504 if they have not within "
        "`wait` seconds, 409 at once if no projector has ever run them, 422 for a cursor beyond every "
        "committed write.",
    ),
]
WaitSeconds = Annotated[
    float,
    Query(ge=0, le=MAX_WAIT_SECONDS, description="How long to wait for `min_cursor` (seconds, at most 30)."),
]
#: The settings that cap waiting reads, by the cap's scope.
WAITER_SETTINGS = {
    "total": "LEDGERFLOW_MAX_PROJECTION_WAITERS",
    "tenant": "LEDGERFLOW_MAX_PROJECTION_WAITERS_PER_TENANT",
}
#: Seconds a caller refused for too many waiting reads is asked to wait (waits last at most 30 s; most
#: end far sooner, as soon as the projector passes their writes).
WAITERS_RETRY_AFTER = 1
PROJECTION_BEHIND: Responses = {
    409: {
        "model": ErrorBody,
        "description": "`min_cursor` was given, but no projector has ever run the projection the read "
        "comes from (details.position is null).",
    },
    429: {
        "model": ErrorBody,
        "description": "`min_cursor` was given, but as many reads already wait as the server allows (in "
        "total or for the tenant; details name the setting); ask again after Retry-After seconds.",
    },
    504: {
        "model": ErrorBody,
        "description": "The projection did not pass `min_cursor` in time; details name the projection, "
        "its position and the wanted cursor. Nothing is wrong with the write: ask again.",
    },
}


def too_many_waiters(exc: TooManyWaitersError) -> JSONResponse:
    """The 429 of a wait past the waiters' caps (`LEDGERFLOW_MAX_PROJECTION_WAITERS[_PER_TENANT]`)."""
    setting = WAITER_SETTINGS[exc.scope]
    return error_response(
        429,
        exc.code,
        f"{exc}; the limit is {setting}",
        {**exc.details(), "setting": setting},
        headers={"Retry-After": str(WAITERS_RETRY_AFTER)},
    )


def client_gone() -> JSONResponse:
    """The answer to a wait whose client went away (nobody reads it; the log names it)."""
    return error_response(499, "client_gone", "the client went away while the read waited")


class ClientGone(Exception):
    """The client went away while its request waited; the wait was given up and its place freed."""


async def _until_disconnected(request: Request) -> None:
    """Returns once the client has gone away (a read's request has no body left to receive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, wait: Coroutine[Any, Any, T]) -> T:
    """`wait`'s result, or its exception; ClientGone (the wait cancelled, so its place under the caps is
    freed) if the client went away first. A client that stops waiting must not keep a place for up to
    30 s."""
    waiting = asyncio.ensure_future(wait)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, gone):
            if not task.done():
                task.cancel()
    if not waiting.done() or waiting.cancelled():
        await asyncio.gather(waiting, return_exceptions=True)  # its `finally` frees the place
        raise ClientGone
    return waiting.result()


async def projection_behind(
    request: Request,
    services: Services,
    projection: Projection,
    min_cursor: str | None,
    wait: float,
    tenant: str,
) -> JSONResponse | None:
    """None once `projection` has passed `min_cursor` (at once without one); else the 409, 429 or 504
    answer. The wait holds no thread and no connection: the server's shared listener wakes it."""
    if min_cursor is None:
        return None
    wanted = Cursor.parse(min_cursor)
    waiters = request.app.state.waiters
    assert isinstance(waiters, ProjectionWaiters)
    try:
        waiters.check_room(tenant)  # refused before its look costs a thread and a connection
    except TooManyWaitersError as exc:
        return too_many_waiters(exc)
    try:
        # One look first: a projection that no projector has ever run will not get there by waiting.
        await run_in_threadpool(wait_for, services.store, projection, wanted, timeout=0)
        return None
    except ProjectionBehindError as exc:
        if exc.position is None:
            return error_response(409, exc.code, str(exc), exc.details())
    in_flight = request.app.state.in_flight
    assert isinstance(in_flight, RequestsInFlight)
    try:
        # While it waits it holds no thread and no connection: not one of the tenant's requests in flight.
        async with in_flight.set_aside(tenant):
            await unless_disconnected(
                request, waiters.wait_for(projection, wanted, timeout=wait, tenant=tenant)
            )
    except NoPlaceAgain:
        return in_flight.refusal(tenant)
    except TooManyWaitersError as exc:
        return too_many_waiters(exc)
    except ProjectionBehindError as exc:
        return error_response(504, exc.code, str(exc), exc.details())
    except ClientGone:  # nobody is left to read the answer
        log.info("projection_wait_abandoned", projection=projection.name, wanted=str(wanted))
        return client_gone()
    return None
