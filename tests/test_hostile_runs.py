"""Issue 37, `popri runs list|show|diff`, `popri.load_run`, `popri.run`, `popri.epsilon`: the
hostile probe's failed cases (/work/shared/probes/hostile-0.3.0.md, one test per id), the
compact `popri runs diff` and the per-round table of `popri runs show`.

    python -m pytest -q tests/test_hostile_runs.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _results(d: Path, eps: float = 0.9999940876222044, acc: float = 0.2660016625103907,
             method: str = "popri") -> dict:
    """A results.json shaped as `popri run` writes one (docs/formats.md; numbers of a real
    one-round CPU run)."""
    row = lambda a, se: {"accuracy": a, "accuracy_se": se, "loss": 4.4,  # noqa: E731
                         "tokens": 2406, "clients": 3}
    return {"run_dir": str(d), "epsilon": eps, "delta": 3e-06, "accountant": "rdp",
            "neighbouring": "add/remove one client", "dp_guarantee": True,
            "noise_multiplier": 2.90594482421875, "sample_rate": 0.5, "rounds": 2, "prompts": 3,
            "samples_per_prompt": 6, "num_synthetic": 18, "generator": "smollm2-135m",
            "downstream": "smollm2-135m", "method": method, "seed": 0,
            "methods": {method: row(acc, 0.017448181903243907),
                        "t0": row(0.2460515378221114, 0.011119809247734385),
                        "eps0": row(0.26974231088944306, 0.012865334949478694),
                        "epsinf": row(0.2913549459684123, 0.011314285160955721)},
            "budget": {"epsilon": 1.0, "delta": 3e-06, "accountant": "rdp", "convention": None},
            "mode": "research", "mode_note": "research mode: noise is seeded",
            "checkpoint_selection": {"on": "none", "note": "checkpoint selection: none"},
            "recovery_rate_per_round": [1.0, 0.5],
            "control": {"acc": acc, "acc_control": 0.2460515378221114,
                        "acc_minus_control": acc - 0.2460515378221114,
                        "acc_minus_control_se": 0.006331964759853008,
                        "acc_minus_control_ci": [0.007042253521126751, 0.03337169159953973]},
            "gap_closed": {"gap_closed": -0.17307692307692238,
                           "gap_closed_se": 0.23159920573348183,
                           "gap_closed_ci": [-0.6363636363636348, 0.3333333333333333]},
            "fid_to_val": 1.2450666300797715,
            "stage_seconds": {"round1-gen": 7.6, "round1-dpo": 24.4},
            "run": {"popri_version": "0.3.0", "git_commit": None, "command": "popri run",
                    "config_hash": "2ab3d549171a69bd", "started": "2026-11-28T02:36:54+0000",
                    "ended": "2026-11-28T02:39:45+0000", "invocations": 1}}


def _metrics(rounds: int = 2) -> list[dict]:
    """metrics.jsonl rows as a POPri run writes them: a probe row per round from 0, then per
    round a score, a prefs and a dpo row (each stage its own fields)."""
    rows = [{"round": 0, "stage": "probe", "private_diagnostic": True, "mean_cosine": 0.41,
             "mmd2": 0.05, "distinct_2": 0.9}]
    for t in range(1, rounds + 1):
        rows += [{"round": t, "stage": "score", "released_mean": 0.17 * t, "samples": 18,
                  "chosen_mean": 13.93, "rejected_mean": -8.1, "pairs": 3},
                 {"round": t, "stage": "prefs", "private_diagnostic": True,
                  "recovery_rate": 1.0},
                 {"round": t, "stage": "dpo", "train_loss": 0.69, "last_epoch_loss": 0.686,
                  "steps": 2, "seconds_per_step": 8.35, "holdout_margin": -0.0026,
                  "holdout_accuracy": 0.0, "holdout_pairs": 1},
                 {"round": t, "stage": "probe", "private_diagnostic": True,
                  "mean_cosine": 0.41 + 0.01 * t, "mmd2": 0.05, "distinct_2": 0.9}]
    return rows


def _run(d: Path, *, results: object = "default", metrics: object = None,
         config: object = "default", text: dict | None = None) -> Path:
    """A run directory: config.resolved.json, results.json ("default": a real-shaped one;
    None: none), metrics.jsonl (rows or raw lines), `.stages/`; ``text``: files written as
    given."""
    d.mkdir(parents=True)
    (d / ".stages").mkdir()
    if config == "default":
        config = {"run_dir": str(d), "method": "popri", "seed": 0, "rounds": 2,
                  "privacy": {"epsilon": 1.0, "delta": 3e-06}, "dpo": {"beta": 0.01}}
    if config is not None:
        (d / "config.resolved.json").write_text(json.dumps(config))
    if results == "default":
        results = _results(d)
    if results is not None:
        (d / "results.json").write_text(json.dumps(results))
    rows = _metrics() if metrics is None else metrics
    (d / "metrics.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r))
                                             + "\n" for r in rows))
    for name, body in (text or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(body)
    return d


def _strict(s: str):
    """json.loads that refuses NaN / Infinity (what JSON is)."""
    def bad(c):
        raise ValueError(f"not JSON: {c}")

    return json.loads(s, parse_constant=bad)


def _ok(p) -> None:
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


# --------------------------------------------------------------------------- the probe's cases
def test_s01_runs_show_keeps_every_valid_row_after_a_torn_line(tmp_path, run_popri):
    rows = [json.dumps(r) for r in _metrics()]
    run = _run(tmp_path / "w_badmet", metrics=[rows[0], '{"round": 1, "sta', *rows[1:]])
    p = run_popri(["runs", "show", run])
    _ok(p)
    assert f"metrics.jsonl: {len(rows)} rows over 3 round(s): 0-2" in p.stdout
    assert "line 2: not JSON" in p.stderr and "1 line(s) skipped" in p.stderr


def test_s04_runs_show_skips_a_row_whose_round_is_not_a_number(tmp_path, run_popri):
    run = _run(tmp_path / "r", metrics=[*_metrics(), {"round": "x", "stage": "probe"}])
    p = run_popri(["runs", "show", run])
    _ok(p)
    assert "over 3 round(s): 0-2" in p.stdout and "field 'round' is \"x\"" in p.stderr


def test_s05_a_non_object_metrics_line_is_skipped_everywhere(tmp_path, run_popri):
    import popri

    run = _run(tmp_path / "tree" / "r", metrics=[*_metrics()[:2], "[1,2]", *_metrics()[2:]])
    _run(tmp_path / "tree" / "good")
    for args in (["show", run], ["show", run, "--json"], ["diff", run, run],
                 ["list", tmp_path / "tree"]):
        p = run_popri(["runs", *args])
        _ok(p)
        assert "line 3: a JSON list, not an object" in p.stderr
    assert len(run_popri(["runs", "list", tmp_path / "tree"]).stdout.splitlines()) == 3
    with pytest.warns(UserWarning, match="line 3: a JSON list"):
        lr = popri.load_run(run)
    assert len(lr.metrics) == len(_metrics()) and sorted(set(lr.metrics["round"])) == [0, 1, 2]


def test_s06_runs_show_lists_rounds_of_rows_without_round(tmp_path, run_popri):
    run = _run(tmp_path / "r", metrics=[*_metrics(1), {"stage": "probe", "mean_cosine": 0.5}])
    p = run_popri(["runs", "show", run])
    _ok(p)
    line = next(x for x in p.stdout.splitlines() if x.startswith("metrics.jsonl:"))
    assert line == "metrics.jsonl: 5 rows over 2 round(s): 0-1" and "nan" not in p.stdout
    assert "no field 'round'" in p.stderr


def test_l02_runs_list_lists_the_good_runs_and_flags_a_torn_results_json(tmp_path, run_popri):
    good = _run(tmp_path / "tree2" / "good")
    bad = _run(tmp_path / "tree2" / "torn", results=None, text={"results.json": '{"epsil'})
    p = run_popri(["runs", "list", tmp_path / "tree2"])
    _ok(p)
    lines = p.stdout.splitlines()
    assert any(x.startswith(str(good)) and "1 / 1" in x for x in lines), p.stdout
    assert any(x.startswith(str(bad)) and "(unreadable)" in x for x in lines), p.stdout
    assert f"{bad}/results.json: not JSON" in p.stderr


def test_l03_a_results_json_that_is_a_list_is_named_not_unfinished(tmp_path, run_popri):
    run = _run(tmp_path / "r", results=[1, 2, 3])
    p = run_popri(["runs", "show", run])
    assert p.returncode == 2 and "results.json is not an object" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    q = run_popri(["runs", "list", run])
    _ok(q)
    assert "(unfinished)" not in q.stdout and "results.json is not an object" in q.stderr


def test_l04_wrong_typed_results_fields_give_a_fallback_line(tmp_path, run_popri):
    run = _run(tmp_path / "w_weird", results={"budget": 5, "run": "y", "methods": "x",
                                              "method": "popri", "epsilon": 1.0,
                                              "gap_closed": 3, "control": [1]})
    p = run_popri(["runs", "list", run])
    _ok(p)
    assert p.stdout.splitlines()[1].split()[:4] == [str(run), "popri", "1", "/"]
    s = run_popri(["runs", "show", run])
    _ok(s)
    assert "results.json lacks fields" in s.stdout


def test_s11_runs_show_summarises_100k_rounds(tmp_path, run_popri):
    rows = [json.dumps({"round": t, "stage": "score", "released_mean": 0.1}) for t in
            range(100_000)]
    run = _run(tmp_path / "huge", metrics=rows)
    p = run_popri(["runs", "show", run])
    _ok(p)
    assert len(p.stdout) < 6000 and max(len(x) for x in p.stdout.splitlines()) < 300
    assert "100000 round(s): 0-99999" in p.stdout and "99999 " in p.stdout
    assert "... (99990 rounds not shown: --all shows them)" in p.stdout


def test_s15_runs_show_json_is_valid_on_a_real_run_shape(tmp_path, run_popri):
    run = _run(tmp_path / "smoke")
    p = run_popri(["runs", "show", run, "--json"])
    _ok(p)
    obj = _strict(p.stdout)
    assert obj["metrics"] == _metrics()  # the rows as written: no field added as NaN


def test_x06_runs_diff_a_nan_metric_equals_itself(tmp_path, run_popri):
    res = _results(tmp_path / "nanrun")
    res["fid_to_val"] = math.nan
    run = _run(tmp_path / "nanrun", results=res)
    p = run_popri(["runs", "diff", run, run])
    _ok(p)
    assert "metrics: 0 differ" in p.stdout and "settings: 0 differ" in p.stdout


def test_x07_runs_diff_and_list_json_are_valid_with_nan_and_infinity(tmp_path, run_popri):
    res = _results(tmp_path / "nanrun")
    res["fid_to_val"] = math.nan
    nan = _run(tmp_path / "nanrun", results=res)
    res = _results(tmp_path / "infrun")
    res["epsilon"] = math.inf
    inf = _run(tmp_path / "infrun", results=res)
    p = run_popri(["runs", "diff", nan, nan, "--json"])
    _ok(p)
    assert _strict(p.stdout)["metrics"] == []
    q = run_popri(["runs", "list", inf, "--json"])
    _ok(q)
    assert _strict(q.stdout)[0]["epsilon"] == "inf"  # not null (hostile-0.4 N04)


def test_l07_runs_list_of_a_file_is_not_a_directory(tmp_path, run_popri):
    f = tmp_path / "afile"
    f.write_text("x\n")
    p = run_popri(["runs", "list", f])
    assert p.returncode == 2 and p.stderr.strip() == f"popri: error: {f}: not a directory"


def test_o01_runs_list_of_an_older_results_json_prints_dash_not_none(tmp_path, run_popri):
    res = _results(tmp_path / "oldrun")
    for k in ("run", "methods", "method"):
        del res[k]
    run = _run(tmp_path / "oldrun", results=res, config=None)
    p = run_popri(["runs", "list", run])
    _ok(p)
    assert "None" not in p.stdout and p.stdout.splitlines()[1].split()[1] == "-"


def test_o05_runs_show_with_text_stage_seconds_falls_back(tmp_path, run_popri):
    res = _results(tmp_path / "oldrun2")
    res["stage_seconds"] = {"gen": "10s", "dpo": 30.0}
    run = _run(tmp_path / "oldrun2", results=res)
    p = run_popri(["runs", "show", run])
    _ok(p)
    assert "stages: 1, 0.5 minutes of work" in p.stdout
    assert "1 value(s) not a number of seconds" in p.stderr


def test_a02_api_run_takes_one_override_string_or_a_mapping(tmp_path, monkeypatch):
    import popri

    monkeypatch.chdir(tmp_path)
    yaml = REPO / "examples" / "default.yaml"
    assert "over T=3 rounds" in popri.run(yaml, overrides="rounds=3", dry_run=True)
    plan = popri.run(yaml, overrides={"rounds": 3, "privacy": {"epsilon": 7}}, dry_run=True)
    assert "over T=3 rounds" in plan and "eps=7" in plan
    with pytest.raises(TypeError, match="overrides"):
        popri.run(yaml, overrides=3, dry_run=True)
    assert not any(tmp_path.iterdir())


def test_a03_api_run_takes_a_mapping_as_the_config(tmp_path, monkeypatch):
    import popri

    monkeypatch.chdir(tmp_path)
    plan = popri.run({"rounds": 3, "run_dir": str(tmp_path / "r")}, dry_run=True)
    assert "over T=3 rounds" in plan and f"popri run {tmp_path / 'r'}" in plan
    with pytest.raises(TypeError, match="config must be"):
        popri.run(42, dry_run=True)
    assert not any(tmp_path.iterdir())


def test_api_epsilon_defaults_delta_as_the_cli_does(run_popri):
    import popri

    cli = json.loads(run_popri(["account", "epsilon", "-z", "2.5", "-q", "0.1", "-T", "20",
                                "--json"], check=True).stdout)
    assert popri.epsilon(2.5, 0.1, 20) == pytest.approx(cli["epsilon"], rel=1e-12)
    assert popri.epsilon(2.5, 0.1, 20) == popri.epsilon(2.5, 0.1, 20, cli["delta"])


# --------------------------------------------------------------------------- compact diff
def _pair(tmp_path):
    a = _run(tmp_path / "runs" / "a")
    res = _results(tmp_path / "runs" / "b", eps=0.99999, acc=0.2712345)
    res["fid_to_val"] = 1.3
    cfg = {"run_dir": "x", "method": "popri", "seed": 1, "rounds": 2,
           "privacy": {"epsilon": 1.0, "delta": 3e-06}, "dpo": {"beta": 0.01}}
    b = _run(tmp_path / "runs" / "b", results=res, config=cfg)
    return a, b


def _row(out: str, key: str) -> list[str]:
    return next(x.split() for x in out.splitlines() if x.split()[:1] == [key])


def test_runs_diff_default_is_compact_and_rounded_to_the_se(tmp_path, run_popri):
    a, b = _pair(tmp_path)
    p = run_popri(["runs", "diff", a, b])
    _ok(p)
    out = p.stdout
    # settings: only the one that differs (run_dir never counts)
    assert "settings: 1 differ (of 6)" in out and _row(out, "seed")[1:] == ["0", "1"]
    assert "privacy.epsilon" not in out and "dpo.beta" not in out
    # epsilon 1 vs 0.99999: below the accountant's precision, not a difference
    assert _row(out, "epsilon")[1:] == ["1", "1", "="]
    # accuracy to 2 significant digits of its SE (0.017): 3 decimals, change too
    assert _row(out, "methods.popri.accuracy")[1:] == ["0.266", "0.271", "0.005"]
    assert _row(out, "fid_to_val")[1:] == ["1.245", "1.3", "0.05493"]
    assert _row(out, "gap_closed.gap_closed")[1:] == ["-0.17", "-0.17", "="]
    assert _row(out, "neighbouring")[-1] == "="
    # the differing control line (acc - t0) rounds with its SE 0.0063: 4 decimals
    assert _row(out, "control.acc_minus_control")[1:] == ["0.02", "0.0252", "0.0052"]
    assert "metrics: 4 differ" in out  # accuracy, fid, control.acc, control.acc_minus_control
    assert "gap_closed_ci" not in out and "stage_seconds" not in out
    assert all(len(x) < 200 for x in out.splitlines())


def test_runs_diff_all_and_keys(tmp_path, run_popri):
    a, b = _pair(tmp_path)
    out = run_popri(["runs", "diff", a, b, "--all"], check=True).stdout
    assert _row(out, "privacy.epsilon")[1:] == ["1", "1"] and _row(out, "dpo.beta")
    assert _row(out, "methods.eps0.accuracy")[-1] == "="
    assert _row(out, "gap_closed.gap_closed_ci")[-1] == "="
    assert _row(out, "epsilon")[-1] == "="
    k = run_popri(["runs", "diff", a, b, "--keys", "methods.*.accuracy", "--keys", "fid"],
                  check=True).stdout
    keys = [x.split()[0] for x in k.splitlines() if x.startswith("  ")]
    assert keys == ["key", "fid_to_val", "methods.popri.accuracy"], k
    assert "settings: 1 differ (of 6); 0 shown" in k
    j = _strict(run_popri(["runs", "diff", a, b, "--json"], check=True).stdout)
    assert ["seed", 0, 1] in j["params"] and len(j["params"]) == 1
    # the metrics that differ by the rule of the counts (hostile-0.4 N05), values exact
    assert not any(m[0] == "epsilon" for m in j["metrics"])
    assert len(j["metrics"]) == j["metrics_differ"]
    head = {h["key"]: h for h in j["headline"]}
    assert head["epsilon"]["differs"] is False and head["methods.popri.accuracy"]["differs"]
    assert head["methods.popri.accuracy"]["decimals"] == 3
    ja = _strict(run_popri(["runs", "diff", a, b, "--json", "--all"], check=True).stdout)
    assert len(ja["params"]) == j["params_total"] == 6


# --------------------------------------------------------------------------- per-round table
def test_runs_show_prints_one_row_per_round(tmp_path, run_popri):
    run = _run(tmp_path / "r")
    out = run_popri(["runs", "show", run], check=True).stdout
    i = out.splitlines().index("metrics.jsonl: 9 rows over 3 round(s): 0-2")
    head, *rows = [x.split() for x in out.splitlines()[i + 1:i + 5]]
    assert head == ["round", "released_mean", "recovery_rate", "train_loss", "holdout_accuracy",
                    "mean_cosine", "mmd2", "distinct_2"]
    assert rows[0] == ["0", "-", "-", "-", "-", "0.41", "0.05", "0.9"]
    assert rows[2] == ["2", "0.34", "1", "0.69", "0", "0.43", "0.05", "0.9"]
    # a metrics.jsonl of other fields: its first numeric ones
    other = _run(tmp_path / "o", metrics=[{"round": 1, "stage": "x", "foo": 1.5, "bar": "t"}])
    out = run_popri(["runs", "show", other], check=True).stdout.splitlines()
    assert out[-2:] == ["  round  foo", "  1      1.5"]


def test_runs_show_many_rounds_first_and_last_few(tmp_path, run_popri):
    run = _run(tmp_path / "r", metrics=_metrics(30))
    def shown(*opts):
        lines = run_popri(["runs", "show", run, *opts], check=True).stdout.splitlines()
        i = next(n for n, x in enumerate(lines) if x.startswith("metrics.jsonl:"))
        return [x.split()[0] for x in lines[i + 2:]], lines[i]

    rounds, head = shown()
    assert head == "metrics.jsonl: 121 rows over 31 round(s): 0-30"
    assert rounds == ["0", "1", "2", "3", "4", "...", "26", "27", "28", "29", "30"]
    assert shown("--all")[0] == [str(t) for t in range(31)]


def test_runs_show_prints_samples_and_a_pair_with_released_scores(tmp_path, run_popri):
    """Issue 37: `popri runs show` shows the synthetic text (the report's samples page,
    shortened): the set's first samples and one chosen / rejected pair with its released
    scores, labelled synthetic, HTML or control characters printed as text."""
    syn = "".join(json.dumps({"id": f"s{i}", "text": f"sample number {i} <b>bold</b>"}) + "\n"
                  for i in range(5))
    pair = json.dumps({"prompt_id": 0, "chosen": "the chosen text", "rejected": "the rejected",
                       "chosen_score": 1.25, "rejected_score": -0.5}) + "\n"
    d = _run(tmp_path / "r", metrics=_metrics(), text={"synthetic.jsonl": syn,
                                                         "round1/prefs.jsonl": pair})
    out = run_popri(["runs", "show", d], check=True).stdout
    assert "samples: Synthetic text written by the generator" in out
    assert "s0: sample number 0 <b>bold</b>" in out and "s3:" not in out  # the first three
    assert "released scores 1.25 / -0.5" in out
    assert "chosen:   the chosen text" in out and "rejected: the rejected" in out
