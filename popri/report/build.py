"""One report of one or more run directories: a verdict per run, samples of the synthetic
text, tables and figures, as Markdown and as one self-contained HTML file (``popri report
RUN_DIR... --out DIR``).

    popri report runs/study/oracle-s0 runs/compare23/dp-fedavg-s0 --out runs/report

The report opens with a verdict block per run (:mod:`popri.report.verdict`): the
method, its epsilon and the relation it holds under (or NOT A DP GUARANTEE), the paired
difference to its control (the untuned generator, T = 0) and to eps = 0 with 95 % intervals,
one sentence in words, and a figure of those paired differences.  Then a page of samples
(:mod:`popri.report.samples`: the final synthetic set's first samples, a few chosen /
rejected pairs with their released scores), the figures across runs and each run's results
table, per-round values and figures.  Every method has one colour and one label in every figure
(:mod:`popri.report.style`).

Reads only what the runs wrote (docs/formats.md; :mod:`popri.report.read`):
``results.json``, ``metrics.jsonl`` or, where a run has none (older runs, DP-FL runs), the
stages' own files: ``roundT/{dpo,sft}/metrics.json``, ``roundT/scores.npy`` and
``roundT/prefs.jsonl`` (released scores), ``probe/roundT.json``, ``fl/roundT/round.json``,
``downstream/NAME/metrics.json``; every ``ledger.jsonl`` under the run (epsilon spent per round,
composed cumulatively with :func:`popri.privacy.accounting.compose`); ``embeddings/val.npy`` and
an embedding of the synthetic set that already exists on disk (no model is ever loaded here).

What does not apply to a run (a DP-FL figure of a POPri run, a curve of a one-round run) is not
drawn and not mentioned (one round's values are a table line); what could not be read is a note;
a partial run never fails the report.  The report is built in a staging directory next to
``--out`` and swapped into place in one step (:mod:`popri.core.outdir`): a failure or a kill
leaves the earlier report or none, never half of one.

The modules, by job: :mod:`~popri.report.runs` (reading the runs), :mod:`~popri.report.page`
(figures and notes being collected), :mod:`~popri.report.figures` and :mod:`~popri.report.pca`
(one run's figures), :mod:`~popri.report.privacy` (epsilon spent), :mod:`~popri.report.compare`
(across runs, tables) and this one (the page written, the report swapped into place).
"""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
from pathlib import Path

from popri.report import style
from popri.report.html import CSS, md_to_html
from popri.core.errors import InputError
from popri.report.samples import samples_html
from popri.report.samples import samples_markdown
from popri.report.verdict import verdict_html
from popri.report.verdict import verdict_markdown
from popri.core.io import atomic_write
from popri.report.samples import samples as read_samples
from popri.report.verdict import fig_paired_differences
from popri.report.verdict import verdict
from popri.core import log, outdir
from popri.report.compare import fig_methods, fig_privacy_utility, table_text
from popri.report.figures import fig_curve, fig_downstream, fig_method_rounds, fig_prefs_hist, fig_probe_distance, fig_probe_quality, fig_scores, fig_steps, fig_tuning, new_fig
from popri.report.page import Fig, Report
from popri.report.pca import fig_pca
from popri.report.privacy import fig_epsilon, privacy_spent
from popri.report.runs import Run, run_labels, load_run, method_of, run_slugs

#: the files of a report (an earlier report's are replaced; anything else in --out is kept)
REPORT_FILES = ("report.md", "report.html")

# --------------------------------------------------------------------------- writing
#: the report's sections, in order
_VERDICT, _ACROSS = "\0verdict", "\0across"  # no run label (a path) holds a NUL
_SAMPLES = "Samples (synthetic text)"
_TITLES = {_VERDICT: "Verdict", _ACROSS: "Across runs"}


def _md_results(text: str) -> str:
    """A results table (popri's own Markdown, run-derived values inside) safe to render: HTML
    special characters as entities, link and code brackets escaped."""
    return "\n".join(re.sub(r"([\[\]`])", r"\\\1", style.md_html_only(line))
                     for line in text.splitlines())


def _figure_md(f: Fig) -> list[str]:
    return [f"![{style.md_text(f.title)}]({f.name})", "",
            f"*{style.md_text(f.title)}* ({style.md_text(f.name)}): {style.md_text(f.caption)}",
            ""]


def _figure_html(report: Report, f: Fig) -> str:
    data = base64.b64encode((report.out / f.name).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{html.escape(f.title)}</b> ({html.escape(f.name)}): "
            f"{html.escape(f.caption)}</figcaption></figure>")


