"""A failed connection, read once where driver errors are translated: a refusal no wait fixes is told
apart from an outage, and both carry the driver's reason and its kind, so that ops advises without
reading the driver's text."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import DatabaseRefusedError, DatabaseUnavailableError, MisconfiguredDatabaseError
from eventstore.spi import check_database_url, translate

PREFIX = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '


@pytest.mark.parametrize(
    ("message", "failure"),
    [
        (PREFIX + 'database "missing_1" does not exist', "no_database"),
        (PREFIX + 'password authentication failed for user "someone"', "login_refused"),
        (PREFIX + 'role "nobody_here" does not exist', "login_refused"),
        (PREFIX + 'no pg_hba.conf entry for host "10.0.0.1", user "u", database "d"', "not_permitted"),
        ('connection is bad: invalid integer value "abc" for connection option "port"', "bad_setting"),
    ],
)
def test_a_refusal_is_told_apart_from_an_outage(message: str, failure: str) -> None:
    refused = translate(psycopg.OperationalError(message))
    assert isinstance(refused, DatabaseRefusedError)
    assert isinstance(refused, DatabaseUnavailableError)  # a running worker waits for the fix
    assert refused.failure == failure
    assert refused.reason is not None
    assert "FATAL" not in refused.reason
    assert refused.reason in message


def test_a_missing_database_is_named() -> None:
    refused = translate(psycopg.OperationalError(PREFIX + 'database "missing_1" does not exist'))
    assert isinstance(refused, DatabaseRefusedError)
    assert (refused.database, refused.reason) == ("missing_1", 'database "missing_1" does not exist')


@pytest.mark.parametrize(
    ("message", "failure"),
    [
        (
            'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused\n'
            "\tIs the server running on that host and accepting TCP/IP connections?",
            "unreachable",
        ),
        (PREFIX + "sorry, too many clients already", "no_free_slot"),
        (PREFIX + "the database system is starting up", "restarting"),
        ("consuming input failed: server closed the connection unexpectedly", "restarting"),
        ("something nobody foresaw", "other"),
    ],
)
def test_an_outage_says_why(message: str, failure: str) -> None:
    unavailable = translate(psycopg.OperationalError(message))
    assert type(unavailable) is DatabaseUnavailableError
    assert unavailable.failure == failure
    assert unavailable.reason == message.splitlines()[0].rsplit("FATAL:", 1)[-1].strip()


@pytest.mark.parametrize(
    "url", ["localhost:5432", "postgresq://someone:s3cret-pw@localhost/ledger", "host=h dbname"]
)
def test_a_malformed_url_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(MisconfiguredDatabaseError, match="LEDGERFLOW_DATABASE_URL is malformed") as raised:
        check_database_url(url)
    assert "s3cret-pw" not in str(raised.value)
    assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in raised.value.todo


@pytest.mark.parametrize("url", [None, "", "postgresql://u:p@h:5432/d", "host=h dbname=d"])
def test_a_well_formed_url_passes(url: str | None) -> None:
    check_database_url(url)
