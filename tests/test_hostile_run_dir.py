"""The hostile test of popri 0.4 (/work/shared/probes/hostile-0.4.md): the failed cases of
`popri run`, `popri account`, `popri runs`, `popri embed` and `popri score`, each through a
real process (scripts/wheelhouse.sh's N12 / N13: tests/test_wheelhouse.py; the relation every
`popri account` line names: tests/test_account_cli.py).

    python -m pytest -q tests/test_hostile_run_dir.py

N01 / N09 an empty or blank --run-dir named as --run-dir; N02 pld refuses absurd T at once;
N04 an infinite epsilon kept as "inf" in --json; N05 one rule for the metrics runs diff lists
and counts; N06 a --keys pattern that matches nothing is named; N08 embed of an empty input;
N10 a run directory of unrelated files refused before anything is written; N11 a text file
given as .npy is "not a .npy file"; and the runs diff examples name runs the run examples
write.
"""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import emb_set, write_jsonl
from test_hostile_run import RUN_SMOKE, SMOKE, _one_line, _popri
from test_hostile_runs import _results, _run, _strict


# --------------------------------------------------------------------------- popri run
def test_n01_n09_an_empty_or_blank_run_dir_is_refused_naming_the_option(tmp_path):
    """'' ran silently into the YAML's runs/smoke under the current directory; ' ' was named
    as '--set run_dir ... must not be null'."""
    for d in ("", " "):
        line = _one_line(_popri([*RUN_SMOKE, "--run-dir", d], cwd=tmp_path))
        assert "--run-dir" in line and "--set" not in line, line
    assert not any(tmp_path.iterdir())  # no runs/smoke
    # a DIR is taken as written: YAML's null, ~ and numbers are directory names here
    p = _popri([*RUN_SMOKE, "--run-dir", "null", "--show-config"], cwd=tmp_path)
    assert p.returncode == 0 and "run_dir: 'null'\n" in p.stdout, p.stderr


def test_n10_a_run_dir_of_unrelated_files_is_refused_before_anything_is_written(tmp_path):
    """As `popri report --out` refuses a directory of the user's files (popri.core.outdir):
    before, the run wrote data/, logs/, round1/ and its marker among them."""
    from popri.core.errors import ConfigError
    from popri.core.outdir import MARKER
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run

    mine = tmp_path / "mine"
    mine.mkdir()
    for i in range(110):
        (mine / f"notes{i}.txt").write_text(f"{i}\n")
    before = sorted(x.name for x in mine.iterdir())
    line = _one_line(_popri([*RUN_SMOKE, "--run-dir", mine]))
    assert str(mine) in line and "not written by popri" in line and "run_dir" in line, line
    assert sorted(x.name for x in mine.iterdir()) == before  # nothing added
    # what still works: a new or empty directory; one holding what the run reads (a prepared
    # dataset, data/; its YAML and inputs; ledgers, whose releases the budget counts); a run
    # directory of popri's (its marker, or .stages/ of an older run): a resume
    (tmp_path / "empty").mkdir()
    kept = tmp_path / "kept"
    (kept / "data" / "private").mkdir(parents=True)
    (kept / "ledger.jsonl").write_text("")
    (kept / "old").mkdir()
    (kept / "old" / "ledger.jsonl").write_text("")
    shutil.copy(SMOKE, kept / "my.yaml")
    write_jsonl(kept / "public.jsonl", [{"id": "a", "text": "a public text"}])
    (tmp_path / "ours" / "round1").mkdir(parents=True)
    (tmp_path / "ours" / MARKER).write_text("{}\n")
    (tmp_path / "ours" / "results.json").write_text("{}\n")
    (tmp_path / "old" / ".stages").mkdir(parents=True)
    (tmp_path / "old" / "notes.txt").write_text("x\n")

    def check(d, yaml=SMOKE):
        Run(C.load(yaml, [f"run_dir={tmp_path / d}", f"data.public_source={kept}/public.jsonl"]),
            inputs=[yaml])._check_run_dir()

    for d in ("new", "empty", "ours", "old"):
        check(d)
    check("kept", kept / "my.yaml")
    (kept / "README").write_text("x\n")
    with pytest.raises(ConfigError, match="it holds README"):
        check("kept", kept / "my.yaml")


# --------------------------------------------------------------------------- popri account
def test_n02_pld_refuses_an_absurd_number_of_steps_at_once():
    """`account sigma ... -T 10^12 --accountant pld` printed nothing for 400 s (10^7: 150 s):
    one line naming --steps, the limit, why, and the rdp accountant."""
    from popri.privacy.accounting import PLD_MAX_STEPS

    for args in (["sigma", "-e", 1, "-q", 0.5, "-T", 10 ** 12],
                 ["epsilon", "-z", 1, "-q", 0.5, "-T", 10 ** 7]):
        t = time.monotonic()
        line = _one_line(_popri(["account", *args, "--accountant", "pld"], timeout=120))
        assert time.monotonic() - t < 60  # not computed: refused (~1 s)
        assert "--steps" in line and f"{PLD_MAX_STEPS:,}" in line and "rdp" in line, line
    p = _popri(["account", "epsilon", "-z", 30, "-q", 0.5, "-T", 1000, "-a", "pld"])
    assert p.returncode == 0 and p.stdout.startswith("epsilon = "), p.stderr


