"""Issue 46: a stage of ``popri run`` is a typed Call, and its command line means what it meant
when stages were argv lists.

    python -m pytest -q tests/test_typed_stages.py

tests/fixtures/stages_before_typed.json.gz holds every stage of 13 shipped configs and three
variants (release mode, PE in release mode, the learning study's remedies: 786 stages) as built
at bfccefe, before the change: its argv, inputs, outputs, stdout file, whether it is a DP
release, and its restart flags.  Each stage built now must parse (the command's own parser,
``popri.cli.options.parse_call``) into the same Call as the old argv did, with the same files.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
import typer

from popri.cli.app import app
from popri.cli.options import parse_call
from popri.kit import Z_LATER, Stage, redrawn
from popri.pipeline.config import load
from popri.pipeline.driver import Run
from popri.specs.commands.gen import GenCall

ROOT = Path(__file__).resolve().parents[1]
BEFORE = ROOT / "tests" / "fixtures" / "stages_before_typed.json.gz"
VARIANTS = {"learning-gate": ("learning", ["dpo.fluency_gate=0.25", "dpo.pair_rule=fluent",
                                           "draws=3", "final_match_tokens=true",
                                           "final_top_p=0.9"]),
            "release": (None, ["release=true"]), "pe-release": ("pe", ["release=true"])}


def _stages(name: str) -> list[Stage]:
    if name in VARIANTS:
        cfg, sets = VARIANTS[name]
    else:
        cfg, sets = (None if name == "default-embedded" else name), []
    path = str(ROOT / "examples" / f"{cfg}.yaml") if cfg else None
    r = Run(load(path, sets), dry_run=True, inputs=[path] if path else [])
    r._set_noise()
    return r.all_stages()


def _parse(root, argv):
    return parse_call(root, ["0.123456789" if a == Z_LATER else a for a in argv])


def test_every_stage_means_what_its_argv_meant(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the plans' run directories are relative, as recorded
    monkeypatch.setenv("POPRI_ZYGOTE", "0")
    before = json.loads(gzip.decompress(BEFORE.read_bytes()))
    root = typer.main.get_command(app)
    n, changed = 0, set()
    for name, old in before.items():
        now = {st.name: st for st in _stages(name)}
        assert set(now) == set(old), name
        for sname, o in old.items():
            st = now[sname]
            a, b = _parse(root, st.args), _parse(root, o["args"])
            if sname == "fetch-public":  # a mark, not a meaning: Omega is public (issue 66)
                assert a[1].public and not b[1].public, (name, sname)
                a = (a[0], dataclasses.replace(a[1], public=False))
            if a != b:
                _rescaled(a, b, (name, sname))
                changed.add((name, sname))
            assert (st.inputs, st.outputs, st.stdout_to, st.release is not None) == \
                (o["inputs"], o["outputs"], o["stdout_to"], o["release"]), (name, sname)
            assert (st.fresh == {"resume": False}) == (o["fresh"] == ["--no-resume"])
            n += 1
    assert n == 786
    # the one change of meaning since the fixture: release mode's DP stages are passed z itself
    # (they were passed z (1 + 1e-4), the mechanism's snapping taken off again on the way)
    assert changed == {("release", "round1-score"), ("pe-release", "round1-score")}


def _rescaled(a, b, where):
    """``a`` (now) differs from ``b`` (the fixture) only by z: b's is a's times 1 + 1e-4 (and
    PE's vote threshold H = z M follows it)."""
    (qa, ca), (qb, cb) = a, b
    diff = {f.name for f in dataclasses.fields(ca) if getattr(ca, f.name) != getattr(cb, f.name)}
    assert qa == qb and diff and diff <= {"noise_multiplier", "threshold"}, (where, diff)
    if "noise_multiplier" in diff:
        assert cb.noise_multiplier == pytest.approx(ca.noise_multiplier * (1 + 1e-4), rel=1e-12)
    if "threshold" in diff:
        assert cb.threshold == pytest.approx(ca.threshold * (1 + 1e-4), rel=1e-12)


def test_a_redraw_replaces_fields_and_renders_them():
    st = Stage("synthetic", GenCall(omega="o.jsonl", num_samples=8, out="syn.jsonl", seed=999,
                                    stats_out="syn_stats.json"), outputs=["syn.jsonl"],
               inputs=["o.jsonl"])
    d = redrawn(st, 2, Path("d2/syn.jsonl"), "synthetic-d2")
    assert d.call == dataclasses.replace(st.call, seed=d.call.seed, out="d2/syn.jsonl",
                                         stats_out="d2/syn_stats.json")
    assert d.call.seed != 999 and d.args[d.args.index("--seed") + 1] == str(d.call.seed)
    assert d.inputs == st.inputs and d.outputs == ["d2/syn.jsonl"]


def test_the_cache_key_follows_the_calls_fields_not_its_rendering(tmp_path):
    """Two calls that render alike but differ in a field (a default written or not) key
    alike only when the fields are equal: the key hashes the call, not the text."""
    from popri.pipeline.stages import StageRunner

    a = Stage("g", GenCall(omega="o", out="x"), outputs=[])
    b = Stage("g", GenCall(omega="o", out="x", temperature=1.0), outputs=[])
    c = Stage("g", GenCall(omega="o", out="x", temperature=0.7), outputs=[])
    r = StageRunner(tmp_path)
    assert a.args == b.args and r.key(a) == r.key(b)
    assert r.key(c) != r.key(a)


def test_a_new_setting_of_a_stage_is_one_field_of_its_spec(tmp_path):
    """Issue 46's newcomer test: a new generator setting written as one field of
    ``GeneratorSpec`` (a copy of popri with that one line added, nothing else) is at once an
    option of ``popri gen`` and ``popri expand``, a key of ``popri run``'s ``generator:``
    section, and an option of the plan's generation lines."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "src"
    shutil.copytree(ROOT / "popri", copy / "popri",
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = copy / "popri" / "specs" / "generation.py"
    src = spec.read_text(encoding="utf-8")
    anchor = "class GeneratorSpec(SamplingSpec):\n"
    i = src.index('"""', src.index('"""', src.index(anchor)) + 3) + 3  # after its docstring
    src = (src[:i] + '\n\n    new_knob: int = param(3, "A new setting (test).", lo=1)'
           + src[i:])
    spec.write_text(src, encoding="utf-8")
    env = {"PYTHONPATH": str(copy), "POPRI_ZYGOTE": "0", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "COLUMNS": "200"}

    def popri(*args):
        p = subprocess.run([sys.executable, "-m", "popri.cli.app", *args], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout

    assert "--new-knob" in popri("gen", "--help") and "--new-knob" in popri("expand", "--help")
    assert "new_knob: 3" in popri("run", "--show-config")
    plan = popri("run", "--dry-run", "--set", "generator.new_knob=5").splitlines()
    gens = [x for x in plan if x.startswith("popri gen")]
    assert gens and all("--new-knob 5" in x for x in gens)
    assert not any("--new-knob" in x for x in popri("run", "--dry-run").splitlines())
