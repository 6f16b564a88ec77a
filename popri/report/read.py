"""Reading a run directory for ``popri report``, leniently: a partial, older or damaged run is
read as far as it goes and what could not be read becomes a note, never an exception.

    from popri.report.read import clean_results, run_ledger

Files are read through :mod:`popri.core.io` (its lenient readers,
:func:`~popri.core.io.read_json_lenient` and :func:`~popri.core.io.read_jsonl_lenient`, and the
ledger's own reader); what is here is what a report makes of them.

Only files ``popri run`` writes (docs/formats.md) are read; nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from popri.core.errors import InputError
from popri.core.readback import as_dict, num, round_dirs
from popri.privacy.ledger import LedgerEntry
from popri.privacy.ledger import read_ledger
from popri.privacy.ledger import LEDGER_NAME
from popri.privacy.ledger import dedupe


#: results.json fields that are JSON objects, and those that are lists (docs/formats.md)
_OBJECTS = ("methods", "control", "gap_closed", "budget", "probe", "run", "checkpoint_selection",
            "fl", "ledger_check", "stage_seconds")
_LISTS = ("recovery_rate_per_round", "research_reads")
_TEXTS = ("method", "mode", "mode_note", "run_dir", "generator", "downstream", "accountant",
          "neighbouring", "guarantee", "released", "recovery_rate_note")


def clean_results(r: dict, notes: list[str]) -> dict:
    """``results.json`` with every field of the wrong type dropped (a note each): what the
    report reads of it can then be read without checking types again."""
    out = dict(r)
    for k in _OBJECTS:
        if k in out and out[k] is not None and not isinstance(out[k], dict):
            notes.append(f"results.json: '{k}' is not an object ({type(out[k]).__name__}): "
                         "ignored")
            del out[k]
    for k in _LISTS:
        if k in out and out[k] is not None and not isinstance(out[k], list):
            notes.append(f"results.json: '{k}' is not a list: ignored")
            del out[k]
    for k in _TEXTS:
        if k in out and out[k] is not None and not isinstance(out[k], str):
            notes.append(f"results.json: '{k}' is not a string: ignored")
            del out[k]
    if isinstance(out.get("methods"), dict):
        bad = [k for k, v in out["methods"].items() if not isinstance(v, dict)]
        if bad:
            notes.append(f"results.json: methods {', '.join(map(repr, bad[:5]))} are not "
                         "objects: ignored")
        out["methods"] = {str(k): v for k, v in out["methods"].items() if isinstance(v, dict)}
    else:
        out["methods"] = {}
    c = out.get("control")
    if isinstance(c, dict) and "draws" in c and not isinstance(c["draws"], (dict, type(None))):
        notes.append("results.json: 'control.draws' is not an object: ignored")
        out["control"] = {k: v for k, v in c.items() if k != "draws"}
    if "dp_guarantee" in out and not isinstance(out["dp_guarantee"], (bool, type(None))):
        notes.append("results.json: 'dp_guarantee' is not true / false: ignored")
        del out["dp_guarantee"]
    return out


# --------------------------------------------------------------------------- ledgers
def read_ledger_lenient(f: Path, notes: list[str]) -> list:
    """The entries of one ledger.jsonl with :func:`popri.privacy.ledger.read_ledger` (the reader
    ``popri account ledger`` uses); when it refuses the file (a malformed line), every line it
    would accept is still counted and the rest named in a note -- never a whole file dropped
    for one bad line."""
    try:
        return read_ledger(f)
    except InputError as e:
        first = e.format()
    except OSError as e:
        notes.append(f"{f}: unreadable ({e.strerror or e}); its releases are not counted")
        return []
    try:
        data = f.read_bytes()
    except OSError as e:
        notes.append(f"{f}: unreadable ({e.strerror or e}); its releases are not counted")
        return []
    whole = data.rfind(b"\n") + 1
    out, bad = [], []
    for lineno, raw in enumerate(data[:whole].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            out.append(LedgerEntry.from_dict(json.loads(raw.decode("utf-8")), path=str(f),
                                             line=lineno))
        except (UnicodeDecodeError, ValueError, RecursionError, InputError, TypeError):
            bad.append(lineno)
    notes.append(f"{f}: {len(bad)} malformed line(s) ({', '.join(map(str, bad[:5]))}) not "
                 f"counted, its {len(out)} valid entr{'y' if len(out) == 1 else 'ies'} counted; "
                 f"'popri account ledger' refuses this ledger ({first}): the epsilon drawn is "
                 "at least what was spent only if those lines were not releases")
    return out


def run_ledger(path: Path, notes: list[str]) -> list:
    """Every ledger entry under a run directory (staging directories of killed stages skipped),
    deduplicated by release id as ``popri account ledger`` does."""
    out = []
    try:
        files = sorted(path.rglob(LEDGER_NAME))
    except OSError as e:
        notes.append(f"{path}: cannot list the ledgers ({e.strerror or e})")
        files = []
    for f in files:
        rel = f.relative_to(path).parts[:-1]
        if any(part.startswith(".") for part in rel):
            continue
        out.extend(read_ledger_lenient(f, notes))
    return dedupe(out)


__all__ = ["num", "as_dict", "round_dirs", "clean_results",
           "read_ledger_lenient", "run_ledger"]
