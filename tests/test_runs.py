"""Runs as data: `popri runs list|show|diff`, `popri.load_run`, `popri.run(path, dry_run=True)`,
one embedded default, the reuse line, the mixed-method refusal, CI-readable stage logs.

    python -m pytest -q tests/test_runs.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _fake_run(d: Path, eps: float, acc: float, seed: int = 0, method: str = "popri") -> Path:
    """A finished run directory as `popri run` writes it (docs/formats.md), numbers made up."""
    from popri.pipeline import config as C

    cfg = C.load(None, [f"privacy.epsilon={eps}", f"seed={seed}", f"run_dir={d}",
                        f"method={method}"])
    d.mkdir(parents=True)
    (d / ".stages").mkdir()
    (d / "config.resolved.json").write_text(json.dumps(C.to_dict(cfg)))
    res = {"run_dir": str(d), "method": method, "epsilon": eps, "delta": 3e-6, "seed": seed,
           "noise_multiplier": 3.0 / eps, "mode": "research", "rounds": 1, "prompts": 4,
           "samples_per_prompt": 8, "num_synthetic": 96, "generator": "smollm2-135m",
           "downstream": "smollm2-135m", "accountant": "rdp", "sample_rate": 0.5,
           "budget": {"epsilon": eps, "delta": 3e-6, "accountant": "rdp"},
           "methods": {method: {"accuracy": acc, "accuracy_se": 0.01}},
           "gap_closed": {"gap_closed": acc * 2, "gap_closed_se": 0.1},
           "stage_seconds": {"round1-gen": 12.5},
           "run": {"popri_version": "0.2.0", "git_commit": None, "command": "popri run",
                   "config_hash": "abc", "started": "2026-11-26T10:00:00+0000",
                   "ended": "2026-11-26T10:20:00+0000", "invocations": 1}}
    (d / "results.json").write_text(json.dumps(res))
    rows = [{"round": r, "stage": "probe", "mean_cosine": 0.5 + 0.01 * r} for r in (0, 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_runs_list_show_diff_through_the_cli(tmp_path, run_popri):
    a = _fake_run(tmp_path / "runs" / "e1", 1.0, 0.30)
    b = _fake_run(tmp_path / "runs" / "e7", 7.0, 0.34)
    r = run_popri(["runs", "list", tmp_path / "runs"], check=True)
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["run", "method"] and len(lines) == 3
    assert str(a) in lines[1] and "1 / 1" in lines[1] and "0.3 +- 0.01" in lines[1]
    assert str(b) in lines[2] and "7 / 7" in lines[2]
    rows = json.loads(run_popri(["runs", "list", tmp_path / "runs", "--json"], check=True).stdout)
    assert [x["epsilon"] for x in rows] == [1.0, 7.0] and rows[1]["accuracy"] == 0.34

    d = run_popri(["runs", "diff", a, b], check=True).stdout
    assert "settings: 1 differ" in d and "privacy.epsilon" in d
    eps_line = next(x for x in d.splitlines() if x.strip().startswith("privacy.epsilon"))
    assert eps_line.split()[1:] == ["1", "7"]
    acc = next(x for x in d.splitlines() if "methods.popri.accuracy " in x + " ")
    assert acc.split()[1:] == ["0.3", "0.34", "0.04"]
    dj = json.loads(run_popri(["runs", "diff", a, b, "--json"], check=True).stdout)
    assert ["privacy.epsilon", 1.0, 7.0] in dj["params"]
    assert not any(k.startswith(("run.", "stage_seconds")) for k, *_ in dj["metrics"])

    s = run_popri(["runs", "show", a], check=True).stdout
    assert "| POPri |" in s and "config_hash: abc" in s and "metrics.jsonl: 2 rows" in s
    sj = json.loads(run_popri(["runs", "show", a, "--json"], check=True).stdout)
    assert sj["config"]["privacy"]["epsilon"] == 1.0 and len(sj["metrics"]) == 2

    bad = run_popri(["runs", "show", tmp_path])
    assert bad.returncode == 2 and "not a popri run directory" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_load_run_returns_config_results_and_a_metrics_frame(tmp_path):
    import popri

    pd = pytest.importorskip("pandas")
    run = popri.load_run(_fake_run(tmp_path / "r", 4.0, 0.31))
    assert run.finished and run.config["privacy"]["epsilon"] == 4.0
    assert run.results["methods"]["popri"]["accuracy"] == 0.31
    assert isinstance(run.metrics, pd.DataFrame) and list(run.metrics["round"]) == [0, 1]
    # an unfinished run (killed mid-line): config only, the torn metrics line dropped
    u = tmp_path / "u"
    u.mkdir()
    (u / "config.resolved.json").write_text(json.dumps({"method": "pe"}))
    (u / "metrics.jsonl").write_text('{"round": 0}\n{"rou')
    lr = popri.load_run(u)
    assert not lr.finished and len(lr.metrics) == 1


def test_one_embedded_default_and_show_config(run_popri):
    from popri.pipeline import config as C

    a = C.to_dict(C.load(None))
    b = C.to_dict(C.load(str(REPO / "examples" / "default.yaml")))
    assert a == b
    r = run_popri(["run", "--show-config"], check=True)
    shown = json.loads(r.stdout) if r.stdout.lstrip().startswith("{") else None
    if shown is None:
        import yaml

        shown = yaml.safe_load(r.stdout)
    assert shown["rounds"] == a["rounds"] and shown["privacy"] == a["privacy"]


def test_api_run_dry_run_on_a_path_and_a_config(tmp_path):
    import popri

    plan = popri.run(REPO / "examples" / "default.yaml", dry_run=True,
                     overrides=[f"run_dir={tmp_path / 'r'}"])
    assert isinstance(plan, str) and "popri gen" in plan and "to run:" in plan
    assert not (tmp_path / "r").exists()
    cfg = popri.load_config(str(REPO / "examples" / "pe.yaml"), [f"run_dir={tmp_path / 'p'}"])
    plan2 = popri.run(cfg, overrides=["seed=3"], dry_run=True)
    assert "popri pe" in plan2 or "pe-" in plan2
    assert not (tmp_path / "p").exists()


def test_a_run_dir_holding_another_methods_run_is_refused_with_nothing_written(tmp_path,
                                                                                 run_popri):
    run = _fake_run(tmp_path / "run", 1.0, 0.3, method="popri")
    (run / "commands.sh").write_text("# the popri run's commands\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    stat = {p: p.stat().st_mtime_ns for p in before}
    r = run_popri(["run", REPO / "examples" / "pe.yaml", "--set", f"run_dir={run}"])
    assert r.returncode == 2, r.stderr
    assert "holds a 'popri' run" in r.stderr and "method" in r.stderr
    after = {p for p in run.rglob("*") if p.is_file()}
    assert after == set(before)
    for p, data in before.items():
        assert p.read_bytes() == data and p.stat().st_mtime_ns == stat[p], p


def test_stage_log_heartbeat_and_no_carriage_returns(tmp_path):
    """A stage's stderr when ours is not a TTY: library carriage returns turned into line ends,
    a heartbeat line while the stage is silent, and everything kept in RUN/logs/NAME.log."""
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        sys.stderr.write("bar 10%\\rbar 50%\\rbar 100%\\n"); sys.stderr.flush()
        time.sleep(3.5)
        sys.stderr.write("finished\\n")
    """))
    drive = tmp_path / "drive.py"
    drive.write_text(textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from popri.kit import Stage
        from popri.pipeline.stages import StageRunner
        from popri.specs.commands.bench import BenchListCall
        run = Path({str(tmp_path / 'run')!r}); run.mkdir(exist_ok=True)
        r = StageRunner(run)
        r.total = 3
        st = Stage("slow-stage", BenchListCall(), outputs=[])
        sys.exit(r._child(st, [sys.executable, {str(script)!r}], None))
    """))
    env = dict(os.environ, POPRI_HEARTBEAT="1", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, str(drive)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr
    lines = p.stderr.splitlines()
    assert lines[:3] == ["bar 10%", "bar 50%", "bar 100%"], lines
    beats = [x for x in lines if x.startswith("run: [1/3 ") and "slow-stage running, " in x]
    assert len(beats) >= 2, p.stderr
    assert lines[-1] == "finished"
    log = (tmp_path / "run" / "logs" / "slow-stage.log").read_text()
    assert "\r" not in log and log.splitlines() == ["bar 10%", "bar 50%", "bar 100%", "finished"]


def test_heartbeat_progress_prints_plain_lines_and_no_private_count(capsys):
    """The progress of a non-TTY log: plain lines; a task without a total (a release-mode
    round's participants) shows elapsed time only, never the count."""
    from popri.core import log

    hb = log.Heartbeat(every=0.0)
    with hb:
        a = hb.add_task("embed", total=4)
        for _ in range(4):
            hb.advance(a)
        b = hb.add_task("round 1 clients", total=None)
        for _ in range(7):
            hb.advance(b)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "  embed: 4/4 (100%), 0 s done" in err.splitlines()
    private = [x for x in err.splitlines() if "round 1 clients" in x]
    assert private and not any(ch.isdigit() for x in private for ch in x.split(":", 1)[1]
                               .replace(" 0 s", "")), private


def test_runs_diff_names_the_numeric_path_of_each_run(tmp_path):
    """Issue 43, item 6: two runs on different numeric paths (fp32 by default on CPU, bf16 by
    POPRI_CPU_BF16=1) need not agree in their last digits; `runs diff` shows the path of each in
    its headline, and only there when the runs have one."""
    from popri.pipeline import runs as R

    a, b = _fake_run(tmp_path / "a", 1.0, 0.30), _fake_run(tmp_path / "b", 1.0, 0.31)
    for d, prec in ((a, "cpu fp32"), (b, "cpu bf16")):
        res = json.loads((d / "results.json").read_text())
        res["precision"] = prec
        (d / "results.json").write_text(json.dumps(res))
    d = R.diff(R.load_run(a), R.load_run(b))
    row = next(h for h in d["headline"] if h["key"] == "precision")
    assert (row["a"], row["b"], row["differs"]) == ("cpu fp32", "cpu bf16", True)
    rows = R.diff_rows(d, R.load_run(a), R.load_run(b))
    assert ("precision", "cpu fp32", "cpu bf16") in [r[:3] for r in rows]
    # the same path: shown, not differing
    same = R.diff(R.load_run(a), R.load_run(a))
    assert next(h for h in same["headline"] if h["key"] == "precision")["differs"] is False
    # runs from before issue 43 have no precision: no row
    c, e = _fake_run(tmp_path / "c", 1.0, 0.3), _fake_run(tmp_path / "e", 1.0, 0.3)
    assert all(h["key"] != "precision" for h in R.diff(R.load_run(c), R.load_run(e))["headline"])
