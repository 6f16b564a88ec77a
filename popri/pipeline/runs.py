"""Finished runs as data: list them, show one, diff two (``popri runs``), load one in Python.

    popri runs list runs/                    # one line per run directory below runs/
    popri runs show runs/demo                # its results table, identity and per-round table
    popri runs diff runs/e1 runs/e7          # the settings that differ, the headline metrics
    >>> run = popri.load_run("runs/demo"); run.results["epsilon"]; run.metrics   # a DataFrame

A run directory is what ``popri run`` writes (docs/formats.md): ``config.resolved.json`` (the
settings), ``results.json`` (the metrics and the run's identity: popri version, git commit,
command line, config hash, start and end) and ``metrics.jsonl`` (per round).

Nothing here trusts a file's shape: a metrics.jsonl line that is not a JSON object with an
integer ``round`` is skipped with a note (``LoadedRun.notes``), a results.json field of the
wrong type reads as missing, and :func:`jsonable` writes +/-Infinity as the strings "inf" /
"-inf" (an epsilon of inf is a run with no DP guarantee: it must not read as "unknown") and NaN
as null (JSON has neither).
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from popri.core.errors import InputError, PopriError
from popri.privacy.ledger import total as ledger_total


@dataclass
class LoadedRun:
    """One run directory: ``config`` (config.resolved.json), ``results`` (results.json, {} when
    the run has not finished), ``metrics`` (metrics.jsonl: a pandas DataFrame where pandas is
    installed, else a list of dicts), ``rows`` (metrics.jsonl's valid rows as read: a list of
    dicts) and ``notes`` (what was skipped on the way, one sentence each)."""

    path: Path
    config: dict
    results: dict
    metrics: Any = field(repr=False, default=None)
    rows: list = field(repr=False, default_factory=list)
    notes: list = field(repr=False, default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.results)

    @property
    def guarantee(self) -> dict:
        """``{"dp_guarantee": bool, "links": [...]}``: whether the run's epsilon is a DP
        guarantee for what it releases, and every reason it is not (:func:`guarantee`)."""
        return guarantee(self)


def _read_object(p: Path, run: Path) -> dict:
    """``p`` (a JSON file of the run ``run``) as a dict; an InputError when it cannot be read,
    is not JSON or holds something other than an object."""
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", path=str(p)) from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"not JSON: {e}", path=str(p)) from None
    if not isinstance(obj, dict):
        raise InputError(f"{p.name} is not an object (it holds a JSON "
                         f"{_json_type(obj)})", path=str(run))
    return obj


def _json_type(x: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(x), type(x).__name__)


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / "config.resolved.json").is_file() or (p / "results.json").is_file()


#: at most this many skipped lines are named one by one in a note
_NAMED = 5


def read_metrics(p: Path, notes: list[str] | None = None) -> list[dict]:
    """The rows of a metrics.jsonl: every line that is a JSON object with an integer ``round``
    >= 0 (an integral float such as 1.0 is read as 1); every other line (torn, not an object,
    no or a bad round) is skipped and counted in one note appended to ``notes``."""
    rows: list[dict] = []
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        if notes is not None:
            notes.append(f"{p}: cannot read ({getattr(e, 'strerror', None) or e}); no "
                         f"per-round metrics")
        return rows
    bad: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            bad.append(f"line {n}: not JSON (a torn line?)")
            continue
        if not isinstance(r, dict):
            bad.append(f"line {n}: a JSON {_json_type(r)}, not an object")
            continue
        t = r.get("round")
        if isinstance(t, float) and math.isfinite(t) and t.is_integer() and abs(t) < 2 ** 53:
            t = int(t)
            r["round"] = t
        if "round" not in r:
            bad.append(f"line {n}: no field 'round'")
            continue
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            bad.append(f"line {n}: field 'round' is {json.dumps(t, default=str)[:40]}, not an "
                       f"integer >= 0")
            continue
        rows.append(r)
    if bad and notes is not None:
        named = "; ".join(bad[:_NAMED]) + (f"; and {len(bad) - _NAMED} more"
                                           if len(bad) > _NAMED else "")
        notes.append(f"{p}: {len(bad)} line(s) skipped, {len(rows)} kept ({named})")
    return rows


def load_run(path: str | Path) -> LoadedRun:
    """The run in ``path`` (config, results, metrics); an InputError for a directory that is
    not a popri run, or whose config.resolved.json / results.json is unreadable, not JSON or
    not a JSON object.  metrics.jsonl's bad lines are skipped, each counted in ``.notes``."""
    p = Path(path)
    if not p.is_dir():
        raise InputError("no such directory" if not p.exists() else "not a directory",
                         path=str(p))
    if not is_run_dir(p):
        raise InputError("not a popri run directory (no config.resolved.json or results.json)",
                         path=str(p))
    cfg = (_read_object(p / "config.resolved.json", p)
           if (p / "config.resolved.json").is_file() else {})
    res = _read_object(p / "results.json", p) if (p / "results.json").is_file() else {}
    notes: list[str] = []
    rows = read_metrics(p / "metrics.jsonl", notes) if (p / "metrics.jsonl").is_file() else []
    metrics: Any = rows
    try:
        import pandas as pd

        metrics = pd.DataFrame(rows)
    except ImportError:
        pass
    return LoadedRun(p, cfg, res, metrics, rows, notes)


