"""One thin Typer module per ``popri`` subcommand (installed as ``popri.cli.commands``).

Each module exposes ``register(app)``; the maths lives in ``popri``.
"""