# --------------------------------------------------------------------------- popri runs
def test_n04_an_infinite_epsilon_stays_inf_in_json(tmp_path):
    """`runs list --json` and `runs diff --json` wrote an epsilon of Infinity as null (the
    text view: inf); now the string "inf" ("-inf"), NaN still null (JSON has neither)."""
    res = _results(tmp_path / "inf")
    res["epsilon"], res["fid_to_val"] = math.inf, math.nan
    inf = _run(tmp_path / "inf", results=res)
    fin = _run(tmp_path / "fin")
    rows = _strict(_popri(["runs", "list", inf, "--json"]).stdout)
    assert rows[0]["epsilon"] == "inf"
    d = _strict(_popri(["runs", "diff", inf, fin, "--json", "--all"]).stdout)
    m = {k: (x, y) for k, x, y, _ch in d["metrics"]}
    assert m["epsilon"][0] == "inf" and m["fid_to_val"][0] is None
    assert {h["key"]: h for h in d["headline"]}["epsilon"]["a"] == "inf"
    show = _strict(_popri(["runs", "show", inf, "--json"]).stdout)
    assert show["results"]["epsilon"] == "inf"
    assert "inf" in _popri(["runs", "list", inf]).stdout.splitlines()[1]


def test_n05_runs_diff_lists_exactly_the_metrics_it_counts(tmp_path):
    """0.999994 vs 0.999986 (epsilons within the accountant's precision) was listed among the
    metrics that differ and counted equal: 83 rows, metrics_differ 82."""
    a = _run(tmp_path / "smoke", results=_results(tmp_path / "smoke", eps=0.999994))
    b = _run(tmp_path / "demo", results=_results(tmp_path / "demo", eps=0.999986, acc=0.3))
    d = _strict(_popri(["runs", "diff", a, b, "--json"]).stdout)
    keys = [k for k, *_ in d["metrics"]]
    assert len(keys) == d["metrics_differ"] and "epsilon" not in keys, d
    assert "methods.popri.accuracy" in keys
    text = _popri(["runs", "diff", a, b, "--keys", "epsilon", "--keys", "accuracy"]).stdout
    shown = [x.split()[0] for x in text.splitlines() if x.startswith("  ")]
    assert f"metrics: {d['metrics_differ']} differ" in text and "epsilon" not in shown, text


def test_n06_a_keys_pattern_that_matches_nothing_is_named(tmp_path):
    """`runs diff A B --keys 'nomatch*'` (also '[') printed '0 shown' and nothing else: now a
    warning naming the pattern (exit 0: an empty selection is an answer, not bad input)."""
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    for pat in ("nomatch*", "["):
        p = _popri(["runs", "diff", a, b, "--keys", pat, "--keys", "epsilon"])
        assert p.returncode == 0, p.stderr
        warn = [x for x in p.stderr.splitlines() if x.startswith("popri: warning:")]
        assert len(warn) == 1 and repr(pat) in warn[0] and "matched no" in warn[0], p.stderr
        assert "'epsilon'" not in warn[0] and "Traceback" not in p.stderr
        j = _strict(_popri(["runs", "diff", a, b, "--keys", pat, "--json"]).stdout)
        assert j["keys_unmatched"] == [pat]
    p = _popri(["runs", "diff", a, b, "--keys", "privacy.*"])
    assert p.returncode == 0 and "warning" not in p.stderr, p.stderr


def test_runs_diff_examples_name_runs_the_run_examples_write():
    """The `popri runs diff` examples of --help named runs/e1 and runs/e7, which no example
    creates: every run directory they name is the --run-dir of a `popri run` example."""
    from popri.cli.examples import EXAMPLES

    made = set()
    for ex in EXAMPLES["run"]:
        w = shlex.split(ex.split("  #")[0])
        made |= {w[i + 1] for i, x in enumerate(w) if x == "--run-dir"}
    for ex in EXAMPLES["runs diff"]:
        w = shlex.split(ex.split("  #")[0])
        assert set(w[3:5]) <= made, (ex, made)


# --------------------------------------------------------------------------- embed, score
def test_n08_embedding_an_empty_input_is_one_line_and_writes_nothing(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = _one_line(_popri(["embed", empty, "--out", tmp_path / "x.npy"]))
    assert f"{empty}: no rows to embed" in line, line
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", "embed", "-", "--out",
                        str(tmp_path / "y.npy")], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=300)
    assert "<stdin>: no rows to embed" in _one_line(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["empty.jsonl"]


def test_n11_a_text_file_given_as_npy_is_not_a_npy_file(tmp_path):
    """It said 'contains pickled (object) data' (numpy's message for any file without the .npy
    header): the shared loader (popri.core.io.load_npy) tells text, a pickle and an empty file."""
    rng = np.random.default_rng(0)
    priv = emb_set(tmp_path / "priv.npy", rng.normal(size=(12, 8)).astype(np.float32),
                   [f"c{i % 4}" for i in range(12)])
    bad = tmp_path / "garbage.npy"
    write_jsonl(tmp_path / "garbage.jsonl", [{"id": "a"}])
    for body, what in ((b"hello, not an array\n", "holds text"),
                       (b"\x80\x04\x95garbage", "is a Python pickle"), (b"", "is empty")):
        bad.write_bytes(body)
        line = _one_line(_popri(["score", "--private", priv, "--synthetic", bad, "-z", 1,
                                 "--out", tmp_path / "s.npy"]))
        assert f"{bad}: not a .npy file: it {what}" in line and "pickled" not in line, line
    assert not (tmp_path / "s.npy").exists()
    # a real .npy, and one holding objects (numpy's own refusal, as before), are told apart
    from popri.core.errors import InputError
    from popri.core.io import load_npy

    good = emb_set(tmp_path / "good.npy", rng.normal(size=(3, 8)).astype(np.float32))
    assert load_npy(good).shape == (3, 8)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="not a .npy array: Object arrays"):
        load_npy(tmp_path / "obj.npy")