def _write(report: Report, runs: list[Run], tables: dict[str, str], verdicts: list[dict],
           samples: dict[str, dict]) -> tuple[Path, Path]:
    md = ["# popri report", "",
          "Runs: " + ", ".join(style.md_text(r.path) for r in runs), ""]
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>popri report</title>", f"<style>{CSS}</style></head><body>",
         "<h1>popri report</h1>",
         '<p class="meta">Runs: ' + ", ".join(f"<code>{html.escape(str(r.path))}</code>"
                                              for r in runs) + "</p>"]

    def figures_and_notes(sec: str) -> None:
        for f in (f for f in report.figures if f.section == sec):
            md.extend(_figure_md(f))
            h.append(_figure_html(report, f))
        notes = [n for s, n in report.notes if s == sec]
        if notes:
            md.extend(["#### Notes", ""] + [f"- {style.md_text(n)}" for n in notes] + [""])
            h.extend(["<h4>Notes</h4>", '<ul class="notes">']
                     + [f"<li>{html.escape(n)}</li>" for n in notes] + ["</ul>"])

    md += ["## Verdict", ""]
    h.append("<h2>Verdict</h2>")
    for v in verdicts:
        md += verdict_markdown(v)
        h.append(verdict_html(v))
    figures_and_notes(_VERDICT)
    if samples:
        md += [f"## {_SAMPLES}", ""]
        h.append(f"<h2>{html.escape(_SAMPLES)}</h2>")
        for run in runs:
            if run.label in samples:
                md += [f"### {style.md_text(run.label)}", ""] + samples_markdown(samples[run.label])
                h += [f"<h3>{html.escape(run.label)}</h3>", samples_html(samples[run.label])]
    if any(f.section == _ACROSS for f in report.figures) or \
            any(s == _ACROSS for s, _ in report.notes):
        md += ["## Across runs", ""]
        h.append("<h2>Across runs</h2>")
        figures_and_notes(_ACROSS)
    for run in runs:
        sec = run.label
        title = f"Run {sec}"
        md += [f"## {style.md_text(title)}", "",
               f"Directory: {style.md_text(run.path)}; per-round metrics from "
               f"{style.md_text(run.metrics_source)}.", ""]
        h += [f"<h2>{html.escape(title)}</h2>",
              f'<p class="meta">Directory: <code>{html.escape(str(run.path))}</code>; '
              f"per-round metrics from {html.escape(run.metrics_source)}.</p>"]
        if sec in tables:
            md += ["### Results", "", _md_results(tables[sec]), ""]
            h += ["<h3>Results</h3>", md_to_html(tables[sec])]
        facts = [(w, v) for s, w, v in report.facts if s == sec]
        if facts:
            md += ["### Per-round values", "", "| what | value |", "|---|---|"]
            md += [f"| {style.md_text(w)} | {style.md_text(v)} |" for w, v in facts] + [""]
            h += ["<h3>Per-round values</h3>", "<table><tbody>"]
            h += [f"<tr><th>{html.escape(w)}</th><td>{html.escape(v)}</td></tr>"
                  for w, v in facts] + ["</tbody></table>"]
        if any(f.section == sec for f in report.figures):
            md += ["### Figures", ""]
            h.append("<h3>Figures</h3>")
        figures_and_notes(sec)
    h.append("</body></html>")
    md_path, html_path = report.out / "report.md", report.out / "report.html"

    with atomic_write(md_path) as fh:
        fh.write("\n".join(md).rstrip() + "\n")
    with atomic_write(html_path) as fh:
        fh.write("\n".join(h) + "\n")
    return md_path, html_path


