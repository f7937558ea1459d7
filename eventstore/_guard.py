"""Detects a foreign package installed under one of ledgerflow's top-level import names.

`eventstore`, `projector`, `workflows` and `ops` are generic names that other distributions also use;
installing one of them beside ledgerflow overwrites files. Each ledgerflow package carries a marker,
and the packages check each other's at import, so the clash fails loudly instead of oddly.
"""

from __future__ import annotations

import importlib

MARKER = "__ledgerflow_package__"


def require_ledgerflow_packages(*names: str) -> None:
    for name in names:
        module = importlib.import_module(name)
        if not getattr(module, MARKER, False):
            where = getattr(module, "__file__", None) or "an unknown location"
            raise ImportError(
                f"the package {name!r} at {where} is not ledgerflow's: another distribution installed a "
                f"package of the same name. Install ledgerflow in its own virtual environment "
                f"(python -m venv .venv) or uninstall the other distribution."
            )
