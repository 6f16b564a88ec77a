"""One thin Typer module per ``popri`` subcommand (installed as ``popri_cli.commands``).

Each module exposes ``register(app)``; the maths lives in ``popri_cli``.
"""
