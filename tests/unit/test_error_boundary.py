"""The database boundary: driver (psycopg) errors are translated into LedgerflowErrors below ops, in the
modules that run SQL, so ops neither translates them (`wrap_exceptions`) nor catches or tests a psycopg
error type. What ops still does is listed here, each with why; the list may only shrink: a new site fails,
and so does a listed one that is gone (take it off the list)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (module, function) -> how many sites it holds, and why it is still there. Left out: ops/cli, whose
#: messages for a failed connect read the driver's error under the translated one (ops/cli/errors.py).
KNOWN: dict[tuple[str, str], tuple[int, str]] = {
    ("ops/api/errors.py", "_on_driver_error"): (1, "the API's net for a driver error that leaked"),
    ("ops/api/errors.py", "install"): (1, "registers that net"),
    ("ops/api/probes.py", "DatabaseMonitor._read_readiness"): (1, "on a connection of its own, not a pool's"),
    ("ops/api/probes.py", "DatabaseMonitor._run"): (3, "opens that connection (spi.connect: raw errors)"),
    ("ops/api/token_lookups.py", "TokenLookups._look_up"): (2, "a kept connection of its own, reopened"),
    ("ops/services.py", "open_store_when_available"): (1, "open_store's connect errors, for fail-fast"),
    ("ops/startup.py", "check_database_url"): (1, "libpq's parse of the URL, before any connection"),
    ("ops/startup.py", "is_permanent"): (2, "reads the driver error under a translated one"),
}


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
    """Per enclosing function (Class.method), the wrap_exceptions() calls and the psycopg error types
    named (in an except clause, an isinstance, an exception handler's registration)."""
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
                if name == "wrap_exceptions":
                    found[scope] += 1
            if isinstance(child, ast.Attribute) and _psycopg_error_reference(child):
                found[scope] += 1
                continue  # psycopg.errors.X is one reference, not two
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("psycopg"):
                found[scope] += sum(a.name.endswith("Error") for a in child.names)
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_ops_sees_no_driver_error_beyond_the_known_sites() -> None:
    found: dict[tuple[str, str], int] = {}
    for path in sorted((ROOT / "ops").rglob("*.py")):
        if "cli" in path.relative_to(ROOT / "ops").parts:
            continue
        for scope, count in _sites(path).items():
            if count:
                found[(str(path.relative_to(ROOT)), scope)] = count
    known = {site: count for site, (count, _) in KNOWN.items()}
    new = {site: n for site, n in found.items() if n > known.get(site, 0)}
    assert new == {}, f"driver errors handled in ops (translate them below, where the SQL runs): {new}"
    gone = {site: n for site, n in known.items() if found.get(site, 0) < n}
    assert gone == {}, f"fewer sites than listed: lower KNOWN to {found}"
