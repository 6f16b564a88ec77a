"""The report's HTML: the one Markdown shape it converts (results tables and paragraphs) and its
style sheet.

    from popri.report.html import CSS, md_to_html
"""

from __future__ import annotations

import html
import re


def md_to_html(text: str) -> str:
    """The few Markdown shapes of a results table: pipe tables and paragraphs."""
    out, table = [], []

    def flush():
        if not table:
            return
        cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table]
        body = [c for c in cells if not all(re.fullmatch(r":?-{3,}:?", x) for x in c)]
        table.clear()
        if not body:
            return
        h = "".join(f"<th>{html.escape(x)}</th>" for x in body[0])
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in row) + "</tr>"
                       for row in body[1:])
        out.append(f"<table><thead><tr>{h}</tr></thead><tbody>{rows}</tbody></table>")
        table.clear()

    for line in text.splitlines():
        if line.strip().startswith("|"):
            table.append(line)
            continue
        flush()
        if line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


#: the style sheet of report.html (one self-contained file)
CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1240px;
margin:24px auto;padding:0 20px;color:#222;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #ddd;padding-bottom:6px}
h2{font-size:1.35em;margin-top:2.2em;border-bottom:1px solid #eee;padding-bottom:4px}
h3{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:10px 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:4px 9px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
tr:nth-child(even) td{background:#fafafa}
figure{margin:18px 0 28px}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#555;margin-top:4px}
.notes li{color:#665;font-size:.92em}
.meta{color:#666;font-size:.9em}
code{background:#f5f5f5;padding:1px 4px;border-radius:3px}
.verdict{border-left:6px solid #999;background:#fafafa;padding:6px 16px 10px;margin:14px 0}
.verdict h3{margin-top:.4em}
.verdict.v-good{border-color:#2a7d2a}.verdict.v-bad{border-color:#b22}
.verdict.v-flat{border-color:#c90}
.verdict .sentence{font-size:1.08em;font-weight:600}
.verdict table th{width:16em;background:#f0f0f0}
.notdp{background:#b22;color:#fff;font-weight:700;padding:4px 10px;display:inline-block}
.synthetic-note{background:#fff8e0;border:1px solid #e5d28a;padding:6px 10px;font-size:.93em}
blockquote.sample{margin:8px 0;padding:6px 12px;border-left:4px solid #ccc;background:#fcfcfc;
white-space:pre-wrap;word-break:break-word;font-family:Georgia,serif;font-size:.95em}
.sid{font-family:monospace;color:#888;font-size:.85em;margin-right:.8em}
table.pairs td{max-width:520px;white-space:pre-wrap;word-break:break-word}
td.chosen{border-left:4px solid #2ca02c}td.rejected{border-left:4px solid #c51b7d}
.score{font-family:monospace;font-size:.85em;color:#444;display:block}
"""
