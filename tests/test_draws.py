"""Draws and their random sources (issue 65): what each draw of the final set and its T = 0
control redraws (``draw_sources``), the test sample, and the per-draw rows of results.json.

    python -m pytest -q tests/test_draws.py
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from popri.core.errors import PopriError
from popri.eval.downstream import load_records
from popri.kit import draw_seed, sample_seed
from popri.pipeline import config as C
from popri.pipeline.driver import Run


def _plan(tmp_path, *sets: str) -> list[str]:
    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "rounds=1", "draws=3", "seed=2",
                        "privacy.noise_multiplier=1.5", "privacy.epsilon=null", *sets])
    run = Run(cfg, dry_run=True)
    run.execute()
    return run.runner.commands


def _gen(cmds, k):
    return [c for c in cmds if " --num-samples " in c and f"/draws/d{k}/" in c]


def _train(cmds, who):
    (c,) = [c for c in cmds if " train-downstream " in c and f"downstream/{who} " in c]
    return c


def _eval(cmds, who):
    (c,) = [c for c in cmds if " eval accuracy " in c and f"eval/{who}.clients.jsonl" in c]
    return c


def _opt(cmd, name):
    m = re.search(rf" {name} (\S+)", cmd)
    return m.group(1) if m else None


def test_the_default_redraws_generation_and_training_and_keeps_the_first_test_records(tmp_path):
    cmds = _plan(tmp_path)
    for k in (1, 2):
        assert len(_gen(cmds, k)) == 2
        for who in ("popri", "t0"):
            t = _train(cmds, f"{who}-d{k}")
            assert _opt(t, "--seed") == str(draw_seed(2, k)) and f"/draws/d{k}/" in t
            assert _opt(_eval(cmds, f"{who}-d{k}"), "--sample-seed") is None
    assert _opt(_eval(cmds, "popri"), "--sample-seed") is None


def test_training_alone_redraws_the_downstream_seed_on_draw_zeros_sets(tmp_path):
    cmds = _plan(tmp_path, "draw_sources=training")
    assert not any("/draws/" in c for c in cmds if " --num-samples " in c)
    run = tmp_path / "run"
    for k in (1, 2):
        for who, syn in (("popri", "synthetic.jsonl"), ("t0", "synthetic_t0.jsonl")):
            t = _train(cmds, f"{who}-d{k}")
            assert t.split(" train-downstream ")[1].split()[0] == str(run / syn)
            assert _opt(t, "--seed") == str(draw_seed(2, k))


def test_generation_alone_redraws_the_sets_and_holds_the_downstream_seed(tmp_path):
    cmds = _plan(tmp_path, "draw_sources=generation")
    for k in (1, 2):
        assert len(_gen(cmds, k)) == 2
        for who in ("popri", "t0"):
            assert _opt(_train(cmds, f"{who}-d{k}"), "--seed") == "2"  # draw 0's
    assert _opt(_train(cmds, "popri"), "--seed") == "2"


def test_test_alone_evaluates_draw_zeros_models_on_a_new_sample_shared_by_the_arms(tmp_path):
    cmds = _plan(tmp_path, "draw_sources=test")
    run = tmp_path / "run"
    assert not any("/draws/" in c for c in cmds if " --num-samples " in c)
    assert not any(" train-downstream " in c and "-d1 " in c for c in cmds)
    for k in (1, 2):
        seeds = set()
        for who in ("popri", "t0"):
            e = _eval(cmds, f"{who}-d{k}")
            assert _opt(e, "--model") == str(run / "downstream" / who)
            seeds.add(_opt(e, "--sample-seed"))
        assert seeds == {str(sample_seed(2, k))}  # the arms share the draw's test sample
    # draw 0 samples its test records as the others do, and so do the baselines beside it
    zero = {_opt(_eval(cmds, w), "--sample-seed") for w in ("popri", "t0", "eps0", "epsinf")}
    assert zero == {str(sample_seed(2, 0))}
    assert len({sample_seed(2, k) for k in range(3)} | {draw_seed(2, 1), 2}) == 5


@pytest.mark.parametrize("sets,msg", [
    (["draw_sources=generation,seeds"], "field 'draw_sources': must be one of"),
    (["draw_sources=test,test"], "field 'draw_sources': names a source twice"),
    (["draw_sources=test", "downstream.eval_max_samples=null"],
     "field 'draw_sources': test redraws"),
])
def test_draw_sources_errors_name_the_field(sets, msg):
    with pytest.raises(PopriError, match=msg):
        C.load(None, ["draws=2", *sets])


def test_a_test_sample_is_seeded_keeps_file_order_and_is_the_same_for_every_model(tmp_path):
    recs = [{"id": f"r{i}", "client_id": f"c{i % 7}", "text": f"t {i}"} for i in range(50)]
    a, _ = load_records(recs, "test", max_samples=20, sample_seed=5)
    b, _ = load_records(recs, "test", max_samples=20, sample_seed=5)
    c, _ = load_records(recs, "test", max_samples=20, sample_seed=6)
    first, _ = load_records(recs, "test", max_samples=20)
    idx = [int(r["id"][1:]) for r in a]
    assert a == b and len(a) == 20 and idx == sorted(idx) and len(set(idx)) == 20
    assert a != c and a != first and first == recs[:20]
    assert load_records(recs, "test", max_samples=80, sample_seed=5)[0] == recs
    # every record is as likely to be drawn: over many seeds, about 20 / 50 each
    hits = np.zeros(50)
    for s in range(400):
        for r in load_records(recs, "test", max_samples=20, sample_seed=s)[0]:
            hits[int(r["id"][1:])] += 1
    assert np.all(np.abs(hits / 400 - 0.4) < 0.1)


def test_results_keep_every_draw_of_both_arms(tmp_path):
    """results.json's ``draws``: accuracy, its SE, loss and tokens of both arms at every draw,
    the paired difference, and which draw of each source it took."""
    from popri.pipeline.results import draw_rows

    cfg = C.load(None, [f"run_dir={tmp_path / 'run'}", "draws=3", "draw_sources=training,test"])
    run = Run(cfg, dry_run=True)
    E = run.paths.eval
    E.mkdir(parents=True)
    for k, sfx in enumerate(["", "-d1", "-d2"]):
        for who, acc in (("popri", 0.30 + k / 100), ("t0", 0.29)):
            (E / f"{who}{sfx}.json").write_text(json.dumps(
                {"accuracy": acc, "accuracy_se": 0.004, "loss": 3.1 + k, "tokens": 900,
                 "clients": 40, "sample_seed": sample_seed(0, k), "bootstrap": 50}))
        if k != 1:  # draw 1 not finished yet: no row
            (E / f"control{sfx}.json").write_text(json.dumps(
                {"acc_minus_control": 0.01 + k / 100, "acc_minus_control_se": 0.003}))
    rows = draw_rows(run)
    assert [r["draw"] for r in rows] == [0, 2]
    assert rows[1]["streams"] == {"generation": 0, "training": 2, "test": 2}
    assert rows[0]["streams"] == {"generation": 0, "training": 0, "test": 0}
    assert rows[1]["arms"]["popri"] == {"accuracy": 0.32, "accuracy_se": 0.004, "loss": 5.1,
                                        "tokens": 900, "clients": 40,
                                        "sample_seed": sample_seed(0, 2),
                                        "perplexity": pytest.approx(np.exp(5.1))}
    assert rows[1]["arms"]["t0"]["loss"] == 5.1 and rows[1]["acc_minus_control"] == 0.03


@pytest.mark.slow
def test_a_curve_run_on_tiny_models_is_paired_across_arms_sizes_and_draws(
        tmp_path, run_popri, tiny_lm, tiny_st_model):
    """``num_synthetic: [6, 12]`` with 2 draws on tiny models: every arm at every n and draw
    trained with the draw's streams (the method and its control: the same initial weights and
    batches), the curve and its summary in results.json, and the report draws the curve."""
    from test_run_e2e import tiny_inputs as _inputs, tiny_overrides

    data, pub = _inputs.__wrapped__(tmp_path, run_popri)
    run = tmp_path / "run"
    ov = [o for o in tiny_overrides(run, data, pub, tiny_lm, tiny_st_model)
          if not o.startswith("num_synthetic=")]
    ov += ["rounds=1", "draws=2", "num_synthetic=[6,12]", "probe.enabled=false",
           "dpo.select_checkpoint=false", "downstream.quality=true"]
    p = run_popri(["run", *[f"--set={o}" for o in ov]])
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    D = run / "downstream"

    def streams(tag):
        return json.loads((D / tag / "metrics.json").read_text())["streams"]

    for sfx in ("", "-d1"):
        for at in ("-n6", ""):
            a, b = streams(f"popri{at}{sfx}"), streams(f"t0{at}{sfx}")
            assert a == b, (at, sfx)
        # the draw's own training stream at both sizes; another size, another order
        assert streams(f"popri-n6{sfx}")["seed"] == streams(f"popri{sfx}")["seed"]
        assert streams(f"popri-n6{sfx}")["order_sha256"] != streams(f"popri{sfx}")["order_sha256"]
    assert streams("popri-n6")["seed"] != streams("popri-n6-d1")["seed"]
    assert streams("epsinf-n6")["order_sha256"] == streams("popri-n6")["order_sha256"]
    m6 = json.loads((D / "popri-n6" / "metrics.json").read_text())
    assert m6["n_train"] == 6
    curve = res["curve"]
    got = {(r["arm"], r["n"], r["draw"]) for r in curve if not r.get("ceiling")}
    assert got == {(a, n, k) for a in ("popri", "t0") for n in (6, 12) for k in (0, 1)} | {
        (a, n, 0) for a in ("epsinf", "eps0") for n in (6, 12)}
    (top,) = [r for r in curve if r.get("ceiling")]
    assert top["arm"] == "epsinf" and top["n"] > 12
    r6 = next(r for r in curve if (r["arm"], r["n"], r["draw"]) == ("popri", 6, 1))
    ctl = json.loads((run / "eval" / "control-n6-d1.json").read_text())
    assert r6["acc_minus_control"] == ctl["acc_minus_control"] and r6["n_train"] == 6
    s = {(r["what"], r["arm"], r["n"]): r for r in res["scaling"]}
    assert s[("accuracy", "popri", 6)]["draws"] == 2
    assert s[("accuracy", "popri", 6)]["se_kind"] == "between draws"
    assert s[("minus_control", "popri", 12)]["mean"] == pytest.approx(
        res["control"]["draws"]["mean"])
    assert s[("accuracy", "epsinf", 6)]["se_kind"] == "over test clients"
    # the second opinion at every arm, size and draw: MAUVE on the downstream model's features
    q = json.loads((run / "eval" / "quality-t0-d1.json").read_text())
    assert [x["n"] for x in q["sizes"]] == [6, 12] and q["private_diagnostic"] is True
    t6 = next(r for r in curve if (r["arm"], r["n"], r["draw"]) == ("t0", 6, 1))
    assert t6["mauve"] == q["sizes"][0]["mauve"] and 0 < t6["mauve"] <= 1
    assert t6["distinct_2"] == q["sizes"][0]["distinct_2"]
    assert t6["perplexity"] == pytest.approx(np.exp(t6["loss"]))
    assert s[("mauve", "popri", 12)]["draws"] == 2
    assert res["quality"]["popri"]["mauve"] == json.loads(
        (run / "eval" / "quality-popri.json").read_text())["mauve"]
    assert res["draws"][1]["arms"]["t0"]["mauve"] == q["mauve"]
    assert any("MAUVE" in x for x in res["research_reads"])
    rep = tmp_path / "report"
    p = run_popri(["report", str(run), "--out", str(rep)])
    assert p.returncode == 0, p.stderr[-2000:]
    pngs = [f.name for f in rep.rglob("*-curve.png")]
    assert len(pngs) == 1, sorted(f.name for f in rep.rglob("*.png"))


def test_runs_diff_compares_curves_point_by_point():
    from types import SimpleNamespace

    from popri.pipeline.runs import curve_points, headline_keys

    res = {"method": "popri", "scaling": [
        {"arm": "popri", "n": 96, "what": "accuracy", "mean": 0.20, "se": 0.004},
        {"arm": "popri", "n": 96, "what": "minus_control", "mean": -0.01, "se": 0.003},
        {"arm": "t0", "n": 1536, "what": "accuracy", "mean": 0.25, "se": 0.002}]}
    pts = curve_points(res)
    assert pts == {"curve.popri.n96.accuracy": 0.20, "curve.popri.n96.accuracy_se": 0.004,
                   "curve.popri.n96.minus_control": -0.01,
                   "curve.popri.n96.minus_control_se": 0.003,
                   "curve.t0.n1536.accuracy": 0.25, "curve.t0.n1536.accuracy_se": 0.002}
    keys = [k for k, _ in headline_keys(SimpleNamespace(results=res),
                                        SimpleNamespace(results={"method": "popri"}))]
    assert "curve.popri.n96.minus_control" in keys and "curve.popri.n1536.accuracy" in keys
