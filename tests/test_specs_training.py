"""The training / evaluation specs (LoraSpec, TrainSpec, DPOSpec, SFTSpec, SelectSpec,
PrefsSpec, DownstreamSpec, EvalSpec, GapSpec) and the commands built on them.

    python -m pytest -q tests/test_specs_training.py

- validation: each field's range / choices, strict ``from_dict``;
- the CLI: a bad value exits 2 with one line naming the flag;
- ``to_argv`` round trip through the real ``popri dpo`` / ``sft`` / ``prefs build`` /
  ``train-downstream`` / ``eval accuracy`` / ``eval gap`` click commands (every option default is
  the spec's default: written once);
- the LoRA settings are declared once (LoraSpec) and shared by DPO, SFT and the downstream model.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from popri.cli.options import build
from popri.core.errors import ConfigError
from popri.core.spec import default, to_argv
from popri.specs.training import (DownstreamSpec, DPOSpec, EvalSpec, GapSpec, LoraSpec,
                                  PrefsSpec, SelectSpec, SFTSpec, TrainSpec)

from conftest import click_command


_command = click_command


def _parse(spec_cls, path: tuple[str, ...], argv: list[str]):
    """The spec the real command would build from ``argv`` (parsed, not run)."""
    ctx = _command(*path).make_context(path[-1], argv, resilient_parsing=True)
    return build(spec_cls, **{f.name: ctx.params[f.name] for f in fields(spec_cls)
                              if f.metadata.get("cli", True)})


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("cls, kw, field", [
    (DPOSpec, {"beta": 0.0}, "beta"),
    (DPOSpec, {"beta": float("inf")}, "beta"),
    (DPOSpec, {"loss": "kto"}, "loss"),
    (DPOSpec, {"lr": -1.0}, "lr"),
    (DPOSpec, {"lr": float("nan")}, "lr"),
    (DPOSpec, {"lr": 0.0}, "lr"),
    (DPOSpec, {"epochs": 1e308}, "epochs"),
    (DPOSpec, {"min_lr_ratio": 1.5}, "min_lr_ratio"),
    (DPOSpec, {"lora_r": 0}, "lora_r"),
    (SFTSpec, {"lora_alpha": 0}, "lora_alpha"),
    (SFTSpec, {"batch_size": 0}, "batch_size"),
    (SFTSpec, {"grad_accum": 0}, "grad_accum"),
    (SFTSpec, {"max_length": 4}, "max_length"),
    (SFTSpec, {"save_steps": 0}, "save_steps"),
    (SFTSpec, {"max_steps": 0}, "max_steps"),
    (SelectSpec, {"select_samples": 1}, "select_samples"),
    (PrefsSpec, {"rejected_rank": 1}, "rejected_rank"),
    (DownstreamSpec, {"select_by": "bleu"}, "select_by"),
    (DownstreamSpec, {"lr": float("inf")}, "lr"),
    (DownstreamSpec, {"weight_decay": -0.1}, "weight_decay"),
    (DownstreamSpec, {"max_length": 1}, "max_length"),
    (DownstreamSpec, {"epochs": 0}, "epochs"),
    (EvalSpec, {"bootstrap": -1}, "bootstrap"),
    (EvalSpec, {"batch_size": 0}, "batch_size"),
    (GapSpec, {"bootstrap": 1}, "bootstrap"),
])
def test_specs_reject_bad_values_naming_the_field(cls, kw, field):
    with pytest.raises(ConfigError) as e:
        cls(**kw)
    assert e.value.field == field


def test_target_modules_accept_a_comma_string_or_a_list():
    assert DPOSpec(target_modules="q_proj, v_proj").target_modules == ("q_proj", "v_proj")
    assert SFTSpec(target_modules=["all-linear"]).target_modules == ("all-linear",)
    assert DownstreamSpec(target_modules=()).target_modules is None


def test_from_dict_is_strict_and_coerces():
    assert DPOSpec.from_dict({"lr": "1e-3", "epochs": 1, "target_modules": "q_proj,v_proj"}) == \
        DPOSpec(lr=1e-3, epochs=1.0, target_modules=("q_proj", "v_proj"))
    with pytest.raises(ConfigError, match="unknown key") as e:
        DPOSpec.from_dict({"rejected_rank": 5}, "dpo")  # a prefs setting, not a DPO one
    assert e.value.field == "dpo.rejected_rank"
    with pytest.raises(ConfigError) as e:
        DownstreamSpec.from_dict({"lora": "yes"}, "downstream")
    assert e.value.field == "downstream.lora"


# --------------------------------------------------------------------------- defaults, once
def test_lora_defaults_are_declared_once_and_shared():
    """DPO, SFT and the downstream model inherit LoraSpec's fields (not copies of them)."""
    lora = {f.name: f for f in fields(LoraSpec)}
    for cls in (TrainSpec, DPOSpec, SFTSpec, DownstreamSpec):
        mine = {f.name: f for f in fields(cls)}
        for name, f in lora.items():
            assert mine[name].default == f.default and mine[name].metadata == f.metadata
            assert name not in vars(cls).get("__annotations__", {}), (cls.__name__, name)
    assert (default(LoraSpec, "lora_r"), default(LoraSpec, "lora_alpha")) == (4, 8)  # POPri B.1
    # DPO and SFT share the training budget (a like-for-like PE+SFT baseline)
    assert DPOSpec().to_dict().items() >= SFTSpec().to_dict().items()
    # the batch of `popri dpo` (the run config keeps its own, 4, explicitly)
    assert DPOSpec().batch_size == 8


