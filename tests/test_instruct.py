"""popri instruct build: the tasks, the template, the partitions, the CLI (real processes).

    python -m pytest tests/test_instruct.py -q
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from popri.core.errors import PopriError
from popri.data import instruct as I
from popri.data.sources import Document
from popri.specs.instruct import InstructSpec

from conftest import write_jsonl

FIX = Path(__file__).parent / "fixtures"


def test_sentences_and_cut_words():
    t = "One two three. Four five six! Seven eight? Nine ten eleven twelve."
    assert I.sentences(t) == ["One two three.", "Four five six!", "Seven eight?",
                              "Nine ten eleven twelve."]
    assert I.sentences("Mr. smith went. Then 3 more.") == ["Mr. smith went.", "Then 3 more."]
    # a sentence end inside the limit that keeps >= half of it
    assert I.cut_words(t, 9) == "One two three. Four five six! Seven eight?"
    # no sentence end in the last half: cut at the word limit
    long = "a " * 20 + "end."
    assert I.cut_words(long, 5) == "a a a a a"
    assert I.cut_words("short text", 10) == "short text"


def test_template_with_and_without_input():
    p = I.prompt("Do it.", "the input")
    assert p.endswith("### Instruction:\nDo it.\n\n### Input:\nthe input\n\n### Response:\n")
    q = I.prompt("Do it.", "  ")
    assert "### Input" not in q and q.endswith("### Instruction:\nDo it.\n\n### Response:\n")
    assert I.render("Do it.", "", "Done.") == q + "Done."


def test_debian_task_from_fixture():
    from popri.data.debian import load_debian

    sd = load_debian(str(FIX / "debian"))
    exs = I.debian_examples(sd.documents, InstructSpec(min_output_words=1))
    by = {e["package"]: e for e in exs}
    a = by["alpha-tool"]
    assert a["instruction"] == ("Describe the Debian package alpha-tool: command-line tool for "
                                "alpha streams.")
    assert a["input"] == ""
    assert a["output"].startswith("Alpha reads streams of records")
    assert "\n\n" in a["output"] and a["client_id"] == "alice@example.org"
    # the synopsis is never its own response; a package without a long description is dropped
    assert all(not e["output"].startswith(e["instruction"].split(": ", 1)[1].rstrip("."))
               for e in exs)


def test_sotu_task_pairs_are_consecutive_and_disjoint():
    text = " ".join(f"Sentence number {i} has exactly seven words." for i in range(40))
    d = Document("1901-x", text, date="1901-12-03", fields={"speaker": "T. Roosevelt"})
    spec = InstructSpec(context_words=20, max_output_words=30, min_output_words=4)
    exs = I.sotu_examples([d], spec)
    assert exs and all(e["client_id"] == "1901-x" for e in exs)
    assert exs[0]["instruction"] == "Continue this passage from T. Roosevelt's State of the Union address."
    for e in exs:
        assert len(e["input"].split()) >= 20 and len(e["output"].split()) <= 30
    # the passages tile the address in order: input then output, example after example
    joined = " ".join(e["input"] + " " + e["output"] for e in exs)
    assert joined in " ".join(text.split())


def test_shakespeare_reply_pairs():
    docs = [Document("p/a", "Who goes there?", fields={"play": "P", "role": "A"}),
            Document("p/b", "Nay, answer me: stand and unfold yourself.", fields={"play": "P", "role": "B"}),
            Document("p/b", "Long live the king, and all his noble house.", fields={"play": "P", "role": "B"}),
            Document("q/c", "A new play begins with these words here.", fields={"play": "Q", "role": "C"})]
    exs = I.shakespeare_examples(docs, InstructSpec(min_output_words=3))
    assert len(exs) == 1  # B after B (same role) and C after another play make no pair
    e = exs[0]
    assert e["client_id"] == "p/b" and e["input"] == "A: Who goes there?"
    assert e["instruction"] == "Write B's reply in P."


def test_table_rows_and_errors(tmp_path):
    f = write_jsonl(tmp_path / "t.jsonl", [
        {"user": "u1", "instruction": "Say hi.", "output": "Hi there, my friend, hello."},
        {"user": "u2", "instruction": "Add.", "input": "1 + 1", "output": "The sum is two, of course.",
         "topic": "maths"}])
    exs = I.table_examples(str(f), "user", InstructSpec())
    assert [e["client_id"] for e in exs] == ["u1", "u2"] and exs[1]["topic"] == "maths"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"user": "u", "instruction": "x", "output": "y y y y"},
                                               {"user": "u", "instruction": "x"}])
    with pytest.raises(Exception) as e:
        I.table_examples(str(bad), "user", InstructSpec())
    assert "bad.jsonl:2: field 'output'" in str(e.value)
    nocl = write_jsonl(tmp_path / "nocl.jsonl", [{"instruction": "x", "output": "y y y y"}])
    with pytest.raises(Exception) as e:
        I.table_examples(str(nocl), None, InstructSpec())
    assert "nocl.jsonl:1: field 'client_id'" in str(e.value)
    # the iid / clusters partitions need no client column
    assert I.table_examples(str(nocl), None, InstructSpec(partition="iid"))[0]["client_id"] == ""


def test_dirichlet_partition_properties():
    labels = [i % 5 for i in range(500)]
    a = I.dirichlet_partition(labels, 10, 1.0, seed=3)
    assert a == I.dirichlet_partition(labels, 10, 1.0, seed=3)  # seeded
    assert a != I.dirichlet_partition(labels, 10, 1.0, seed=4)
    assert len(a) == 500 and set(a) <= set(range(10))
    # large alpha: near-uniform shares of every cluster; small alpha: concentrated
    big = I.dirichlet_partition(labels, 10, 1e4, seed=0)
    per = Counter((labels[i], big[i]) for i in range(500))
    assert all(abs(per[(c, k)] - 10) <= 3 for c in range(5) for k in range(10))

    def top_share(alpha):  # mean over clusters of the largest client's share
        a = I.dirichlet_partition(labels, 10, alpha, seed=0)
        return sum(max(Counter(a[i] for i in range(500) if labels[i] == c).values())
                   for c in range(5)) / 500

    assert top_share(0.01) > 0.8 > top_share(1.0) > top_share(1e4) - 1e-9
    assert top_share(1e4) < 0.15


def test_spec_validation():
    with pytest.raises(Exception, match="max_clients"):
        InstructSpec(partition="clusters", max_clients=3)
    with pytest.raises(Exception, match="per_cluster"):
        InstructSpec(per_cluster=3)
    with pytest.raises(Exception, match="min_output_words"):
        InstructSpec(min_output_words=50, max_output_words=10)


def test_cli_debian_fixture_is_byte_identical(run_popri, tmp_path):
    args = ["instruct", "build", "debian", "--source", FIX / "debian", "--min-output-words", "1",
            "--val-frac", "0", "--test-frac", "0"]
    p = run_popri([*args, "--out", tmp_path / "a"])
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""  # data only on stdout: none here
    q = run_popri([*args, "--out", tmp_path / "b"], check=True)
    assert q.returncode == 0
    for f in ("train.jsonl", "manifest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["format"] == "popri-federated-dataset" and m["instruct"]["template"] == "alpaca"
    recs = [json.loads(l) for l in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    assert recs and all(r["text"] == I.render(r["instruction"], r["input"], r["output"]) for r in recs)


def test_cli_bad_table_exit_2_nothing_written(run_popri, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"client_id": "a", "instruction": "x", "output": "y y y y"},
                                               {"client_id": "a", "output": "z z z z"}])
    p = run_popri(["instruct", "build", bad, "--out", tmp_path / "o"])
    assert p.returncode == 2
    assert "bad.jsonl:2: field 'instruction'" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    p = run_popri(["instruct", "build", "nosuch", "--out", tmp_path / "o"])
    assert p.returncode == 2 and "unknown source 'nosuch'" in p.stderr


def test_cli_iid_partition(run_popri, tmp_path):
    rows = [{"instruction": f"Task {i}.", "output": f"Answer {i} is a fine answer."} for i in range(40)]
    f = write_jsonl(tmp_path / "t.jsonl", rows)
    run_popri(["instruct", "build", f, "--partition", "iid", "--num-clients", "4", "--val-frac", "0",
               "--test-frac", "0", "--out", tmp_path / "o"], check=True)
    recs = [json.loads(l) for l in (tmp_path / "o" / "train.jsonl").read_text().splitlines()]
    assert sorted(Counter(r["client_id"] for r in recs).values()) == [10, 10, 10, 10]


def test_clusters_partition(tiny_st_model, tmp_path):
    pytest.importorskip("faiss")
    rows = ([{"instruction": f"Describe the fish number {i}.", "output": "It swims in the sea all day."}
             for i in range(30)] +
            [{"instruction": f"Compute {i} plus {i}.", "output": f"The answer is {2 * i}, as sums go."}
             for i in range(30)])
    f = write_jsonl(tmp_path / "t.jsonl", rows)
    spec = InstructSpec(partition="clusters", clusters=4, per_cluster=5, num_clients=3,
                        embedder=tiny_st_model, val_frac=0, test_frac=0)
    from popri.models.embed import embed_texts

    with pytest.raises(PopriError, match="needs a sentence embedder"):  # the data layer loads no model
        I.build(str(f), str(tmp_path / "o0"), spec, seed=0)
    m = I.build(str(f), str(tmp_path / "o"), spec, seed=0, embed=embed_texts)
    recs = [json.loads(l) for l in (tmp_path / "o" / "train.jsonl").read_text().splitlines()]
    per = Counter(r["cluster"] for r in recs)
    assert len(recs) <= 4 * 5 and all(v <= 5 for v in per.values())
    assert {r["client_id"] for r in recs} <= {"client000", "client001", "client002"}
    assert m["instruct"]["partition"]["rule"] == "clusters"
    # seeded: the same split again
    I.build(str(f), str(tmp_path / "o2"), spec, seed=0, embed=embed_texts)
    assert (tmp_path / "o" / "train.jsonl").read_bytes() == (tmp_path / "o2" / "train.jsonl").read_bytes()


def test_debian_instructions_of_other_packages_pass_the_novelty_filter():
    """FewFedPIT's novelty filter compares instructions alone: another package's instruction must
    be able to pass it (with "Describe the Debian package NAME." two names score 0.8 > 0.7)."""
    from popri.data.debian import load_debian
    from popri.methods.fewfedpit.filters import novel_instructions

    sd = load_debian(str(FIX / "debian"))
    ins = [e["instruction"] for e in I.debian_examples(sd.documents, InstructSpec(min_output_words=1))]
    assert len(ins) >= 2
    for i, own in enumerate(ins):
        others = ins[:i] + ins[i + 1:]
        rows, counts = novel_instructions(others, [own], keep=len(others))
        assert counts["rouge_local"] == 0, rows
        _, again = novel_instructions([own], [own], keep=1)   # a copy is still dropped
        assert again["rouge_local"] == 1
