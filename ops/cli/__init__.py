"""The `ledgerflow` command line: the click group and `main` in `ops.cli.commands`, one module per
command group beside it (`workflows`, `bulk`, `projections`, ...), and what they share in `common` and
`errors`. Nothing is imported here, so that a module of the package (`ops.cli.errors`, used by the
services too) loads without the whole command line."""
