"""The `ledgerflow` command line: the click group and `main` in `ops.cli.commands`, one module per
command group beside it (`workflows`, `bulk`, `projections`, ...), and what they share in `common` and
`errors`. Nothing is imported here, so that a module of the package (`ops.cli.errors`, used by the
services too) loads without the whole command line.

A call loads only what it uses: the groups list the other modules' commands from a table
(`ops.cli.lazy`) and import a command's module when it runs or shows its help, and the command modules
import the product packages, rich and the driver inside their functions. A command of a new module
goes in its group's table (`ops.cli.command_table`); tests/unit/test_cli_lazy.py and
tests/acceptance/test_cli_start_up.py hold the tables and the imports to this."""