def find_runs(dirs: Iterable[str | Path]) -> list[Path]:
    """Run directories among ``dirs`` and below them (sorted); an InputError for a DIR that
    does not exist or is not a directory."""
    out = set()
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise InputError("no such directory", path=str(d))
        if not d.is_dir():
            raise InputError("not a directory", path=str(d))
        if is_run_dir(d):
            out.add(d)
        for f in d.rglob("config.resolved.json"):
            out.add(f.parent)
        for f in d.rglob("results.json"):
            if (f.parent / ".stages").is_dir():
                out.add(f.parent)
    return sorted(out)


# --------------------------------------------------------------------------- reading fields
def obj(x: Any) -> dict:
    """``x`` when it is a dict, else {} (a field of the wrong type reads as missing)."""
    return x if isinstance(x, dict) else {}


def number(x: Any) -> bool:
    """A JSON number (bools are not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def finite(x: Any) -> bool:
    """A JSON number that is a finite float (an int too large for a float is not)."""
    if not number(x):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _method_row(res: dict) -> dict:
    name = res.get("method")
    m = obj(obj(res.get("methods")).get(name)) if isinstance(name, str) else {}
    g, c = obj(res.get("gap_closed")), obj(res.get("control"))
    return {"accuracy": m.get("accuracy"), "accuracy_se": m.get("accuracy_se"),
            "gap_closed": g.get("gap_closed"), "gap_closed_se": g.get("gap_closed_se"),
            "minus_t0": c.get("acc_minus_control"), "minus_t0_se": c.get("acc_minus_control_se")}


SUMMARY_KEYS = ("run_dir", "method", "finished", "epsilon", "neighbouring", "dp_guarantee",
                "not_dp",
                "budget", "mode", "rounds", "accuracy", "accuracy_se", "gap_closed",
                "gap_closed_se", "minus_t0", "minus_t0_se", "seed", "popri_version",
                "git_commit", "started", "ended", "config_hash")


def spent_so_far(run: LoadedRun) -> dict | None:
    """What an unfinished run has spent (hostile case F02, issue 66: a run killed after its
    first release showed "epsilon unknown" while its ledgers held the release): every
    ledger.jsonl under the run composed as ``popri account ledger RUN`` does, with the run's
    accountant and convention; None when no release is recorded (or the ledgers cannot be
    totalled)."""
    if not run.path.is_dir() or not any(run.path.rglob("ledger.jsonl")):
        return None
    pr = obj(run.config.get("privacy"))
    try:
        c = ledger_total([run.path], accountant=pr.get("accountant") or "rdp",
                         convention=pr.get("convention")).composition
    except (PopriError, ValueError) as e:
        run.notes.append(f"{run.path}: the epsilon spent so far could not be totalled ({e})")
        return None
    return {"epsilon": c.epsilon, "delta": c.delta, "guarantee": c.label,
            "entries": c.entries}


def guarantee(run: LoadedRun) -> dict:
    """Whether the run's epsilon is a DP guarantee for what it releases (issue 66):
    ``{"dp_guarantee": bool, "links": [...]}``: False under a convention that is not one
    (``privacy.convention: papers``) or when the release's provenance holds a not-dp link
    (results.json's ``release_provenance``; a run of an older popri: its convention only)."""
    r, pr = run.results, obj(run.config.get("privacy"))
    rp = obj(r.get("release_provenance"))
    links = [str(x) for x in rp.get("links") or ()]
    conv = pr.get("convention") or obj(r.get("budget")).get("convention")
    if (conv or r.get("dp_guarantee") is False) and not any("convention" in x for x in links):
        links.append(f"epsilon accounted under the {conv or 'papers'!r} convention, not a "
                     "proven relation")
    return {"dp_guarantee": not links, "links": links}


def guarantee_words(g: dict) -> str:
    """``""`` for a DP guarantee, else ``NOT A DP GUARANTEE (link; link)``."""
    return "" if g["dp_guarantee"] else f"NOT A DP GUARANTEE ({'; '.join(g['links'])})"


def summary(run: LoadedRun) -> dict:
    """One line of ``popri runs list``: where, what, how private, how good, when; an
    unfinished run's epsilon is what its ledgers hold so far (:func:`spent_so_far`)."""
    r, c = run.results, run.config
    ident = obj(r.get("run"))
    budget = r.get("budget")
    spent = None if run.finished else spent_so_far(run)
    g = guarantee(run)
    return {"run_dir": str(run.path), "method": r.get("method") or c.get("method"),
            "finished": run.finished,
            "epsilon": r.get("epsilon") if spent is None else spent["epsilon"],
            "neighbouring": r.get("neighbouring") if spent is None else spent["guarantee"],
            "dp_guarantee": g["dp_guarantee"] if r or run.config else None,
            "not_dp": g["links"],
            "budget": ((budget.get("epsilon") if isinstance(budget, dict) else budget)
                       if r else obj(c.get("privacy")).get("epsilon")),
            "mode": r.get("mode"), "rounds": r.get("rounds") or c.get("rounds"),
            **_method_row(r), "seed": r.get("seed", c.get("seed")),
            "popri_version": ident.get("popri_version"), "git_commit": ident.get("git_commit"),
            "started": ident.get("started"), "ended": ident.get("ended"),
            "config_hash": ident.get("config_hash")}


def error_summary(path: str | Path, message: str) -> dict:
    """A ``popri runs list`` line for a run that could not be read: every field null but
    ``run_dir`` and ``error``."""
    return {**{k: None for k in SUMMARY_KEYS}, "run_dir": str(path), "finished": None,
            "error": message}


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists of scalars kept whole, lists of objects by
    index (``a[0].b``)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, list) and any(isinstance(x, (dict, list)) for x in d):
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


