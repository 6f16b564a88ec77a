"""The samples page of ``popri report``: the first samples of a run's final synthetic set and a
few chosen / rejected preference pairs of its last round with their released (noised) scores.

    from popri.report.samples import samples, samples_markdown, samples_html

Texts are untrusted (a generator writes anything): escaped for HTML and Markdown.  Only what
the run released or generated is shown: never the private data, never the exact (noise-free)
scores (``diagnostics/roundT/exact.npy``, research mode's private diagnostic).
"""

from __future__ import annotations

from pathlib import Path

from popri.core.io import read_jsonl_lenient as read_jsonl
from popri.report.read import num, round_dirs
from popri.report.style import MODEL_METHODS, h, md_text
from popri.methods.base import Method
from popri.pipeline.recipes import METHODS
from popri.report.verdict import privacy_words

#: how many samples and pairs are shown, and how much of each text
N_SAMPLES, N_PAIRS, MAX_CHARS = 5, 3, 600


def _clip(t: object) -> str:
    s = t if isinstance(t, str) else str(t)
    return s if len(s) <= MAX_CHARS else s[:MAX_CHARS].rstrip() + " [...]"


def _through(method: str | None) -> str:
    """How the clients' data reach the method's text (its ``Method.feedback``)."""
    return (METHODS.get(method or "") or Method).feedback


def samples(run_path: Path, r: dict | None, notes: list[str]) -> dict | None:
    """{"set": [{id, text}], "set_file", "pairs": [{round, prompt_id, chosen, rejected,
    chosen_score, rejected_score}], "pairs_file", "note"}; None when the run has no text to show
    (a method that releases a model, a run before its synthetic set)."""
    r = r or {}
    method = r.get("method") if isinstance(r.get("method"), str) else None
    if method in MODEL_METHODS:
        return None
    syn = run_path / "synthetic.jsonl"
    rel = r.get("released")
    if isinstance(rel, str) and rel.endswith(".jsonl"):
        q = Path(rel)
        q = q if q.is_absolute() else run_path / q
        if q.is_file() and run_path.resolve() in q.resolve().parents:
            syn = q
    rows = [x for x in read_jsonl(syn, notes, limit=50) if isinstance(x.get("text"), str)]
    got = {"set": [{"id": str(x.get("id", i)), "text": _clip(x["text"])}
                   for i, x in enumerate(rows[:N_SAMPLES])],
           "set_file": syn.name if rows else None, "pairs": [], "pairs_file": None}
    for t, R in reversed(round_dirs(run_path)):
        pairs = []
        for p in read_jsonl(R / "prefs.jsonl", notes, limit=200):
            cs, rs = num(p.get("chosen_score")), num(p.get("rejected_score"))
            if isinstance(p.get("chosen"), str) and isinstance(p.get("rejected"), str):
                pairs.append({"round": t, "prompt_id": p.get("prompt_id"),
                              "chosen": _clip(p["chosen"]), "rejected": _clip(p["rejected"]),
                              "chosen_score": cs, "rejected_score": rs})
            if len(pairs) >= N_PAIRS:
                break
        if pairs:
            got["pairs"] = pairs
            got["pairs_file"] = f"round{t}/prefs.jsonl"
            break
    if not got["set"] and not got["pairs"]:
        return None

    eps, dp = privacy_words(r) if r else ("epsilon unknown", True)
    got["note"] = (
        "Synthetic text written by the generator, not private data: it may still echo the "
        f"private data, but only through {_through(method)} ({eps}"
        + ("" if dp else "; that total is NOT A DP GUARANTEE") + ")."
        + (" Research mode: the noise is seeded and reproducible, so this text is not "
           "private against whoever holds the seed; not for release."
           if r.get("mode") == "research" else "")
        + (" Scores shown are the released (noised) ones; the exact scores are never shown."
           if got["pairs"] else ""))
    return got


def samples_markdown(s: dict) -> list[str]:
    lines = [f"*{md_text(s['note'])}*", ""]
    if s["set"]:
        lines += [f"First {len(s['set'])} samples of the final synthetic set "
                  f"({md_text(s['set_file'])}):", ""]
        for x in s["set"]:
            lines += [f"> **{md_text(x['id'])}** {md_text(x['text'])}", ""]
    if s["pairs"]:
        lines += [f"Preference pairs ({md_text(s['pairs_file'])}; released scores):", "",
                  "| prompt | chosen (released score) | rejected (released score) |",
                  "|---|---|---|"]
        for p in s["pairs"]:
            lines.append(f"| {md_text(p['prompt_id'])} | {md_text(p['chosen'])} "
                         f"({_score(p['chosen_score'])}) | {md_text(p['rejected'])} "
                         f"({_score(p['rejected_score'])}) |")
        lines.append("")
    return lines


def samples_html(s: dict) -> str:
    out = [f'<p class="synthetic-note">{h(s["note"])}</p>']
    if s["set"]:
        out.append(f"<p>First {len(s['set'])} samples of the final synthetic set "
                   f"(<code>{h(s['set_file'])}</code>):</p>")
        out += [f'<blockquote class="sample"><span class="sid">{h(x["id"])}</span>'
                f'{h(x["text"])}</blockquote>' for x in s["set"]]
    if s["pairs"]:
        out.append(f"<p>Preference pairs (<code>{h(s['pairs_file'])}</code>; released "
                   "scores):</p>")
        out.append('<table class="pairs"><thead><tr><th>prompt</th><th>chosen</th>'
                   "<th>rejected</th></tr></thead><tbody>")
        for p in s["pairs"]:
            out.append(f"<tr><td>{h(p['prompt_id'])}</td>"
                       f'<td class="chosen"><span class="score">{h(_score(p["chosen_score"]))}'
                       f"</span> {h(p['chosen'])}</td>"
                       f'<td class="rejected"><span class="score">'
                       f"{h(_score(p['rejected_score']))}</span> {h(p['rejected'])}</td></tr>")
        out.append("</tbody></table>")
    return "\n".join(out)


def _score(v: float | None) -> str:
    return "no score" if v is None else f"score {v:+.3f}"


__all__ = ["samples", "samples_markdown", "samples_html", "N_SAMPLES", "N_PAIRS"]
