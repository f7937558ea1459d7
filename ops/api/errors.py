"""Every error the API returns, as one JSON shape with a stable code:
`{"error": {"code", "message", "next", "details"}}`.

Typed ledgerflow errors map to statuses by kind. Driver errors never get here: the modules that run SQL
translate them (a lost database is a DatabaseUnavailableError, so a 503); one that did would be a bug
below, answered as any unexpected error (a 500, logged with its traceback).
"""

from __future__ import annotations

import math
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from eventstore import (
    ConflictError,
    DatabaseUnavailableError,
    InvalidInputError,
    LedgerflowError,
    MigrationError,
    NotFoundError,
    QuotaExceededError,
)
from ops.api.jobs import JobQueueFullError
from ops.auth import AuthenticationError, PermissionDeniedError
from workflows import PayloadTooLargeError

log = structlog.get_logger(__name__)

REQUEST_TOO_LARGE = "request_too_large"
INVALID_REQUEST = "invalid_request"
INTERNAL_ERROR = "internal_error"

#: What a caller can do next, by error code (None where there is nothing sensible to suggest).
NEXT: dict[str, str] = {
    "wrong_expected_version": "re-read the stream, decide again, and append with If-Match set to its version",
    "idempotency_conflict": "use a new Idempotency-Key for new content",
    "duplicate_event_id": "use a fresh event_id, or an Idempotency-Key to retry an append safely",
    "run_state_conflict": "GET the run to see its status",
    "conflict": "retry the request",
    "run_in_progress": "wait for the run named in details.run_id to end, then ask again",
    "invalid_input": "fix the request as the message says and send it again",
    "invalid_utf8": "send text as UTF-8 (percent-encode UTF-8 bytes in paths and queries)",
    "event_too_large": "store large payloads elsewhere and append a reference",
    "payload_too_large": "store large payloads elsewhere and send a reference (details.setting: the limit)",
    "run_signal_limit": "start a new run for further signals; the run's count never goes down",
    "unknown_event_type": "fix the event type as the message says",
    INVALID_REQUEST: "fix the request (details.errors lists the fields, where known) and send it again",
    REQUEST_TOO_LARGE: "send a smaller body (split the append into several)",
    "not_found": "check the identifier; resources of other tenants are not visible",
    "unauthenticated": "send 'Authorization: Bearer <token>' with a live API token",
    "forbidden": "use a token with the scope named in details.required_any_of",
    "database_unavailable": "retry once the database answers",
    "migration_error": "apply the pending migrations",
    "job_queue_full": "ask again after Retry-After seconds, once some of your queued runs have ended",
    "quota_exceeded": "wait as long as Retry-After says (details.retry_after), then send it again",
    "master_key_missing": "the server's operator sets LEDGERFLOW_MASTER_KEY or LEDGERFLOW_MASTER_KEY_FILE",
    "master_key_unknown": "ask the server's operator to configure the master key named in details",
}


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, machine-readable error code.")
    message: str
    next: str | None = Field(default=None, description="What the caller can do next.")
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    error: ErrorDetail


def _response(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


Responses = dict[int | str, dict[str, Any]]

#: Error statuses every authenticated route may answer with, for the OpenAPI document.
COMMON_RESPONSES: Responses = {
    400: _response(
        "Text that is not UTF-8 (in the path, the query, a header the API reads or a JSON body), or a NUL "
        "character in the path or query; nothing was written."
    ),
    401: _response("Missing, malformed, unknown or revoked bearer token."),
    403: _response("The token lacks the scope the request needs."),
    413: _response("The request body is over the size limit."),
    422: _response("The request is invalid; nothing was written."),
    503: _response("The database is unavailable."),
}
NOT_FOUND: Responses = {404: _response("No such resource (or it belongs to another tenant).")}
CONFLICT: Responses = {409: _response("The request conflicts with what is recorded; nothing was written.")}
TOO_MANY_REQUESTS: Responses = {
    429: _response("Too many of the caller's jobs are waiting; nothing was recorded (see Retry-After).")
}
QUOTA: Responses = {
    429: _response(
        "The tenant is over a quota (details.quota); nothing was written. Retry after the seconds the "
        "Retry-After header says."
    )
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return ErrorBody(
        error=ErrorDetail(code=code, message=message, next=NEXT.get(code), details=details or {})
    ).model_dump(mode="json")


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def status_of(exc: LedgerflowError) -> int:
    if isinstance(exc, AuthenticationError):
        return 401
    if isinstance(exc, PermissionDeniedError):
        return 403
    if isinstance(exc, JobQueueFullError):
        return 429
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, QuotaExceededError):
        return 429
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, PayloadTooLargeError):
        return 413
    if isinstance(exc, InvalidInputError):
        return 422
    if isinstance(exc, DatabaseUnavailableError | MigrationError):
        return 503
    return 500


def ledgerflow_error_response(exc: LedgerflowError) -> JSONResponse:
    status = status_of(exc)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="ledgerflow"'
    elif status == 503:
        headers["Retry-After"] = "1"
    elif isinstance(exc, JobQueueFullError):
        headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, QuotaExceededError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))  # whole seconds (RFC 9110)
    if status == 500:
        # The message may carry internals (SQL state, driver text): logged, not shown.
        log.error("api_request_failed", code=exc.code, error=str(exc), exc_info=exc)
        return error_response(500, exc.code, "an unexpected error occurred; it has been logged")
    if status == 503:
        log.warning("api_database_unavailable", code=exc.code, error=str(exc))
    return error_response(status, exc.code, str(exc), exc.details(), headers or None)


async def _on_ledgerflow_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LedgerflowError)
    return ledgerflow_error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only where and what: echoing the input back could echo megabytes, or values JSON cannot carry.
    errors = [
        {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": e.get("type")}
        for e in exc.errors()
    ]
    return error_response(
        422, INVALID_REQUEST, "the request is invalid; nothing was written", {"errors": errors}
    )


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: REQUEST_TOO_LARGE,
    415: "unsupported_media_type",
}


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400:  # FastAPI's answer to a body it could not parse (too deep, huge numbers)
        return error_response(422, INVALID_REQUEST, f"the request body could not be parsed: {exc.detail}")
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = "no such route" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, code, message, headers=dict(exc.headers or {}) or None)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("api_unexpected_error", path=request.url.path, exc_info=exc)
    return error_response(500, INTERNAL_ERROR, "an unexpected error occurred; it has been logged")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the one error shape."""
    app.add_exception_handler(LedgerflowError, _on_ledgerflow_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
