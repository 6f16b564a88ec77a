"""popri runs: list, show and diff finished runs (library: popri/pipeline/runs.py).

    popri runs list runs/
    popri runs show runs/demo
    popri runs diff runs/e1 runs/e7                 # settings that differ, headline metrics
    popri runs diff runs/e1 runs/e7 --all           # every setting and metric
    popri runs diff runs/e1 runs/e7 --keys 'gap_closed*' --keys probe
    popri runs diff runs/e1 runs/e7 --json
"""

from __future__ import annotations

from typing import List

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.core.errors import InputError
from popri.core.io import dumps
from popri.pipeline import runs as R
from popri.pipeline.results import results_table
from popri.report.samples import samples
from popri.cli.options import command
from popri.specs.commands.runs import RunsDiffCall, RunsListCall, RunsShowCall

app = typer.Typer(help="Finished runs: list them, show one, diff two (results.json, "
                       "config.resolved.json, metrics.jsonl).", no_args_is_help=True)


def _notes(run) -> None:
    """A run's notes (metrics.jsonl lines skipped, ...) on stderr."""
    for n in run.notes:
        log.warn(n)


def _table(lines: list, indent: str = "") -> None:
    """Aligned columns; a str among the rows is printed as is (an ellipsis line)."""
    rows = [x for x in lines if not isinstance(x, str)]
    width = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    for x in lines:
        typer.echo(indent + (x if isinstance(x, str) else
                             "  ".join(v.ljust(w) for v, w in zip(x, width)).rstrip()))


@command(RunsListCall)
def list_cmd(dirs: List[str], as_json: bool) -> None:
    """One line per run directory found in DIRS (and below): method, epsilon spent of the
    budget, accuracy, gap closed, the method minus its T = 0 row, seed, popri version, when it
    ended. A run whose results.json or config.resolved.json cannot be read is listed as
    '(unreadable)', with the reason on stderr; the other runs are listed as usual."""
    rows = []
    for d in R.find_runs(dirs or ["runs"]):
        try:
            run = R.load_run(d)
        except InputError as e:
            log.warn(f"{e.format()}; listed as unreadable")
            rows.append(R.error_summary(d, e.format()))
            continue
        _notes(run)
        rows.append(R.summary(run))
    if as_json:
        typer.echo(dumps(R.jsonable(rows)))
        return
    head = ("run", "method", "eps / budget", "accuracy", "gap closed", "minus T=0", "seed",
            "popri", "ended")
    lines = [head]

    for r in rows:
        if r.get("error"):
            lines.append((R.fmt(r["run_dir"], width=None), "-", "(unreadable)", *("-",) * 6))
            continue
        nodp = "" if r.get("dp_guarantee") is not False else " NOT A DP GUARANTEE"
        lines.append((R.fmt(r["run_dir"], width=None), R.fmt(r["method"]),
                      f"{R.fmt(r['epsilon'])} / {R.fmt(r['budget'])}{nodp}"
                      if r["finished"] else "(unfinished)" if r["epsilon"] is None
                      else f"{R.fmt(r['epsilon'])} / {R.fmt(r['budget'])}{nodp} (unfinished)",
                      R.fmt_se(r["accuracy"], r["accuracy_se"]),
                      R.fmt_se(r["gap_closed"], r["gap_closed_se"]),
                      R.fmt_se(r["minus_t0"], r["minus_t0_se"]), R.fmt(r["seed"]),
                      R.fmt(r["popri_version"]), R.fmt(r["ended"])))
    _table(lines)
    for r in rows:  # each NOT A DP GUARANTEE named with its links (issue 66)
        if r.get("dp_guarantee") is False:
            typer.echo(f"{r['run_dir']}: NOT A DP GUARANTEE: " + "; ".join(r.get("not_dp") or ()))


