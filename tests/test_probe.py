"""The per-round view of POPri's learning (issue 24): the probe's distances, fluency and
diversity (popri/eval/probe.py), the paired control difference, held-out DPO pairs and
checkpoint selection by a low-variance distance.

    python -m pytest -q tests/test_probe.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_jsonl
from popri.eval import probe as P


def test_distinct_n_by_hand():
    assert P.distinct_n(["a b a b", "a b"], 1) == pytest.approx(2 / 6)
    assert P.distinct_n(["a b a b", "a b"], 2) == pytest.approx(2 / 4)  # (a b), (b a)
    assert P.distinct_n(["a"], 2) is None


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.integers(5, 40), st.integers(2, 12))
def test_mmd2_is_symmetric_and_near_zero_for_one_distribution(seed, n, d):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n + 3, d))
    h = P.median_bandwidth(x, y)
    assert P.mmd2_unbiased(x, y, h) == pytest.approx(P.mmd2_unbiased(y, x, h))
    assert abs(P.mmd2_unbiased(x, y, h)) < 1.0


def test_mmd2_is_unbiased_and_grows_with_a_shift():
    """E[MMD^2_u] = 0 when both samples come from one distribution (unlike the biased V
    statistic, which is positive); a mean shift makes it clearly positive."""
    rng = np.random.default_rng(0)
    vals = [P.mmd2_unbiased(rng.normal(size=(20, 4)), rng.normal(size=(20, 4)), 2.0)
            for _ in range(400)]
    assert abs(np.mean(vals)) < 3 * np.std(vals) / np.sqrt(len(vals))
    shifted = P.mmd2_unbiased(rng.normal(size=(60, 4)) + 1.5, rng.normal(size=(60, 4)), 2.0)
    assert shifted > 10 * np.std(vals)


def test_distances_follow_the_target_and_report_ses():
    rng = np.random.default_rng(1)
    target = rng.normal(size=(80, 8)) + np.eye(8)[0] * 3
    near = target[:40] + 0.1 * rng.normal(size=(40, 8))
    far = rng.normal(size=(40, 8)) - np.eye(8)[0] * 3
    a, b = P.distances(near, target, n_boot=50), P.distances(far, target, n_boot=50)
    assert a["mean_cosine"] > b["mean_cosine"] and a["mmd2"] < b["mmd2"]
    assert a["mean_cosine_se"] > 0 and a["mmd2_se"] > 0 and a["samples"] == 40


def test_cli_probe_marks_a_private_diagnostic(tiny_st_model, tmp_path, run_popri):
    samples = write_jsonl(tmp_path / "probe.jsonl", [
        {"id": f"s{i}", "text": f"the nation grows strong in year {i}"} for i in range(6)])
    val = write_jsonl(tmp_path / "val.jsonl", [
        {"id": f"v{i}", "text": f"our union and its people number {i}"} for i in range(8)])
    p = run_popri(["eval", "probe", samples, "--target", val, "--embed-model", tiny_st_model,
                   "--json"], check=True)
    r = json.loads(p.stdout)
    assert r["private_diagnostic"] is True and "never a release" in r["note"]
    assert -1 <= r["mean_cosine"] <= 1 and r["samples"] == 6 and r["target"] == 8
    assert 0 < r["distinct_1"] <= 1 and "perplexity" not in r


def test_eval_diff_is_the_paired_accuracy_difference(tmp_path, run_popri):
    rows = lambda acc: [{"client_id": f"c{k}", "tokens": 100, "correct": int(100 * a)}  # noqa
                        for k, a in enumerate(acc)]
    m = write_jsonl(tmp_path / "m.jsonl", rows([0.5, 0.6, 0.7, 0.4]))
    c = write_jsonl(tmp_path / "c.jsonl", rows([0.4, 0.5, 0.6, 0.3]))
    r = json.loads(run_popri(["eval", "diff", "--method", m, "--control", c, "--json"],
                             check=True).stdout)
    assert r["acc_minus_control"] == pytest.approx(0.1)
    assert r["acc_minus_control_se"] == pytest.approx(0.0, abs=1e-12)  # the same gain everywhere


def test_holdout_keeps_whole_prompts_apart():
    from popri.methods.popri.dpo import split_holdout

    recs = [{"prompt": f"p{i // 2}", "prompt_id": i // 2, "chosen": "a", "rejected": "b"}
            for i in range(20)]
    train, held = split_holdout(recs, 0.3, seed=0)
    assert len(held) == 6 and len(train) == 14  # 3 of 10 prompts, 2 pairs each
    assert not {r["prompt_id"] for r in train} & {r["prompt_id"] for r in held}
    assert split_holdout(recs, 0.3, seed=0) == (train, held)


@pytest.mark.parametrize("by", ["mean-cosine", "mmd", "fid"])
def test_selection_picks_the_checkpoint_closest_by_each_distance(by):
    from popri.methods.popri.select import select_checkpoint

    rng = np.random.default_rng(0)
    val = rng.normal(size=(60, 6)) + np.eye(6)[0] * 2
    samples = {"near": val[:30] + 0.05 * rng.normal(size=(30, 6)),
               "far": rng.normal(size=(30, 6)) - np.eye(6)[0] * 2}
    best, res = select_checkpoint(["far", "near"], base_model="m", val_embeddings=val,
                                  generate_fn=lambda ck: [ck] * 30,
                                  embed_fn=lambda texts: samples[texts[0]], select_by=by)
    assert best == "near" and all(by in r for r in res)


def test_mmd_selection_needs_samples_not_dp_statistics():
    from popri.core.errors import InputError
    from popri.methods.popri.select import select_checkpoint

    with pytest.raises(InputError, match="mean-cosine or fid"):
        select_checkpoint(["a"], base_model="m", val_stats=(np.zeros(3), np.eye(3)),
                          generate_fn=lambda ck: ["x", "y"], embed_fn=lambda t: np.eye(2, 3),
                          select_by="mmd")
