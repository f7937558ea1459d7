"""The CLI's two rich consoles: data on stdout, errors, progress and logs on stderr. Imported when a command
first prints (through `ops.cli.common`), so that `--help` and the commands that print no table do not load
rich."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

#: The width of output that goes to a pipe or a file: wide enough that no table cuts a cell (`workflo…`)
#: or folds a row; a program reading it gets whole values. COLUMNS, when set, still decides.
PIPED_WIDTH = 100_000


class _Console(Console):
    """rich's console, but output that is not a terminal's is not cut to 80 columns."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        # COLUMNS as it is now, not as it was when this console was made (rich reads it once).
        columns = self._environ.get("COLUMNS", "")
        if columns.isdigit():
            return ConsoleDimensions(int(columns), size.height)
        if self.is_terminal:
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = _Console()
#: Errors, progress and logs go to stderr, so that stdout carries only data.
err_console = Console(stderr=True)
