"""The CLI shell: help for every command, --config defaults, --version, error format."""

import json

import numpy as np
import pytest

from conftest import write_jsonl

COMMANDS = {
    ("bench", "fetch"): ["--out", "--max-tokens", "--split"],
    ("bench", "stats"): ["--json"],
    ("embed",): ["--out", "--model", "all-MiniLM-L6-v2"],
    ("score",): ["--mode", "--private", "--synthetic", "--noise-multiplier", "--clip",
                 "--sample-rate", "--clients-per-round", "--seed", "--standardize",
                 "--max-samples-per-client", "--threshold", "--out", "--per-client-out"],
    ("aggregate",): ["--out", "--threshold"],
    ("account", "epsilon"): ["--noise-multiplier", "--sample-rate", "--steps", "--delta", "--accountant"],
    ("account", "sigma"): ["--epsilon", "--sample-rate", "--steps", "--delta", "--accountant"],
    ("account", "ledger"): ["--delta", "--json"],
}


def test_top_level_help_lists_pipeline_commands(run_popri):
    p = run_popri(["--help"], check=True)
    for name in ("bench", "embed", "score", "aggregate", "account"):
        assert name in p.stdout
    assert p.stderr == ""


@pytest.mark.parametrize("path,options", list(COMMANDS.items()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_command_documents_its_options(run_popri, path, options):
    p = run_popri([*path, "--help"], env={"COLUMNS": "200"}, check=True)
    for opt in options:
        assert opt in p.stdout, f"{' '.join(path)} --help does not mention {opt}"


def test_version(run_popri):
    p = run_popri(["--version"], check=True)
    assert p.stdout.startswith("popri ")


def test_config_file_gives_defaults_and_flags_override(tiny_st_model, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "text": "hello world"}])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"embed:\n  model: {tiny_st_model}\n  normalize: false\n")
    run_popri(["--config", cfg, "embed", src, "--out", tmp_path / "a.npy"], check=True)
    a = np.load(tmp_path / "a.npy")
    assert a.shape == (1, 32)
    assert json.loads((tmp_path / "a.meta.json").read_text())["normalize"] is False
    # a flag beats the config file
    run_popri(["--config", cfg, "embed", src, "--normalize", "--out", tmp_path / "b.npy"], check=True)
    assert json.loads((tmp_path / "b.meta.json").read_text())["normalize"] is True
    assert np.isclose(np.linalg.norm(np.load(tmp_path / "b.npy")), 1.0, atol=1e-5)


def test_bad_config_is_one_clear_error(tmp_path, run_popri):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("embed: [unclosed\n")
    p = run_popri(["--config", cfg, "embed", "x.jsonl", "--out", tmp_path / "o.npy"])
    assert p.returncode != 0 and "malformed YAML" in p.stderr and "Traceback" not in p.stderr


def test_python_m_popri_runs_from_a_source_checkout(tmp_path):
    """Issue 9 (section 6) / issue 11: a plain source tree (no install; the package first on
    sys.path) runs `python -m popri`; the removed `popri_cli` name is gone (0.3.0)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "popri", tmp_path / "popri",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", "import popri.cli.app as c; print(c.__file__)"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert p.stdout.strip() == str(tmp_path / "popri" / "cli" / "app.py")
    p = subprocess.run([sys.executable, "-m", "popri", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "score" in p.stdout and "audit" in p.stdout, p.stderr
    assert not (root / "popri_cli").exists()


