"""Property-based fuzzing of every operation from the published OpenAPI document (schemathesis).

For requests that fit the schema and requests that do not: the API never answers 5xx, answers only
with statuses and bodies its document declares, rejects data that breaks the schema, and a request it
refuses (4xx) leaves the event log exactly as it was. Bounded: a fixed number of examples per operation.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from ops.api import create_app
from ops.services import Services
from tests.api.helpers import MakeToken

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
#: For each of the two modes; about 25 s for the whole API. Raise it for a deeper run by hand.
EXAMPLES_PER_OPERATION = int(os.environ.get("LEDGERFLOW_FUZZ_EXAMPLES", "12"))
BASE_URL = "http://testserver"


def _request_kwargs(case: schemathesis.Case[Any]) -> dict[str, Any]:
    """The case as arguments for the TestClient (httpx-style)."""
    sent = case.as_transport_kwargs(base_url=BASE_URL)
    kwargs: dict[str, Any] = {
        "method": sent["method"],
        "url": sent["url"],
        "headers": sent.get("headers"),
        "params": sent.get("params") or None,
    }
    if "json" in sent:
        kwargs["json"] = sent["json"]
    elif sent.get("data") is not None:
        data = sent["data"]
        kwargs["content"] = data.encode() if isinstance(data, str) else data
    return kwargs


# Hypothesis warns when the global `random` state changes while it draws an example, taking it for a
# strategy that uses `random`. The API's own threads do change it meanwhile: psycopg_pool jitters each new
# connection's lifetime with `random()`, and the store opens one in the background when the log needs its
# next partition. Nothing in the strategies uses it, so the warning says nothing about them here.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
def test_fuzzing_every_operation_from_the_openapi_document(
    services: Services, database_url: str, make_token: MakeToken
) -> None:
    authorization = make_token("admin")["Authorization"]
    app = create_app(services)
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 20
    began = time.monotonic()
    with (
        TestClient(app) as client,
        psycopg.connect(database_url, autocommit=True) as counter,
    ):

        def events() -> int:
            row = counter.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
            assert row is not None
            return int(row[0])

        for operation in operations:
            inputs = [p.name for p in operation.iter_parameters() if p.name != "Authorization"]
            modes = [GenerationMode.POSITIVE]
            if inputs or operation.body:  # otherwise there is nothing to break
                modes.append(GenerationMode.NEGATIVE)
            for mode in modes:

                @settings(
                    max_examples=EXAMPLES_PER_OPERATION,
                    deadline=None,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck),
                )
                # A valid admin token on every case, so fuzzing reaches past authentication (401 and 403
                # are tested elsewhere).
                @given(case=operation.as_strategy(mode, headers={"Authorization": authorization}))
                def exercise(case: schemathesis.Case[Any]) -> None:
                    before = events()
                    response = client.request(**_request_kwargs(case))
                    if response.status_code == 413:
                        # A body over the size limit is refused before it is parsed: a rejection as good
                        # as a 422, though not one the negative-data check lists (a generated list of
                        # over 10,000 events, some megabytes, gets it).
                        assert response.json()["error"]["code"]
                        assert events() == before
                        return
                    case.validate_response(response, checks=CHECKS)
                    if 400 <= response.status_code < 500:
                        assert events() == before, (
                            f"{case.operation.label}: {response.status_code}, yet wrote"
                        )

                exercise()
    # The budget is examples, not seconds: a wall-clock bound breaks on a loaded machine. The run's
    # --durations shows what the fuzzing costs; the per-test timeout stops a runaway.
    print(
        f"\nfuzzed {len(operations)} operations x {EXAMPLES_PER_OPERATION} examples in "
        f"{time.monotonic() - began:.1f}s"
    )
