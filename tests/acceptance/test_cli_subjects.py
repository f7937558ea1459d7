"""`ledgerflow subjects forget` and `ledgerflow keys …` through the CLI's commands (run in this
process)."""

from __future__ import annotations

import json
from pathlib import Path

from eventstore import REDACTED, DatabaseSettings, NewEvent, open_store, personal_fields
from eventstore.spi import json_loads
from tests.acceptance.cli_runs import invoke_cli

personal_fields("CliCustomerSeen", subject="customer_id", fields=["email"])


def _append(url: str, master: str, customer: str, email: str) -> None:
    settings = DatabaseSettings(master_key=master)  # type: ignore[arg-type]
    with open_store(settings, url=url, migrate=False) as store:
        store.append(
            f"customer-{customer}", [NewEvent("CliCustomerSeen", {"customer_id": customer, "email": email})]
        )


def _emails(url: str, **env: str) -> list[str]:
    shown = invoke_cli(url, "read", "customer-c1", "--json", **env)
    assert shown.returncode == 0, shown.stderr
    return [json_loads(line)["data"]["email"] for line in shown.stdout.splitlines()]


def test_forget_and_rotate_through_the_cli(database_url: str, tmp_path: Path) -> None:
    generated = invoke_cli(database_url, "keys", "generate")
    assert generated.returncode == 0, generated.stderr
    master = generated.stdout.strip()
    key_file = tmp_path / "master.key"
    key_file.write_text(master + "\n")
    _append(database_url, master, "c1", "ann@example.com")
    by_file = {"LEDGERFLOW_MASTER_KEY_FILE": str(key_file)}
    assert _emails(database_url, **by_file) == ["ann@example.com"]

    # Rotation: the new key current, the old one previous; the log is not rewritten.
    new_master = invoke_cli(database_url, "keys", "generate").stdout.strip()
    both = {"LEDGERFLOW_MASTER_KEY": new_master, "LEDGERFLOW_PREVIOUS_MASTER_KEYS": master}
    rotated = invoke_cli(database_url, "keys", "rotate-master", **both)
    assert rotated.returncode == 0, rotated.stderr
    assert "1 data keys re-wrapped" in rotated.stdout
    assert "0 data keys re-wrapped" in invoke_cli(database_url, "keys", "rotate-master", **both).stdout
    assert _emails(database_url, LEDGERFLOW_MASTER_KEY=new_master) == ["ann@example.com"]

    # Without --yes and no answer on stdin, nothing is forgotten.
    refused = invoke_cli(database_url, "subjects", "forget", "c1", LEDGERFLOW_MASTER_KEY=new_master)
    assert refused.returncode != 0
    assert _emails(database_url, LEDGERFLOW_MASTER_KEY=new_master) == ["ann@example.com"]
    forgot = invoke_cli(database_url, "subjects", "forget", "c1", "--yes", "--json", "--reason", "erasure")
    assert forgot.returncode == 0, forgot.stderr
    assert json.loads(forgot.stdout)["already"] is False
    assert _emails(database_url, LEDGERFLOW_MASTER_KEY=new_master) == [REDACTED]
    status = invoke_cli(database_url, "keys", "status", "--json", LEDGERFLOW_MASTER_KEY=new_master)
    assert json.loads(status.stdout)["keys"] == {"forgotten": 1}


def test_reading_sealed_data_without_a_master_key_names_the_setting(database_url: str) -> None:
    _append(
        database_url, invoke_cli(database_url, "keys", "generate").stdout.strip(), "c1", "ann@example.com"
    )
    shown = invoke_cli(database_url, "read", "customer-c1")
    assert shown.returncode == 1
    assert "master_key_missing" in shown.stderr
    assert "LEDGERFLOW_MASTER_KEY" in shown.stderr
