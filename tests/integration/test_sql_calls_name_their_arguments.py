"""The long SQL functions are called with named arguments (`p_run_id => %(run_id)s`), never by position:
with 16 to 31 parameters, several of one type, an argument moved by one place would still run, with every
value after it in the wrong parameter. Named, a call that does not match the function's declaration (a
parameter renamed, added or dropped by a migration) fails at once."""

from __future__ import annotations

import re
from pathlib import Path

from eventstore import EventStore

ROOT = Path(__file__).resolve().parents[2]
#: Functions with at least this many parameters are called by name.
LONG = 6


def _declared(store: EventStore) -> dict[str, list[str]]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT proname, (proargnames)[1:pronargs] FROM pg_proc"
            " WHERE pronamespace = 'ledgerflow'::regnamespace AND pronargs >= %s",
            (LONG,),
        ).fetchall()
    return {name: list(args) for name, args in rows}


def _call_arguments(text: str, function: str) -> list[str]:
    """The argument lists of each call of ledgerflow.<function> in `text` (placeholders kept whole)."""
    calls = []
    for match in re.finditer(rf"ledgerflow\.{function}\(", text):
        depth, i = 1, match.end()
        while depth:
            if text.startswith("%(", i):
                i = text.index(")", i) + 1
                continue
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        calls.append(text[match.end() : i - 1])
    return calls


def test_every_call_of_a_long_function_names_each_argument_as_declared(store: EventStore) -> None:
    declared = _declared(store)
    assert {"wf_record_run_end", "wf_record_node_end", "wf_end_node", "append_events"} <= set(declared)
    queries = [
        p
        for package in ("eventstore", "projector", "workflows", "ops")
        for p in (ROOT / package).rglob("*.sql")
    ]
    checked = 0
    for path in queries:
        text = path.read_text()
        for function, parameters in declared.items():
            for arguments in _call_arguments(text, function):
                named = re.findall(r"\b(p_\w+)\s*=>", arguments)
                assert named == parameters, (
                    f"{path.name}: ledgerflow.{function} called with {named or 'positions'}"
                )
                checked += 1
    assert checked >= 8  # the calls this was written for: a moved query file must not pass by finding none
