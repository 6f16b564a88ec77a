"""`popri account epsilon | sigma | ledger` through the real CLI.

    python -m pytest -q tests/test_account_cli.py
"""

import json
import math
import re

import pytest

from popri.privacy import ledger
from popri.privacy import accounting as A

from conftest import write_jsonl

PRETEXT_Z = 1.541 * math.sqrt(2)


def ok(run_popri, *args):
    p = run_popri(["account", *map(str, args)], check=True)
    return p.stdout


def js(run_popri, *args):
    out = ok(run_popri, *args, "--json")
    assert out.count("\n") == 1  # one JSON object, one line
    return json.loads(out)


def test_epsilon_line(run_popri):
    out = ok(run_popri, "epsilon", "--noise-multiplier", 2.5, "--sample-rate", 0.1, "--steps", 20,
             "--delta", 3e-6)
    assert out == ("epsilon = 0.9617 (rdp, q=0.1, T=20, delta=3e-06, z=2.5; add/remove one "
                   "client)\n")
    # a fixed L of N: sampling without replacement under replace one client (RDP only)
    out = ok(run_popri, "epsilon", "-z", 2.5, "-q", 0.1, "-T", 20, "--sampling", "fixed")
    assert out.endswith("z=2.5; replace one client)\n")
    assert float(out.split()[2]) == pytest.approx(
        A.epsilon(2.5, 0.1, 20, 3e-6, sampling="fixed"), abs=1e-4)
    p = run_popri(["account", "epsilon", "-z", 2.5, "-q", 0.1, "-T", 20, "--sampling", "fixed",
                   "-a", "pld"])
    assert p.returncode == 2 and "--accountant" in p.stderr and p.stdout == ""


def test_epsilon_json_pld_pretext(run_popri):
    d = js(run_popri, "epsilon", "-z", PRETEXT_Z, "-q", 1, "-T", 11, "--delta", 3e-6,
           "--accountant", "pld")
    assert d["epsilon"] == pytest.approx(7.58, abs=0.01)  # PrE-Text's 7.58 (D.1)
    assert (d["noise_multiplier"], d["sample_rate"], d["steps"], d["delta"], d["accountant"]) == \
        (pytest.approx(PRETEXT_Z), 1.0, 11, 3e-6, "pld")
    assert d["neighbouring"] == "add/remove one client"


def test_epsilon_zero_noise(run_popri):
    assert ok(run_popri, "epsilon", "-z", 0, "-q", 0.5, "-T", 3).startswith("epsilon = inf (")
    d = js(run_popri, "epsilon", "-z", 0, "-q", 0.5, "-T", 3, "-a", "pld")
    assert d["epsilon"] is None and "infinity" in d["note"]


@pytest.mark.parametrize("acc", ["rdp", "pld"])
@pytest.mark.parametrize("target", [7.58, 1.29])
def test_sigma_round_trips_pretext(run_popri, acc, target):
    d = js(run_popri, "sigma", "--epsilon", target, "--steps", 11, "--sample-rate", 1,
           "--delta", 3e-6, "--accountant", acc)
    assert d["epsilon"] == target and d["accountant"] == acc
    z = d["noise_multiplier"]
    e = js(run_popri, "epsilon", "-z", repr(z), "-q", 1, "-T", 11, "--delta", 3e-6, "-a", acc)
    assert target - 1e-3 <= e["epsilon"] <= target
    assert e["epsilon"] == pytest.approx(d["epsilon_achieved"], abs=1e-12)


def test_sigma_line_rounds_up(run_popri):
    out = ok(run_popri, "sigma", "-e", 1, "-q", 1, "-T", 20)  # POPri C.1: 19.3 at q = 1
    m = re.fullmatch(r"noise_multiplier = (\S+) \(rdp, q=1, T=20, delta=3e-06, "
                     r"epsilon=(\S+) <= 1; add/remove one client\)\n", out)
    assert m, out
    z = float(m.group(1))
    assert 19.2 < z <= 19.3
    assert A.epsilon(z, 1.0, 20, 3e-6) <= 1.0  # the printed (rounded) value meets the target


def _entry(stage, z, q, steps, rid, sampling="poisson", delta=3e-6):
    return {"stage": stage, "mechanism": "gaussian" if q == 1 else "subsampled_gaussian",
            "noise_multiplier": z, "sample_rate": q, "sampling": sampling if q < 1 else "none",
            "steps": steps, "delta": delta, "sensitivity": 1.0,
            "neighbouring": "add/remove one client", "release_id": rid}


