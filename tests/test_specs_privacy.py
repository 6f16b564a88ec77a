"""The privacy specs (popri/specs/privacy.py): validation, defaults written once, and the round
trip spec -> to_argv -> the real command's options -> the same spec.

    python -m pytest -q tests/test_specs_privacy.py
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from popri.cli.options import build
from popri.core.errors import ConfigError, InputError
from popri.core.spec import to_argv
from popri.specs.privacy import (AuditSpec, EpsilonSpec, FredStatsSpec, LedgerTotalSpec,
                                 SigmaSpec)

from conftest import click_command


_command = click_command


def _parse(path: tuple[str, ...], argv: list[str]) -> dict:
    """The values the real command's options parse ``argv`` into."""
    cmd = _command(*path)
    with cmd.make_context(path[-1], list(argv)) as ctx:
        return dict(ctx.params)


def _fields(spec_cls, params: dict, rename: dict | None = None) -> dict:
    import dataclasses

    rename = rename or {}
    names = {f.name for f in dataclasses.fields(spec_cls)}
    out = {}
    for k, v in params.items():
        k = rename.get(k, k)
        if k in names:
            out[k] = v
    return out


# --------------------------------------------------------------------------- one source of truth
def test_choices_are_the_librarys():
    from popri.methods.fred import stats as F
    from popri.privacy import accounting as A
    from popri.apps import audit
    from popri.privacy import calibration as C
    from popri.specs import privacy as S

    assert S.ACCOUNTANTS == A.ACCOUNTANTS
    assert S.RELATIONS == F.RELATIONS and S.LEVELS == F.LEVELS
    assert S.CALIBRATIONS == C.CALIBRATIONS == F.CALIBRATIONS
    assert S.DEFAULT_USER_CAP == F.DEFAULT_USER_CAP
    assert audit.MECHANISMS == S.AUDIT_MECHANISMS and audit.BREAKS == S.AUDIT_BREAKS


def test_specs_import_no_numpy():
    code = "import sys, popri.specs.privacy; print('numpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --------------------------------------------------------------------------- FredStatsSpec
def test_fred_defaults_are_resolved_once():
    s = FredStatsSpec(epsilon=0.6, delta=2e-6)
    assert (s.relation, s.level, s.clip, s.calibration, s.denoise) == \
        ("replace-one", "sample", 1.0, "classic", False)
    assert s.max_samples_per_client is None
    u = FredStatsSpec(epsilon=0.6, delta=2e-6, level="user")
    assert u.max_samples_per_client == 8
    assert FredStatsSpec(epsilon=0.6, delta=2e-6, level="user",
                         max_samples_per_client=3).max_samples_per_client == 3
    n = FredStatsSpec(non_private=True)  # nothing resolved: those settings do not apply
    assert (n.relation, n.clip, n.calibration) == (None, None, None)


@pytest.mark.parametrize("kw, field", [
    ({}, "epsilon"),
    ({"epsilon": 0.5}, "delta"),
    ({"epsilon": 0.0, "delta": 1e-5}, "epsilon"),
    ({"epsilon": 701.0, "delta": 1e-5}, "epsilon"),
    ({"epsilon": math.nan, "delta": 1e-5}, "epsilon"),
    ({"epsilon": 0.5, "delta": 1.0}, "delta"),
    ({"epsilon": 0.5, "delta": 1e-5, "clip": 0.0}, "clip"),
    ({"epsilon": 0.5, "delta": 1e-5, "clip": 1e300}, "clip"),
    ({"epsilon": 0.5, "delta": 1e-5, "relation": "swap"}, "relation"),
    ({"epsilon": 0.5, "delta": 1e-5, "level": "client"}, "level"),
    ({"epsilon": 0.5, "delta": 1e-5, "calibration": "rdp"}, "calibration"),
    ({"epsilon": 0.5, "delta": 1e-5, "max_samples_per_client": 3}, "max_samples_per_client"),
    ({"epsilon": 0.5, "delta": 1e-5, "level": "user", "max_samples_per_client": 0},
     "max_samples_per_client"),
    ({"non_private": True, "epsilon": 0.5}, "epsilon"),
    ({"non_private": True, "relation": "replace-one"}, "relation"),
    ({"non_private": True, "denoise": False}, "denoise"),
    ({"non_private": True, "release": True}, "release"),
])
def test_fred_spec_validation_names_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        FredStatsSpec(**kw)
    assert e.value.field == field


