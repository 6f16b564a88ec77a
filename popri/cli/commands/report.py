"""popri report: tables and figures of one or more run directories, as Markdown and one
self-contained HTML file (library: popri/report/).

    popri report runs/study/oracle-s0 --out runs/report
    popri report runs/compare23/*-s0 runs/study/oracle-s0 --out runs/report --json
"""

from __future__ import annotations

from typing import List

import typer

from popri.cli.options import unwrap
from popri.core import log
from popri.core.errors import InputError, MissingResourceError
from popri.core.io import dumps
from popri.report import RUN_FILES, build_report, check_out, is_run_dir
from popri.cli.options import command
from popri.specs.commands.report import ReportCall

_HELP = """A report of run directories ('popri run' outputs) as Markdown and one self-contained
HTML file.

It opens with a verdict per run: the method, its epsilon and the relation it holds under (or
NOT A DP GUARANTEE under the papers' convention), the paired difference to its untuned
generator (T = 0) and to eps = 0 with 95% intervals, one sentence in words and a figure of the
paired differences (a release-mode run: what it released and at which epsilon).  Then a page of
samples of the synthetic text (the final set's first samples, a few chosen / rejected pairs with
their released scores), accuracy of each model and privacy-utility across runs, and per run its
results table, per-round curves from RUN/metrics.jsonl or the stages' own files (probe
distance, diversity and fluency, DPO/SFT loss and held-out margin, released scores, recovery
rate, DP-FL rounds, downstream training), a chosen-vs-rejected score histogram, a PCA of the
synthetic set against the private validation split (only from embeddings on disk) and epsilon
spent per round from the run's ledgers.  One colour and one label per method in every figure;
what does not apply to a run is not drawn (a one-round run's values are a table).  Writes
report.md, report.html (figures embedded) and the PNG figures into --out, built aside and
swapped into place in one step (an interrupted report leaves the earlier one); stdout: the HTML
file's path, or the JSON result with --json."""


@command(ReportCall)
def report(run_dirs: List[str], out: str, json_out: bool) -> None:
    from pathlib import Path

    if out in ("", "-"):
        check_out(out, [])  # one line: --out must be a directory
    for d in run_dirs:
        p = Path(d)
        if not p.exists():
            raise InputError("no such directory", path=d)
        if not p.is_dir():
            raise InputError("not a directory: give a run directory ('popri run --out')", path=d)
        if not is_run_dir(p):
            raise InputError(f"not a run directory (no {', '.join(RUN_FILES)})", path=d)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingResourceError("popri report needs matplotlib: pip install matplotlib") \
            from None
    check_out(out, list(run_dirs))  # before any figure is drawn

    log.info(f"report: {len(run_dirs)} run(s) -> {out}")
    res = build_report(list(run_dirs), out)
    for n in res["notes"]:
        log.info(f"report: {n}")
    log.info(f"report: {len(res['figures'])} figure(s), {res['md']}")
    typer.echo(dumps(res) if json_out else res["html"])


def register(app: typer.Typer) -> None:
    app.command("report", help=unwrap(_HELP.strip()))(report)
