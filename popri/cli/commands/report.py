"""popri report: tables and figures of one or more run directories, as Markdown and one
self-contained HTML file (library: popri/pipeline/report.py).

    popri report runs/study/oracle-s0 --out runs/report
    popri report runs/compare23/*-s0 runs/study/oracle-s0 --out runs/report --json
"""

from __future__ import annotations

from typing import List

import typer

_HELP = """Tables and figures of run directories ('popri run' outputs) as Markdown and one
self-contained HTML file.

Each run's results table (accuracy
with SEs, gap closed, the T = 0 control), per-round curves from RUN/metrics.jsonl (probe
mean-embedding cosine and MMD^2 with SEs, distinct-2, perplexity, DPO/SFT loss, held-out margin
and accuracy, released chosen / rejected scores, recovery rate), or from the stages' own files
where a run has none (DPO loss per step, DP-FL rounds, downstream accuracy per epoch), a
chosen-vs-rejected score histogram, a PCA of the synthetic set's embeddings against the private
validation split's (only when both exist on disk: no model is loaded), epsilon spent per round
from the run's ledgers; across runs, accuracy against epsilon and a method comparison with 95%
intervals.  A figure whose data are missing is skipped with a note.  Writes report.md,
report.html (self-contained: figures embedded) and the PNG figures into --out; stdout: the
HTML file's path, or the JSON result with --json."""


def report(
    run_dirs: List[str] = typer.Argument(..., metavar="RUN_DIR...", help="Run directories "
                                         "(each holds results.json, metrics.jsonl or, while "
                                         "running, config.resolved.json)."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (created; an earlier "
                            "report there is replaced)."),
    json_out: bool = typer.Option(False, "--json", help="Print {figures, notes, html, md} as "
                                  "JSON instead of the HTML path."),
) -> None:
    from pathlib import Path

    from popri.core import log, outdir
    from popri.core.errors import InputError, MissingResourceError
    from popri.core.io import dumps
    from popri.pipeline.report import RUN_FILES, is_run_dir

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
    dest = outdir.check(out, inputs=run_dirs)
    if dest.is_dir() and any(dest.iterdir()):
        kind = _kind(dest / outdir.MARKER)
        if kind != "report":  # another output of popri's (a model, a round): not ours to mix
            raise InputError(f"holds popri's {kind or 'unmarked'} output, not a report; choose "
                             "another --out", path=out)
        for f in [*dest.glob("*.png"), dest / "report.md", dest / "report.html"]:
            if f.is_file():  # an earlier report: its files go first
                f.unlink()
    from popri.pipeline.report import build_report

    log.info(f"report: {len(run_dirs)} run(s) -> {out}")
    res = build_report(list(run_dirs), out)
    outdir.mark(dest, "report")
    for n in res["notes"]:
        log.info(f"report: {n}")
    log.info(f"report: {len(res['figures'])} figure(s), {res['md']}")
    typer.echo(dumps(res) if json_out else res["html"])


def _kind(marker) -> str | None:
    import json

    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def register(app: typer.Typer) -> None:
    from popri.cli.options import unwrap

    app.command("report", help=unwrap(_HELP.strip()))(report)
