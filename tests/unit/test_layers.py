"""Layers point one way: eventstore <- projector <- workflows <- ops. Nothing imports upward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["eventstore", "projector", "workflows", "ops"]


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_no_package_imports_a_layer_above_it(package: str) -> None:
    above = set(LAYERS[LAYERS.index(package) + 1 :])
    for path in sorted((ROOT / package).rglob("*.py")):
        upward = imported_packages(path) & above
        assert not upward, f"{path.relative_to(ROOT)} imports {sorted(upward)}, a layer above {package}"


def test_a_foreign_package_in_our_place_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventstore._guard import require_ledgerflow_packages

    (tmp_path / "impostor").mkdir()
    (tmp_path / "impostor" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="not ledgerflow's"):
        require_ledgerflow_packages("impostor")
    require_ledgerflow_packages("eventstore", "projector", "workflows", "ops")
