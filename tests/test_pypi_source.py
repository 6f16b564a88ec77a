"""The pypi corpus (popri/data/pypi.py): README prose, authors as clients, the pinned releases
checked against the index, offline rebuild from a directory, and `popri bench fetch pypi`.

    python -m pytest -q tests/test_pypi_source.py
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from popri.core.errors import InputError
from popri.data import pypi as P

FIX = Path(__file__).parent / "fixtures" / "pypi"


def test_markdown_readme_becomes_prose():
    rec = json.loads((FIX / "tinyplot-0.2.json").read_text())
    t = P.prose(rec["info"]["description"])
    assert t.startswith("Tinyplot draws line and bar charts")
    assert "pip install" not in t and "shields.io" not in t and "|" not in t
    assert "Works with numpy arrays and plain Python lists of numbers." in t  # link text kept
    assert "##" not in t and "Install" not in t.split()  # headings dropped


def test_restructuredtext_readme_becomes_prose():
    rec = json.loads((FIX / "tinyplot-server-1.0.json").read_text())
    t = P.prose(rec["info"]["description"])
    assert t.startswith("This package serves the charts of tinyplot")
    assert "===" not in t and "image::" not in t and ":target:" not in t
    assert "--port" not in t                       # the literal block after '::'
    assert "See the docs for the options" in t     # `text <url>`_ keeps its text


def test_prose_caps_length_and_drops_short_or_foreign_paragraphs():
    long = "\n\n".join(f"Paragraph {i} says a few plain words about the package." for i in range(400))
    assert len(P.prose(long)) <= P.MAX_CHARS
    assert P.prose("Too short.\n\n这是本人第一个对外发布的私人包哦仅供练习使用请勿用于生产环境") == ""


def test_clients_are_authors_by_email_else_name():
    assert P.client_of({"author_email": "Ada Example <Ada@Example.org>"}) == "ada@example.org"
    assert P.client_of({"author_email": "UNKNOWN", "maintainer_email": "m@x.io"}) == "m@x.io"
    assert P.client_of({"author": "  Bob   Builder "}) == "bob builder"
    assert P.client_of({"author": "UNKNOWN", "author_email": "none"}) is None


def test_load_from_a_directory_groups_releases_by_author():
    sd = P.load_pypi(str(FIX))
    by = {d.fields["project"]: d for d in sd.documents}
    assert set(by) == {"tinyplot", "tinyplot-server", "bobtools"}  # no author; not English
    assert by["tinyplot"].client_id == by["tinyplot-server"].client_id == "ada@example.org"
    assert by["tinyplot"].text.startswith("Plot small data in the terminal.\n\n")
    assert by["tinyplot"].date == "2021-05-04" and by["bobtools"].client_id == "bob builder"
    assert sd.details["authors"] == 2 and sd.details["skipped"] == 2
    assert P.load_pypi(str(FIX)).version == sd.version  # the digest of the files read
    with pytest.raises(InputError, match="directory"):
        P.load_pypi(str(FIX / "tinyplot-0.2.json"))


def test_pins_file_parses_and_is_shipped():
    pins = P.read_pins()
    assert len(pins) > 3000 and all(len(h) == 16 for _, _, h in pins)
    assert len({n for n, _, _ in pins}) == len(pins)


def test_bad_pin_line_is_named(tmp_path):
    f = tmp_path / "pins.txt"
    f.write_text("# header\nok==1.0 0123456789abcdef\nbroken-line\n")
    with pytest.raises(InputError) as e:
        P.read_pins(f)
    assert "pins.txt:3" in str(e.value)


class _Index(http.server.BaseHTTPRequestHandler):
    records: dict = {}

    def do_GET(self):  # /pypi/NAME/json
        name = self.path.strip("/").split("/")[1]
        rec = self.records.get(name)
        if rec is None:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps(rec).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_fetch_keeps_only_releases_that_still_match_their_pin(tmp_path, monkeypatch):
    recs = {p.stem.rsplit("-", 1)[0]: json.loads(p.read_text()) for p in FIX.glob("*.json")}
    pins = [(n, r["info"]["version"], P.digest_of(r)) for n, r in sorted(recs.items())]
    newer = json.loads(json.dumps(recs["bobtools"]))
    newer["info"]["version"] = "3.2"
    edited = json.loads(json.dumps(recs["tinyplot"]))
    edited["info"]["summary"] = "Now plots big data too"
    _Index.records = {**recs, "bobtools": newer, "tinyplot": edited}
    del _Index.records["zh"]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setattr(P, "INDEX", f"http://127.0.0.1:{srv.server_address[1]}")
    try:
        counts = P.fetch_releases(pins, tmp_path)
    finally:
        srv.shutdown()
    assert counts == {"fetched": 2, "newer release": 1, "changed metadata": 1, "deleted": 1}
    assert (tmp_path / "bobtools-3.1.json.missing").read_text() == "newer release"
    kept = json.loads((tmp_path / "tinyplot-server-1.0.json").read_text())
    assert P.digest_of(kept) == dict((n, h) for n, _, h in pins)["tinyplot-server"]
    # cached: a second fetch asks the index nothing (the server is down)
    assert P.fetch_releases(pins, tmp_path) == {}


def test_bench_fetch_pypi_from_a_directory(tmp_path, run_popri):
    out = tmp_path / "data"
    run_popri(["bench", "fetch", "pypi", "--source", FIX, "--out", out, "--split", "hash",
               "--seed", "0"], check=True)
    rows = [json.loads(x) for f in ("train", "val", "test") if (out / f"{f}.jsonl").exists()
            for x in (out / f"{f}.jsonl").read_text().splitlines()]
    assert {r["client_id"] for r in rows} == {"ada@example.org", "bob builder"}
    assert {r["project"] for r in rows} == {"tinyplot", "tinyplot-server", "bobtools"}
