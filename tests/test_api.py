"""Issue 11: `import popri` is the public API; it writes what the CLI writes; the package's
shape (a recipe per method, one driver, honest stage keys) holds."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import emb_set

from popri.specs.commands.account import AccountEpsilonCall
from popri.specs.commands.pe import PeSeedsCall


def test_import_popri_is_light_and_has_the_api():
    code = ("import sys, popri; print(popri.__version__); "
            "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules)); "
            "print(callable(popri.score), callable(popri.account))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    version, heavy, api = p.stdout.split("\n")[:3]
    assert heavy == "[]" and api == "True True"


def test_api_score_and_account_write_what_the_cli_writes(tmp_path, run_popri):
    import popri

    rng = np.random.default_rng(0)
    priv = rng.normal(size=(60, 8))
    priv /= np.linalg.norm(priv, axis=1, keepdims=True)
    syn = rng.normal(size=(7, 8))
    syn /= np.linalg.norm(syn, axis=1, keepdims=True)
    p = emb_set(tmp_path / "priv.npy", priv, client_ids=[f"c{i // 3}" for i in range(60)])
    s = emb_set(tmp_path / "syn.npy", syn)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    popri.score(p, s, noise_multiplier=2.0, out=str(tmp_path / "a" / "scores.npy"), seed=3)
    r = run_popri(["score", "--private", p, "--synthetic", s, "--noise-multiplier", "2.0",
                   "--seed", "3", "--out", tmp_path / "b" / "scores.npy"])
    assert r.returncode == 0, r.stderr
    a = np.load(tmp_path / "a" / "scores.npy")
    b = np.load(tmp_path / "b" / "scores.npy")
    assert np.array_equal(a, b)
    la = [json.loads(x) for x in (tmp_path / "a" / "ledger.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (tmp_path / "b" / "ledger.jsonl").read_text().splitlines()]
    assert la[0]["release_id"] == lb[0]["release_id"]
    total = popri.account(str(tmp_path / "a"))
    cli = run_popri(["account", "ledger", tmp_path / "a", "--json"])
    assert total.epsilon == pytest.approx(json.loads(cli.stdout)["epsilon"], rel=1e-12)


def test_every_method_is_a_recipe_in_one_table_and_the_driver_is_method_agnostic():
    import inspect

    from popri.pipeline import driver
    from popri.pipeline.recipes import METHODS

    assert {"popri", "pe", "pe-sft"} <= set(METHODS)
    src = inspect.getsource(driver)
    for name in METHODS:  # no branch on a method's name in the driver
        assert f'== "{name}"' not in src and f"== '{name}'" not in src


def test_a_new_method_is_one_recipe_entry(tmp_path, monkeypatch):
    """A toy method registered in METHODS runs through the same driver (plan, budget, dry
    run) with no other change, and asks of the run only what RunContext declares (issue 39):
    its recipe and hooks get a RunContext, and their code reads nothing else of it."""
    import ast
    import inspect
    import textwrap

    from test_layers import run_context_members, run_reads

    from popri.kit import Stage
    from popri.methods import steps
    from popri.methods.base import RunContext
    from popri.pipeline import config as C
    from popri.pipeline import recipes
    from popri.pipeline.driver import Run

    seen = {}

    class Toy(recipes.Method):
        name, label = "toy", "Toy"

        def recipe(self, run):
            seen["context"] = isinstance(run, RunContext)
            seen["noise"], seen["clients"] = run.noise, run.disclosed_clients()
            R = run.paths.root / "toy"
            yield steps.score_stage(run, 1, run.paths.emb_val, R / "scores.npy", seed=7)
            yield Stage("toy-copy", PeSeedsCall(survivors=(str(run.paths.root / "x.jsonl"),),
                                                out=str(run.paths.synthetic)),
                        outputs=[str(run.paths.synthetic)])

        def plan_notes(self, run):
            return [f"toy: {'release' if run.release else 'research'} mode, "
                    f"z passed as {run.noise.z:.4f}"]

    monkeypatch.setitem(recipes.METHODS, "toy", Toy())
    cfg = C.load(None, [f"run_dir={tmp_path / 'r'}", "method=toy", "rounds=1"])
    r = Run(cfg, dry_run=True)
    r.execute()
    cmds = r.runner.commands
    assert any(c.startswith("popri score") and "toy/scores.npy" in c for c in cmds)
    assert [n for n, *_ in r.dp_stages()] == ["round1-score"]
    assert "popri account ledger" in cmds[-1]
    # a RunContext, with the planned noise (Poisson q = 0.5: N stays private)
    assert seen["context"] and seen["noise"] is r.noise and seen["clients"] is None
    assert f"--noise-multiplier {r.noise.z!r}" in next(c for c in cmds if "toy/scores" in c)
    assert "toy: research mode" in r.plan_text()
    # and the toy's code reads nothing of the run but RunContext's members
    tree = ast.parse(textwrap.dedent(inspect.getsource(Toy)))
    reads = {attr for _, attr in run_reads(tree)}
    assert reads and reads <= run_context_members(), reads - run_context_members()


def test_stage_key_covers_version_and_keyed_env_and_strips_other_popri_settings(tmp_path,
                                                                                monkeypatch):
    from popri.kit import Stage
    from popri.pipeline import stages as S

    st = Stage("s", AccountEpsilonCall(noise_multiplier=2.0, sample_rate=1.0, steps=1),
               outputs=[])
    monkeypatch.setenv("POPRI_RELEASE", "1")
    monkeypatch.setenv("POPRI_EMBED_MODEL", "x")
    r = S.StageRunner(tmp_path)
    assert "POPRI_RELEASE" not in r.env and "POPRI_EMBED_MODEL" not in r.env
    k = r.key(st)
    # the thread count is in no stage key (issue 37: a resume at another POPRI_THREADS reuses
    # every finished stage; StageRunner.key says why), only recorded in the marker
    monkeypatch.setenv("POPRI_THREADS", "1")
    k1 = S.StageRunner(tmp_path).key(st)
    monkeypatch.setenv("POPRI_THREADS", "2")
    assert k1 == S.StageRunner(tmp_path).key(st) == k
    assert S.StageRunner(tmp_path).env["POPRI_THREADS"] == "2"  # passed on to the stage
    from popri.pipeline import keys as K

    monkeypatch.setattr(K, "__version__", "9.9.9")  # the key's version (pipeline/keys.py)
    assert S.StageRunner(tmp_path).key(st) != k1
    st2 = Stage("s", AccountEpsilonCall(noise_multiplier=3.0, sample_rate=1.0, steps=1),
                outputs=[])
    assert S.StageRunner(tmp_path).key(st2) != S.StageRunner(tmp_path).key(st)


def test_an_edited_intermediate_reruns_its_stage(tmp_path):
    """Markers store output hashes: an output edited after its stage ran is not 'up to
    date' (before: existence only), and a directory input is keyed by content, not mtime."""
    from popri.kit import Stage
    from popri.pipeline.stages import StageRunner

    out = tmp_path / "eps.json"
    st = lambda: Stage("eps", AccountEpsilonCall(noise_multiplier=2.0, sample_rate=1.0,  # noqa: E731
                                                 steps=1, as_json=True),
                       outputs=[str(out)], stdout_to=str(out))
    assert StageRunner(tmp_path).run(st()) is True
    assert StageRunner(tmp_path).run(st()) is False
    out.write_text('{"epsilon": 0.0}')                 # hand-edited intermediate
    assert StageRunner(tmp_path).run(st()) is True
    assert json.loads(out.read_text())["noise_multiplier"] == 2.0
    d = tmp_path / "d"
    d.mkdir()
    (d / "f.txt").write_text("a")
    r = StageRunner(tmp_path)
    k1 = r._input_key(str(d))
    (d / "f.txt").write_text("b")                      # same size, maybe same mtime second
    assert StageRunner(tmp_path)._input_key(str(d)) != k1


def test_readme_help_table_is_generated_from_the_code():
    """The README's "--help to the maths" table is scripts/help_table.py's output."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, str(root / "scripts" / "help_table.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
