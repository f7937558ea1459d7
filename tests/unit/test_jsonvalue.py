"""`jsonvalue.loads` scans text without surrounding whitespace directly; any other text takes the decoder's
full path. Both must give the same values and the same errors."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore.jsonvalue import dumps, loads
from tests.strategies import json_values

_whitespace = st.text(st.sampled_from(" \t\n\r"), max_size=3)


@given(json_values, _whitespace, _whitespace, st.booleans())
def test_loads_reads_any_value_whatever_the_whitespace(
    value: Any, before: str, after: str, compact: bool
) -> None:
    text = dumps(value) if compact else json.dumps(value, indent=1)
    assert loads(before + text + after) == value
    assert loads((before + text + after).encode()) == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.00000000000000000001", Decimal("1.00000000000000000001")),
        ('{"a":1e-400}', {"a": Decimal("1E-400")}),
        ("0.1", 0.1),
        ('"x"', "x"),
    ],
)
def test_loads_keeps_exact_numbers(text: str, expected: Any) -> None:
    assert loads(text) == expected
    assert type(loads(text)) is type(expected)


@pytest.mark.parametrize("text", ["", " ", "nul", '{"a":1}x', "1 2", '{"a":', "[1,]"])
def test_loads_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        loads(text)
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    assert (refused.value.msg, refused.value.pos) == (expected.value.msg, expected.value.pos)
