"""Hostile inputs of the 0.2.0 probe (/work/shared/probes/hostile-0.2.0.md), one test per case
ID: instruction records of the wrong types, empty evaluation data, synthetic sets of another
client or round, FedMIT without its private data, selfgen's two outputs committed together, an
empty split of instruct build, an absurd audit z, and help / error texts that name what exists.

    python -m pytest tests/test_hostile_inputs.py -q
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import assert_one_line_error, write_jsonl
from test_fewfedpit import FAST, _data, _synthetic  # noqa: E402 (skips without rouge-score)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# in-process LoRA setup (the r0 fixture): peft's warning, silenced by the CLI as well
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.* is deprecated")


def _one_line_error(p, *needles: str) -> str:
    """The CLI's bad-input contract (conftest): exit 2, one line on stderr, no traceback."""
    return assert_one_line_error(p, *needles)


@pytest.fixture(scope="module")
def r0(tiny_lm, tmp_path_factory) -> Path:
    """Round 0's global weights of the tiny model (what 'fewfedpit init' writes)."""
    from popri.methods.fewfedpit.client import init_global
    from popri.specs.fewfedpit import FewFedPITSpec

    out = tmp_path_factory.mktemp("ffp") / "r0"
    init_global(tiny_lm, str(out), FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False), seed=0,
                device="cpu")
    return out


GOOD = {"client_id": "c0", "instruction": "Say hello.", "input": "", "output": "Hello there."}


# --------------------------------------------------------------------------- eval instruct
def test_ev10_empty_data_is_refused(tiny_lm, tmp_path, run_popri):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    p = run_popri(["eval", "instruct", "--model", tiny_lm, "--data", empty, "--no-bf16",
                   "--no-generate", "--json"])
    _one_line_error(p, "empty.jsonl", "no examples")
    assert p.stdout == ""


_TYPED = {
    "ev11": ({"instruction": ["a", "b"], "output": 3}, "instruction"),
    "ev20": ({"instruction": "Add.", "input": 1, "output": "Two."}, "input"),
    "ev21": ({"instruction": "Add.", "input": ["a"], "output": "Two."}, "input"),
}


def _eval_typed(case, tiny_lm, tmp_path, run_popri):
    row, field = _TYPED[case]
    f = write_jsonl(tmp_path / f"{case}.jsonl", [GOOD, {"client_id": "c1", **row}])
    p = run_popri(["eval", "instruct", "--model", tiny_lm, "--data", f, "--no-bf16",
                   "--no-generate", "--json"])
    _one_line_error(p, f"{case}.jsonl:2: field '{field}'")


def test_ev11_instruction_list_output_int_is_one_line(tiny_lm, tmp_path, run_popri):
    _eval_typed("ev11", tiny_lm, tmp_path, run_popri)


def test_ev20_input_int_is_one_line(tiny_lm, tmp_path, run_popri):
    _eval_typed("ev20", tiny_lm, tmp_path, run_popri)


def test_ev21_input_list_is_one_line(tiny_lm, tmp_path, run_popri):
    _eval_typed("ev21", tiny_lm, tmp_path, run_popri)


# --------------------------------------------------------------------------- fewfedpit
def test_ff115_local_with_wrong_types_is_one_line(r0, tmp_path, run_popri):
    f = write_jsonl(tmp_path / "types.jsonl", [
        {"client_id": "1", "instruction": "Say hi.", "output": "Hi."},
        {"client_id": "1", "instruction": ["Say", "hi"], "output": 5}])
    p = run_popri(["fewfedpit", "local", "--data", f, "--client", "1", "--round", "1",
                   "--init", r0, "--out", tmp_path / "local", *FAST])
    _one_line_error(p, "types.jsonl:2: field 'instruction'")
    assert not (tmp_path / "local").exists()


def _train(run_popri, r0, syn, out, *more):
    return run_popri(["fewfedpit", "train", "--synthetic", syn, "--client", "c0", "--round", "1",
                      "--init", r0, "--out", out, *FAST, *more])


