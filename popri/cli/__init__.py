"""The command line: ``app`` (the Typer app and the process edges), ``options`` (shared option
factories built from the specs), ``commands/`` (one thin module per subcommand)."""
