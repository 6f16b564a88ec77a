"""examples/compare.py's instruction table, assembled from fake runs: the script's table code
runs in every `make compare`, only after hours of training, so it is checked here on its own.

    python -m pytest -q tests/test_compare_tables.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _compare():
    spec = importlib.util.spec_from_file_location("popri_compare", ROOT / "examples" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_run(d: Path, name: str, acc: float, leak: float, baselines: bool) -> None:
    res = {"methods_instruct": {name: {"accuracy": acc, "accuracy_se": 0.01, "rouge_l": acc / 2,
                                       "rouge_l_se": 0.02}},
           "leakage": {name: {"rouge_l": leak, "rouge_l_se": 0.03}}}
    if baselines:
        res["methods_instruct"]["eps0"] = {"accuracy": 0.30, "accuracy_se": 0.01,
                                           "rouge_l": 0.10, "rouge_l_se": 0.01}
        res["methods_instruct"]["epsinf"] = {"accuracy": 0.50, "accuracy_se": 0.01,
                                             "rouge_l": 0.30, "rouge_l_se": 0.01}
        res["leakage"]["eps0"] = {"rouge_l": 0.2, "rouge_l_se": 0.01}
        res["leakage"]["epsinf"] = {"rouge_l": 0.6, "rouge_l_se": 0.01}
    (d / ".stages").mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(res))
    (d / ".stages" / "ffp-r1-local.json").write_text(json.dumps({"seconds": 120.0}))
    if baselines:  # the baselines' own stages are not the method's minutes
        (d / ".stages" / "ffp-centralized.json").write_text(json.dumps({"seconds": 60.0}))
        (d / ".stages" / "eval-eps0.json").write_text(json.dumps({"seconds": 30.0}))


def test_instruct_table_means_baselines_and_minutes(tmp_path, monkeypatch):
    C = _compare()
    accs = {("fewfedpit", 0): 0.40, ("fewfedpit", 1): 0.44, ("fedit", 0): 0.42, ("fedit", 1): 0.46}

    def run_method(a, runs, m, seed, carrier):
        d = runs / f"{m}-s{seed}"
        _fake_run(d, C.RUN_METHOD[m], accs[m, seed], 0.25 if m == "fewfedpit" else 0.35,
                  baselines=m == carrier)
        return d

    monkeypatch.setattr(C, "run_method", run_method)
    monkeypatch.setattr(C, "paired_gap", lambda d, name, ref, seed, *extra: {
        "gap_closed": (accs[d.name.split("-s")[0], seed] - 0.30) / 0.20, "gap_closed_se": 0.1})
    a = argparse.Namespace(seeds=[0, 1], sets=[])
    out = C.instruct_table(a, ["fewfedpit", "fedit"], tmp_path)
    table = json.loads((tmp_path / "compare-instruct.json").read_text())
    assert (tmp_path / "compare-instruct.md").read_text().strip() == out.strip()
    assert math.isclose(table["fewfedpit"]["accuracy"][0], 0.42)
    assert math.isclose(table["fedit"]["accuracy"][0], 0.44)
    assert math.isclose(table["fewfedpit"]["gap_closed"][0], 0.6)
    assert math.isclose(table["fewfedpit"]["leakage"][0], 0.25)
    # the baselines come from the carrier's runs and have no gap of their own
    assert math.isclose(table["epsinf"]["accuracy"][0], 0.50) and table["epsinf"]["gap_closed"] is None
    assert math.isclose(table["eps0"]["leakage"][0], 0.2)
    # minutes: the method's stages only (120 s), the baselines' stages their own
    assert math.isclose(table["fewfedpit"]["minutes"], 2.0)
    assert math.isclose(table["epsinf"]["minutes"], 1.0)
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| FewFedPIT", "| FedIT (beta = 1)",
                                                     "| eps=0 (base model)",
                                                     "| eps=inf (centralised)"]
