"""`python -m ops.cli`: the `ledgerflow` command."""

from ops.cli.commands import main

main()
