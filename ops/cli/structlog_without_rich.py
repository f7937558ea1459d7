"""structlog without rich, in the CLI's own processes.

When rich is installed, structlog imports rich.traceback, and with it pygments, at its own import, to draw
exceptions in its console renderer: about 0.1 s of CPU on every call that logs, for nothing, since
ledgerflow's logs format exceptions as text before they are rendered (`format_exc_info`). The CLI draws
its tables with rich, importing the parts it draws with. So the CLI's entry point installs a finder that
answers "not installed" when, and only when, one of structlog's modules asks for rich: structlog then
renders exceptions as plain text, as without rich. A program that uses ledgerflow as a library keeps its
structlog as it is.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class RichNotForStructlog(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        # rich or any of its modules: once a table has imported rich itself, only its other modules are
        # still looked for here.
        if fullname.partition(".")[0] == "rich" and _importer().partition(".")[0] == "structlog":
            # An ImportError is what structlog expects of a missing rich (`try: import rich`).
            raise ModuleNotFoundError("rich is not offered to structlog in the CLI", name=fullname)
        return None  # the other finders decide


def _importer() -> str:
    """The name of the module whose import statement is running: the first caller of `find_spec` past the
    import system's own frames."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
        frame = frame.f_back  # type: ignore[assignment]
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


def install() -> None:
    """Before anything imports structlog; once."""
    if "structlog" in sys.modules or any(isinstance(f, RichNotForStructlog) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, RichNotForStructlog())
