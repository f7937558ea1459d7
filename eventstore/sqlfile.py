"""Named SQL statements kept in a `queries.sql` beside the module that runs them.

A file holds blocks that start with `-- name: some_name`; each block is one statement. Keeping SQL in
.sql files keeps it readable and reviewable, and each statement lives in exactly one place.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, LiteralString]:
    text = (resources.files(package) / filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, LiteralString] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} is defined twice")
        # The text comes from a file shipped with the package, never from user input.
        queries[name] = cast(LiteralString, body.strip())
    return queries