def test_fred_from_dict_is_strict():
    s = FredStatsSpec.from_dict({"epsilon": "0.5", "delta": 1e-5, "level": "user"})
    assert s.epsilon == 0.5 and s.max_samples_per_client == 8
    with pytest.raises(ConfigError) as e:
        FredStatsSpec.from_dict({"epsilonn": 0.5}, "fred.stats")
    assert e.value.field == "fred.stats.epsilonn" and "known:" in e.value.message


def test_build_names_the_flag():
    with pytest.raises(InputError) as e:
        build(FredStatsSpec, non_private=True, max_samples_per_client=4)
    assert e.value.field == "--max-samples-per-client"
    assert "--max-samples-per-client applies to the private release only" in e.value.message


# --------------------------------------------------------------------------- the other specs
def test_account_and_audit_specs():
    assert EpsilonSpec(noise_multiplier=1.0, sample_rate=0.1, steps=3).delta == 3e-6
    assert LedgerTotalSpec().delta is None  # the entries' own delta by default
    for kw, field in (({"sample_rate": 0.1, "steps": 3}, "noise_multiplier"),
                      ({"noise_multiplier": -1.0, "sample_rate": 0.1, "steps": 3},
                       "noise_multiplier"),
                      ({"noise_multiplier": 1.0, "sample_rate": 0.0, "steps": 3}, "sample_rate"),
                      ({"noise_multiplier": 1.0, "sample_rate": 0.1}, "steps"),
                      ({"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 3,
                        "accountant": "moments"}, "accountant")):
        with pytest.raises(ConfigError) as e:
            EpsilonSpec(**kw)
        assert e.value.field == field
    with pytest.raises(ConfigError) as e:
        SigmaSpec(epsilon=1.0, sample_rate=0.1, steps=3, tol=1e-300)
    assert e.value.field == "tol"
    with pytest.raises(ConfigError) as e:
        LedgerTotalSpec(max_epsilon=math.inf)
    assert e.value.field == "max_epsilon"

    a = AuditSpec(mechanism="fred", trials=1000, epsilon=0.9)
    assert (a.relation, a.level, a.clip, a.calibration, a.n_clients) == \
        ("replace-one", "sample", 1.0, "classic", 3)
    h = AuditSpec(mechanism="nn-histogram", trials=1000, noise_multiplier=1.0)
    assert h.clip is None and h.relation is None and h.n_clients == 20
    for kw, field in (({"mechanism": "cosine", "trials": 1000}, "noise_multiplier"),
                      ({"mechanism": "cosine", "trials": 1000, "noise_multiplier": 1.0,
                        "epsilon": 1.0}, "noise_multiplier"),
                      ({"mechanism": "nn-histogram", "trials": 1000, "noise_multiplier": 1.0,
                        "clip": 1.0}, "clip"),
                      ({"mechanism": "cosine", "trials": 1000, "noise_multiplier": 1.0,
                        "level": "user"}, "level"),
                      ({"mechanism": "fred", "trials": 1000, "noise_multiplier": 1.0,
                        "max_samples_per_client": 4}, "max_samples_per_client"),
                      ({"mechanism": "cosine", "trials": 1000, "noise_multiplier": 1.0,
                        "max_samples_per_client": 1001}, "max_samples_per_client"),
                      ({"mechanism": "cosine", "trials": 99, "noise_multiplier": 1.0}, "trials"),
                      ({"mechanism": "cosine", "trials": 1000, "noise_multiplier": 1.0,
                        "brk": "x"}, "brk"),
                      ({"trials": 1000, "noise_multiplier": 1.0}, "mechanism")):
        with pytest.raises(ConfigError) as e:
            AuditSpec(**kw)
        assert e.value.field == field, kw


