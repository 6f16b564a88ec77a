"""What every command shares: its parameters generated from its Call, help unwrapping, error
mapping.

    from popri.cli.options import command
    from popri.specs.commands.score import ScoreCall

    @command(ScoreCall)                 # every field of ScoreCall is an argument or an option
    def score(synthetic: str, out: str | None, ..., *, spec: ScoreSpec) -> None:
        ...                             # spec: built and validated; errors name the flag

A command's arguments are the fields of its :class:`~popri.core.spec.Call`
(popri/specs/commands/), each declaring its default, help, source and range once
(:mod:`popri.core.spec`), so a new setting is one field; :func:`option` turns one field into a
Typer option (or argument), :func:`build` turns the parsed values back into the Call (a
ConfigError from its validation becomes an InputError naming the flag: exit 2).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from typing import Any, Optional

import typer

from popri.core import provenance
from popri.core.errors import ConfigError, InputError
from popri.core.guard import check_writable
from popri.core.spec import field_default, flag_of, help_of, spec_field
from popri.privacy.noise import release_mode_from_env
from popri.specs.commands.flows import FLOWS


def option(spec_cls, name: str, *decls: str, **overrides: Any) -> Any:
    """The Typer option of spec field ``name``: default, flag (``--x`` or ``--x/--no-x`` for a
    bool), help with its source, closed numeric bounds as click ranges (open bounds and
    choices are checked by the spec's validation, with the same one-line error)."""
    f = spec_field(spec_cls, name)
    md = f.metadata
    if f.default is not dataclasses.MISSING:
        dflt = f.default
    elif f.default_factory is not dataclasses.MISSING:
        dflt = f.default_factory()
    else:
        dflt = ...  # required
    if md.get("positional"):
        kw = {"help": escape(help_of(f)) or None}
        if md.get("metavar"):
            kw["metavar"] = md["metavar"]
        if isinstance(dflt, tuple) and not dflt:
            dflt = None
        kw.update(overrides)
        return typer.Argument(dflt, **kw)
    flag = flag_of(f)
    if not decls:
        decls = md.get("decls") or ()
    if not decls:
        if isinstance(dflt, bool) and md.get("negatable", True):
            decls = (f"{flag}/--no-{flag[2:]}",)
        else:
            decls = (flag,) + ((md["short"],) if md.get("short") else ())
    kw: dict[str, Any] = {"help": escape(help_of(f)) or None}
    if md.get("envvar"):
        kw["envvar"] = md["envvar"]
    if md.get("metavar"):
        kw["metavar"] = md["metavar"]
    if isinstance(dflt, (list, tuple)) and md.get("sep"):
        dflt = md["sep"].join(map(str, dflt))
    elif isinstance(dflt, tuple):
        dflt = list(dflt)
    for bound, key in (("lo", "min"), ("hi", "max")):
        v = md.get(bound)
        if v is not None and not md.get(f"{bound}_open") and (
                md.get("cli_range") or isinstance(dflt, int) and not isinstance(dflt, bool)):
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


def _param_type(t: Any, f: dataclasses.Field) -> Any:
    """:func:`_option_type`, but a tuple without ``sep`` (a repeated option, or any number of
    positional arguments) as ``List[item]``."""
    inner = [a for a in typing.get_args(t) if a is not type(None)]
    if (isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union) \
            and len(inner) == 1:
        t = inner[0]
    if (typing.get_origin(t) is tuple or t is tuple) and not f.metadata.get("sep"):
        (item, *_) = typing.get_args(t) or (str,)
        return typing.List[item]
    return _option_type(t)


def command(call_cls):
    """Decorator: the command's parameters are the fields of ``call_cls`` (a
    :class:`~popri.core.spec.Call`: its own arguments in declaration order, then its inherited
    settings), each from its one declaration (:func:`option`).  The function receives each own
    argument it names as a keyword, and each settings spec of ``call_cls.into`` built and
    validated (errors name the flag: exit 2)::

        @command(GenCall)
        def gen(omega: str, out: str, ..., *, spec: GenSpec) -> None: ...
    """
    hints = typing.get_type_hints(call_cls)
    by = {f.name: f for f in dataclasses.fields(call_cls) if f.init}
    own = call_cls.own_fields()
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY,
                                default=option(call_cls, n, *call_cls.flags.get(n, ())),
                                annotation=_param_type(hints[n], by[n]))
              for n in call_cls.order()]

    def deco(fn):
        takes = set(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def cmd(**kw):
            for n, v in list(kw.items()):
                if isinstance(v, list):
                    kw[n] = tuple(v)
                elif v is None and isinstance(field_default(by[n]), tuple):
                    kw[n] = field_default(by[n])  # no values given: the empty tuple
            call = build(call_cls, **kw)
            args = {n: (list(getattr(call, n)) if isinstance(getattr(call, n), tuple)
                        and not by[n].metadata.get("sep") else getattr(call, n))
                    for n in own if n in takes}
            for into in call_cls.into:
                if into in takes:
                    args[into] = call.settings(into)
            flow = FLOWS.get(call_cls.command)
            if flow is None:
                return fn(**args)
            return _with_provenance(flow, call, fn, args)

        cmd.call_cls = call_cls  # what the command parses into (tests: argv round trips)
        cmd.__signature__ = inspect.Signature(params)
        cmd.__annotations__ = {p.name: p.annotation for p in params}
        return cmd

    return deco


def _with_provenance(flow, call, fn, args):
    """Run ``fn(**args)`` with each output's privacy provenance derived from the inputs'
    (:mod:`popri.core.provenance`): refused in release mode when a chain is not-dp, each
    output's companion written with it."""
    check_writable(getattr(call, n, None) for n in flow.outputs)  # before any work (I06)
    contrib = provenance.contributions(flow, call, call.command)  # each input read once
    planned = provenance.derive(flow, call, call.command, contrib)
    warn = provenance.inherited(flow, call, call.command, contrib)
    release = getattr(call, "release", None)
    provenance.plan(planned, command=call.command,
                    release=bool(release) if isinstance(release, bool) else release_mode_from_env())
    ok = False
    try:
        result = fn(**args)
        ok = True
        return result
    finally:
        provenance.finish(planned, provenance.ledger_ids, ok, warn)


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


def parse_call(root, argv: list[str]):
    """``(quiet, call)``: a ``popri`` command line (after ``popri``) parsed the way the command
    parses it, as the :class:`~popri.core.spec.Call` its function would build -- what a stage's
    rendered command line means (tests compare plans by it).  ``root``: the click group of the
    app (``typer.main.get_command(app)``)."""
    args, quiet = list(argv), False
    if args and args[0] == "--quiet":
        quiet, args = True, args[1:]
    cmd, path = root, []
    while getattr(cmd, "commands", None) and args and args[0] in cmd.commands:
        path.append(args[0])
        cmd = cmd.commands[args.pop(0)]
    call_cls = cmd.callback.call_cls
    ctx = cmd.make_context(" ".join(path), args, resilient_parsing=False)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in ctx.params.items()}
    return quiet, build(call_cls, **values)
