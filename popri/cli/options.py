"""What every command shares: options generated from the specs, help unwrapping, error mapping.

    from popri.cli.options import option, build, register
    from popri.specs import DPOSpec

    def dpo(beta: float = option(DPOSpec, "beta"), ...):
        spec = build(DPOSpec, beta=beta, ...)       # validated; errors name --beta

A spec field declares its default, help, source and range once (:mod:`popri.core.spec`);
:func:`option` turns it into the Typer option, :func:`build` turns the parsed values back into
the spec (a ConfigError from its validation becomes an InputError naming the flag: exit 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from popri.core.errors import ConfigError, InputError
from popri.core.spec import flag_of, help_of, spec_field


def option(spec_cls, name: str, *decls: str, **overrides: Any) -> Any:
    """The Typer option of spec field ``name``: default, flag (``--x`` or ``--x/--no-x`` for a
    bool), help with its source, closed numeric bounds as click ranges (open bounds and
    choices are checked by the spec's validation, with the same one-line error)."""
    f = spec_field(spec_cls, name)
    md = f.metadata
    dflt = f.default_factory() if f.default is dataclasses.MISSING else f.default
    flag = flag_of(f)
    if not decls:
        if isinstance(dflt, bool) and md.get("negatable", True):
            decls = (f"{flag}/--no-{flag[2:]}",)
        else:
            decls = (flag,) + ((md["short"],) if md.get("short") else ())
    kw: dict[str, Any] = {"help": escape(help_of(f))}
    if md.get("envvar"):
        kw["envvar"] = md["envvar"]
    if isinstance(dflt, (list, tuple)) and md.get("sep"):
        dflt = md["sep"].join(map(str, dflt))
    for bound, key in (("lo", "min"), ("hi", "max")):
        v = md.get(bound)
        if v is not None and not md.get(f"{bound}_open") and isinstance(dflt, int) \
                and not isinstance(dflt, bool):
            kw[key] = v
    kw.update(overrides)
    return typer.Option(dflt, *decls, **kw)


def build(spec_cls, **values: Any):
    """The spec from a command's parsed options; its validation errors name the flag."""
    names = {f.name: flag_of(f) for f in dataclasses.fields(spec_cls)}
    for f in dataclasses.fields(spec_cls):
        sep = f.metadata.get("sep")
        v = values.get(f.name)
        if sep and isinstance(v, str):
            values[f.name] = tuple(x.strip() for x in v.split(sep) if x.strip())
    try:
        return spec_cls(**values)
    except ConfigError as e:
        raise InputError(e.message, field=names.get(e.field or "", e.field)) from None


def escape(text: str) -> str:
    """Help text shown as written: the app renders help with Rich markup (``rich_markup_mode``
    in popri/cli/app.py), which would take ``[flower]`` in ``pip install 'popri[flower]'`` for a
    style tag and drop it; this escapes every such bracket (Rich's own ``markup.escape``)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def unwrap(text: str) -> str:
    """A help text written with hard line breaks as paragraphs click can re-wrap (and Rich shows
    as written: :func:`escape`)."""
    return escape("\n\n".join(" ".join(p.split()) for p in text.split("\n\n")))


def param_error(err, option_names: dict[str, str]) -> InputError:
    """A library ParameterError (``param``, ``message``) as an InputError naming the option."""
    return InputError(err.message, field=option_names.get(err.param, err.param))
