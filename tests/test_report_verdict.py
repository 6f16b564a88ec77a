"""popri report's verdict block, samples page, palette and one-round runs (issue 37), on fake
run directories (no models).

    python -m pytest -q tests/test_report_verdict.py
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from conftest import write_jsonl
from test_report import _ledger, fake_run

pytest.importorskip("matplotlib")

Z = 1.959963984540054


def _edit(run: Path, **fields) -> dict:
    r = json.loads((run / "results.json").read_text())
    for k, v in fields.items():
        if v is None:
            r.pop(k, None)
        else:
            r[k] = v
    (run / "results.json").write_text(json.dumps(r))
    return r


def _relation(run: Path, **extra) -> dict:
    return _edit(run, neighbouring="add/remove one client", dp_guarantee=True,
                 guarantee="(eps, delta)-DP under add/remove one client", **extra)


def _report(run_popri, runs, out: Path) -> dict:
    p = run_popri(["report", *runs, "--out", out, "--json"])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _md_verdict(out: Path) -> str:
    md = (out / "report.md").read_text(encoding="utf-8")
    return md.split("## Verdict", 1)[1].split("\n## ", 1)[0]


# --------------------------------------------------------------------------- the verdict
def test_research_one_draw_verdict_numbers(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "won", 1.0, 0.300, 3.0)
    r = _relation(run)
    res = _report(run_popri, [run], tmp_path / "rep")
    v = res["verdicts"][0]
    c = r["control"]
    d, se = c["acc_minus_control"], c["acc_minus_control_se"]
    lo, hi = c["acc_minus_control_ci"]  # the stored interval, read as it is (N03)
    assert v["control"]["value"] == pytest.approx(d)
    assert v["control"]["low"] == pytest.approx(lo) and v["control"]["high"] == pytest.approx(hi)
    assert lo != pytest.approx(d - Z * se)
    # one draw excludes 0 over test clients, yet it is no verdict (issue 43, item 5)
    assert v["control"]["low"] > 0 and " beat" not in v["sentence"].replace("cannot", "")
    assert "one draw: POPri minus its untuned generator (T = 0)" in v["sentence"]
    assert "leaves out the randomness of generation and training" in v["sentence"]
    assert "draws: 3" in v["sentence"]
    assert f"{d:+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}]" in v["sentence"]
    assert "epsilon = 1.000" in v["privacy"] and "add/remove one client" in v["privacy"]
    assert v["dp_guarantee"] is True
    # eps = 0: no gap_closed.acc_minus_eps0 and no per-client files: unpaired, said so
    e = v["eps0"]
    m = r["methods"]
    se0 = math.hypot(m["popri"]["accuracy_se"], m["eps0"]["accuracy_se"])
    assert e["value"] == pytest.approx(m["popri"]["accuracy"] - m["eps0"]["accuracy"])
    assert e["high"] == pytest.approx(e["value"] + Z * se0) and e["paired"] is False
    md = _md_verdict(tmp_path / "rep")
    assert "one draw: POPri minus" in md and "UNPAIRED" in md and "beat its" not in md
    assert "10 test clients" in md  # the sample size of every rate
    assert "paired-differences.png" in res["figures"]
    # the verdict opens the report: before the per-run sections
    full = (tmp_path / "rep" / "report.md").read_text()
    assert full.index("## Verdict") < full.index("## Run ")


def test_did_not_beat_and_paired_eps0_from_per_client_files(tmp_path, run_popri):
    from popri.eval.stats import paired_bootstrap

    run = fake_run(tmp_path / "runs", "flat", 1.0, 0.292, 3.0)
    _relation(run, seed=0)
    (run / "eval").mkdir()
    a = [{"client_id": f"c{i}", "tokens": 100, "correct": 30 + (i % 3)} for i in range(12)]
    b = [{"client_id": f"c{i}", "tokens": 100, "correct": 29 + (i % 4)} for i in range(12)]
    write_jsonl(run / "eval" / "popri.clients.jsonl", a)
    write_jsonl(run / "eval" / "eps0.clients.jsonl", b)
    res = _report(run_popri, [run], tmp_path / "rep")
    v = res["verdicts"][0]
    lo, hi = v["control"]["low"], v["control"]["high"]
    assert lo < 0 < hi
    assert "one draw: POPri minus its untuned generator" in v["sentence"]
    assert "did not beat" not in v["sentence"] and "no verdict" in v["sentence"]
    exp = paired_bootstrap([a, b], lambda x, z: x - z, n_boot=1000, seed=0)
    e = v["eps0"]
    assert e["paired"] is True and e["n"] == 12
    assert e["value"] == pytest.approx(exp["value"])
    assert e["low"] == pytest.approx(exp["value"] - Z * exp["se"])


def test_several_draws_use_student_t(tmp_path, run_popri):
    from scipy import stats

    run = fake_run(tmp_path / "runs", "draws", 1.0, 0.300, 3.0)
    per = [0.01, 0.02, 0.03]
    se_b = statistics.stdev(per) / math.sqrt(3)
    r = _relation(run)
    r["control"]["draws"] = {"n": 3, "acc_minus_control": per, "mean": 0.02,
                             "se_between": se_b, "se_within": 0.002}
    _edit(run, control=r["control"])
    res = _report(run_popri, [run], tmp_path / "rep")
    c = res["verdicts"][0]["control"]
    t = stats.t.ppf(0.975, 2)
    assert c["value"] == pytest.approx(0.02)
    assert c["low"] == pytest.approx(0.02 - t * se_b)
    assert c["high"] == pytest.approx(0.02 + t * se_b)
    assert c["n"] == 3 and c["unit"] == "draws"
    # a normal interval would exclude 0; Student's t with 2 d.o.f. does not
    assert 0.02 - Z * se_b > 0 > c["low"]
    assert "did not beat" in res["verdicts"][0]["sentence"]
    assert "3 draws" in _md_verdict(tmp_path / "rep")


def test_the_stored_interval_is_read_not_recomputed(tmp_path, run_popri):
    """N03: a run whose stored interval excludes 0 where +-1.96 SE would not."""
    run = fake_run(tmp_path / "runs", "n03", 1.0, 0.300, 3.0)
    r = _relation(run)
    r["control"].update(acc_minus_control=0.0040, acc_minus_control_se=0.0025,
                        acc_minus_control_ci=[0.0005, 0.0080])
    _edit(run, control=r["control"])
    c = _report(run_popri, [run], tmp_path / "rep")["verdicts"][0]["control"]
    assert (c["low"], c["high"]) == (pytest.approx(0.0005), pytest.approx(0.0080))
    assert r"\[+0.0005, +0.0080\]" in (tmp_path / "rep" / "report.md").read_text()


@pytest.mark.parametrize("per,words", [
    ([0.010, 0.012, 0.011, 0.013], "POPri beat its untuned generator"),
    ([0.010, 0.012], "2 draws are too few for a verdict"),
])
def test_only_three_or_more_draws_decide(tmp_path, run_popri, per, words):
    run = fake_run(tmp_path / "runs", "d", 1.0, 0.300, 3.0)
    r = _relation(run)
    r["control"]["draws"] = {"n": len(per), "acc_minus_control": per,
                             "mean": statistics.fmean(per),
                             "se_between": statistics.stdev(per) / math.sqrt(len(per)),
                             "se_within": 0.002}
    _edit(run, control=r["control"])
    v = _report(run_popri, [run], tmp_path / "rep")["verdicts"][0]
    assert words in v["sentence"]
    html = (tmp_path / "rep" / "report.html").read_text()
    assert ('class="verdict v-good"' in html) == (len(per) >= 3)


def test_release_mode_verdict_says_what_was_released(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "rel", 1.0, 0.300, 3.0)
    write_jsonl(run / "synthetic.jsonl", [{"id": f"s{i}", "text": f"text {i}"} for i in range(7)])
    _relation(run, mode="release", mode_note="release mode", methods={}, control=None,
              gap_closed=None, released=str(run / "synthetic.jsonl"))
    res = _report(run_popri, [run], tmp_path / "rep")
    v = res["verdicts"][0]
    assert v["mode"] == "release" and v["control"] is None and v["eps0"] is None
    assert "released 7 synthetic samples" in v["sentence"]
    assert "epsilon = 1.000" in v["sentence"]
    assert "beat" not in v["sentence"] and "accuracy 0." not in v["sentence"]
    md = _md_verdict(tmp_path / "rep")
    assert "next-token accuracy" not in md
    assert "method-comparison.png" not in res["figures"]
    assert "paired-differences.png" not in res["figures"]


def test_papers_convention_is_not_a_dp_guarantee(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "papers", 1.0, 0.300, 3.0)
    _edit(run, neighbouring="replace one client", dp_guarantee=False,
          guarantee="NOT A DP GUARANTEE (papers' convention)")
    res = _report(run_popri, [run], tmp_path / "rep")
    v = res["verdicts"][0]
    assert v["dp_guarantee"] is False and "NOT A DP GUARANTEE" in v["privacy"]
    assert "NOT A DP GUARANTEE" in _md_verdict(tmp_path / "rep")
    page = (tmp_path / "rep" / "report.html").read_text()
    assert 'class="notdp"' in page


# --------------------------------------------------------------------------- samples page
def test_samples_page_escapes_html_and_says_synthetic(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "inj", 1.0, 0.300, 3.0)
    evil = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>",
            "[click](javascript:alert(3))", "</p><b>bold</b>"]
    write_jsonl(run / "synthetic.jsonl", [{"id": f"<i>{i}", "text": t} for i, t in enumerate(evil)])
    write_jsonl(run / "round1" / "prefs.jsonl", [
        {"prompt": "p", "chosen": evil[0], "rejected": evil[1], "prompt_id": 0,
         "chosen_score": 0.75, "rejected_score": -0.25}])
    res = _report(run_popri, [run], tmp_path / "rep")
    page = (tmp_path / "rep" / "report.html").read_text()
    md = (tmp_path / "rep" / "report.md").read_text()
    for doc in (page, md):
        low = doc.lower()
        assert "<script" not in low and "<img src=x" not in low and "<i>" not in low
        assert "synthetic text written by the generator" in low
    assert "[click](" not in md and "\\[click\\](" in md  # no Markdown link
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "score +0.750" in page and "score -0.250" in page  # the released scores
    assert "## Samples (synthetic text)" in md
    assert res["verdicts"][0]["method"] == "popri"


def test_no_samples_for_a_model_releasing_method(tmp_path, run_popri):
    run = fake_run(tmp_path / "runs", "fl", 1.0, 0.300, 3.0)
    _relation(run, method="dp-fedavg")
    write_jsonl(run / "synthetic.jsonl", [{"id": "a", "text": "x"}])
    _report(run_popri, [run], tmp_path / "rep")
    assert "Samples (synthetic text)" not in (tmp_path / "rep" / "report.md").read_text()


# --------------------------------------------------------------------------- palette, labels
def test_one_colour_per_method_across_figures(tmp_path, run_popri):
    from popri.report.style import PALETTE, ROLES

    a = fake_run(tmp_path / "runs", "a-popri", 1.0, 0.300, 3.0)
    b = fake_run(tmp_path / "runs", "b-pe", 4.0, 0.305, 1.0)
    _relation(a)
    rb = _relation(b, method="pe")
    rb["methods"]["pe"] = rb["methods"].pop("popri")
    _edit(b, methods=rb["methods"])
    for run, names in ((a, ("popri", "t0", "eps0", "epsinf")), (b, ("pe", "eps0"))):
        for name in names:  # downstream/NAME: one line per model, in its method's colour
            d = run / "downstream" / name
            d.mkdir(parents=True)
            (d / "metrics.json").write_text(json.dumps({
                "initial": {"val_accuracy": 0.1, "val_loss": 5.0},
                "history": [{"epoch": 1, "val_accuracy": 0.2, "val_loss": 4.0,
                             "train_loss": 4.5}]}))
    res = _report(run_popri, [a, b], tmp_path / "rep")
    pal = res["palette"]
    seen: dict[str, str] = {}
    for fig, used in pal.items():
        for key, col in used.items():
            if key.startswith("role:"):
                assert col == ROLES[key[5:]]
                continue
            assert col == PALETTE[key], (fig, key)
            assert seen.setdefault(key, col) == col
    method_cols = set(PALETTE.values())
    assert ROLES["chosen"] not in method_cols and ROLES["rejected"] not in method_cols
    assert len(method_cols) == len(PALETTE)  # no two methods share a colour
    assert {"popri", "pe", "t0", "eps0", "epsinf"} <= set(pal["method-comparison.png"])
    assert {"popri", "t0", "eps0", "epsinf"} <= set(pal["a-popri-downstream.png"])
    assert pal["a-popri-probe-distance.png"] == {"popri": PALETTE["popri"]}
    assert "pe" in pal["b-pe-probe-distance.png"]
    # human labels, not internal keys, in the report's text around the figures
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "epsinf/popri/t0" not in md and "params.round" not in md


# --------------------------------------------------------------------------- one round
def _one_round_run(root: Path) -> Path:
    run = root / "one"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "run_dir": str(run), "epsilon": 1.0, "delta": 3e-6, "accountant": "rdp",
        "neighbouring": "add/remove one client", "dp_guarantee": True, "rounds": 1,
        "method": "popri", "seed": 0, "mode": "research", "methods": {},
        "noise_multiplier": 3.0, "sample_rate": 1.0, "budget": {"epsilon": 1.0}}))
    write_jsonl(run / "metrics.jsonl", [
        {"round": 0, "stage": "probe", "mean_cosine": 0.8, "mmd2": 0.05, "samples": 4},
        {"round": 1, "stage": "probe", "mean_cosine": 0.82, "mmd2": 0.04, "samples": 4},
        {"round": 1, "stage": "score", "released_mean": 0.1, "chosen_mean": 0.3,
         "rejected_mean": -0.2, "samples": 12, "pairs": 3},
        {"round": 1, "stage": "prefs", "recovery_rate": 0.67},
        {"round": 1, "stage": "dpo", "train_loss": 0.69, "holdout_accuracy": 0.33,
         "holdout_pairs": 3}])
    _ledger(run / "round1" / "ledger.jsonl", 3.0, rounds=(1,))
    (run / "fl" / "round1").mkdir(parents=True)
    (run / "fl" / "round1" / "round.json").write_text(json.dumps({
        "spec": {"clip": 1.0}, "private_diagnostics": {"local_loss": 3.0, "clipped_share": 0.5,
                                                       "participants": 8}}))
    return run


def test_one_round_run_draws_no_single_point_panels(tmp_path, run_popri):
    run = _one_round_run(tmp_path / "runs")
    res = _report(run_popri, [run], tmp_path / "rep")
    figs = res["figures"]
    assert "one-probe-distance.png" in figs  # rounds 0 and 1: a curve
    for kind in ("tuning", "scores", "fl-rounds", "epsilon"):
        assert f"one-{kind}.png" not in figs, kind
    md = (tmp_path / "rep" / "report.md").read_text()
    sec = md.split("### Per-round values", 1)[1]
    assert "0.33 (round 1, 3 pairs)" in sec  # a rate with its sample size
    assert "0.67 (round 1, 3 pairs)" in sec
    assert "after round 1:" in sec
    assert "skipped" not in md and "DP-FL" not in md.split("### Per-round values")[0]


def test_panels_of_one_round_are_facts():
    from popri.report import figures as report

    facts = []
    rows = [{"round": 1, "stage": "dpo", "train_loss": 0.7, "holdout_accuracy": 0.33,
             "holdout_pairs": 3}]
    got = report._panels(rows, [
        {"title": "loss", "ylabel": "", "lines": [("train_loss", None, "train")]},
        {"title": "acc", "ylabel": "", "lines": [("holdout_accuracy", None, "held-out",
                                                  "holdout_pairs", "pairs")]}],
        "t", "round", method="popri", facts=lambda w, v: facts.append((w, v)))
    assert got is None
    assert ("acc: held-out", "0.33 (round 1, 3 pairs)") in facts


# --------------------------------------------------------------------------- asked of the method
def test_the_method_reads_its_own_files_back(tmp_path, run_popri):
    """A run without metrics.jsonl (an earlier version's): its method's read-back
    (Method.metrics_from_files) gives the per-round rows; DP-FL's own rounds figure comes from
    DPFL.round_panels, and a POPri run with the same files draws none (the report names no
    method: it asks the registry)."""
    from popri.kit.readback import metrics_from_files
    from popri.methods.dpfl.readback import fl_rounds

    fl = tmp_path / "runs" / "fl"
    for t in (1, 2):
        R = fl / "fl" / f"round{t}"
        R.mkdir(parents=True)
        (R / "round.json").write_text(json.dumps({
            "spec": {"clip": 1.0}, "private_diagnostics": {
                "local_loss": 3.0 - t, "update_norm_mean": 0.5 * t, "update_norm_max": t,
                "clipped_share": 0.25 * t, "participants": 8}}))
    (fl / "results.json").write_text(json.dumps({
        "run_dir": str(fl), "method": "dp-fedavg", "mode": "research", "rounds": 2,
        "methods": {}}))
    po = tmp_path / "runs" / "po"
    (po / "round1" / "dpo").mkdir(parents=True)
    np.save(po / "round1" / "scores.npy", np.array([0.1, 0.3], dtype=np.float32))
    write_jsonl(po / "round1" / "prefs.jsonl",
                [{"chosen_score": 0.3, "rejected_score": 0.1}])
    (po / "round1" / "dpo" / "metrics.json").write_text(json.dumps(
        {"train_loss": 0.6, "global_step": 4, "epochs": [{"loss": 0.55}]}))
    (po / "results.json").write_text(json.dumps({
        "run_dir": str(po), "method": "popri", "mode": "research", "rounds": 1,
        "methods": {}}))
    shutil.copytree(fl / "fl", po / "fl")
    notes: list = []
    rows = metrics_from_files(po, None, notes, release=False)
    assert {(r["round"], r["stage"]) for r in rows} == {(1, "score"), (1, "dpo")}
    score = next(r for r in rows if r["stage"] == "score")
    assert score["released_mean"] == pytest.approx(0.2) and score["pairs"] == 1
    assert [r["local_loss"] for r in fl_rounds(fl, None)] == [2.0, 1.0]
    res = _report(run_popri, [fl, po], tmp_path / "rep")
    assert "fl-fl-rounds.png" in res["figures"]
    assert not any(f.startswith("po-fl-rounds") for f in res["figures"])
