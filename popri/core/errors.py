"""One error type for bad input, so every stage fails the same way.

``InputError`` names the file, the line (1-based, for JSONL) and the field.  The CLI
prints it as ``popri: error: FILE:LINE: field 'F': message`` and exits with status 2;
outputs are written atomically, so nothing partial is left behind.
"""

from __future__ import annotations


class PopriError(Exception):
    """Base class for errors reported to the user without a traceback."""

    exit_code = 1


class InputError(PopriError):
    """Bad input: names the file, line and field where known."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.path != "-" else "<stdin>"
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        fld = f"field '{self.field}': " if self.field else ""
        return f"{where}{fld}{self.message}"


class ConfigError(InputError):
    """A bad configuration (``popri run`` YAML / ``--set``, or the global ``--config``): exit 2,
    before any stage runs.  ``path`` is the YAML file (or ``--set KEY=VALUE``), ``field`` the
    dotted key."""


class MissingResourceError(PopriError):
    """Something the command needs is not installed or not reachable (model, apt index...)."""

    exit_code = 3
