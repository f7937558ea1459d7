"""Layers point one way: eventstore <- projector <- workflows <- ops. Nothing imports upward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_package_imports_a_layer_above_it() -> None:
    """The contract lives in pyproject.toml ([tool.importlinter]); import-linter sees every import,
    those inside functions too."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_foreign_package_in_our_place_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventstore._guard import require_ledgerflow_packages

    (tmp_path / "impostor").mkdir()
    (tmp_path / "impostor" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="not ledgerflow's"):
        require_ledgerflow_packages("impostor")
    require_ledgerflow_packages("eventstore", "projector", "workflows", "ops")
