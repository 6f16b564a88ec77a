"""The report being built: its figures (drawn by a callable, saved as PNG, a failure a note),
notes and one-round facts, by section.

    python -m pytest -q tests/test_report.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from popri.report import style
from popri.core.io import writing

_RC = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
       "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12,
       "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
       "axes.spines.right": False, "figure.dpi": 100, "savefig.dpi": 100,
       "savefig.facecolor": "white", "figure.facecolor": "white"}
# --------------------------------------------------------------------------- figures


@dataclass
class Fig:
    name: str
    title: str
    caption: str
    section: str


class Report:
    def __init__(self, out: Path):
        self.out = out
        self.figures: list[Fig] = []
        self.notes: list[tuple[str, str]] = []  # (section, text)
        self.facts: list[tuple[str, str, str]] = []  # (section, what, value): one-round values
        self.not_shown: list[tuple[str, str]] = []  # nothing to show: not in the report
        self.palette: dict[str, dict[str, str]] = {}  # figure -> {method key: colour}

    def note(self, section: str, text: str) -> None:
        self.notes.append((section, text))

    def fact(self, section: str, what: str, value: str) -> None:
        self.facts.append((section, what, value))

    def figure(self, section: str, name: str, title: str, caption: str,
               draw: Callable[[], Any]) -> None:
        """Run ``draw()`` -> a matplotlib Figure, None (nothing to show: not drawn, not said)
        or a str (why it could not be drawn: a note); save it.  An error while drawing is a
        note (a partial run never fails the report); an error while writing (a full disk) is
        not: the report fails whole."""
        import matplotlib

        used = {f.name for f in self.figures}
        stem, k = name[:-4], 2
        while name in used:
            name, k = f"{stem}-{k}.png", k + 1
        with matplotlib.rc_context(_RC), style.recording() as pal:
            try:
                fig = draw()
            except Exception as e:  # noqa: BLE001 -- a partial run must never fail the report
                self.note(section, f"{title}: not drawn ({type(e).__name__}: {e})")
                return
            if fig is None:
                self.not_shown.append((section, f": {title}"))
                return
            if isinstance(fig, str):
                self.note(section, f"{title}: not drawn ({fig})")
                return

            with writing(self.out / name):  # an OSError names the file
                fig.savefig(self.out / name, format="png")
        self.palette[name] = dict(pal)
        self.figures.append(Fig(name, title, caption, section))
