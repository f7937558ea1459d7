"""An appender process for the forget drill: appends events with a personal field, for a subject to be
forgotten and one that is not, until a stop file appears. Prints its counts as JSON when it ends.

    python -m tests.acceptance.personal_appender NAME STOP_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eventstore import DatabaseSettings, LedgerflowError, NewEvent, open_store, personal_fields

personal_fields("DrillCustomerSeen", subject="customer_id", fields=["email"])


def main() -> None:
    name, stop = sys.argv[1], Path(sys.argv[2])
    appended = refused = 0
    with open_store(DatabaseSettings(), migrate=False) as store:
        i = 0
        while not stop.exists():
            for who in ("victim", "bystander"):
                event = NewEvent("DrillCustomerSeen", {"customer_id": who, "email": f"{who}-{name}-{i}@mail"})
                try:
                    store.append(f"customer-{name}", [event])
                    appended += 1
                except LedgerflowError:
                    refused += 1  # a typed refusal is allowed; anything else ends the process non-zero
            i += 1
    print(json.dumps({"appended": appended, "refused": refused}))


if __name__ == "__main__":
    main()