#: how ``--json`` writes +/-Infinity (JSON has no infinity; null is kept for NaN, "no value")
INF, NEG_INF = "inf", "-inf"


def jsonable(x: Any) -> Any:
    """``x`` with every +/-Infinity written as the string :data:`INF` / :data:`NEG_INF` and
    every NaN as None (JSON has neither: an infinite epsilon is a run without a DP guarantee,
    which null would hide), numpy scalars as Python numbers and tuples as lists, so
    ``json.dumps(..., allow_nan=False)`` accepts it."""
    if isinstance(x, float):
        if math.isnan(x):
            return None
        return x if math.isfinite(x) else INF if x > 0 else NEG_INF
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    item = getattr(x, "item", None)  # a numpy scalar
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(x)


# --------------------------------------------------------------------------- diff
#: results.json fields that are not metrics (identity, timings, notes, settings echoed)
_NOT_METRICS = ("run.", "stage_seconds.", "run_dir", "budget.", "mode_note", "note",
                "curve[", "scaling[")  # the curve: compared as its points (curve_points)


def curve_points(results: dict) -> dict[str, Any]:
    """The learning curve of a results.json (``scaling``, issue 65) as flat metric keys that
    ``popri runs diff`` compares point by point: ``curve.ARM.nN.accuracy`` (the mean over
    draws) and ``curve.ARM.nN.minus_control`` (the method minus its T = 0 control, paired),
    each with its ``_se``."""
    out: dict[str, Any] = {}
    for r in results.get("scaling") or []:
        if not isinstance(r, dict) or r.get("what") not in ("accuracy", "minus_control"):
            continue
        k = f"curve.{r.get('arm')}.n{r.get('n')}.{r['what']}"
        out[k], out[k + "_se"] = r.get("mean"), r.get("se")
    return out

#: relative difference below which two epsilons are the same (the accountants' precision:
#: the RDP order grid and the calibration's bisection leave ~1e-5 between equal budgets)
EPS_RTOL = 1e-4