@pytest.mark.parametrize("path, cls", [
    (("dpo",), DPOSpec), (("dpo",), SelectSpec), (("sft",), SFTSpec),
    (("prefs", "build"), PrefsSpec), (("train-downstream",), DownstreamSpec),
    (("eval", "accuracy"), EvalSpec), (("eval", "gap"), GapSpec),
])
def test_every_option_default_is_the_spec_default(path, cls):
    params = {p.name: p for p in _command(*path).params}
    for f in fields(cls):
        d = default(cls, f.name)
        if isinstance(d, tuple) and f.metadata.get("sep"):
            d = f.metadata["sep"].join(d)
        assert params[f.name].default == d, f"{' '.join(path)} {f.name}"


# --------------------------------------------------------------------------- to_argv round trip
REQUIRED = {
    ("dpo",): ["--pairs", "p.jsonl", "--out", "o"],
    ("sft",): ["--out", "o"],
    ("prefs", "build"): ["--samples", "s.jsonl", "--scores", "s.npy"],
    ("train-downstream",): ["syn.jsonl", "--out", "o"],
    ("eval", "accuracy"): ["--data", "d"],
    ("eval", "gap"): ["--acc", "0.4", "--eps0", "0.3", "--epsinf", "0.5"],
}


@pytest.mark.parametrize("path, spec", [
    (("dpo",), DPOSpec(loss="ipo", beta=0.05, lora_r=16, lora_alpha=16,
                       target_modules=("q_proj", "v_proj"), lr=8e-7, min_lr_ratio=0.1, epochs=1.5,
                       batch_size=4, grad_accum=6, max_length=256, save_steps=3, max_steps=9,
                       bf16=False, gradient_checkpointing=True)),
    (("dpo",), SelectSpec(select_samples=16)),
    (("sft",), SFTSpec(lora_r=8, target_modules=("all-linear",), lr=1e-4, epochs=3.0,
                       save_steps=2, bf16=False, gradient_checkpointing=True)),
    (("prefs", "build"), PrefsSpec(rejected_rank=3)),
    (("train-downstream",), DownstreamSpec(max_length=32, count_eos=False, bos_token="<s>",
                                           eos_token="</s>", bf16=False, lr=1e-3,
                                           weight_decay=0.0, epochs=2, batch_size=16,
                                           micro_batch_size=4, lora=True, lora_r=8,
                                           lora_alpha=32, target_modules=("c_attn",),
                                           select_by="loss", max_steps=5, max_samples=100,
                                           max_val_samples=10, eval_batch_size=8)),
    (("train-downstream",), DownstreamSpec(lora=False, count_eos=True)),
    (("eval", "accuracy"), EvalSpec(max_length=128, count_eos=False, bos_token="<|endoftext|>",
                                    batch_size=4, bf16=False, max_samples=10, bootstrap=0)),
    (("eval", "gap"), GapSpec(bootstrap=50, allow_undefined=True)),
], ids=lambda x: " ".join(x) if isinstance(x, tuple) else type(x).__name__)
def test_to_argv_round_trips_through_the_command(path, spec):
    argv = to_argv(spec)
    assert _parse(type(spec), path, argv + REQUIRED[path]) == spec
    assert _parse(type(spec), path, REQUIRED[path]) == type(spec)()  # no flags: the defaults


def test_run_json_config_is_the_spec():
    """What a DPO / SFT run records is spec.to_dict() plus model, adapter, seed and count."""
    from popri.methods.popri.dpo import _config

    spec = DPOSpec(beta=0.05, target_modules=("q_proj",))
    cfg = json.loads(json.dumps(_config(spec, [{}] * 3, model="m", adapter=None, seed=7)))
    assert cfg == {**json.loads(json.dumps(spec.to_dict())), "model": "m", "adapter": None,
                   "adapter_sha256": None, "seed": 7, "records": 3}


# --------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("argv, flag", [
    (["dpo", "--pairs", "{p}", "--out", "{o}", "--loss", "kto"], "--loss"),
    (["dpo", "--pairs", "{p}", "--out", "{o}", "--min-lr-ratio", "2"], "--min-lr-ratio"),
    (["sft", "--pairs", "{p}", "--out", "{o}", "--save-steps", "0"], "--save-steps"),
    (["train-downstream", "{p}", "--out", "{o}", "--select-by", "bleu"], "--select-by"),
    (["train-downstream", "{p}", "--out", "{o}", "--weight-decay", "-1"], "--weight-decay"),
    (["eval", "accuracy", "--data", "{p}", "--max-samples", "0"], "--max-samples"),
])
def test_cli_bad_value_is_one_line_naming_the_flag(tmp_path, run_popri, argv, flag):
    p = tmp_path / "in.jsonl"
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c", "text": "t"}\n')
    r = run_popri([a.format(p=p, o=tmp_path / "o") for a in argv] + ["--model", "/nonexistent"])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("popri: error: ") and flag in lines[0], r.stderr
    assert not (tmp_path / "o").exists()
