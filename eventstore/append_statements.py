"""What an append sends: its events checked and serialised, its parameters, and which statement carries
them (one event, one stream, or the general form with several streams or an idempotency key). Nothing
here touches a connection; `eventstore.appending` sends what this builds."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString, NamedTuple

import pydantic
from psycopg import sql

from eventstore import _validation as check
from eventstore import direct, jsonvalue
from eventstore.arrays import BigintArray, IntArray, TextArray, UuidArray
from eventstore.errors import InvalidInputError
from eventstore.events import ExpectedState, ExpectedVersion, NewEvent, StreamAppend
from eventstore.eventtypes import EventTypes
from eventstore.personal import Shredder
from eventstore.sqlfile import load_queries

Q = load_queries("eventstore")


class AppendStatement(NamedTuple):
    """One append, ready to send."""

    query: LiteralString | bytes
    params: dict[str, Any]
    tenant: str
    #: How many streams and events it writes (for its span).
    streams: int
    events: int
    #: The stream and expectation of a single-stream statement, which inserts no row (rather than raising)
    #: when the expected version does not hold: then the sender reads the stream's version to say so.
    missing: tuple[str, ExpectedVersion] | None
    #: The statement's form for `eventstore.direct`, if it has one.
    direct_form: direct.DirectStatement | None = None


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    event: NewEvent
    data: str
    metadata: str


class AppendStatements:
    """The building of append statements, for `EventStore` (whose attributes these are)."""

    types: EventTypes
    personal: Shredder
    max_event_bytes: int
    max_events_per_append: int

    def _statement(
        self, appends: Sequence[StreamAppend], idempotency_key: str | None, tenant: str
    ) -> AppendStatement:
        """The statement of `append_many(appends, ...)`: the one-event form when it is one event to one
        stream without a key, the one-stream form for more events to one stream, else the general one."""
        if idempotency_key is None and type(appends) in (list, tuple) and len(appends) == 1:
            one = appends[0]
            if isinstance(one, StreamAppend) and type(one.events) in (list, tuple) and len(one.events) == 1:
                return self._one_event_statement(one.stream_id, one.events[0], one.expected_version, tenant)
        params = self._append_params(appends, idempotency_key, tenant)
        events = len(params["event_ids"])
        if len(appends) == 1 and idempotency_key is None:
            append = appends[0]
            query, params = _one_stream(append, params)
            return AppendStatement(
                query, params, tenant, 1, events, (append.stream_id, append.expected_version)
            )
        return AppendStatement(Q["append"], params, tenant, len(appends), events, None)

    def _one_event_statement(
        self,
        stream_id: str,
        event: NewEvent | pydantic.BaseModel,
        expected: ExpectedVersion,
        tenant: str,
    ) -> AppendStatement:
        """The most common append of all, one event to one stream without an idempotency key: the same
        checks in the same order as the general form, one plain statement with plain parameters."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        p = self._prepare(event, tenant)
        new = p.event
        code = expected_code(expected)
        params = {
            "tenant": tenant,
            "stream_id": stream_id,
            "count": 1,
            "expected": code if code > 0 else None,
            "event_id": new.event_id,
            "type": new.type,
            "one_data": p.data,
            "one_metadata": p.metadata,
            "correlation_id": new.correlation_id,
            "causation_id": new.causation_id,
        }
        key = _bump_key(expected)
        return AppendStatement(
            _ONE_EVENT[key], params, tenant, 1, 1, (stream_id, expected), _ONE_EVENT_DIRECT[key]
        )

    def one_stream_params(
        self,
        stream_id: str,
        events: Sequence[NewEvent | pydantic.BaseModel],
        expected_version: ExpectedVersion,
        tenant: str,
    ) -> dict[str, Any]:
        """The parameters of an append of `events` to one stream expected at `expected_version`, checked
        as `append` checks them, for a statement that appends as `append_one_stream` does (in queries.sql)
        together with writes of its own, in one round trip (see ledgerflow.wf_record_node_end). Its rows
        go through `appended`; it does not wake subscribers: call `notify_appended` once it committed."""
        params = self._append_params([StreamAppend(stream_id, events, expected_version)], None, tenant)
        del params["idempotency_key"], params["request_hash"], params["stream_ids"], params["counts"]
        exact = isinstance(expected_version, int) and not isinstance(expected_version, bool)
        return {**params, "stream_id": stream_id, "expected": expected_version if exact else None}

    def _prepare(self, event: NewEvent | pydantic.BaseModel, tenant: str) -> PreparedEvent:
        # A model instance becomes its NewEvent; a declared type is validated and its version recorded.
        event = self.types.stamp(event)
        if not isinstance(event, NewEvent):
            raise InvalidInputError(f"events must be NewEvent instances, not {type(event).__name__}")
        check.check_event_type(event.type)
        # The stored data: personal fields sealed. `event` keeps the plain data for the idempotency hash,
        # so a retry hashes the same whatever the ciphertexts' random nonces.
        data, problem = check.dumped_json_object(self.personal.seal(tenant, event))
        if problem is not None:
            raise InvalidInputError(f"data of event {event.type!r} {problem}")
        metadata, problem = check.dumped_json_object(event.metadata)
        if problem is not None:
            raise InvalidInputError(f"metadata of event {event.type!r} {problem}")
        check.check_size(event.type, data, metadata, self.max_event_bytes)
        return PreparedEvent(event, data, metadata)

    def _append_params(
        self, appends: Sequence[StreamAppend], idempotency_key: str | None, tenant: str
    ) -> dict[str, Any]:
        check.check_tenant(tenant)
        if idempotency_key is not None:
            check.check_idempotency_key(idempotency_key)
        if not appends:
            raise InvalidInputError("an append needs at least one stream")
        seen: set[str] = set()
        for a in appends:
            check.check_stream_id(a.stream_id)
            if a.stream_id in seen:
                raise InvalidInputError(
                    f"stream {a.stream_id!r} appears twice in one append; merge its events"
                )
            seen.add(a.stream_id)
            if not a.events:
                raise InvalidInputError(f"the append to stream {a.stream_id!r} has no events")
        total = sum(len(a.events) for a in appends)
        if total > self.max_events_per_append:
            raise InvalidInputError(
                f"{total} events in one append; the limit is {self.max_events_per_append}. "
                "Split the append, or use import_events for bulk loads"
            )
        # Streams are locked in a fixed order so that two multi-stream appends cannot deadlock.
        ordered = sorted(appends, key=lambda a: a.stream_id)
        prepared = [[self._prepare(e, tenant) for e in a.events] for a in ordered]
        flat = [p for group in prepared for p in group]
        expected = [expected_code(a.expected_version) for a in ordered]
        request_hash = None
        if idempotency_key is not None:
            request_hash = _request_hash(ordered, expected, prepared)
        return {
            "tenant": tenant,
            "idempotency_key": idempotency_key,
            "request_hash": request_hash,
            "stream_ids": TextArray(a.stream_id for a in ordered),
            "expected": BigintArray(expected),
            "counts": IntArray(len(group) for group in prepared),
            "event_ids": UuidArray(p.event.event_id for p in flat),
            "types": TextArray(p.event.type for p in flat),
            "data": TextArray(p.data for p in flat),
            "metadata": TextArray(p.metadata for p in flat),
            "correlation_ids": UuidArray(p.event.correlation_id for p in flat),
            "causation_ids": UuidArray(p.event.causation_id for p in flat),
        }