def test_fft_inlist_train_input_list_is_one_line(r0, tmp_path, run_popri):
    syn = write_jsonl(tmp_path / "s_inlist.jsonl", [
        {"instruction": "Name a colour.", "input": "", "output": "Blue.", "kept": True},
        {"instruction": "Say hello.", "input": ["a"], "output": "Hello.", "kept": True}])
    p = _train(run_popri, r0, syn, tmp_path / "public")
    _one_line_error(p, "s_inlist.jsonl:2: field 'input'")
    assert not (tmp_path / "public").exists()


def _selfgen_rows(client, round_):
    return [{"id": f"r{round_}/{client}/syn{i}", "client_id": client, "round": round_,
             "instruction": i_, "input": "", "output": o, "kept": True, "stage": "ifs"}
            for i, (i_, o) in enumerate([("Name a colour.", "Blue is a colour."),
                                         ("Say hello.", "Hello there.")])]


def test_fft_otherclient_train_refuses_another_clients_rows(r0, tmp_path, run_popri):
    syn = write_jsonl(tmp_path / "syn_c9.jsonl", _selfgen_rows("c9", 1))
    p = _train(run_popri, r0, syn, tmp_path / "public")
    _one_line_error(p, "syn_c9.jsonl:1: field 'client_id'", "'c9'", "'c0'")
    assert not (tmp_path / "public").exists()


def test_fft_round_train_refuses_another_rounds_rows(r0, tmp_path, run_popri):
    syn = write_jsonl(tmp_path / "syn_r7.jsonl", _selfgen_rows("c0", 7))
    p = _train(run_popri, r0, syn, tmp_path / "public")
    _one_line_error(p, "syn_r7.jsonl:1: field 'round'", "7")
    assert not (tmp_path / "public").exists()


def test_fft_fedmit_without_private_data_is_refused(r0, tmp_path, run_popri):
    p = _train(run_popri, r0, _synthetic(tmp_path), tmp_path / "public", "--mode", "fedmit")
    _one_line_error(p, "field '--data'", "fedmit")
    assert not (tmp_path / "public").exists()


def _bad_stats_targets(tmp_path: Path) -> list[str]:
    """--stats-out paths that cannot be written (as root too): under a regular file, and the
    /dev/full device where this machine has it."""
    (tmp_path / "afile").write_text("x")
    out = [str(tmp_path / "afile" / "stats.json")]
    if os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode):
        out.append("/dev/full")
    return out


def test_ff137_selfgen_writes_both_outputs_or_neither(tiny_lm, r0, tmp_path, run_popri):
    from popri.methods.fewfedpit.client import run_local
    from popri.specs.fewfedpit import FewFedPITSpec

    data = _data(tmp_path)
    local = tmp_path / "local"
    run_local(str(data), "c0", str(local), FewFedPITSpec(lora_r=8, lora_alpha=16, bf16=False),
              round_=1, init=str(r0), device="cpu")
    gen = ["fewfedpit", "selfgen", "--data", data, "--client", "c0", "--round", "1", "--init",
           r0, "--local", local, "--candidates", "2", "--keep", "1", "--instruction-prompts",
           "1", "--instruction-tokens", "8", "--response-tokens", "8", "--retries", "1", *FAST]
    for bad in _bad_stats_targets(tmp_path):
        out = tmp_path / "s.jsonl"
        p = run_popri([*gen, "--out", out, "--stats-out", bad])
        assert p.returncode == 2 and "Traceback" not in p.stderr, (bad, p.stderr[-2000:])
        assert not out.exists(), bad  # neither file: --out is not left behind
        assert not list(tmp_path.glob(".s.jsonl.*")), bad  # nor its temporary file
    # the same command with a writable --stats-out writes both
    p = run_popri([*gen, "--out", tmp_path / "s.jsonl", "--stats-out", tmp_path / "s.json"],
                  check=True)
    assert (tmp_path / "s.jsonl").is_file()
    assert json.loads((tmp_path / "s.json").read_text())["client"] == "c0"


