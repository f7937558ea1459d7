"""Facades whose names import their module on first use (PEP 562), so that importing a package costs
only what its user touches: `ledgerflow --help` needs none of the driver, pydantic or cryptography that
the store's modules bring.

A facade keeps its names for mypy in an `if TYPE_CHECKING:` block of ordinary imports and gives the same
names, with their modules, to `lazy_exports` in the `else:` branch; tests/unit/test_lazy_exports.py checks
that the two agree and that every name in `__all__` resolves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of module `package`, which offers the names `exports` lists under
    each module (a name `alias=name` offers the module's `name` as `alias`)."""
    where: dict[str, tuple[str, str]] = {}
    for module, names in exports.items():
        for entry in names:
            alias, _, name = entry.partition("=")
            where[alias] = (module, name or alias)
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        try:
            module, attribute = where[name]
        except KeyError:
            # Also how `from package import submodule` learns to import the submodule.
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value  # from now on an ordinary global: later uses do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