def _is_epsilon(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == "epsilon"


def _same(x: Any, y: Any) -> bool:
    """Exact equality where NaN equals NaN (a missing FID is the same on both sides)."""
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y))
    return type(x) is type(y) and x == y or (number(x) and number(y) and x == y)


def _change(x: Any, y: Any) -> float | None:
    if number(x) and number(y):
        try:
            d = y - x
        except OverflowError:
            return None
        return d if not (isinstance(d, float) and math.isnan(d)) else None
    return None


def se_key(key: str, flat: dict) -> str | None:
    """The key of ``key``'s standard error in a flattened results.json: ``K_se``, or for a
    confidence interval ``K_ci`` the ``K_se`` beside it."""
    for k in (key + "_se", key[:-3] + "_se" if key.endswith("_ci") else None):
        if k and k in flat:
            return k
    return None


def _se(key: str, fa: dict, fb: dict) -> float | None:
    """The smaller positive finite SE of ``key`` in the two runs (None: no SE)."""
    ses = []
    for f in (fa, fb):
        k = se_key(key, f)
        v = f.get(k) if k else None
        if v is not None and finite(v) and v > 0:
            ses.append(float(v))
    return min(ses) if ses else None


def decimals(se: float | None) -> int | None:
    """The decimals that show two significant digits of ``se`` (None: no SE)."""
    if se is None or not (se > 0 and math.isfinite(se)):
        return None
    return min(1 - math.floor(math.log10(se)), 15)


def rounded(x: Any, nd: int | None) -> Any:
    """``x`` rounded to ``nd`` decimals (numbers, and lists of them); as is otherwise."""
    if nd is None:
        return x
    if isinstance(x, list):
        return [rounded(v, nd) for v in x]
    if finite(x):
        return round(float(x), nd)
    return x


def differs(key: str, x: Any, y: Any, nd: int | None = None) -> bool:
    """Whether a metric differs between two runs: at the precision its SE supports (``nd``
    decimals), an epsilon by more than EPS_RTOL relative, otherwise exactly (NaN = NaN)."""
    if _same(x, y):
        return False
    if finite(x) and finite(y):
        if _is_epsilon(key) and abs(y - x) <= EPS_RTOL * max(abs(x), abs(y)):
            return False
        if nd is not None:
            return round(float(x), nd) != round(float(y), nd)
    if nd is not None and isinstance(x, list) and isinstance(y, list):
        return not _same(rounded(x, nd), rounded(y, nd))
    return True


def headline_keys(a: LoadedRun, b: LoadedRun) -> list[tuple[str, str]]:
    """(key, label) of the metrics ``popri runs diff`` shows by default: the method's accuracy,
    epsilon and its relation, the learning line (the method minus its T = 0 row), gap closed,
    FID, and the numeric path the models ran on (``precision``: 'cpu fp32', 'cpu bf16', ...;
    two runs on different paths need not agree in their last digits, issue 43)."""
    out: list[tuple[str, str]] = []
    names = []
    for r in (a.results, b.results):
        m = r.get("method")
        if isinstance(m, str) and m not in names:
            names.append(m)
    for m in names:
        out += [(f"methods.{m}.accuracy", f"{m} accuracy"),
                (f"methods_instruct.{m}.accuracy", f"{m} accuracy (instructions)"),
                (f"methods_instruct.{m}.rouge_l", f"{m} Rouge-L")]
    out += [("epsilon", "epsilon spent"), ("dp_guarantee", "a DP guarantee"),
            ("neighbouring", "relation"),
            ("control.acc_minus_control", "minus its T = 0 row"),
            ("control.draws.mean", "minus its T = 0 row, mean over draws"),
            ("gap_closed.gap_closed", "gap closed"), ("fid_to_val", "FID to val"),
            ("precision", "numeric path")]
    sizes = sorted({int(r["n"]) for res in (a.results, b.results)
                    for r in res.get("scaling") or []
                    if isinstance(r, dict) and isinstance(r.get("n"), int)})
    for m in names:  # the learning curve, point by point (issue 65)
        for n in sizes:
            out += [(f"curve.{m}.n{n}.accuracy", f"{m} accuracy at N = {n}"),
                    (f"curve.{m}.n{n}.minus_control", f"{m} minus T = 0 at N = {n}")]
    return out


def _keep(key: str, patterns: Iterable[str]) -> bool:
    pats = list(patterns)
    if not pats:
        return True
    for p in pats:
        if any(ch in p for ch in "*?[") and fnmatch.fnmatchcase(key, p) or p in key:
            return True
    return False


