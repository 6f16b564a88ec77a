"""Keyword arguments that work across the library versions ``pyproject.toml`` admits.

transformers / TRL / PEFT rename and add options between releases (e.g. transformers 5.23's
``TrainingArguments(activation_checkpointing=...)`` is ``gradient_checkpointing`` before it, and
``from_pretrained(dtype=...)`` is ``torch_dtype`` before 4.56).  Instead of passing whatever the
newest release calls an option, the config builders ask the installed class what it accepts:

    args = DPOConfig(**config_kwargs(DPOConfig, {...}))

Each option is given under its newest name; :data:`ALIASES` lists the older names it had, and
the first one the class accepts is used.  An option in :data:`OPTIONAL` that the class lacks
is dropped (it changes nothing that is trained), as is one that is off (False / None); any other missing option is an error naming
the installed version, never a silent change of what is trained.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Iterable, Mapping

from popri.core.errors import MissingResourceError

# newest name -> the names it had in older releases (tried in this order)
ALIASES: dict[str, tuple[str, ...]] = {
    "activation_checkpointing": ("activation_checkpointing", "gradient_checkpointing"),
    "use_cpu": ("use_cpu", "no_cuda"),
    "eval_strategy": ("eval_strategy", "evaluation_strategy"),
    "processing_class": ("processing_class", "tokenizer"),
}

# options that only tune speed / logging / defaults: dropped when a version lacks them
OPTIONAL = frozenset({
    "data_seed", "dataloader_num_workers", "dataloader_pin_memory", "disable_tqdm",
    "logging_first_step", "report_to", "save_only_model", "use_cpu",
})


def accepted_options(cls) -> frozenset[str] | None:
    """The keyword arguments ``cls(...)`` accepts: a dataclass's init fields, else the named
    parameters of ``__init__``; None when it takes ``**kwargs`` (anything may be accepted)."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   inspect.Parameter.KEYWORD_ONLY))


def _owner(cls) -> str:
    """'trl 0.20.0' for trl.DPOConfig: the installed package a class comes from."""
    top = (getattr(cls, "__module__", "") or "").split(".")[0]
    try:
        from importlib.metadata import version

        return f"{top} {version(top)}"
    except Exception:
        return top or "the installed library"


def config_kwargs(cls, options: Mapping[str, object], *,
                  optional: Iterable[str] = OPTIONAL) -> dict:
    """``options`` (newest names) translated to what the installed ``cls`` accepts: each name
    or its first accepted older alias; an ``optional`` option the class lacks is dropped, as is a
    missing option whose value is off (False / None: the class's default is off too); anything
    else missing raises :class:`MissingResourceError`."""
    have = accepted_options(cls)
    if have is None:
        return dict(options)
    optional = frozenset(optional)
    out: dict = {}
    for key, value in options.items():
        name = next((n for n in ALIASES.get(key, (key,)) if n in have), None)
        if name is not None:
            out[name] = value
            continue
        if value is None or value is False or key in optional:
            continue  # left at the class's default
        raise MissingResourceError(
            f"{cls.__name__} of {_owner(cls)} has no option {key!r} (also tried "
            f"{', '.join(repr(a) for a in ALIASES.get(key, ())[1:]) or 'no other name'}): install a "
            f"version within the ranges pyproject.toml gives")
    return out


def _leading_int(s: str) -> int:
    n = ""
    for c in s:
        if not c.isdigit():
            break
        n += c
    return int(n or 0)


def dtype_kwargs(torch_dtype) -> dict:
    """``{"dtype": torch_dtype}`` for ``from_pretrained`` on transformers >= 4.56, else the
    older ``{"torch_dtype": ...}`` (4.56 renamed it; 5.x still takes the old name with a
    deprecation warning, older releases pass an unknown ``dtype`` on to the model's
    ``__init__``, which fails)."""
    import transformers

    new = tuple(_leading_int(p) for p in transformers.__version__.split(".")[:2]) >= (4, 56)
    return {"dtype" if new else "torch_dtype": torch_dtype}