@pytest.fixture
def pipeline(tmp_path):
    """Two heterogeneous releases; the score release also copied into a score sidecar and
    into a second run directory (same release_id: counted once)."""
    score = _entry("score", 1.05, 0.0075, 20, "rel-score")
    hist = _entry("histogram", 12.858, 1.0, 11, "rel-hist")
    (tmp_path / "round1").mkdir()
    (tmp_path / "round2").mkdir()
    write_jsonl(tmp_path / "round1" / "ledger.jsonl", [score])
    ledger.append(tmp_path / "round2" / "out.npy", [ledger.LedgerEntry(**hist),
                                                    ledger.LedgerEntry(**score)])
    (tmp_path / "scores.json").write_text(json.dumps({"ids": ["a"], "ledger": [score]}))
    return tmp_path, [(1.05, 0.0075, 20), (12.858, 1.0, 11)]


@pytest.mark.parametrize("acc", ["rdp", "pld"])
def test_ledger_json(run_popri, pipeline, acc):
    root, history = pipeline
    d = js(run_popri, "ledger", root, root / "scores.json", "--accountant", acc)
    assert d["entries"] == 2 and len(d["groups"]) == 2
    assert d["delta"] == 3e-6 and d["accountant"] == acc  # delta taken from the entries
    assert d["epsilon"] == pytest.approx(A.compose(history, 3e-6, acc).epsilon, rel=1e-9)
    alone = {g["stage"]: g["epsilon_alone"] for g in d["groups"]}
    assert alone["histogram"] == pytest.approx(A.epsilon(12.858, 1.0, 11, 3e-6, acc), rel=1e-9)
    assert d["epsilon"] > max(alone.values())
    assert d["neighbouring"] == "add/remove one client" and d["dp_guarantee"] is True


def test_ledger_table(run_popri, pipeline):
    root, history = pipeline
    p = run_popri(["account", "ledger", root / "round1" / "ledger.jsonl", root / "round2"],
                  check=True)
    lines = p.stdout.splitlines()
    assert lines[0].split()[:7] == ["stage", "mechanism", "z", "q", "steps", "sampling",
                                    "relation"]
    assert lines[1].split()[:6] == ["score", "subsampled_gaussian", "1.05", "0.0075", "20",
                                    "poisson"]
    assert lines[2].split()[:6] == ["histogram", "gaussian", "12.858", "1", "11", "none"]
    assert "add/remove one client" in lines[1] and "add/remove one client" in lines[2]
    eps = A.compose(history, 3e-6).epsilon
    assert lines[3] == (f"total: epsilon = {math.ceil(eps * 1e4) / 1e4:.4f} "
                        f"(rdp, delta=3e-06, 2 entries, 2 lines; (eps, delta)-DP under "
                        f"add/remove one client)")


def test_an_old_fixed_size_ledger_is_refused_unless_the_papers_convention_is_named(
        run_popri, tmp_path):
    """popri <= 0.3 recorded L of N clients under add/remove at q = L/N: no proven accounting
    (the displacement pair), so the total is refused with one line naming the way out; with
    --convention papers it is the old number, labelled NOT A DP GUARANTEE on every output."""
    write_jsonl(tmp_path / "ledger.jsonl",
                [_entry("score", 1.05, 0.0075, 20, "old", sampling="fixed")])
    p = run_popri(["account", "ledger", tmp_path])
    assert p.returncode == 2 and p.stdout == "" and p.stderr.strip().count("\n") == 0
    assert "displaces" in p.stderr and "--convention papers" in p.stderr
    p = run_popri(["account", "ledger", tmp_path, "--convention", "papers"], check=True)
    total = p.stdout.splitlines()[-1]
    assert total.endswith("NOT A DP GUARANTEE (papers' convention))")
    assert "NOT A DP GUARANTEE" in p.stderr and "L/N" in p.stderr
    assert float(total.split()[3]) == pytest.approx(A.epsilon(1.05, 0.0075, 20, 3e-6), abs=1e-4)
    d = js(run_popri, "ledger", tmp_path, "--convention", "papers")
    assert d["dp_guarantee"] is False and d["guarantee"].startswith("NOT A DP GUARANTEE")


