"""popri.specs.generation: GenSpec / VarySpec / ExpandSpec validation, shared fields, and the
round trip spec -> to_argv -> the real click command of popri gen / vary / expand -> spec.

    python -m pytest -q tests/test_specs_generation.py
"""

import dataclasses

import pytest

from popri.core.errors import ConfigError
from popri.core.spec import spec_field, to_argv
from popri.specs.generation import (
    ExpandSpec,
    FilterSpec,
    GeneratorSpec,
    GenSpec,
    SamplingSpec,
    VarySpec,
    settle,
)

from conftest import click_command

# (spec class, field, bad value, words the message must hold)
BAD = [
    (GenSpec, "temperature", -1.0, ">= 0"),
    (GenSpec, "top_p", 0.0, "in (0, 1]"),
    (GenSpec, "top_p", 1.5, "in (0, 1]"),
    (GenSpec, "max_new_tokens", 0, ">= 1"),
    (GenSpec, "max_tokens", 0, ">= 1"),
    (GenSpec, "batch_size", 0, ">= 1"),
    (GenSpec, "backend", "tgi", "one of transformers, transformers-generate, vllm, openai"),
    (GenSpec, "adapter_mode", "fuse", "one of lora, merge"),
    (GenSpec, "samples_per_prompt", 0, ">= 1"),
    (GenSpec, "shots", 0, ">= 1"),
    (GenSpec, "min_words", -1, ">= 0"),
    (GenSpec, "max_retries", -1, ">= 0"),
    (GenSpec, "marker", "", "must not be empty"),
    (GenSpec, "model", " ", "must not be empty"),
    (VarySpec, "method", "rewrite", "one of mask-fill, paraphrase"),
    (VarySpec, "fill", "gibbs", "one of parallel, sequential"),
    (VarySpec, "mask_ratio", 0.0, "in (0, 1]"),
    (VarySpec, "steps", 0, ">= 1"),
    (VarySpec, "variations", 0, ">= 1"),
    (VarySpec, "lookahead", -1, ">= 0"),
    (VarySpec, "batch_size", 0, ">= 1"),
    (ExpandSpec, "attempt_factor", 0.5, "in [1, 1e+06]"),
    (ExpandSpec, "attempt_factor", 1e308, "in [1, 1e+06]"),
    (ExpandSpec, "shard_size", 0, ">= 1"),
    (ExpandSpec, "batch_size", 0, ">= 1"),
    (ExpandSpec, "temperature", float("nan"), ">= 0"),
]


@pytest.mark.parametrize("cls, name, value, words", BAD,
                         ids=[f"{c.__name__}.{n}={v!r}" for c, n, v, _ in BAD])
def test_bad_value_is_a_config_error_naming_the_field(cls, name, value, words):
    with pytest.raises(ConfigError) as e:
        cls(**{name: value})
    assert e.value.field == name and words in e.value.message, e.value.message


def test_from_dict_is_strict_and_coerces():
    assert GenSpec.from_dict({"temperature": "0.5", "batch_size": 4}) == GenSpec(temperature=0.5,
                                                                                batch_size=4)
    with pytest.raises(ConfigError, match="unknown key") as e:
        GenSpec.from_dict({"temprature": 0.5}, "generator")
    assert e.value.field == "generator.temprature"
    with pytest.raises(ConfigError) as e:
        VarySpec.from_dict({"mask_ratio": 2}, "pe")
    assert e.value.field == "pe.mask_ratio"


def test_shared_fields_are_declared_once():
    """temperature ... bf16 come from SamplingSpec, min_words / max_retries from FilterSpec:
    the help, source and range of every step's copy are the mixin's; only the defaults that
    differ are re-declared (vary's batch of 16, expand's backend-dependent batch, its 4 words)."""
    for name in (f.name for f in dataclasses.fields(SamplingSpec)):
        base = spec_field(SamplingSpec, name)
        for cls in (GeneratorSpec, GenSpec, VarySpec, ExpandSpec):
            f = spec_field(cls, name)
            assert {k: v for k, v in f.metadata.items() if k != "help"} == \
                {k: v for k, v in base.metadata.items() if k != "help"}, (cls, name)
    for cls in (GenSpec, VarySpec):
        for name in ("min_words", "max_retries"):
            assert spec_field(cls, name).metadata == spec_field(FilterSpec, name).metadata
    assert (GenSpec().batch_size, VarySpec().batch_size, ExpandSpec().batch_size) == (24, 16, None)
    assert (GenSpec().min_words, VarySpec().min_words, ExpandSpec().min_words) == (3, 3, 4)
    # the generator section of popri run: exactly the gen / expand generator settings
    gen_fields = {f.name for f in dataclasses.fields(GeneratorSpec)}
    assert gen_fields <= {f.name for f in dataclasses.fields(GenSpec)}
    assert gen_fields <= {f.name for f in dataclasses.fields(ExpandSpec)}
    # the papers' values, with their source
    s = GenSpec()
    assert (s.temperature, s.top_p, s.max_new_tokens, s.max_tokens) == (1.0, 1.0, 85, 64)
    assert "POPri reference code" in spec_field(GenSpec, "temperature").metadata["cite"]
    assert "PrE-Text D.2" in spec_field(VarySpec, "mask_ratio").metadata["cite"]
    v = VarySpec()
    assert (v.mask_ratio, v.steps, v.method, v.fill) == (0.3, 2, "mask-fill", "parallel")


