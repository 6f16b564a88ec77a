"""``popri report``: one report of one or more run directories (Markdown and one HTML file).

    popri report runs/demo runs/pe --out runs/compare
    python -m pytest -q tests/test_report.py tests/test_report_verdict.py

A layer of its own, above ``popri run``'s driver (it reads what runs wrote, and names each
method by the registry): :mod:`popri.report.build` (the report; its parts by job: ``runs``, ``page``,
``figures``, ``pca``, ``privacy``, ``compare``), :mod:`popri.report.verdict`
(the verdict block of each run), :mod:`popri.report.samples` (the samples page),
:mod:`popri.report.style` (one colour and label per method), :mod:`popri.report.html` (the
Markdown tables as HTML, the style sheet) and :mod:`popri.report.read` (a run directory read
leniently, through :mod:`popri.core.io`).
"""

from popri.report.build import REPORT_FILES, build_report, check_out
from popri.report.privacy import epsilon_per_round
from popri.report.runs import RUN_FILES, is_run_dir

__all__ = ["build_report", "check_out", "is_run_dir", "epsilon_per_round", "RUN_FILES",
           "REPORT_FILES"]