def test_a_fixed_size_ledger_totals_under_replace_one(run_popri, tmp_path):
    """What popri records for L of N since 0.4: replace one client, sensitivity 2C, sampling
    without replacement (RDP); a q = 1 Gaussian under add/remove joins it at twice its
    sensitivity (noted), and pld refuses the mixture with one line."""
    score = _entry("score", 1.5, 0.5, 3, "new", sampling="fixed")
    score.update(neighbouring="replace one client", sensitivity=2.0)
    fred = _entry("fred", 30.0, 1.0, 1, "sel")
    write_jsonl(tmp_path / "ledger.jsonl", [score, fred])
    d = js(run_popri, "ledger", tmp_path)
    assert d["neighbouring"] == "replace one client" and d["dp_guarantee"] is True
    assert "2 times its sensitivity" in d["note"]
    want = A.compose([{**score}, {**fred, "neighbouring": "replace one client",
                                   "noise_multiplier": 15.0, "sensitivity": 2.0}], 3e-6).epsilon
    assert d["epsilon"] == pytest.approx(want, rel=1e-9)
    p = run_popri(["account", "ledger", tmp_path, "--accountant", "pld"])
    assert p.returncode == 2 and "rdp" in p.stderr


def test_ledger_delta_must_be_chosen_when_entries_disagree(run_popri, tmp_path):
    write_jsonl(tmp_path / "ledger.jsonl", [_entry("a", 2.0, 0.1, 5, "x"),
                                            _entry("b", 3.0, 1.0, 1, "y", delta=1e-5)])
    p = run_popri(["account", "ledger", tmp_path])
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "--delta" in p.stderr
    d = js(run_popri, "ledger", tmp_path, "--delta", 1e-5)
    assert d["delta"] == 1e-5 and d["entries"] == 2


@pytest.mark.parametrize("args,needle", [
    (["epsilon", "-z", -1, "-q", 0.1, "-T", 5], "--noise-multiplier"),
    (["epsilon", "-z", 1, "-q", 0, "-T", 5], "--sample-rate"),
    (["epsilon", "-z", 1, "-q", 1.5, "-T", 5], "--sample-rate"),
    (["epsilon", "-z", 1, "-q", 0.1, "-T", 0], "--steps"),
    (["epsilon", "-z", 1, "-q", 0.1, "-T", 5, "--delta", 0], "--delta"),
    (["epsilon", "-z", 1, "-q", 0.1, "-T", 5, "--delta", 1.5], "--delta"),
    (["epsilon", "-z", 1, "-q", 0.1, "-T", 5, "-a", "moments"], "--accountant"),
    (["sigma", "-e", 0, "-q", 0.1, "-T", 5], "--epsilon"),
    (["sigma", "-e", -2, "-q", 0.1, "-T", 5], "--epsilon"),
    (["sigma", "-e", 1, "-q", 0.1, "-T", 5, "--tol", 0], "--tol"),
    (["ledger", "no/such/ledger.jsonl"], "no such file"),
])
def test_bad_input_one_clear_line(run_popri, args, needle):
    p = run_popri(["account", *map(str, args)])
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("popri: error:") and needle in lines[0]


def test_bad_ledger_line_names_file_line_field(run_popri, tmp_path):
    f = tmp_path / "ledger.jsonl"
    write_jsonl(f, [_entry("a", 2.0, 0.1, 5, "x")])
    with open(f, "a") as fh:
        fh.write(json.dumps({"stage": "b", "mechanism": "gaussian", "sample_rate": 1,
                             "steps": 1}) + "\n")
    p = run_popri(["account", "ledger", f])
    assert p.returncode == 2
    assert p.stderr.strip() == (f"popri: error: {f}:2: field 'noise_multiplier': "
                                "missing required ledger field")


def test_non_integer_steps_is_a_usage_error(run_popri):
    p = run_popri(["account", "epsilon", "-z", 1, "-q", 0.1, "-T", 2.5])
    assert p.returncode == 2 and "--steps" in p.stderr and p.stdout == ""


def test_help_explains_defaults_and_neighbouring(run_popri):
    def text(*args):  # help as one line of words, without rich's box-drawing characters
        return " ".join(re.sub(r"[\u2500-\u257f]", " ", ok(run_popri, *args)).split())

    assert "rdp" in text("--help") and "pld" in text("--help")
    for sub in ("epsilon", "sigma", "ledger"):
        h = text(sub, "--help")
        assert "one client's whole data (user-level DP): added or removed" in h
        assert "replaced under fixed-size sampling" in h
    eps_help = text("epsilon", "--help")
    assert "POPri D.1" in eps_help and "PrE-Text D.1" in eps_help and "3e-6" in eps_help
    assert "replace one client" in eps_help and "--sampling" in eps_help
    led = text("ledger", "--help")
    assert "not a DP guarantee" in led and "--convention" in led