def _results_table(run) -> str:
    try:
        return results_table(run.results)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, ZeroDivisionError,
            OverflowError):  # a results.json of another popri version, or edited by hand
        return (f"{run.path}: method {R.fmt(run.results.get('method'))}, epsilon "
                f"{R.fmt(run.results.get('epsilon'))}; results.json lacks fields this popri's "
                f"table needs, or holds them with other types (see --json)")


@command(RunsShowCall)
def show_cmd(run_dir: str, as_json: bool, every: bool) -> None:
    """One run: its results table (as 'popri run' printed it), its identity (popri version,
    git commit, command line, config hash, start and end), the stages' seconds and its
    per-round table: one row per round with the per-round metrics metrics.jsonl holds (the
    released scores' mean, the recovery rate, the training loss, the held-out preference
    accuracy, the probe's cosine, MMD^2 and distinct-2; --json has every field), the first and
    last rounds only when there are many (--all: every round). metrics.jsonl lines that are not
    a JSON object with an integer round are skipped, with a note on stderr."""
    run = R.load_run(run_dir)
    _notes(run)
    if as_json:
        typer.echo(dumps(R.jsonable({"run_dir": str(run.path), "config": run.config,
                                     "results": run.results, "metrics": run.rows,
                                     "notes": run.notes})))
        return
    if not run.finished:
        typer.echo(f"{run.path}: not finished (no results.json); method "
                   f"{R.fmt(run.config.get('method'))}")
        spent = R.spent_so_far(run)
        typer.echo(f"epsilon spent so far: {R.fmt(spent['epsilon'])} at delta "
                   f"{R.fmt(spent['delta'])}, {spent['guarantee']} ({spent['entries']} "
                   f"ledger entries; popri account ledger {run.path})" if spent else
                   "epsilon spent so far: unknown (its ledgers could not be totalled: popri "
                   f"account ledger {run.path} says why)" if any(run.path.rglob("ledger.jsonl"))
                   else "epsilon spent so far: 0 (no release recorded in its ledgers)")
    else:
        typer.echo(_results_table(run))
    g = R.guarantee(run)  # what the epsilon is, with every not-dp link (issue 66)
    if not g["dp_guarantee"]:
        typer.echo(R.guarantee_words(g))
    if run.finished:
        ident = run.results.get("run")
        if isinstance(ident, dict) and ident:
            typer.echo("")
            for k in ("popri_version", "git_commit", "command", "config_hash", "started",
                      "ended", "invocations"):
                typer.echo(f"{k}: {R.fmt(ident.get(k), width=None)}")
        elif ident is not None and not isinstance(ident, dict):
            log.warn(f"{run.path}/results.json: field 'run' is not an object; no identity "
                     f"shown")
        total, n, bad = R.stage_seconds(run.results)
        if bad:
            log.warn(f"{run.path}/results.json: field 'stage_seconds': {bad} value(s) not a "
                     f"number of seconds, not counted")
        if n:
            typer.echo(f"stages: {n}, {total / 60:.1f} minutes of work")
    _round_table(run, every)
    _samples(run)


def _round_table(run, every: bool) -> None:
    """The per-round table of ``popri runs show``."""
    rows = run.rows
    if not rows:
        if (run.path / "metrics.jsonl").is_file():
            typer.echo("metrics.jsonl: no rows")
        return
    head, table = R.round_table(rows)
    typer.echo("")
    typer.echo(f"metrics.jsonl: {len(rows)} rows over {len(table)} round(s): "
               f"{R.round_ranges(t[0] for t in table)}")
    if len(head) == 1:
        return
    lines: list = [tuple(head)]
    for t in (table if every else R.compact_rows(table)):
        lines.append(f"... ({len(table) - 2 * R.EDGE} rounds not shown: --all shows them)"
                     if t is None else (str(t[0]), *(R.fmt(v) for v in t[1:])))
    _table(lines, "  ")


#: how much of each sample ``popri runs show`` prints (the report shows more)
SHOW_SAMPLES, SHOW_CHARS = 3, 160


