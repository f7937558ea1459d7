"""The database boundary: driver (psycopg) errors are translated into LedgerflowErrors below ops, in the
modules that run SQL, so ops neither translates them (`wrap_exceptions`, `translate`) nor catches or tests
a psycopg error type. An import contract ([tool.importlinter] in pyproject.toml) keeps the driver's modules
out of ops; this test keeps out what that contract cannot see: translating through `eventstore.spi`."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What translates driver errors, named in a call.
TRANSLATORS = {"wrap_exceptions", "translate"}


def _psycopg_error_reference(node: ast.AST) -> bool:
    """`psycopg.Error`, `psycopg.errors.X`, `psycopg.OperationalError`, ...: a psycopg error type."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not (isinstance(node, ast.Name) and node.id == "psycopg" and parts):
        return False
    return any(p == "errors" or p.endswith(("Error", "Warning", "Timeout")) for p in parts)


def _sites(path: Path) -> Counter[str]:
    """Per enclosing function (Class.method), the calls of a translator and the psycopg error types named
    (in an except clause, an isinstance, an exception handler's registration)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: Counter[str] = Counter()

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name if scope == "<module>" else f"{scope}.{child.name}"
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in TRANSLATORS:
                    found[scope] += 1
            if isinstance(child, ast.Attribute) and _psycopg_error_reference(child):
                found[scope] += 1
                continue  # psycopg.errors.X is one reference, not two
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("psycopg"):
                found[scope] += sum(a.name.endswith("Error") for a in child.names)
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    try:\n        pass\n    except psycopg.errors.UndefinedTable:\n        pass\n"
        "class C:\n    def g(self):\n        with spi.wrap_exceptions():\n            raise translate(e)\n"
    )
    assert _sites(module) == {"f": 1, "C.g": 2}


def test_ops_sees_no_driver_error() -> None:
    found: dict[tuple[str, str], int] = {}
    for path in sorted((ROOT / "ops").rglob("*.py")):
        for scope, count in _sites(path).items():
            if count:
                found[(str(path.relative_to(ROOT)), scope)] = count
    assert found == {}, f"driver errors handled in ops (translate them below, where the SQL runs): {found}"
