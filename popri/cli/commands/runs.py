"""popri runs: list, show and diff finished runs (library: popri/pipeline/runs.py).

    popri runs list runs/
    popri runs show runs/demo
    popri runs diff runs/e1 runs/e7 --json
"""

from __future__ import annotations

from typing import List

import typer

from popri.cli.options import unwrap

app = typer.Typer(help="Finished runs: list them, show one, diff two (results.json, "
                       "config.resolved.json, metrics.jsonl).", no_args_is_help=True)


def list_cmd(
    dirs: List[str] = typer.Argument(None, metavar="DIRS...", help="Run directories or folders "
                                     "holding them (default: runs)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON list on stdout."),
) -> None:
    """One line per run directory found in DIRS (and below): method, epsilon spent of the
    budget, accuracy, gap closed, the method minus its T = 0 row, seed, popri version, when it
    ended."""
    from popri.core.io import dumps
    from popri.pipeline import runs as R

    rows = [R.summary(R.load_run(d)) for d in R.find_runs(dirs or ["runs"])]
    if as_json:
        typer.echo(dumps(rows))
        return
    head = ("run", "method", "eps / budget", "accuracy", "gap closed", "minus T=0", "seed",
            "popri", "ended")
    lines = [head]
    for r in rows:
        pm = lambda v, s: R.fmt(v) + (f" +- {R.fmt(s)}" if s is not None else "")  # noqa: E731
        lines.append((r["run_dir"], str(r["method"]),
                      f"{R.fmt(r['epsilon'])} / {R.fmt(r['budget'])}"
                      if r["finished"] else "(unfinished)",
                      pm(r["accuracy"], r["accuracy_se"]), pm(r["gap_closed"], r["gap_closed_se"]),
                      pm(r["minus_t0"], r["minus_t0_se"]), R.fmt(r["seed"]),
                      R.fmt(r["popri_version"]), R.fmt(r["ended"])))
    width = [max(len(x[i]) for x in lines) for i in range(len(head))]
    for x in lines:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(x, width)).rstrip())


def show_cmd(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="config, results and metrics as one "
                                 "JSON object."),
) -> None:
    """One run: its results table (as 'popri run' printed it), its identity (popri version,
    git commit, command line, config hash, start and end), the stages' seconds and its
    per-round metrics."""
    from popri.core.io import dumps
    from popri.pipeline import runs as R

    run = R.load_run(run_dir)
    rows = run.metrics.to_dict("records") if hasattr(run.metrics, "to_dict") else run.metrics
    if as_json:
        typer.echo(dumps({"run_dir": str(run.path), "config": run.config,
                          "results": run.results, "metrics": rows}))
        return
    if not run.finished:
        typer.echo(f"{run.path}: not finished (no results.json); method "
                   f"{run.config.get('method')}")
        return
    from popri.pipeline.driver import results_table

    try:
        typer.echo(results_table(run.results))
    except (KeyError, TypeError, AttributeError):  # a results.json of another popri version
        typer.echo(f"{run.path}: method {run.results.get('method')}, epsilon "
                   f"{R.fmt(run.results.get('epsilon'))}; results.json lacks fields this popri's "
                   f"table needs (see --json)")
    ident = run.results.get("run") or {}
    if ident:
        typer.echo("")
        for k in ("popri_version", "git_commit", "command", "config_hash", "started", "ended",
                  "invocations"):
            typer.echo(f"{k}: {R.fmt(ident.get(k))}")
    secs = run.results.get("stage_seconds") or {}
    if secs:
        typer.echo(f"stages: {len(secs)}, {sum(secs.values()) / 60:.1f} minutes of work")
    if rows:
        typer.echo(f"metrics.jsonl: {len(rows)} rows over rounds "
                   f"{sorted({r.get('round') for r in rows})}")


def diff_cmd(
    a: str = typer.Argument(..., metavar="RUN_A"),
    b: str = typer.Argument(..., metavar="RUN_B"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
) -> None:
    """Two runs side by side: the settings that differ (config.resolved.json, as 'dvc params
    diff'), then the metrics that differ (results.json, as 'dvc metrics diff', with the
    change)."""
    from popri.core.io import dumps
    from popri.pipeline import runs as R

    d = R.diff(R.load_run(a), R.load_run(b))
    if as_json:
        typer.echo(dumps(d))
        return
    for title, rows, head in (("settings", d["params"], ("key", a, b)),
                              ("metrics", d["metrics"], ("key", a, b, "change"))):
        typer.echo(f"{title}: {len(rows)} differ")
        if not rows:
            continue
        cells = [head] + [tuple(R.fmt(v) for v in r) for r in rows]
        width = [max(len(str(c[i])) for c in cells) for i in range(len(head))]
        for c in cells:
            typer.echo("  " + "  ".join(str(v).ljust(w) for v, w in zip(c, width)).rstrip())


app.command("list", help=unwrap(list_cmd.__doc__ or ""))(list_cmd)
app.command("show", help=unwrap(show_cmd.__doc__ or ""))(show_cmd)
app.command("diff", help=unwrap(diff_cmd.__doc__ or ""))(diff_cmd)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="runs")
