"""As root, the embedded PostgreSQL never loosens a private directory: it refuses, with advice, before
anything is changed (pgserver would make every ancestor world-traversable)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eventstore.embedded import default_data_dir, start_embedded
from eventstore.errors import ConfigurationError

pytestmark = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="only as root")


def test_a_data_directory_under_a_private_parent_is_refused_and_left_alone(tmp_path: Path) -> None:
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with pytest.raises(ConfigurationError, match="will not loosen") as refused:
        start_embedded(private / "pgdata")
    assert "LEDGERFLOW_EMBEDDED_DATA_DIR" in str(refused.value)
    assert private.stat().st_mode & 0o777 == 0o700, "the private directory keeps its mode"
    assert not (private / "pgdata").exists()


def test_roots_default_data_directory_has_only_traversable_parents() -> None:
    assert default_data_dir() == Path("/var/lib/ledgerflow/pgdata")
    for parent in default_data_dir().parents:
        if parent.exists():
            assert parent.stat().st_mode & 0o001, parent


def _create_user(name: str) -> None:
    from eventstore.embedded import _ensure_server_user

    _ensure_server_user(name)


def test_first_starts_in_several_processes_at_once_all_get_the_server_user() -> None:
    """pgserver's own useradd runs outside its lock: the loser of two first starts failed (exit 9). The
    user is now created under a lock; a name of the test's own keeps the real one untouched."""
    import multiprocessing
    import pwd
    import subprocess
    import uuid

    name = f"lf{uuid.uuid4().hex[:10]}"
    try:
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            pool.map(_create_user, [name] * 8)
        assert pwd.getpwnam(name).pw_name == name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
