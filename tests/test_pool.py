"""The evolving few-shot pool (issue 24; popri/methods/popri/pool.py, `popri prefs pool`).

    python -m pytest -q tests/test_pool.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from popri.core.errors import ConfigError
from popri.methods.popri.pool import chosen_records, evolve


def samples(K=2, J=4):
    return [{"id": f"s{k}-{j}", "round": 1, "prompt_id": k, "sample_idx": j,
             "prompt": f"P{k}", "text": f"text {k}-{j}", "model": "m"}
            for k in range(K) for j in range(J)]


def test_chosen_is_the_top_scored_sample_per_prompt_skipping_degenerate_ones():
    S = samples()
    sc = np.array([.1, .9, .5, .2, .8, .1, .3, .7])
    got = chosen_records(S, sc, None, round_no=3)
    assert [r["text"] for r in got] == ["text 0-1", "text 1-0"]
    assert [r["source"] for r in got] == ["round3", "round3"]
    assert len({r["id"] for r in got}) == 2 and all(r["id"].startswith("pool-r3-") for r in got)
    # no score (or any other number derived from the release) is carried into the pool
    assert all(set(r) == {"id", "text", "source", "prompt_id"} for r in got)
    # a degenerate best sample gives way to the next best; an all-degenerate prompt adds nothing
    S[1]["degenerate"] = True
    for j in range(4):
        S[4 + j]["degenerate"] = True
    got = chosen_records(S, sc, None, round_no=3)
    assert [r["text"] for r in got] == ["text 0-2"]
    # scores matched by id, not by row, when the sidecar names them
    ids = [s["id"] for s in S][::-1]
    got = chosen_records(samples(), sc[::-1], ids, round_no=1)
    assert [r["text"] for r in got] == ["text 0-1", "text 1-0"]


def test_union_keeps_omega_chosen_keeps_only_earlier_chosen_samples():
    omega = [{"id": "o1", "text": "a"}, {"id": "o2", "text": "b"}]
    c1 = [{"id": "pool-r1-p0-s1", "text": "x", "source": "round1", "prompt_id": 0}]
    c2 = [{"id": "pool-r2-p0-s0", "text": "y", "source": "round2", "prompt_id": 0}]
    u1 = evolve(omega, c1, "union")
    assert [r["text"] for r in u1] == ["a", "b", "x"]
    assert [r["text"] for r in evolve(u1, c2, "union")] == ["a", "b", "x", "y"]
    k1 = evolve(omega, c1, "chosen")
    assert [r["text"] for r in k1] == ["x"]
    assert [r["text"] for r in evolve(k1, c2, "chosen")] == ["x", "y"]
    # chosen mode keeps the whole base while the chosen samples are too few for a prompt
    assert [r["text"] for r in evolve(omega, c1, "chosen", min_size=2)] == ["a", "b", "x"]
    assert [r["text"] for r in evolve(k1, c2, "chosen", min_size=2)] == ["x", "y"]
    # an id seen twice keeps its first record
    assert [r["text"] for r in evolve(u1, c1, "union")] == ["a", "b", "x"]
    with pytest.raises(ValueError):
        evolve(omega, c1, "static")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_cli_writes_the_pool_and_refuses_bad_input(run_popri, tmp_path):
    S = samples(K=3, J=2)
    sam = _write(tmp_path / "samples.jsonl", S)
    sc = _write(tmp_path / "scores.jsonl", [{"id": s["id"], "score": float(i % 2)}
                                            for i, s in enumerate(S)])
    base = _write(tmp_path / "omega.jsonl", [{"id": "o1", "text": "omega text"}])
    out = tmp_path / "pool.jsonl"
    p = run_popri(["prefs", "pool", "--samples", sam, "--scores", sc, "--base", base,
                   "--round", "1", "--pool", "union", "--out", out], check=True)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == ["omega text", "text 0-1", "text 1-1", "text 2-1"]
    assert "prefs pool: 4 texts" in p.stderr and p.stdout == ""
    # chained: round 2 in chosen mode drops Omega, keeps round 1's chosen samples
    out2 = tmp_path / "pool2.jsonl"
    run_popri(["prefs", "pool", "--samples", sam, "--scores", sc, "--base", out, "--round", "2",
               "--pool", "chosen", "--out", out2], check=True)
    assert [r["source"] for r in map(json.loads, out2.read_text().splitlines())] == (
        ["round1"] * 3 + ["round2"] * 3)
    # static is not a pool; a score that is not a number names its file, line and field
    p = run_popri(["prefs", "pool", "--samples", sam, "--scores", sc, "--base", base, "--round",
                   "1", "--pool", "static", "--out", tmp_path / "x.jsonl"])
    assert p.returncode == 2 and "--pool" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    bad = _write(tmp_path / "bad.jsonl", [{"id": "s0-0", "score": "high"}])
    p = run_popri(["prefs", "pool", "--samples", sam, "--scores", bad, "--base", base, "--round",
                   "1", "--pool", "union", "--out", tmp_path / "y.jsonl"])
    assert p.returncode == 2 and "bad.jsonl" in p.stderr and "score" in p.stderr
    assert not (tmp_path / "y.jsonl").exists() and not (tmp_path / "x.jsonl").exists()


def test_run_plan_draws_later_rounds_and_the_final_set_from_the_pool(tmp_path):
    from popri.pipeline import config as C
    from popri.pipeline.driver import Run

    cfg = C.load(None, [f"run_dir={tmp_path / 'r'}", "rounds=2", "pool=chosen"])
    r = Run(cfg, dry_run=True)
    r.execute()
    cmds = r.runner.commands
    pool1 = str(tmp_path / "r" / "round1" / "pool.jsonl")
    pool2 = str(tmp_path / "r" / "round2" / "pool.jsonl")
    gen2 = next(c for c in cmds if c.startswith("popri gen") and "--round 2" in c)
    assert gen2.startswith(f"popri gen {pool1} ")
    final = next(c for c in cmds if c.startswith("popri gen") and "synthetic.jsonl" in c)
    assert final.startswith(f"popri gen {pool2} ")
    # the control (the untuned generator, T = 0) keeps Omega's prompts
    t0 = next(c for c in cmds if c.startswith("popri gen") and "synthetic_t0.jsonl" in c)
    assert "pool.jsonl" not in t0
    assert any(c.startswith("popri prefs pool") and "--pool chosen" in c for c in cmds)
    # the pool is post-processing: the DP releases are the score rounds and the checkpoint
    # selection's DP statistic (dpo.select_on: dp, the default), nothing for the pool
    assert [n for n, *_ in r.dp_stages()] == ["select-stats", "round1-score", "round2-score"]
    with pytest.raises(ConfigError, match="evolving pool"):
        C.load(None, [f"run_dir={tmp_path / 'p'}", "method=pe", "pool=union"])
    with pytest.raises(ConfigError):
        C.load(None, [f"run_dir={tmp_path / 'p'}", "pool=sometimes"])
