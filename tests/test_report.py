"""popri report: a Markdown and a self-contained HTML report of fake run directories (no
models), every figure a real, non-blank PNG.

    python -m pytest -q tests/test_report.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import emb_set, write_jsonl

pytest.importorskip("matplotlib")


def _ledger(path: Path, z: float, rounds=(1, 2)) -> None:
    from popri.privacy.ledger import LedgerEntry

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [LedgerEntry(stage="score", mechanism="gaussian", noise_multiplier=z, sample_rate=1.0,
                        steps=1, delta=3e-6, sensitivity=1.0, release_id=f"r{t}-{z}",
                        params={"round": t}).to_dict() for t in rounds]
    write_jsonl(path, rows)


def fake_run(root: Path, name: str, eps: float, acc: float, z: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    methods = {"popri": {"accuracy": acc, "accuracy_se": 0.006, "loss": 4.1, "tokens": 1000,
                         "clients": 10},
               "t0": {"accuracy": 0.291, "accuracy_se": 0.007, "loss": 4.2, "tokens": 1000,
                      "clients": 10},
               "eps0": {"accuracy": 0.290, "accuracy_se": 0.007, "loss": 4.2, "tokens": 1000,
                        "clients": 10},
               "epsinf": {"accuracy": 0.310, "accuracy_se": 0.005, "loss": 3.9, "tokens": 1000,
                          "clients": 10}}
    gap = (acc - 0.290) / 0.020
    (run / "results.json").write_text(json.dumps({
        "run_dir": str(run), "epsilon": eps, "delta": 3e-6, "accountant": "rdp",
        "noise_multiplier": z, "sample_rate": 1.0, "rounds": 2, "prompts": 4,
        "samples_per_prompt": 2, "num_synthetic": 40, "generator": "tiny", "downstream": "tiny",
        "method": "popri", "seed": 0, "methods": methods,
        "budget": {"epsilon": eps * 1.2, "delta": 3e-6, "accountant": "rdp"},
        "mode": "research", "mode_note": "research mode",
        "gap_closed": {"gap_closed": gap, "gap_closed_se": 0.1,
                       "gap_closed_ci": [gap - .2, gap + .2]},
        "control": {"acc_minus_control": acc - 0.291, "acc_minus_control_se": 0.003,
                    "acc_minus_control_ci": [acc - 0.297, acc - 0.285]},
        "recovery_rate_per_round": [0.7, 0.8]}))
    rows = []
    for t in range(3):
        rows.append({"round": t, "stage": "probe", "private_diagnostic": True,
                     "mean_cosine": 0.80 + 0.03 * t, "mean_cosine_se": 0.01,
                     "mmd2": 0.05 - 0.01 * t, "mmd2_se": 0.004, "self_cosine": 0.4,
                     "distinct_1": 0.5, "distinct_2": 0.8 - 0.02 * t, "perplexity": 30 - t,
                     "loss": 3.4, "samples": 16})
        if t:
            rows += [{"round": t, "stage": "score", "released_mean": 0.1 * t, "chosen_mean": 0.3,
                      "rejected_mean": -0.2, "samples": 20, "pairs": 8},
                     {"round": t, "stage": "prefs", "private_diagnostic": True,
                      "recovery_rate": 0.6 + 0.1 * t},
                     {"round": t, "stage": "dpo", "train_loss": 0.69 - 0.05 * t,
                      "last_epoch_loss": 0.66 - 0.05 * t, "steps": 6, "seconds_per_step": 0.1,
                      "train_eval_margin": 0.1 * t, "train_eval_accuracy": 0.6,
                      "holdout_margin": 0.05 * t, "holdout_accuracy": 0.55, "holdout_pairs": 2}]
    write_jsonl(run / "metrics.jsonl", rows)
    rng = np.random.default_rng(int(z * 10))
    (run / "round1").mkdir()
    write_jsonl(run / "round1" / "prefs.jsonl", [
        {"prompt": "p", "chosen": "a", "rejected": "b", "prompt_id": i,
         "chosen_score": float(rng.normal(0.5, 0.3)),
         "rejected_score": float(rng.normal(-0.3, 0.3))}
        for i in range(30)])
    (run / "round1" / "dpo").mkdir()
    (run / "round1" / "dpo" / "metrics.json").write_text(json.dumps({"steps": [
        {"step": s, "epoch": s / 3, "loss": 0.69 - 0.02 * s, "rewards/margins": 0.01 * s}
        for s in range(1, 7)]}))
    (run / "embeddings").mkdir()
    emb_set(run / "embeddings" / "val.npy", rng.normal(size=(40, 8)).astype(np.float32))
    emb_set(run / "embeddings" / "synthetic.npy",
            (rng.normal(size=(30, 8)) + 0.5).astype(np.float32))
    _ledger(run / "round1" / "ledger.jsonl", z, rounds=(1,))
    _ledger(run / "round2" / "ledger.jsonl", z, rounds=(2,))
    return run


@pytest.fixture
def two_runs(tmp_path):
    return (fake_run(tmp_path / "runs", "popri-eps1", 1.0, 0.300, 3.0),
            fake_run(tmp_path / "runs", "popri-eps4", 4.0, 0.305, 1.0))


def test_report_of_two_runs(two_runs, tmp_path, run_popri):
    import matplotlib.image as mpimg

    out = tmp_path / "report"
    p = run_popri(["report", *two_runs, "--out", out, "--json"])
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    html_path = Path(res["html"])
    assert html_path == out / "report.html" and html_path.is_file()
    page = html_path.read_text(encoding="utf-8")
    assert "data:image/png;base64," in page
    assert 'src="http' not in page and 'href="http' not in page
    assert "<link" not in page and "<script" not in page
    md = (out / "report.md").read_text(encoding="utf-8")
    figs = res["figures"]
    for kind in ("probe-distance", "probe-quality", "tuning", "tuning-steps", "scores",
                 "prefs-hist", "pca", "epsilon"):
        for run in ("popri-eps1", "popri-eps4"):
            assert f"{run}-{kind}.png" in figs, (kind, run, res["notes"])
    assert "privacy-utility.png" in figs and "method-comparison.png" in figs
    for name in figs:
        f = out / name
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        img = mpimg.imread(f)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name
        assert float(img[..., :3].std()) > 0.01, f"{name} is blank"
        assert f"]({name})" in md, f"report.md does not show {name}"
    # the results table of each run, with the intervals results.json has
    assert "| method | epsilon |" in md and "gap closed 95% interval" in md
    assert "<table>" in page
    # what does not apply to the method is not drawn and not said in the report (issue 37: a
    # POPri report no longer ends with 'DP-FL rounds: skipped'); a figure of the method's own
    # rounds is asked of the method (Method.round_panels: DP-FL's), so a POPri run has none
    assert not any("DP-FL" in n for n in res["not_shown"])
    assert "DP-FL" not in md and "skipped" not in md
    assert (out / ".popri-output").is_file()


def test_report_stdout_is_the_html_path_and_reruns(two_runs, tmp_path, run_popri):
    out = tmp_path / "r"
    for _ in range(2):  # a second report replaces the first one (ours)
        p = run_popri(["report", two_runs[0], "--out", out])
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == str(out / "report.html")
    assert (out / "popri-eps1-epsilon.png").is_file()


def test_epsilon_per_round_composes_cumulatively(two_runs):
    from popri.report import epsilon_per_round
    from popri.privacy.accounting import compose
    from popri.privacy.ledger import read_ledger

    d = epsilon_per_round(two_runs[0])
    assert d["x"] == [1, 2] and d["by_round"]
    e1 = read_ledger(two_runs[0] / "round1" / "ledger.jsonl")
    e2 = read_ledger(two_runs[0] / "round2" / "ledger.jsonl")
    assert d["epsilon"][0] == pytest.approx(compose(e1, 3e-6, "rdp").epsilon)
    assert d["epsilon"][1] == pytest.approx(compose(e1 + e2, 3e-6, "rdp").epsilon)
    assert d["epsilon"][1] > d["epsilon"][0]


def test_partial_run_is_notes_not_a_crash(tmp_path, run_popri):
    run = tmp_path / "partial"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"round": 0, "stage": "probe", "mean_cosine": 0.8}\n'
                                       '{"round": 1, "stage": "pro')  # cut mid-write
    out = tmp_path / "rep"
    p = run_popri(["report", run, "--out", out, "--json"])
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    # one probed round: its values are a table line, not a panel of single dots (issue 37)
    assert "partial-probe-distance.png" not in res["figures"]
    md = (out / "report.md").read_text()
    assert "mean cosine +- SE | 0.8 (round 0)" in md
    assert any("no results.json" in n for n in res["notes"])
    assert any("1 unreadable line(s) ignored" in n for n in res["notes"])
    assert "no results.json" in md and "no verdict" in md


def test_not_a_run_directory_is_one_line_exit_2(tmp_path, run_popri):
    d = tmp_path / "empty"
    d.mkdir()
    p = run_popri(["report", d, "--out", tmp_path / "o"])
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0
    assert p.stderr.startswith("popri: error:") and "not a run directory" in p.stderr
    assert not (tmp_path / "o").exists()


def test_rerun_keeps_the_users_files_and_drops_the_old_figures(two_runs, tmp_path, run_popri):
    """The report is swapped in whole (issue 37); what the user keeps next to it stays."""
    out = tmp_path / "r"
    assert run_popri(["report", *two_runs, "--out", out]).returncode == 0
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "x.txt").write_text("also mine")
    assert (out / "popri-eps4-epsilon.png").is_file()
    p = run_popri(["report", two_runs[0], "--out", out])
    assert p.returncode == 0, p.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "sub" / "x.txt").read_text() == "also mine"
    assert not (out / "popri-eps4-epsilon.png").exists()  # the earlier report's own figures
    assert (out / "popri-eps1-epsilon.png").is_file()
    assert not list(tmp_path.glob(".r.*"))  # no staging directory left


def test_the_same_run_named_twice_is_reported_once(two_runs, tmp_path, run_popri):
    """Hostile case H05 (issue 66): `popri report R R` made a report of 2 runs with every
    figure twice; the repeat (also by another path to the same directory) is reported once."""
    a = two_runs[0]
    other = Path(a).parent / "." / Path(a).name
    p = run_popri(["report", a, other, a, "--out", tmp_path / "rep", "--json"])
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    md = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "again: reported once" in p.stderr
    assert sum(1 for f in res["figures"] if f.endswith("-epsilon.png")) == 1
    runs_line = next(x for x in md.splitlines() if x.startswith("Runs: "))
    assert runs_line.count("popri-eps1") == 1 and "," not in runs_line