# --------------------------------------------------------------------------- the real CLI
@pytest.mark.parametrize("argv, flag", [
    (["fred", "stats", "--private", "p.npy", "--out", "o.npz", "-e", "0.5", "--delta", "1e-5",
      "--calibration", "exact"], "--calibration"),
    (["fred", "stats", "--private", "p.npy", "--out", "o.npz", "-e", "0.5", "--delta", "1e-5",
      "--level", "client"], "--level"),
    (["fred", "stats", "--private", "p.npy", "--out", "o.npz", "--non-private", "--clip", "2"],
     "--clip"),
    (["account", "epsilon", "-z", "1", "-q", "0.1", "-T", "3", "-a", "moments"], "--accountant"),
    (["account", "sigma", "-e", "1", "-q", "0.1", "-T", "3", "--delta", "0"], "--delta"),
    (["audit", "release", "--mechanism", "cosine", "-z", "1", "--trials", "1000", "--dataset",
      "mine"], "--dataset"),
    (["audit", "release", "--mechanism", "cosine", "-z", "1", "--trials", "1000",
      "--confidence", "1"], "--confidence"),
])
def test_cli_bad_value_exits_2_naming_the_flag(tmp_path, run_popri, argv, flag):
    p = run_popri(argv, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("popri: error:") and f"'{flag}'" in lines[0]
    assert list(tmp_path.iterdir()) == []


FRED_SPECS = [
    FredStatsSpec(epsilon=0.6, delta=2e-6),
    FredStatsSpec(epsilon=2.0, delta=3e-6, relation="add-remove", level="user", clip=0.5,
                  calibration="analytic", denoise=True, release=True),
    FredStatsSpec(epsilon=0.1, delta=1e-9, level="user", max_samples_per_client=3),
    FredStatsSpec(non_private=True),
]


@pytest.mark.parametrize("spec", FRED_SPECS)
def test_fred_stats_spec_round_trips_through_the_real_command(spec):
    argv = to_argv(spec)
    params = _parse(("fred", "stats"), ["--private", "p.npy", "--out", "o.npz", *argv])
    assert params["private"] == "p.npy" and params["out"] == "o.npz"
    assert build(FredStatsSpec, **_fields(FredStatsSpec, params)) == spec


@pytest.mark.parametrize("path, spec, rename", [
    (("account", "epsilon"), EpsilonSpec(noise_multiplier=1.05, sample_rate=0.0075, steps=20,
                                         accountant="pld", delta=1e-5), None),
    (("account", "sigma"), SigmaSpec(epsilon=7.58, sample_rate=1.0, steps=11, tol=1e-3), None),
    (("account", "ledger"), LedgerTotalSpec(delta=1e-5, max_epsilon=2.5), None),
    (("audit", "release"), AuditSpec(mechanism="fred", trials=2000, epsilon=0.9, delta=1e-5,
                                     level="user", max_samples_per_client=4, brk="no-clip",
                                     dataset="adversarial", confidence=0.9), None),
    (("audit", "release"), AuditSpec(mechanism="nn-histogram", trials=500,
                                     noise_multiplier=2.0, clients=7, synthetic=30, dim=4),
     None),
])
def test_account_and_audit_specs_round_trip(path, spec, rename):
    argv = to_argv(spec)
    extra = ["runs/"] if path[-1] == "ledger" else []
    params = _parse(path, [*extra, *argv])
    assert build(type(spec), **_fields(type(spec), params, rename)) == spec


def test_the_readmes_default_relation_claim_is_true_of_every_default():
    """Hostile case L10 (issue 66): README said every default is add/remove one client, but
    `popri fred stats` defaults to FreD's replace one sample.  The claim now names the
    exception, and the code keeps both sides of it true."""
    from pathlib import Path

    from popri.methods.steps import select_settings
    from popri.pipeline import config as C
    from popri.specs.privacy import FredStatsSpec

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "every method's default: add/remove one client" in text
    assert "`popri fred stats` alone keeps FreD's replace-one-sample" in text
    assert FredStatsSpec.DEFAULTS["relation"] == "replace-one"
    assert FredStatsSpec.DEFAULTS["level"] == "sample"
    sel = select_settings(C.load(None))  # popri run's own FreD release: user level, add/remove
    assert (sel["relation"], sel["level"]) == ("add-remove", "user")