def diff(a: LoadedRun, b: LoadedRun, *, everything: bool = False,
         keys: Iterable[str] = ()) -> dict:
    """Settings and metrics of two runs side by side (``dvc params diff`` / ``dvc metrics
    diff``): {"params": [(key, a, b)], "metrics": [(key, a, b, change)], "headline": [...]}.

    ``params`` hold every setting whose values differ (NaN = NaN), ``metrics`` every metric
    that :func:`differs` (at its precision: the one rule of the list, the count and the change
    column), or every key with ``everything``; ``keys`` (globs or substrings) keeps the
    matching keys only, and ``keys_unmatched`` lists the patterns that match no setting or
    metric key of either run (``popri runs diff`` names them on stderr).
    ``headline`` is the compact view: one dict per headline metric present in either run
    (``key``, ``label``, ``a``, ``b``, ``change``, ``se``, ``decimals``, ``differs``: at the
    precision its SE supports, an epsilon by more than 1e-4 relative).  Counts:
    ``params_total``, ``params_differ``, ``metrics_total``, ``metrics_differ`` (at the same
    precision rule)."""
    keys = list(keys)
    pa, pb = flatten(a.config), flatten(b.config)
    pkeys = [k for k in sorted(set(pa) | set(pb)) if k != "run_dir"]
    params = [(k, pa.get(k), pb.get(k)) for k in pkeys
              if (everything or not _same(pa.get(k), pb.get(k))) and _keep(k, keys)]
    ma = {k: v for k, v in flatten(a.results).items() if not k.startswith(_NOT_METRICS)}
    mb = {k: v for k, v in flatten(b.results).items() if not k.startswith(_NOT_METRICS)}
    ma.update(curve_points(a.results))
    mb.update(curve_points(b.results))
    for m, run in ((ma, a), (mb, b)):  # what the epsilon is (issue 66): never a bare number
        m["dp_guarantee"] = guarantee_words(guarantee(run)) or "yes"
    mkeys = sorted(set(ma) | set(mb))
    metrics, differ = [], 0
    for k in mkeys:
        x, y = ma.get(k), mb.get(k)
        dif = differs(k, x, y, decimals(_se(k, ma, mb)))
        differ += dif
        if (everything or dif) and _keep(k, keys):
            metrics.append((k, x, y, _change(x, y)))
    head = []
    for k, label in headline_keys(a, b):
        if k not in ma and k not in mb:
            continue
        x, y = ma.get(k), mb.get(k)
        se = _se(k, ma, mb)
        nd = decimals(se)
        head.append({"key": k, "label": label, "a": x, "b": y, "change": _change(x, y),
                     "se": se, "decimals": nd, "differs": differs(k, x, y, nd)})
    return {"a": str(a.path), "b": str(b.path), "params": params, "metrics": metrics,
            "headline": head, "params_total": len(pkeys),
            "params_differ": sum(not _same(pa.get(k), pb.get(k)) for k in pkeys),
            "metrics_total": len(mkeys), "metrics_differ": differ,
            "keys_unmatched": [p for p in keys
                               if not any(_keep(k, [p]) for k in (*pkeys, *mkeys))]}


def diff_rows(d: dict, a: LoadedRun, b: LoadedRun, *, everything: bool = False,
              keys: Iterable[str] = ()) -> list[tuple[str, Any, Any, Any, int | None, bool]]:
    """The metric rows ``popri runs diff`` prints: (key, a, b, change, decimals, differs).
    By default the headline metrics; with ``keys`` every matching key that differs (with
    ``everything``: every matching key); with ``everything`` alone every key."""
    keys = list(keys)
    if not everything and not keys:
        return [(h["key"], h["a"], h["b"], h["change"], h["decimals"], h["differs"])
                for h in d["headline"]]
    ma, mb = flatten(a.results), flatten(b.results)
    ma.update(curve_points(a.results))
    mb.update(curve_points(b.results))
    out = []
    for k, x, y, ch in d["metrics"]:
        nd = decimals(_se(k, ma, mb))
        out.append((k, x, y, ch, nd, differs(k, x, y, nd)))
    return out


# --------------------------------------------------------------------------- per-round table
#: per-round fields ``popri runs show`` tabulates, in this order, where metrics.jsonl has them
#: (docs/formats.md: score, prefs, dpo / sft and probe rows)
ROUND_FIELDS = ("released_mean", "recovery_rate", "train_loss", "holdout_accuracy", "mean_cosine",
                "mmd2", "distinct_2")

