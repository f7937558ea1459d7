"""The hot statements' arrays, written in PostgreSQL's binary array format by eventstore.arrays, read back
by the server as what they hold: every element, NULLs, empty arrays and non-ASCII text."""

from __future__ import annotations

import uuid

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from eventstore.arrays import BigintArray, FloatArray, IntArray, TextArray, UuidArray

# PostgreSQL's text holds any character but NUL.
texts = st.text(st.characters(exclude_characters="\x00"), max_size=40)
int4 = st.integers(-(2**31), 2**31 - 1)
int8 = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False)


@given(
    text=st.lists(st.none() | texts, max_size=8),
    ints=st.lists(st.none() | int4, max_size=8),
    bigints=st.lists(st.none() | int8, max_size=8),
    doubles=st.lists(st.none() | floats, max_size=8),
    uuids=st.lists(st.none() | st.uuids(), max_size=8),
)
def test_binary_arrays_reach_the_server_as_they_are(
    admin_url: str,
    text: list[str | None],
    ints: list[int | None],
    bigints: list[int | None],
    doubles: list[float | None],
    uuids: list[uuid.UUID | None],
) -> None:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute(
            "SELECT %b::text[], %b::int[], %b::bigint[], %b::float8[], %b::uuid[], "
            "       cardinality(%b::text[]), array_position(%b::text[], NULL) IS NOT NULL",
            (
                TextArray(text),
                IntArray(ints),
                BigintArray(bigints),
                FloatArray(doubles),
                UuidArray(uuids),
                TextArray(text),
                TextArray(text),
            ),
        ).fetchone()
    assert row == (text, ints, bigints, doubles, uuids, len(text), None in text)


def test_a_statement_that_takes_the_array_as_text_gets_the_same_values(admin_url: str) -> None:
    """Each is a list: a `%s` placeholder goes through psycopg's own list dumper."""
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT %s::text[], %s::int[]", (TextArray(["a", None]), IntArray([1]))).fetchone()
    assert row == (["a", None], [1])