def _samples(run) -> None:
    """The first samples of the run's synthetic set and one chosen / rejected pair with its
    released scores, as the report's samples page (popri.report.samples), shortened."""
    notes: list[str] = []
    s = samples(run.path, run.results if run.finished else None, notes)
    for n in notes:
        log.warn(n)
    if not s:
        return

    def short(t: str) -> str:
        t = " ".join(t.split())
        return t if len(t) <= SHOW_CHARS else t[:SHOW_CHARS - 3].rstrip() + "..."

    typer.echo("")
    typer.echo(f"samples: {s['note']}")
    if s["set"]:
        typer.echo(f"  {s['set_file']}, the first {min(SHOW_SAMPLES, len(s['set']))}:")
        for x in s["set"][:SHOW_SAMPLES]:
            typer.echo(f"    {x['id']}: {short(x['text'])}")
    if s["pairs"]:
        p = s["pairs"][0]
        typer.echo(f"  a preference pair ({s['pairs_file']}, prompt {p['prompt_id']}; released "
                   f"scores {R_fmt(p['chosen_score'])} / {R_fmt(p['rejected_score'])}):")
        typer.echo(f"    chosen:   {short(p['chosen'])}")
        typer.echo(f"    rejected: {short(p['rejected'])}")


def R_fmt(x) -> str:
    return R.fmt(x, width=None)


@command(RunsDiffCall)
def diff_cmd(a: str, b: str, everything: bool, keys: List[str], as_json: bool) -> None:
    """Two runs side by side (as 'dvc params diff' and 'dvc metrics diff'): the settings that
    differ (config.resolved.json), then the headline metrics (results.json: the method's
    accuracy, epsilon and its relation, the method minus its T = 0 row, gap closed, FID) with
    their change. A number with a standard error is rounded to two significant digits of
    its SE and differs only at that precision; two epsilons within 1e-4 relative (the
    accountant's precision) are the same. The change column says '=' for no difference."""
    ra, rb = R.load_run(a), R.load_run(b)
    _notes(ra)
    _notes(rb)
    keys = list(keys or [])
    d = R.diff(ra, rb, everything=everything, keys=keys)
    if d["keys_unmatched"]:
        log.warn("--keys " + ", ".join(repr(k) for k in d["keys_unmatched"]) + " matched no "
                 "setting or metric key of either run (a glob such as 'privacy.*' or a "
                 "substring such as 'gap_closed'; --all lists every key)")
    if as_json:
        typer.echo(dumps(R.jsonable(d)))
        return
    params = d["params"]
    sel = f"matching {', '.join(keys)}" if keys else "every one" if everything else ""
    typer.echo(f"settings: {d['params_differ']} differ (of {d['params_total']})"
               + (f"; {len(params)} shown, {sel}" if sel else ""))
    if params:
        _table([("key", a, b)] + [(k, R.fmt(x), R.fmt(y)) for k, x, y in params], "  ")
    rows = R.diff_rows(d, ra, rb, everything=everything, keys=keys)
    if sel:
        typer.echo(f"metrics: {d['metrics_differ']} differ (of {d['metrics_total']}); "
                   f"{len(rows)} shown, {sel}")
    else:
        typer.echo(f"metrics: {d['metrics_differ']} differ (of {d['metrics_total']}); the "
                   f"headline (--all: every metric, --keys PATTERN: some)")
    if rows:
        cells = [("key", a, b, "change")]
        for k, x, y, ch, nd, dif in rows:
            cells.append((k, R.fmt(x, nd), R.fmt(y, nd), R.fmt_change(ch, nd, dif, x, y)))
        _table(cells, "  ")


app.command("list", help=unwrap(list_cmd.__doc__ or ""))(list_cmd)
app.command("show", help=unwrap(show_cmd.__doc__ or ""))(show_cmd)
app.command("diff", help=unwrap(diff_cmd.__doc__ or ""))(diff_cmd)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="runs")