def test_an_empty_ledger_says_it_holds_no_entries(run_popri, tmp_path):
    """Hostile case N07: a directory whose ledger.jsonl is empty (e.g. a release rolled back)
    used to say "pass --delta", and with --delta "nothing to compose".  One line saying the
    ledger holds no entries, exit 2 (a silent epsilon 0 would pass --max-epsilon while the
    path, or the release, is wrong), with or without --delta and --json."""
    (tmp_path / "ledger.jsonl").write_text("")
    for extra in ([], ["--delta", "1e-5"], ["--json", "--max-epsilon", "1"]):
        p = run_popri(["account", "ledger", tmp_path, *extra])
        assert p.returncode == 2 and p.stdout == "", p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0] == (f"popri: error: {tmp_path}: the ledger holds no "
                                                "entries (no DP release is recorded there): "
                                                "nothing to total"), lines


def _in_process(capsys, args):
    """`popri ARGS` in this process (popri.cli.process.run: the console script's exit codes and
    one-line errors), for the option loop below: ~46 invocations at ~1.5 s of start-up each as
    processes (the other tests of this file run the real console script)."""
    from types import SimpleNamespace

    from popri.cli import app, process

    capsys.readouterr()
    rc = process.run(app.command(), [str(a) for a in args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)


def test_every_printed_epsilon_names_the_relation_the_rule_gives(capsys, tmp_path):
    """Each sub-command over its sampling options (poisson | fixed, and the ledger's none),
    q < 1 and q = 1, --convention where it exists, each accountant: the relation printed (text
    and --json) is the one popri.privacy.relations.of_sampling gives -- a fixed L of N is
    replace one client at q = 1 too (popri.federated.participation.sample_clients records a
    fixed L = N as 'fixed').  Before: --sampling fixed at q = 1 printed add/remove where its help
    said replace one (z relative to 2C) (issue 43, item 4)."""
    from popri.privacy.relations import PAPERS_NOTE, of_sampling

    def run_popri(args):
        return _in_process(capsys, args)

    def rule(sampling, q, convention=None):
        return of_sampling(sampling, convention)

    for sub, val in (("epsilon", ["-z", 2]), ("sigma", ["-e", 10, "--tol", 0.1])):
        for sampling in ("poisson", "fixed"):
            for q in (0.5, 1):
                for acc in ("rdp", "pld"):
                    args = ["account", sub, *val, "-q", q, "-T", 3, "--sampling", sampling,
                            "-a", acc]
                    p, j = run_popri(args), run_popri([*args, "--json"])
                    if sampling == "fixed" and q < 1 and acc == "pld":  # RDP only
                        assert p.returncode == j.returncode == 2 and "--accountant" in p.stderr
                        continue
                    assert p.returncode == j.returncode == 0, (args, p.stderr, j.stderr)
                    want = rule(sampling, q)
                    d = json.loads(j.stdout)
                    assert d["neighbouring"] == want, (args, d)
                    tail = p.stdout.rstrip().rsplit("; ", 1)[1]
                    assert tail == want + ")", (args, p.stdout)
                    if sampling == "fixed":
                        assert want == "replace one client"
    # the ledger: one entry as a stage records it (its sampling at q, its relation by the rule
    # under the convention it was recorded under, the sensitivity under that relation), totalled
    # by each accountant without and with --convention papers
    for sampling, q, convention in (("none", 1, None), ("poisson", 0.5, None),
                                    ("fixed", 0.5, None), ("fixed", 0.5, "papers")):
        rel = rule(sampling, q, convention)
        d = tmp_path / f"{sampling}-{convention}"
        d.mkdir()
        write_jsonl(d / "ledger.jsonl", [{
            **_entry("score", 2.0, q, 3, f"{sampling}-{convention}", sampling=sampling),
            "neighbouring": rel, "sensitivity": 2.0 if rel == "replace one client" else 1.0}])
        unproven = convention == "papers"  # fixed under add/remove: what popri <= 0.3 recorded
        for acc in ("rdp", "pld"):
            for conv in ([], ["--convention", "papers"]) if sampling != "none" else ([],):
                p = run_popri(["account", "ledger", d, "-a", acc, *conv, "--json"])
                if (sampling == "fixed" and not unproven and acc == "pld") or \
                        (unproven and not conv):
                    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
                    continue
                assert p.returncode == 0, (sampling, convention, acc, conv, p.stderr)
                t = json.loads(p.stdout)
                assert t["neighbouring"] == rel and t["dp_guarantee"] is not unproven, t
                assert t["guarantee"] == ("NOT A DP GUARANTEE (papers' convention)"
                                          if unproven else f"(eps, delta)-DP under {rel}")
                assert (PAPERS_NOTE in t.get("note", "")) is unproven, t
