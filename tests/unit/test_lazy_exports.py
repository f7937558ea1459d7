"""eventstore's facades (`eventstore`, `eventstore.spi`) import a module when one of its names is first
used (eventstore._lazy): importing them costs nothing, and every name is the object an eager import gives."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import eventstore
import eventstore.spi

FACADES = {"eventstore": eventstore, "eventstore.spi": eventstore.spi}


def type_checking_imports(facade: ModuleType) -> dict[str, tuple[str, str]]:
    """What the facade's `if TYPE_CHECKING:` block imports, as mypy sees it: name -> (module, attribute)."""
    assert facade.__file__ is not None
    tree = ast.parse(Path(facade.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    found: dict[str, tuple[str, str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module is not None
        for alias in node.names:
            found[alias.asname or alias.name] = (node.module, alias.name)
    return found


@pytest.mark.parametrize("facade", FACADES.values(), ids=FACADES.keys())
def test_each_name_is_what_mypy_sees(facade: ModuleType) -> None:
    imports = type_checking_imports(facade)
    assert set(imports) == set(facade.__all__)
    for name, (module, attribute) in imports.items():
        assert getattr(facade, name) is getattr(importlib.import_module(module), attribute), name
    assert set(facade.__all__) <= set(dir(facade))


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = eventstore.no_such_name  # type: ignore[attr-defined]
    from eventstore import jsonvalue  # a submodule, not an exported name

    assert jsonvalue.__name__ == "eventstore.jsonvalue"


@pytest.mark.parametrize("facade", FACADES)
def test_importing_a_facade_loads_none_of_the_store(facade: str) -> None:
    code = (
        f"import sys, {facade}; print(' '.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('eventstore', 'psycopg', 'pydantic', 'structlog', 'cryptography'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert set(loaded) <= {"eventstore", "eventstore._lazy", "eventstore.spi"}, loaded
