"""What every command shares: options generated from the specs, help unwrapping, error mapping.

    from popri.cli.options import spec_options
    from popri.specs.feedback import ScoreSpec

    @spec_options(ScoreSpec)                   # every field of ScoreSpec is an option
    def score(synthetic: str = typer.Option(...), *, spec: ScoreSpec) -> None:
        ...                                     # spec: built and validated; errors name the flag

A spec field declares its default, help, source and range once (:mod:`popri.core.spec`);
:func:`spec_options` makes every field of a spec an option of a command, so a new setting is one
field; :func:`option` turns one field into a Typer option, :func:`build` turns the parsed values
back into the spec (a ConfigError from its validation becomes an InputError naming the flag:
exit 2).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from typing import Any, Optional

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


def _option_type(t: Any) -> Any:
    """A spec field's type as Typer reads it: ``X | None`` as ``Optional[X]``; a tuple (given as
    one separated string, its field's ``sep``) as ``str``."""
    args = typing.get_args(t)
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return Optional[_option_type(inner[0])] if len(inner) == 1 else str
    if typing.get_origin(t) is tuple or t is tuple:
        return str
    return t


def spec_options(spec_cls, *, into: str = "spec", exclude: tuple[str, ...] = (),
                 only: tuple[str, ...] | None = None,
                 decls: dict[str, tuple[str, ...]] | None = None):
    """Decorator: every field of ``spec_cls`` (but ``exclude``; or just ``only``, in that order)
    becomes an option of the command, after the command's own parameters (:func:`option`: its
    default, flag, help and range), and the command receives the built, validated spec as the
    keyword ``into`` (fields that are not options keep their defaults).  A field the command
    declares itself (a different flag or a required value) keeps the command's option and still
    goes into the spec.  ``decls``: other flag spellings of a field (``--x/--no-x``)."""
    hints = typing.get_type_hints(spec_cls)
    fields = [f for f in dataclasses.fields(spec_cls) if f.init and f.name not in exclude]
    if only is not None:
        by = {f.name: f for f in fields}
        unknown = [n for n in only if n not in by]
        if unknown:
            raise TypeError(f"{spec_cls.__name__} has no field {', '.join(unknown)}")
        fields = [by[n] for n in only]
    decls = decls or {}

    def deco(fn):
        sig = inspect.signature(fn)
        resolved = typing.get_type_hints(fn)  # the command module's string annotations
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY,
                         annotation=resolved.get(n, p.annotation))
               for n, p in sig.parameters.items() if n != into]
        mine = {p.name for p in own}
        added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                   default=option(spec_cls, f.name, *decls.get(f.name, ())),
                                   annotation=_option_type(hints[f.name]))
                 for f in fields if f.name not in mine]
        in_spec = [f.name for f in fields]

        @functools.wraps(fn)
        def command(**kw):
            vals = {n: kw[n] for n in in_spec if n in kw}
            for p in added:
                kw.pop(p.name, None)
            kw[into] = build(spec_cls, **vals)
            return fn(**kw)

        command.__signature__ = sig.replace(parameters=own + added)
        command.__annotations__ = {**{p.name: p.annotation for p in own + added},
                                   "return": resolved.get("return", None)}
        return command

    return deco


def escape(text: str) -> str:
    """Help text shown as written.  The app renders plain help (``rich_markup_mode=None`` in
    popri/cli/app.py), where ``[flower]`` in ``pip install 'popri[flower]'`` is text, not a Rich
    style tag: nothing to escape (kept so that one place decides, should Rich return)."""
    return text


def unwrap(text: str) -> str:
    """A help text written with hard line breaks as paragraphs click can re-wrap."""
    return escape("\n\n".join(" ".join(p.split()) for p in text.split("\n\n")))


def param_error(err, option_names: dict[str, str]) -> InputError:
    """A library ParameterError (``param``, ``message``) as an InputError naming the option."""
    return InputError(err.message, field=option_names.get(err.param, err.param))
