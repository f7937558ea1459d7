"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Text PostgreSQL can store: no NUL, no lone surrogates (the store refuses those with a typed error).
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | storable_text
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
)

json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4),
    max_leaves=12,
)

json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(storable_text, json_values, max_size=5)

event_types = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_.:-]{0,20}\Z")


def as_json_numbers(value: Any) -> Any:
    """`value` with every number as a Decimal. PostgreSQL's jsonb keeps numbers as exact decimals and
    JSON has no int/float distinction: 7.205759403792151e16 may come back as the int 72057594037921510,
    the same number. Comparing through Decimal checks that the value, not its Python type, survived."""
    from decimal import Decimal

    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [as_json_numbers(v) for v in value]
    return {k: as_json_numbers(v) for k, v in value.items()}
