"""The CLI keeps JSON numbers exact: what `append --data` takes, `read --json` gives back digit for digit."""

from __future__ import annotations

import json
from decimal import Decimal

from tests.acceptance.cli_runs import invoke_cli as run


def test_append_and_read_keep_exact_decimals(database_url: str) -> None:
    data = '{"long": 1.00000000000000000001, "tiny": 1e-400, "half": 0.5}'
    appended = run(database_url, "append", "m-1", "--type", "Measured", "--data", data)
    assert appended.returncode == 0, appended.stderr
    read = run(database_url, "read", "m-1", "--json")
    assert read.returncode == 0, read.stderr
    [line] = [json.loads(text, parse_float=Decimal) for text in read.stdout.splitlines()]
    assert line["data"] == {
        "long": Decimal("1.00000000000000000001"),
        "tiny": Decimal("1e-400"),
        "half": Decimal("0.5"),
    }
