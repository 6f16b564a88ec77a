"""The look of ``popri report``: one colour and one human label per method across every figure,
the colours of the few non-method roles (chosen / rejected, references), and escaping of
untrusted text for Markdown and HTML.

    from popri.report.style import colour, method_label, md_text

Every figure asks :func:`colour` for a method's colour, so a method is drawn the same in all of
them; :func:`recording` collects which colour each figure used (``popri report --json``'s
``palette``), so a test can check that no figure disagrees.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import re
from typing import Iterator
from popri.pipeline.recipes import METHODS

#: one colour per key, fixed (results.json's ``method`` and ``methods`` keys): the rows every
#: run has, then each method's own (``Method.colour`` and its ``variants``, from the registry).
#: Green and magenta are kept for chosen / rejected, so no method is drawn in them.
PALETTE: dict[str, str] = {
    "t0": "#ff7f0e",         # orange: the untuned generator (T = 0)
    "eps0": "#7f7f7f",       # grey: the public model (eps = 0)
    "epsinf": "#222222",     # near black: the private data (eps = inf)
    **{k: m.colour for k, m in METHODS.items() if m.colour},
    **{k: c for m in METHODS.values() for k, (_, c) in m.variants.items()},
}
#: the colours a method without a fixed colour is given (by a hash of its name: stable)
_EXTRA = ["#637939", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39", "#ad494a",
          "#a55194", "#6b6ecf", "#b5cf6b"]
#: non-method roles: never a method's colour
ROLES: dict[str, str] = {"chosen": "#2ca02c", "rejected": "#c51b7d", "reference": "#555555",
                         "budget": "#555555"}

#: human labels (no internal keys in a figure)
LABELS: dict[str, str] = {
    "t0": "untuned generator (T = 0)", "eps0": "public model (eps = 0)",
    "epsinf": "private data (eps = inf)",
    **{k: m.figure_label or m.label for k, m in METHODS.items()},
    **{k: lab for m in METHODS.values() for k, (lab, _) in m.variants.items()},
}
#: methods that release a model, not a synthetic set (their report shows no text samples)
def _model_methods() -> frozenset[str]:
    """The methods that release a model, not text (Method.releases, from the registry)."""
    return frozenset(n for n, m in METHODS.items() if m.releases == "model")


MODEL_METHODS = _model_methods()

_USED: list[dict[str, str]] = []


def colour(key: str | None) -> str:
    """The colour of method ``key`` in every figure (a stable one for unknown names)."""
    k = str(key) if key is not None else "?"
    c = PALETTE.get(k)
    if c is None:
        h = int(hashlib.sha256(k.encode("utf-8", "replace")).hexdigest()[:8], 16)
        c = _EXTRA[h % len(_EXTRA)]
    if _USED:
        _USED[-1][k] = c
    return c


def role(name: str) -> str:
    """The colour of a non-method role (chosen, rejected, reference, budget)."""
    c = ROLES[name]
    if _USED:
        _USED[-1][f"role:{name}"] = c
    return c


@contextlib.contextmanager
def recording() -> Iterator[dict[str, str]]:
    """Collect {method key or 'role:NAME': colour} of every :func:`colour` / :func:`role` call
    made inside (one figure's palette)."""
    d: dict[str, str] = {}
    _USED.append(d)
    try:
        yield d
    finally:
        _USED.pop()


def method_label(key: str | None) -> str:
    """A method's human name: POPri, untuned generator (T = 0), public model (eps = 0), ..."""
    if key is None:
        return "unknown method"
    k = str(key)
    if k in LABELS:
        return LABELS[k]
    try:
        m = METHODS.get(k)
        if m is not None and m.label:
            return str(m.label)
    except Exception:  # noqa: BLE001 -- only a label
        pass
    return k


def shade(hex_colour: str, k: int, n: int) -> str:
    """The k-th of n shades of a colour, dark to light (the rounds of one run)."""
    hc = hex_colour.lstrip("#")
    rgb = [int(hc[i:i + 2], 16) for i in (0, 2, 4)]
    f = 0.0 if n <= 1 else 0.6 * k / (n - 1)
    return "#" + "".join(f"{int(round(c + (255 - c) * f)):02x}" for c in rgb)


# --------------------------------------------------------------------------- escaping
#: what could make text Markdown: a link or image needs '[', a code span '`', emphasis '*' / '_',
#: a table cell ends at '|' (raw HTML is handled by entities)
_MD_PUNCT = re.compile(r"([\\`*_\[\]|])")


def md_text(s: object) -> str:
    """Untrusted text as Markdown that renders as that text: HTML special characters as
    entities (no raw tag reaches a renderer), Markdown punctuation backslash-escaped (no link,
    image, emphasis, code span or table cell break), newlines as spaces (one paragraph or
    table cell)."""
    t = html.escape(str(s), quote=False)
    t = _MD_PUNCT.sub(r"\\\1", t)
    return re.sub(r"\s*[\r\n]+\s*", " ", t)


def md_html_only(s: object) -> str:
    """Only the HTML special characters of ``s`` as entities (a Markdown table's line whose
    cells popri wrote: pipes kept, raw tags neutralised)."""
    return html.escape(str(s), quote=False)


def h(s: object) -> str:
    """HTML-escaped text (attributes too)."""
    return html.escape(str(s), quote=True)


__all__ = ["PALETTE", "ROLES", "LABELS", "MODEL_METHODS", "colour", "role", "recording",
           "method_label", "shade", "md_text", "md_html_only", "h"]
