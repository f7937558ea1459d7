"""Resolving `package.module:attribute` import paths from configuration (user projections, workflows,
event types)."""

from __future__ import annotations

import importlib

from eventstore.errors import ConfigurationError


def import_object(path: str, what: str) -> object:
    """The object named by `path`; a ConfigurationError saying what was being loaded if it cannot be."""
    module_name, _, attribute = path.strip().partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{path!r} is not an import path; write it as 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {what} from {path!r}: {exc}") from exc


def import_modules(names: str, what: str) -> None:
    """Import each module of a comma-separated list, for what importing it declares."""
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot load {what} from module {name!r}: {exc}") from exc
