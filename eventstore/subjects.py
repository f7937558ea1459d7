"""Operator actions on subjects' data keys: forgetting a subject (recorded in its tenant's log) and
re-wrapping every data key under a new master key."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from eventstore import _validation as check
from eventstore.db import wrap_exceptions
from eventstore.events import NewEvent
from eventstore.keys import Forgotten, RotationProgress
from eventstore.store import EventStore

log = structlog.get_logger(__name__)

#: The stream of a tenant's log where each forgetting is recorded, as an event of this type.
FORGOTTEN_STREAM = "subjects-forgotten"
FORGOTTEN_TYPE = "SubjectForgotten"


def forget_subject(store: EventStore, subject: str, *, tenant: str, by: str, reason: str = "") -> Forgotten:
    """Delete `subject`'s data key in `tenant`: from the commit on, reads answer its personal fields as
    `REDACTED`. Recorded as a `SubjectForgotten` event in the tenant's `subjects-forgotten` stream, in the
    same transaction. Forgetting again changes nothing and records nothing (`already`)."""
    check.check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
        done = store.personal.keys.forget_txn(conn, tenant, subject, by)
        if not done.already:
            store.append(
                FORGOTTEN_STREAM,
                [
                    NewEvent(
                        FORGOTTEN_TYPE,
                        {"subject": done.subject, "key_id": str(done.key_id), "by": by, "reason": reason},
                    )
                ],
                tenant=tenant,
                conn=conn,
            )
    if not done.already:
        store.notify_appended()
    log.info("subject_forgotten", tenant=tenant, key_id=str(done.key_id), by=by, already=done.already)
    return done


def rotate_master_key(
    store: EventStore,
    *,
    batch: int = 500,
    progress: Callable[[RotationProgress], None] | None = None,
) -> int:
    """Re-wrap every data key still wrapped by a previous master key under the current one, a batch per
    transaction; the log is not touched. Stopped at any point, running it again goes on where it stopped;
    with nothing left, it does nothing. Returns how many keys it re-wrapped."""
    total = 0
    while True:
        step = store.personal.keys.rotate_batch(batch)
        total += step.rewrapped
        if progress is not None:
            progress(step)
        if step.rewrapped == 0:
            break
    log.info("master_key_rotated", rewrapped=total, remaining=step.remaining)
    return total