#: rounds shown at each end of a longer table
EDGE = 5


def round_table(rows: list[dict]) -> tuple[list[str], list[tuple]]:
    """(header, one row per round) of metrics.jsonl's rows: the round, then each of
    ROUND_FIELDS present (else the first six numeric fields found), the value of the round's
    last row that has it."""
    cols = [k for k in ROUND_FIELDS if any(number(r.get(k)) for r in rows)]
    if not cols:
        seen: list[str] = []
        for r in rows:
            for k, v in r.items():
                if k not in ("round", "samples", "pairs", "steps") and number(v) \
                        and k not in seen:
                    seen.append(k)
        cols = seen[:6]
    per: dict[int, dict] = {}
    for r in rows:
        d = per.setdefault(r["round"], {})
        for k in cols:
            if k in r and r[k] is not None:
                d[k] = r[k]
    return ["round", *cols], [(t, *(per[t].get(k) for k in cols)) for t in sorted(per)]


def compact_rows(table: list[tuple], edge: int = EDGE) -> list[tuple | None]:
    """``table`` with its middle replaced by None (an ellipsis) when it is longer than
    2 * edge + 1 rows."""
    if len(table) <= 2 * edge + 1:
        return list(table)
    return [*table[:edge], None, *table[-edge:]]


def round_ranges(rounds: Iterable[int], most: int = 8) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``; at most ``most`` ranges (then ``...``)."""
    rs = sorted(set(rounds))
    spans: list[tuple[int, int]] = []
    for t in rs:
        if spans and t == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], t)
        else:
            spans.append((t, t))
    txt = [str(s) if s == e else f"{s}-{e}" for s, e in spans]
    if len(txt) > most:
        txt = txt[:most // 2] + ["..."] + txt[-(most // 2):]
    return ", ".join(txt)


def stage_seconds(res: dict) -> tuple[float, int, int]:
    """(total seconds, stages counted, entries ignored: not a number) of results.json's
    ``stage_seconds``."""
    secs = res.get("stage_seconds")
    if not isinstance(secs, dict):
        return 0.0, 0, 0 if secs is None else 1
    ok = [v for v in secs.values() if finite(v)]
    return float(sum(ok)), len(ok), len(secs) - len(ok)


# --------------------------------------------------------------------------- formatting
#: the longest cell a table prints
CELL = 60


def fmt(x: Any, nd: int | None = None, width: int | None = CELL) -> str:
    """A table cell: None as '-', floats to 4 significant digits (``nd``: to ``nd`` decimals,
    trailing zeros dropped), lists element by element, text on one line, at most ``width``
    characters (None: no limit)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if number(x):
        if isinstance(x, float) and not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if not finite(x):  # an int beyond a float
            return ">1e308" if x > 0 else "<-1e308"
        if abs(x) >= 1e15:
            return f"{float(x):.4g}"
        if nd is not None:
            s = f"{round(float(x), nd):.{max(nd, 0)}f}"
            if "." in s:
                s = s.rstrip("0").rstrip(".")
            return "0" if s in ("-0", "") else s
        return f"{x:.4g}" if isinstance(x, float) else str(x)
    if isinstance(x, list):
        s = "[" + ", ".join(fmt(v, nd) for v in x) + "]"
    elif isinstance(x, dict):
        s = json.dumps(jsonable(x), ensure_ascii=False)
    else:
        s = str(x)
    s = " ".join(s.split()) if any(c in s for c in "\n\r\t") else s
    return s if width is None or len(s) <= width else s[:max(width - 3, 0)] + "..."


def fmt_se(x: Any, se: Any) -> str:
    """``x +- se``, both to two significant digits of the SE (``x`` alone without an SE)."""
    nd = decimals(float(se)) if finite(se) else None
    return fmt(x, nd) + (f" +- {fmt(se, nd)}" if se is not None else "")


def fmt_change(ch: Any, nd: int | None, differ: bool, x: Any = None, y: Any = None) -> str:
    """The change column: '=' when the two do not differ (at their precision), the signed
    difference of numbers, 'differs' for other values."""
    if not differ:
        return "="
    if ch is None:
        return "differs" if not (x is None or y is None) else ("new" if x is None else "gone")
    return fmt(ch, nd)
