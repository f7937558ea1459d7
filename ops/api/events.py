"""Appending to and reading the event log: `/api/v1/streams/...` and `/api/v1/events`.

Every read and write is scoped to the token's tenant. Requests are checked completely (stream id,
event types, JSON, expected version, idempotency key) before the store is called; the store checks again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, model_validator
from starlette.concurrency import run_in_threadpool

from eventstore import (
    ANY,
    EVENT_TYPE_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    NO_STREAM,
    STREAM_EXISTS,
    Cursor,
    EncodedEvent,
    EventStore,
    ExpectedVersion,
    InvalidInputError,
    NewEvent,
    NotFoundError,
    check_stream_id,
)
from eventstore.spi import json_loads
from ops.api.deps import Appender, Reader, ServicesDep
from ops.api.errors import CONFLICT, NOT_FOUND, QUOTA
from workflows import RESERVED_CATEGORIES, RESERVED_TYPE_PREFIX


class _ExactJsonRequest(Request):
    """A request whose JSON body keeps every number's exact value (see `eventstore.jsonvalue`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # The guard middleware has refused bodies that are not UTF-8.
            self._json = json_loads((await self.body()).decode("utf-8"))
        return self._json


class _ExactJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def exact(request: Request) -> Response:
            return await handler(_ExactJsonRequest(request.scope, request.receive))

        return exact


router = APIRouter(tags=["events"], route_class=_ExactJsonRoute)

MAX_PAGE = 1000
_MAX_BIGINT = 2**63 - 1
_TYPE_PATTERN = EVENT_TYPE_PATTERN.pattern
_CURSOR_PATTERN = r"^[0-9]{1,20}:[0-9]{1,20}$"


class EventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(pattern=_TYPE_PATTERN, max_length=200, examples=["OrderPlaced"])
    data: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    event_id: uuid.UUID | None = Field(
        default=None, description="Unique within the tenant's log; generated if absent."
    )
    correlation_id: uuid.UUID | None = None
    causation_id: uuid.UUID | None = None

    def to_new_event(self) -> NewEvent:
        return NewEvent(
            type=self.type,
            data=self.data,
            metadata=self.metadata,
            event_id=self.event_id or uuid.uuid4(),
            correlation_id=self.correlation_id,
            causation_id=self.causation_id,
        )


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _event_ids_unique(self) -> AppendRequest:
        ids = [e.event_id for e in self.events if e.event_id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("two events of the append share an event_id")
        return self


class AppendedOut(BaseModel):
    stream_id: str
    stream_version: int
    position: int
    cursor: str


class AppendResponse(BaseModel):
    events: list[AppendedOut]
    duplicate: bool = Field(
        description="True when an Idempotency-Key repeat returned the first append's result."
    )


class EventOut(BaseModel):
    position: int
    cursor: str = Field(description="Where this event lies in the global log's resume order.")
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    type: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    recorded_at: datetime


class StreamPage(BaseModel):
    events: list[EventOut]
    next_version: int | None = Field(
        description="Where the next page starts (`from_version=`); null when this page reached the "
        "stream's end in its direction."
    )


class LogPage(BaseModel):
    events: list[EventOut]
    cursor: str = Field(description="Resume from here (`after=`); it may lie beyond the last event.")
    caught_up: bool = Field(
        description="Everything readable now was read; false when the page stopped at its count or "
        "byte limit, so more follows at once."
    )


_DATETIME = TypeAdapter(datetime)


def _event_json(e: EncodedEvent) -> bytes:
    """One event of an answer, its data and metadata passed on as the JSON text PostgreSQL wrote, never
    decoded into Python objects (which would take several times their size in memory)."""
    return b"".join(
        (
            b'{"position":%d,"cursor":"%s","stream_id":%s,"stream_version":%d,"event_id":"%s","type":%s,'
            % (
                e.position,
                str(e.cursor).encode(),
                json.dumps(e.stream_id, ensure_ascii=False).encode(),
                e.stream_version,
                str(e.event_id).encode(),
                json.dumps(e.type).encode(),
            ),
            b'"data":',
            e.data_json.encode(),
            b',"metadata":',
            e.metadata_json.encode(),
            b',"correlation_id":%s,"causation_id":%s,"recorded_at":%s}'
            % (
                b"null" if e.correlation_id is None else b'"%s"' % str(e.correlation_id).encode(),
                b"null" if e.causation_id is None else b'"%s"' % str(e.causation_id).encode(),
                _DATETIME.dump_json(e.recorded_at),
            ),
        )
    )


#: Pages being read or answered at once, per store. Each holds up to a page's size (LEDGERFLOW_MAX_PAGE_BYTES
#: and one event more) a few times over (the rows, the answer's parts, the answer), and a database
#: connection while it reads; the rest wait here, holding neither a worker thread nor a connection, so
#: probes and writes are served meanwhile however many readers come.
_GATES: weakref.WeakKeyDictionary[EventStore, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _gate(store: EventStore) -> asyncio.Semaphore:
    gate = _GATES.get(store)
    if gate is None:
        gate = _GATES[store] = asyncio.Semaphore(max(1, store.pool.max_size // 3))
    return gate


def _page_response(events: Sequence[EncodedEvent], tail: dict[str, Any]) -> Response:
    """`{"events": [...], **tail}` built from the events' JSON text."""
    parts = [b'{"events":[', b",".join(_event_json(e) for e in events), b"],"]
    parts.append(json.dumps(tail, separators=(",", ":")).encode()[1:])
    return Response(b"".join(parts), media_type="application/json")


def parse_if_match(value: str | None) -> ExpectedVersion:
    """If-Match: an exact version (`3`, or the ETag form `"3"`), `no-stream`, `exists`, or `*` for any."""
    if value is None:
        return ANY
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    named: dict[str, ExpectedVersion] = {"*": ANY, "no-stream": NO_STREAM, "exists": STREAM_EXISTS}
    if text in named:
        return named[text]
    if text.isascii() and text.isdigit() and len(text) <= 18 and int(text) >= 1:
        return int(text)
    raise InvalidInputError(
        f"If-Match {value!r} is invalid: use a stream version (1 or more), 'no-stream', 'exists' or '*'"
    )


# Workflow runs keep their state in reserved streams and event types (workflows.RESERVED_CATEGORIES);
# the engine alone writes them.


def _refuse_reserved(stream_id: str, events: list[EventIn]) -> None:
    category = stream_id.split("-", 1)[0]
    if category in RESERVED_CATEGORIES:
        raise InvalidInputError(
            f"streams of category {category!r} belong to workflow runs and are written by the engine "
            "alone; start and steer runs through /api/v1/workflows and /api/v1/runs"
        )
    for e in events:
        if e.type.startswith(RESERVED_TYPE_PREFIX):
            raise InvalidInputError(
                f"event type {e.type!r} is reserved for the workflow engine ({RESERVED_TYPE_PREFIX}*)"
            )


EventType = Annotated[str, StringConstraints(pattern=_TYPE_PATTERN, max_length=200)]
Category = Annotated[str, StringConstraints(min_length=1, max_length=400)]
StreamId = Annotated[str, Path(description="The stream, e.g. `order-42`; slashes are allowed.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=IDEMPOTENCY_KEY_PATTERN.pattern,
        description="A repeat with the same content returns the first result and writes nothing.",
    ),
]


@router.post(
    "/streams/{stream_id:path}/events",
    status_code=201,
    response_model=AppendResponse,
    responses={
        200: {"model": AppendResponse, "description": "An idempotent repeat."},
        **CONFLICT,
        **QUOTA,
        **NOT_FOUND,  # a stream id the route cannot carry (a line break)
    },
)
def append_events(
    stream_id: StreamId,
    body: AppendRequest,
    principal: Appender,
    services: ServicesDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    if_match: Annotated[
        str | None,
        Header(
            alias="If-Match",
            max_length=40,
            description="The expected stream version: a number, `no-stream`, `exists`, or `*` (any).",
        ),
    ] = None,
) -> AppendResponse:
    """Append events to one stream atomically, with optimistic concurrency and idempotency."""
    stream_id = check_stream_id(stream_id)
    expected = parse_if_match(if_match)
    _refuse_reserved(stream_id, body.events)
    events = [e.to_new_event() for e in body.events]
    services.quotas.take_append(principal.tenant)  # after the checks of content: bad input costs no token
    result = services.store.append(
        stream_id,
        events,
        expected_version=expected,
        idempotency_key=idempotency_key,
        tenant=principal.tenant,
    )
    if result.duplicate:
        response.status_code = 200
    last = max(e.stream_version for e in result.events)
    response.headers["ETag"] = f'"{last}"'
    return AppendResponse(
        events=[
            AppendedOut(
                stream_id=e.stream_id,
                stream_version=e.stream_version,
                position=e.position,
                cursor=str(Cursor(e.transaction_id, e.position)),
            )
            for e in result.events
        ],
        duplicate=result.duplicate,
    )


_UPCAST = (
    "Events of declared types in their latest shape, through the server's upcasters "
    "(LEDGERFLOW_EVENT_TYPES); the stored events are unchanged. Default: as stored."
)


@router.get("/streams/{stream_id:path}", response_model=StreamPage, responses=NOT_FOUND)
async def read_stream(
    stream_id: StreamId,
    principal: Reader,
    services: ServicesDep,
    from_version: Annotated[int | None, Query(ge=1, le=_MAX_BIGINT - 1)] = None,
    backward: bool = False,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    upcast: Annotated[bool, Query(description=_UPCAST)] = False,
) -> Response:
    """A stream's events from `from_version` (inclusive), oldest first or, with `backward`, newest first.

    A page holds at most `limit` events and stops early once they pass the server's page size
    (LEDGERFLOW_MAX_PAGE_BYTES, always with at least one event); continue from `next_version`."""
    stream_id = check_stream_id(stream_id)
    store = services.store

    def answer() -> Response:
        page = store.read_stream_page(
            stream_id,
            tenant=principal.tenant,
            from_version=from_version,
            backward=backward,
            limit=limit,
            upcast=upcast,
        )
        if not page.events and store.stream_version(stream_id, tenant=principal.tenant) is None:
            raise NotFoundError(f"no stream {stream_id!r} in this tenant")
        return _page_response(page.events, {"next_version": page.next_version})

    async with _gate(store):
        return await run_in_threadpool(answer)


def _cursor(text: str | None) -> Cursor:
    if text is None:
        return Cursor()
    cursor = Cursor.parse(text)
    if cursor.transaction_id > _MAX_BIGINT or cursor.position > _MAX_BIGINT:
        raise InvalidInputError(f"cursor {text!r} is out of range")
    return cursor


@router.get("/events", response_model=LogPage)
async def read_log(
    principal: Reader,
    services: ServicesDep,
    after: Annotated[
        str | None,
        Query(pattern=_CURSOR_PATTERN, description="A cursor from an earlier page; default: start."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    type: Annotated[list[EventType], Query(max_length=50, description="Only these event types.")] = [],  # noqa: B006
    category: Annotated[
        list[Category],
        Query(max_length=50, description="Only streams of these categories (`order` of `order-42`)."),
    ] = [],  # noqa: B006
    upcast: Annotated[bool, Query(description=_UPCAST)] = False,
) -> Response:
    """The tenant's events in the global log's resume order, gap-free: resume from `cursor`.

    A page holds at most `limit` events and stops early once they pass the server's page size
    (LEDGERFLOW_MAX_PAGE_BYTES, always with at least one event); such a page is not `caught_up`."""
    for name in category:
        if not name.isprintable():
            raise InvalidInputError(f"category {name!r} contains control characters")
    cursor, store = _cursor(after), services.store

    def answer() -> Response:
        page = store.read_all_encoded(
            cursor,
            limit=limit,
            tenant=principal.tenant,
            types=type or None,
            categories=category or None,
            upcast=upcast,
        )
        return _page_response(page.events, {"cursor": str(page.cursor), "caught_up": page.caught_up})

    async with _gate(store):
        return await run_in_threadpool(answer)
