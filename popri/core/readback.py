"""Lenient values read back from a run directory: a number that may be missing or damaged, an
object that may not be one, the ``roundT`` directories of a stage.

    from popri.core.readback import num, as_dict, round_dirs

What ``popri report`` and a method's read-back of its own files
(:meth:`popri.methods.base.Method.metrics_from_files`) share: a partial, older or damaged run is
read as far as it goes, never with an exception.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any


def num(x: Any) -> float | None:
    """A finite float, else None (missing, null, NaN, a string, a bool)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        x = float(x)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def as_dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def round_dirs(base: Path, prefix: str = "round") -> list[tuple[int, Path]]:
    """[(T, base/roundT)] sorted by T."""
    out = []
    try:
        entries = list(base.iterdir()) if base.is_dir() else []
    except OSError:
        entries = []
    for d in entries:
        m = re.fullmatch(prefix + r"(\d+)", d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d))
    return sorted(out)


__all__ = ["num", "as_dict", "round_dirs"]
