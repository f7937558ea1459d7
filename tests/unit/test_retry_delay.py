"""The back-off between attempts to reach the database: soon when it is away, spread out and longer when
it answers but has no free connection slot."""

from __future__ import annotations

import psycopg

from eventstore import DatabaseUnavailableError
from eventstore.outage import MAX_BACKOFF, SLOTS_BACKOFF_MAX, retry_delay, slots_full

FULL = psycopg.OperationalError(
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many '
    "clients already"
)
RESERVED = psycopg.OperationalError(
    "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute"
)
DOWN = psycopg.OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')


def test_a_full_server_is_told_apart_from_one_that_is_away() -> None:
    assert slots_full(FULL)
    assert slots_full(RESERVED)
    assert not slots_full(DOWN)
    assert not slots_full(None)
    # Also once translated: the driver's error is the cause.
    translated = DatabaseUnavailableError("the database connection failed")
    translated.__cause__ = FULL
    assert slots_full(translated)


def test_a_server_that_is_away_is_tried_again_soon() -> None:
    delays = [retry_delay(n, DOWN) for n in range(1, 30)]
    assert delays[0] < 0.11
    assert max(delays) <= MAX_BACKOFF + 0.05
    assert delays[-1] >= MAX_BACKOFF  # it keeps trying every couple of seconds


def test_a_full_server_is_asked_less_often_and_at_spread_out_moments() -> None:
    late = [retry_delay(12, FULL) for _ in range(500)]
    assert max(late) <= SLOTS_BACKOFF_MAX
    assert sum(late) / len(late) > 4 * MAX_BACKOFF / 2  # on average well above an outage's back-off
    # Full jitter: the waiting processes do not come back together.
    assert min(late) < SLOTS_BACKOFF_MAX / 4
    assert max(late) > SLOTS_BACKOFF_MAX * 3 / 4