def test_settle_takes_a_spec_or_its_fields_as_keywords():
    assert settle(GenSpec, None, {}) == GenSpec()
    assert settle(GenSpec, GenSpec(top_p=0.9), {"temperature": 0.5}) == GenSpec(top_p=0.9,
                                                                                temperature=0.5)
    with pytest.raises(TypeError, match="temprature"):
        settle(GenSpec, None, {"temprature": 0.5})
    with pytest.raises(TypeError, match="GenSpec"):
        settle(GenSpec, VarySpec(), {})
    with pytest.raises(ConfigError, match="top_p"):
        settle(GenSpec, None, {"top_p": 0})


# --------------------------------------------------------------------------- round trip
_command = click_command


def _parse(cls, command, argv):
    """The spec the real command builds from ``argv`` (parsed by click, as `popri` does)."""
    from popri.cli.options import build

    cmd = _command(command)
    ctx = cmd.make_context(command, list(argv), resilient_parsing=True)
    names = {f.name for f in dataclasses.fields(cls)}
    return build(cls, **{k: v for k, v in ctx.params.items() if k in names})


NON_DEFAULT = [
    ("gen", ["omega.jsonl", "-K", "2"], GenSpec(
        temperature=0.7, top_p=0.9, max_new_tokens=40, max_tokens=32, batch_size=3, bf16=False,
        model="gemma3-270m", backend="vllm", adapter_mode="merge", min_words=0, max_retries=5,
        samples_per_prompt=4, shots=2, marker="### Sample")),
    ("vary", ["in.jsonl"], VarySpec(
        temperature=0.0, top_p=0.95, max_new_tokens=30, max_tokens=48, batch_size=2, bf16=False,
        min_words=1, max_retries=0, method="paraphrase", model="some/model", variations=3,
        lookahead=4, embedder="my-embedder", mask_ratio=0.15, steps=3, fill="sequential",
        chat=False, fallback=False, fallback_model="gemma3-270m")),
    ("vary", ["in.jsonl"], VarySpec(chat=True, mask_ratio=1.0)),
    ("expand", ["seeds.jsonl", "-N", "8", "--out", "x"], ExpandSpec(
        temperature=1.3, top_p=0.5, max_new_tokens=16, max_tokens=12, batch_size=5, bf16=False,
        model="other", backend="vllm", adapter_mode="merge", shard_size=7,
        attempt_factor=2.5, min_words=2)),
]


@pytest.mark.parametrize("command, pos, spec", NON_DEFAULT,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(NON_DEFAULT)])
def test_to_argv_round_trips_through_the_real_command(command, pos, spec, monkeypatch):
    monkeypatch.delenv("POPRI_GEN_MODEL", raising=False)
    assert spec != type(spec)()
    assert _parse(type(spec), command, [*pos, *to_argv(spec)]) == spec


@pytest.mark.parametrize("command, cls, pos", [
    ("gen", GenSpec, ["omega.jsonl", "-K", "2"]), ("vary", VarySpec, ["in.jsonl"]),
    ("expand", ExpandSpec, ["seeds.jsonl", "-N", "8", "--out", "x"])])
def test_command_defaults_are_the_spec_defaults(command, cls, pos, monkeypatch):
    monkeypatch.delenv("POPRI_GEN_MODEL", raising=False)
    assert _parse(cls, command, pos) == cls()
    assert _parse(cls, command, [*pos, *to_argv(cls())]) == cls()


# --------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("argv, flag", [
    (["gen", "{inp}", "-K", "1", "--top-p", "0"], "--top-p"),
    (["gen", "{inp}", "-K", "1", "--backend", "tgi"], "--backend"),
    (["vary", "{inp}", "--mask-ratio", "1.5"], "--mask-ratio"),
    (["expand", "{inp}", "-N", "2", "--out", "{tmp}/x", "--attempt-factor", "0.5"],
     "--attempt-factor"),
])
def test_cli_bad_value_exit_2_one_line_naming_the_flag(argv, flag, tmp_path, run_popri):
    from conftest import write_jsonl

    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": f"hello world {i}"}
                                              for i in range(4)])
    p = run_popri([a.format(inp=inp, tmp=tmp_path) for a in argv] + ["--model", "/nonexistent"])
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.startswith(f"popri: error: field '{flag}': must be ") and \
        p.stderr.count("\n") == 1, p.stderr
    assert not (tmp_path / "x").exists()