# --------------------------------------------------------------------------- instruct build
def test_ib22_empty_test_split_warns_and_eval_refuses_it(tiny_lm, tmp_path, run_popri):
    from popri.data import splits as S

    # clients the hash rule (seed 0, default fractions 0.1 / 0.1) puts in train: val and test
    # get none
    cands = [f"user{i}" for i in range(200)]
    where = S.assign_splits(dict.fromkeys(cands), "hash", 0.1, 0.1, 0)
    train = [c for c in cands if where[c] == "train"][:4]
    rows = [{"client_id": c, "instruction": f"Describe item {k} of {c}.",
             "output": f"Item {k} of {c} is small, round and quite heavy."}
            for c in train for k in range(2)]
    f = write_jsonl(tmp_path / "ok.jsonl", rows)
    p = run_popri(["instruct", "build", f, "--out", tmp_path / "D"])
    assert p.returncode == 0, p.stderr
    for split in ("val", "test"):
        warn = [x for x in p.stderr.splitlines() if x.startswith("popri: warning: ")
                and f"split {split} " in x]
        assert warn and f"--{split}-frac" in warn[0] and "more clients" in warn[0], p.stderr
    p = run_popri(["eval", "instruct", "--model", tiny_lm, "--data", tmp_path / "D", "--split",
                   "test", "--no-bf16", "--no-generate", "--json"])
    _one_line_error(p, "test.jsonl", "no examples")


# --------------------------------------------------------------------------- audit, fl, help
def test_ar20_audit_refuses_an_absurd_noise_multiplier(run_popri):
    p = run_popri(["audit", "release", "--mechanism", "cosine", "-z", "1e-300", "-T", "100"])
    _one_line_error(p, "field '--noise-multiplier'")
    assert p.stdout == ""
    # the help says why there is a floor
    p = run_popri(["audit", "release", "--help"], env={"COLUMNS": "200"})
    assert "can refute" in " ".join(p.stdout.replace("│", " ").split())


def test_fl40_missing_z_names_a_real_command(run_popri, tmp_path):
    p = run_popri(["fl", "round", "--data", tmp_path / "d.jsonl", "--round", "1", "--out",
                   tmp_path / "o"])
    err = _one_line_error(p, "--noise-multiplier", "popri account sigma")
    assert "calibrate'" not in err
    assert "sigma" in run_popri(["account", "--help"], env={"COLUMNS": "200"}).stdout


def test_fl_help_shows_the_flower_extra(run_popri):
    for cmd in (["fl", "round"], ["score"]):
        p = run_popri([*cmd, "--help"], env={"COLUMNS": "200"})
        assert p.returncode == 0, p.stderr
        text = " ".join(p.stdout.replace("│", " ").split())
        assert "pip install 'popri[flower]'" in text, (cmd, text)
        assert "'popri'" not in text and "\\[" not in text


# --------------------------------------------------------------------------- popri run
def test_rf27_run_fewfedpit_refuses_privacy_noise_multiplier(run_popri, tmp_path):
    p = run_popri(["run", EXAMPLES / "fewfedpit.yaml", "--dry-run", "--set",
                   f"run_dir={tmp_path / 'run'}", "--set", "privacy.noise_multiplier=1"])
    _one_line_error(p, "privacy.noise_multiplier", "fewfedpit.noise_multiplier",
                    "fewfedpit.clip")
    assert not (tmp_path / "run").exists()
    # the extension's own settings still plan its noise
    p = run_popri(["run", EXAMPLES / "fewfedpit.yaml", "--dry-run", "--set",
                   f"run_dir={tmp_path / 'run'}", "--set", "fewfedpit.noise_multiplier=1",
                   "--set", "fewfedpit.clip=1"], check=True)
    assert "--noise-multiplier 1" in p.stdout