def expected_code(expected: ExpectedVersion) -> int:
    if isinstance(expected, ExpectedState):
        return expected.value
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise InvalidInputError(
            f"expected version {expected!r} is invalid: stream versions start at 1; "
            "use NO_STREAM for a new stream"
        )
    return expected


def _with_bumps(query: LiteralString) -> dict[ExpectedState | None, bytes]:
    """`query` completed with each way of moving a stream's version; None: an exact version, or
    STREAM_EXISTS (no version condition). Rendered once to bytes: a composed query would be rendered
    again on every execution."""
    bumps = {ExpectedState.ANY: "bump_any", ExpectedState.NO_STREAM: "bump_no_stream", None: "bump_existing"}
    return {
        k: sql.SQL(query).format(writer=sql.SQL(Q["writer"]), bump=sql.SQL(Q[name])).as_bytes()
        for k, name in bumps.items()
    }


_ONE_STREAM = _with_bumps(Q["append_one_stream"])
_ONE_EVENT = _with_bumps(Q["append_one_event"])
#: The same statements for `eventstore.direct`, by the same keys.
_ONE_EVENT_DIRECT = {
    key: direct.DirectStatement.of(f"append_one_event_{'exact' if key is None else key.name.lower()}", query)
    for key, query in _ONE_EVENT.items()
}


def _bump_key(expected: ExpectedVersion) -> ExpectedState | None:
    return expected if expected is ExpectedState.ANY or expected is ExpectedState.NO_STREAM else None


def _one_stream(append: StreamAppend, params: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The single-statement form of a one-stream append of several events without an idempotency key."""
    expected = append.expected_version
    one = {
        **params,
        "stream_id": append.stream_id,
        "count": len(append.events),
        "expected": expected if isinstance(expected, int) and not isinstance(expected, bool) else None,
    }
    return _ONE_STREAM[_bump_key(expected)], one


def _request_hash(
    appends: Sequence[StreamAppend], expected: Sequence[int], prepared: Sequence[Sequence[PreparedEvent]]
) -> str:
    """A fingerprint of an append's content. Event ids are left out: a retry that generates fresh ids
    for the same content is the same request."""
    content = [
        [
            a.stream_id,
            code,
            [
                [
                    p.event.type,
                    dict(p.event.data),
                    dict(p.event.metadata),
                    str(p.event.correlation_id),
                    str(p.event.causation_id),
                ]
                for p in group
            ],
        ]
        for a, code, group in zip(appends, expected, prepared, strict=True)
    ]
    # sort_keys: the same mapping built in another key order is the same content.
    canonical = jsonvalue.dumps(content, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