def _run_section(report: Report, run: Run, tables: dict[str, str]) -> dict | None:
    """One run's table, per-round values and figures; returns its epsilon per round."""
    sec, s = run.label, run.slug
    for n in run.notes:
        report.note(sec, n)
    run.notes.clear()
    if run.results is not None:
        tables[sec] = table_text(run.results)
    elif not (run.path / "results.json").is_file():
        report.note(sec, "no results.json (the run has not finished): no results table")
    if not run.metrics and (run.path / "metrics.jsonl").is_file():
        report.note(sec, "metrics.jsonl has no rows")

    def facts(what: str, value: str) -> None:
        report.fact(sec, what, value)

    fig = report.figure
    fig(sec, f"{s}-probe-distance.png", "Probe: distance to the private validation split",
        "mean-embedding cosine and unbiased MMD² of the round's generator sample (fixed "
        "prompts and seeds) against the private validation embeddings; error bars ±1 "
        "bootstrap SE; n: the probe's samples. A private diagnostic, never a release.",
        lambda: fig_probe_distance(run, facts))
    fig(sec, f"{s}-probe-quality.png", "Probe: diversity and fluency",
        "distinct-1/2 n-gram shares, the public model's perplexity and the mean pairwise "
        "cosine of the probe sample per round.", lambda: fig_probe_quality(run, facts))
    fig(sec, f"{s}-tuning.png", "DPO / SFT per round",
        "training loss, exact reward margin and preference accuracy on the training and "
        "the held-out preference pairs (n: pairs), per round.", lambda: fig_tuning(run, facts))
    fig(sec, f"{s}-tuning-steps.png", "DPO / SFT per step",
        "loss (and DPO reward margin) at each logging step of each round's tuning, from "
        "roundT/dpo|sft/metrics.json; darker = earlier round.", lambda: fig_steps(run))
    rec = bool(run.rows("prefs")) and not run.release
    fig(sec, f"{s}-scores.png", "Released scores" + (" and recovery rate" if rec else ""),
        "mean DP-released score of the round's samples and of the preference pairs' "
        "chosen / rejected samples; n: samples or pairs" + (
            "; recovery rate: share of pairs whose order the noise-free scores agree with (a "
            "private diagnostic, POPri Fig. 6)." if rec else "."),
        lambda: fig_scores(run, facts))
    fig(sec, f"{s}-prefs-hist.png", "Chosen vs rejected released scores",
        "histograms of the released scores of the chosen and rejected samples of the "
        "preference pairs (roundT/prefs.jsonl); at most four rounds shown.",
        lambda: fig_prefs_hist(run))
    own = method_of(run).round_panels(run.path, run.results)
    if own is not None:
        fig(sec, f"{s}-{own.name}.png", own.title, own.caption,
            lambda: fig_method_rounds(run, own, facts))
    fig(sec, f"{s}-curve.png", "Learning curve in N",
        "test accuracy of every arm trained on the first n samples of its set (nested "
        "prefixes of one generation: paired across n), log x; band +-1 SE between draws (one "
        "draw: its SE over test clients, no verdict); dots: single draws; star: eps = inf on "
        "all the private training text; right: the method minus its T = 0 control.",
        lambda: fig_curve(run, facts))
    fig(sec, f"{s}-downstream.png", "Downstream training",
        "validation next-token accuracy and loss per epoch of each downstream model "
        "(downstream/NAME/metrics.json), in the colour of its method.",
        lambda: fig_downstream(run))
    fig(sec, f"{s}-pca.png", "PCA of embeddings",
        "the first two principal components (numpy SVD of both sets together) of the "
        "synthetic set's and the private validation split's sentence embeddings (a private "
        "diagnostic).", lambda: fig_pca(run))
    spent = privacy_spent(run, report, sec)
    fig(sec, f"{s}-epsilon.png", "Privacy spent per round",
        "epsilon of every ledger.jsonl under the run, composed cumulatively round by round "
        "(popri.privacy.accounting.compose; entries deduplicated by release id).",
        lambda: fig_epsilon(run, spent))
    return spent


def _build(run_dirs: list[str], outp: Path) -> dict:
    """Write the report into the (staging) directory ``outp``."""
    report = Report(outp)
    labels = run_labels(list(run_dirs))
    runs = [load_run(p, lab, slug) for p, lab, slug in zip(run_dirs, labels, run_slugs(labels))]

    verdicts, samples, spent = [], {}, {}
    for run in runs:
        try:
            verdicts.append(verdict(run.path, run.label, run.results))
        except Exception as e:  # noqa: BLE001 -- a partial run never fails the report
            report.note(run.label, f"verdict: not made ({type(e).__name__}: {e})")
            verdicts.append(verdict(run.path, run.label, None))
        try:
            got = read_samples(run.path, run.results, run.notes)
        except Exception as e:  # noqa: BLE001
            run.notes.append(f"samples: not shown ({type(e).__name__}: {e})")
            got = None
        if got is not None:
            samples[run.label] = got
    report.figure(_VERDICT, "paired-differences.png", "Paired differences",
                  "each run's method minus its untuned generator (T = 0; circles) and minus "
                  "the public model (eps = 0; squares), with 95% intervals; the interval "
                  "excludes 0 only where the method's difference is clear. Filled: paired over "
                  "the same test clients (or over draws, Student's t); open: unpaired or no "
                  "interval.", lambda: fig_paired_differences(verdicts, new_fig))
    tables: dict[str, str] = {}
    for run in runs:
        d = _run_section(report, run, tables)
        if d is not None:
            spent[run.label] = {"x": d["x"], "epsilon": d["epsilon"], "by_round": d["by_round"],
                                "entries": d["entries"]}
    report.figure(_ACROSS, "method-comparison.png", "Accuracy of each model",
                  "next-token accuracy of each run's method and of its untuned generator "
                  "(T = 0), public model (eps = 0) and private-data (eps = inf) rows, each with "
                  "its own 95% interval (±1.96 SE over test clients). Whether a method beat its "
                  "comparison is the paired difference (Verdict), not the overlap of these.",
                  lambda: fig_methods(runs))
    report.figure(_ACROSS, "privacy-utility.png", "Privacy-utility",
                  "accuracy (and gap closed, where present) against each run's epsilon, error "
                  "bars ±1 SE; dashed lines: the eps = 0 and eps = inf accuracies.",
                  lambda: fig_privacy_utility(runs, report, _ACROSS))
    md_path, html_path = _write(report, runs, tables, verdicts, samples)
    return {"figures": [f.name for f in report.figures],
            "notes": [f"{_TITLES.get(s, s)}: {n}" for s, n in report.notes],
            "not_shown": [_TITLES.get(s, s) + t for s, t in report.not_shown],
            "verdicts": [{k: v[k] for k in ("run", "method", "mode", "privacy", "dp_guarantee",
                                            "sentence", "control", "eps0", "gap_closed")}
                         for v in verdicts],
            "epsilon": spent, "palette": report.palette,
            "html": html_path.name, "md": md_path.name}


def check_out(out: str | os.PathLike, run_dirs: list[str]) -> Path:
    """Refuse an --out the report must not replace (popri.core.outdir.check: '-', a file, an
    input, a ledger, a foreign non-empty directory; and popri's other outputs): InputError."""
    if os.fspath(out) in ("", "-"):
        raise InputError("--out must be a directory (the report is report.md, report.html and "
                         "its PNG figures): it cannot go to stdout ('-')")
    dest = outdir.check(out, inputs=run_dirs)
    if dest.is_dir() and any(dest.iterdir()):
        kind = _kind(dest / outdir.MARKER)
        if kind != "report":  # another output of popri's (a model, a round): not ours to mix
            raise InputError(f"holds popri's {kind or 'unmarked'} output, not a report; choose "
                             "another --out", path=str(out))
    return dest


def _kind(marker: Path) -> str | None:
    import json

    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def _carry_over(old: Path, new: Path) -> None:
    """What the user keeps in an earlier report's directory (their notes, anything not the
    report's own files: report.md, report.html, the PNGs, popri's marker) moves into the new
    report unchanged (hard links where possible; links copied as links)."""
    if not old.is_dir() or old.is_symlink():
        return

    def link_or_copy(src, dst):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)

    for e in old.iterdir():
        if e.name in (*REPORT_FILES, outdir.MARKER) or e.suffix.lower() == ".png" \
                or e.name.startswith(".") or (new / e.name).exists():
            continue
        if e.is_symlink():
            os.symlink(os.readlink(e), new / e.name)
        elif e.is_dir():
            shutil.copytree(e, new / e.name, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(e, new / e.name)


def unique_runs(run_dirs) -> list[str]:
    """The run directories once each, in the order given (hostile case H05, issue 66: the
    same run named twice, or by two paths, made a report of "2 runs" with every figure twice);
    a repeat is said on stderr."""
    seen: dict[str, str] = {}
    out = []
    for d in run_dirs:
        key = os.path.realpath(str(d))
        if key in seen:
            log.warn(f"report: {d} is {seen[key]} again: reported once")
            continue
        seen[key] = str(d)
        out.append(str(d))
    return out


def build_report(run_dirs: list[str], out: str) -> dict:
    """Write report.md, report.html and the figures (PNG) of ``run_dirs`` into ``out``.
    Returns {"figures": [file names], "notes": [...], "not_shown", "verdicts", "epsilon",
    "palette", "html": path, "md": path}.

    ``out`` is checked (:func:`check_out`), the report built in a staging directory next to it
    and swapped into place in one step (:func:`popri.core.outdir.replace`, with the marker): an
    error or a signal leaves the earlier report (or nothing), never part of one, and a rerun
    works.  The user's own files in an earlier report's directory are kept."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    run_dirs = unique_runs(run_dirs)
    dest = check_out(out, list(run_dirs))
    tmp = outdir.staging_dir(dest)
    try:
        res = _build(list(run_dirs), tmp)
        _carry_over(dest, tmp)
        outdir.replace(tmp, dest, kind="report")
    except BaseException as e:
        if isinstance(e, OSError) and e.filename is not None:  # name the output, not the stage
            f = os.fspath(e.filename)
            if f.startswith(str(tmp)):
                e.filename = str(dest) + f[len(str(tmp)):]
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    res["html"], res["md"] = str(dest / res["html"]), str(dest / res["md"])
    return res


__all__ = ["build_report", "check_out", "REPORT_FILES"]
