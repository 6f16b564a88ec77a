"""Spec dataclasses: the settings of one step, each default written once.

A *spec* is a frozen dataclass (as TRL's ``DPOConfig``) whose fields carry their help text, the
paper value they come from, their CLI flag and their valid range in the field metadata::

    @dataclass(frozen=True)
    class DPOSpec(Spec):
        beta: float = param(0.01, "DPO beta = POPri tau.", cite="POPri B.1", lo=0, lo_open=True)

Everything else is derived from that one declaration:

- validation in ``__post_init__`` (ranges, choices, non-empty strings; a
  :class:`~popri.core.errors.ConfigError` naming the field),
- ``Spec.from_dict`` (strict: an unknown key is an error naming the known ones; YAML values are
  coerced to the field's type), used by ``popri run``'s config, which nests the specs,
- the Typer options of the command (:func:`popri.cli.options.option`),
- the command line a pipeline stage runs (:func:`to_argv`: one function for every stage).

Pure Python: importing this (and the spec modules) costs no torch import, so ``popri --help``
and ``popri run --dry-run`` stay fast.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, get_type_hints

from .errors import ConfigError

#: metadata keys understood by param()
_META = ("help", "cite", "flag", "short", "lo", "hi", "lo_open", "hi_open", "choices",
         "nonempty", "envvar", "cli", "sep", "negatable", "positional", "decls", "metavar",
         "cli_range", "always")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: :func:`same`'s default for a field the command requires (no default)
REQUIRED: Any = _Required()


def param(default: Any = MISSING, help: str = "", *, cite: str | None = None,
          flag: str | None = None, short: str | None = None, lo: float | None = None,
          hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
          choices: tuple | None = None, nonempty: bool = False, envvar: str | None = None,
          cli: bool = True, sep: str | None = None, negatable: bool = True,
          positional: bool = False, decls: tuple[str, ...] | None = None,
          metavar: str | None = None, cli_range: bool = False, always: bool = False,
          keyed: bool = True, default_factory: Any = MISSING) -> Any:
    """A spec field.  ``help``: one sentence for ``--help``; ``cite``: where the default comes
    from ("POPri B.1"); ``flag``: the long option (default ``--field-name``); ``lo``/``hi``
    (``*_open`` for strict): the valid range; ``choices``: the allowed values; ``sep``: a list
    field given as one ``sep``-joined option value; ``cli``: False for settings only the config
    has; ``negatable``: a bool flag has a ``--no-`` form.  Of a command's own arguments
    (:class:`Call`): ``positional`` (an argument, not an option; a tuple field takes any number),
    ``decls`` (every spelling, ``("--steps", "--rounds", "-T")`` or ``("--lora/--full",)``, when
    ``flag`` / ``short`` cannot say it), ``metavar``; ``cli_range``: the command-line parser
    checks the closed bounds itself even where the default is not an int (``None``);
    ``always``: a stage's command line writes it even at its default (:meth:`Call.given`);
    ``keyed=False``: not in a stage's cache key (it changes no output's content: a mark)."""
    md = {"help": help, "cite": cite, "flag": flag, "short": short, "lo": lo, "hi": hi,
          "lo_open": lo_open, "hi_open": hi_open, "choices": tuple(choices) if choices else None,
          "nonempty": nonempty, "envvar": envvar, "cli": cli, "sep": sep,
          "negatable": negatable, "positional": positional,
          "decls": tuple(decls) if decls else None, "metavar": metavar, "cli_range": cli_range,
          "always": always, "keyed": keyed}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


# ---------------------------------------------------------------- the arguments every command shares
# Declared once here (flag, type, default); each command says what they mean for it in ``help``.

def seed_param(help: str, **kw: Any) -> Any:
    """``--seed``: an int, default 0 (every random choice of a command is derived from it;
    a stage's command line always writes it)."""
    return param(0, help, always=True, **kw)


def out_param(help: str, default: Any = MISSING, **kw: Any) -> Any:
    """``--out`` / ``-o``: where the command writes (a file, a directory, or ``-`` for stdout,
    as ``help`` says); no default: required."""
    return param(default, help, short="-o", **kw)


def json_param(help: str, **kw: Any) -> Any:
    """``--json``: print one JSON object on stdout instead of text (a switch, no ``--no-``)."""
    return param(False, help, flag="--json", negatable=False, **kw)


def flag_of(f: dataclasses.Field) -> str:
    """A field's long option: its ``flag``, else the first long spelling of its ``decls`` (the
    true side of ``--a/--b``), else ``--field-name``."""
    md = f.metadata
    if md.get("flag"):
        return md["flag"]
    for d in md.get("decls") or ():
        if d.startswith("--"):
            return d.split("/")[0]
    return "--" + f.name.replace("_", "-")


def false_flag_of(f: dataclasses.Field) -> str | None:
    """A bool field's false side: ``--b`` of ``decls`` ``("--a/--b",)``, ``--no-x`` when
    negatable, else None (the flag's absence)."""
    for d in f.metadata.get("decls") or ():
        if "/" in d:
            return d.split("/")[1]
    return "--no-" + flag_of(f)[2:] if f.metadata.get("negatable", True) else None


def help_of(f: dataclasses.Field) -> str:
    """The help line: the sentence, its source and the range (for --help and the docs)."""
    md = f.metadata
    h = md.get("help") or ""
    if md.get("cite"):
        h += f" [{md['cite']}]"
    return h


def _num(x) -> str:
    """A bound as written: an int exactly (4294966, not 4.29497e+06), a float with ``g``."""
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else f"{x:g}"


def range_text(lo, hi, lo_open=False, hi_open=False) -> str:
    if hi is None:
        return f"a finite number {'>' if lo_open else '>='} {_num(lo)}"
    if lo is None:
        return f"a finite number {'<' if hi_open else '<='} {_num(hi)}"
    return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"


def _base_type(typ: Any) -> Any:
    args = [t for t in getattr(typ, "__args__", ()) if t is not type(None)]
    if typing.get_origin(typ) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return args[0] if args else typ
    return typ


def _optional(typ: Any) -> bool:
    return type(None) in getattr(typ, "__args__", ())


def coerce(value: Any, typ: Any, where: str) -> Any:
    """A YAML / JSON value as the field's type (bool, int, float, str, tuple/list), or a
    ConfigError naming ``where``."""
    if value is None:
        return None
    t = _base_type(typ)
    origin = typing.get_origin(t)
    try:
        if origin in (tuple, list):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise TypeError
            (item,) = set(a for a in typing.get_args(t) if a is not Ellipsis) or {str}
            out = [coerce(v, item, where) for v in value]
            return tuple(out) if origin is tuple else out
        if isinstance(value, (dict, list, tuple, set)):
            raise TypeError
        if t is bool:
            if isinstance(value, bool):
                return value
            raise ValueError
        if t is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):  # exact: no float round trip (2**53 + 1 stays itself)
                return value
            if isinstance(value, str):
                try:
                    return int(value.strip(), 0)
                except ValueError:
                    pass
            if float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if t is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if t is str:
            if isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError, OverflowError):
        name = getattr(t, "__name__", str(t))
        raise ConfigError(f"expects {name}, got {value!r}", field=where) from None
    return value


def check_field(f: dataclasses.Field, v: Any, where: str | None = None) -> None:
    """One value against its field's declared range / choices (ConfigError naming ``where``)."""
    md, where = f.metadata, where or f.name
    if v is None:
        return
    lo, hi = md.get("lo"), md.get("hi")
    if (lo is not None or hi is not None) and not isinstance(v, (list, tuple)):
        lo_open, hi_open = md.get("lo_open", False), md.get("hi_open", False)
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (lo is None or (v > lo if lo_open else v >= lo))
              and (hi is None or (v < hi if hi_open else v <= hi)))
        if not ok:
            raise ConfigError(f"must be {range_text(lo, hi, lo_open, hi_open)} (got {v!r})",
                              field=where)
    if md.get("choices"):  # a list field: each of its items
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if x not in md["choices"]:
                raise ConfigError(f"must be one of {', '.join(map(str, md['choices']))} "
                                  f"(got {x!r})", field=where)
    if md.get("nonempty") and not str(v).strip():
        raise ConfigError("must not be empty", field=where)


@dataclass(frozen=True)
class Spec:
    """Base of every spec: validation from the field metadata in ``__post_init__`` (subclasses
    add cross-field checks in ``check()``), strict ``from_dict``, ``replace``, ``to_dict``."""

    #: settings whose None the spec resolves itself in ``__post_init__`` (the mode's default),
    #: recording those given in ``_given``: a call renders only the given ones
    RESOLVED: ClassVar[tuple] = ()

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and not _optional(hints[f.name]) and f.default is not None:
                raise ConfigError("must not be null", field=f.name)
            check_field(f, v)
        self.check()

    def check(self) -> None:
        """Cross-field checks (override)."""

    @classmethod
    def from_dict(cls, d: dict | None, where: str = ""):
        """Strict: every key a field (else ConfigError naming the known ones), values coerced;
        nested specs from nested mappings.  ``where``: the dotted prefix for error messages."""
        d = {} if d is None else d
        pre = f"{where}." if where else ""
        if not isinstance(d, dict):
            raise ConfigError(f"must be a mapping (a section), got {d!r}", field=where or None)
        hints = get_type_hints(cls)
        names = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise ConfigError(f"unknown key (known: {', '.join(sorted(names))})",
                              field=f"{pre}{unknown[0]}")
        kw = {}
        for k, v in d.items():
            typ = hints[k]
            sub = _base_type(typ)
            if isinstance(sub, type) and issubclass(sub, Spec):
                kw[k] = sub.from_dict(v, f"{pre}{k}")
            else:
                kw[k] = coerce(v, typ, f"{pre}{k}")
        try:
            return cls(**kw)
        except ConfigError as e:
            if e.path is None and e.field and not str(e.field).startswith(pre or "\0"):
                raise ConfigError(e.message, field=f"{pre}{e.field}") from None
            raise

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def spec_field(spec_cls, name: str) -> dataclasses.Field:
    for f in fields(spec_cls):
        if f.name == name:
            return f
    raise KeyError(f"{spec_cls.__name__} has no field {name!r}")


def default(spec_cls, name: str) -> Any:
    """A field's default (for the few places outside a spec that need the value)."""
    return field_default(spec_field(spec_cls, name))


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's value); :data:`REQUIRED` when it has none."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return REQUIRED


def to_argv(spec: Spec, *, only: typing.Iterable[str] | None = None,
            skip: typing.Iterable[str] = ()) -> list[str]:
    """The command-line options that reproduce ``spec`` (the one spec -> argv function of the
    pipeline): ``--flag value`` per CLI field in declaration order, ``--x/--no-x`` for bools,
    None omitted (the command's default is then None as well), lists joined by ``sep`` or
    repeated, floats as ``repr`` (exact round trip)."""
    want = None if only is None else set(only)
    skip = set(skip)
    out: list[str] = []
    for f in fields(spec):
        md = f.metadata
        if not md.get("cli", True) or f.name in skip or (want is not None and f.name not in want) \
                or md.get("positional"):
            continue
        v = getattr(spec, f.name)
        if isinstance(v, Spec):
            continue
        flag = flag_of(f)
        if v is None:
            continue
        if isinstance(v, bool):
            no = false_flag_of(f)
            if v:
                out.append(flag)
            elif no:
                out.append(no)
            continue
        if isinstance(v, (list, tuple)):
            if md.get("sep"):
                out += [flag, md["sep"].join(map(str, v))]
            else:
                for x in v:
                    out += [flag, str(x)]
            continue
        out += [flag, repr(v) if isinstance(v, float) else str(v)]
    return out


def same(spec_cls, name: str, default: Any = MISSING, **meta: Any) -> Any:
    """Field ``name`` of ``spec_cls`` for another spec (e.g. a section of ``popri run``'s config):
    the same default, help, source and range -- declared once, in ``spec_cls`` -- unless
    ``default`` (a setting's value in that context, e.g. the embedded run's smaller cap) or
    metadata overrides are given."""
    f = spec_field(spec_cls, name)
    md = {**f.metadata, **meta}
    if default is REQUIRED:
        return dataclasses.field(metadata=md)
    if default is not MISSING:
        return dataclasses.field(default=default, metadata=md)
    if f.default is MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=md)
    return dataclasses.field(default=f.default, metadata=md)


@dataclass(frozen=True)
class Call(Spec):
    """One invocation of a ``popri`` command: every argument it takes, as fields -- its
    settings (the settings spec(s) it inherits: ``into`` maps the keyword the command's function
    receives each one as to its class) and its own arguments (paths, sizes, seeds: the fields
    declared in the subclass, with :func:`param` / :func:`same`).

        from popri.specs.commands.gen import GenCall
        GenCall(omega="omega.jsonl", prompts=4, out="r1.jsonl").argv()
        # ['gen', 'omega.jsonl', '--prompts', '4', ..., '--out', 'r1.jsonl', ...]

    The command's options are derived from it (:func:`popri.cli.options.command`) and a stage's
    command line is rendered from it (:meth:`argv`): one declaration per argument."""

    #: the command path after ``popri`` ("gen", "fred stats")
    command: ClassVar[str] = ""
    #: keyword -> settings spec class the command's function receives (built from the fields)
    into: ClassVar[dict] = {}
    #: other spellings of an inherited settings field's option ({"lora": ("--lora/--full",)})
    flags: ClassVar[dict] = {}

    @classmethod
    def own_fields(cls) -> list[str]:
        """The fields the subclasses declare (body order), before the inherited settings."""
        names: list[str] = []
        by = {f.name for f in fields(cls)}
        for k in reversed(cls.__mro__):
            if k in (Call, Spec, object) or not issubclass(k, Call):
                continue
            for n in k.__dict__.get("__annotations__", {}):
                if n in by and n not in names:
                    names.append(n)
        return names

    @classmethod
    def order(cls) -> list[str]:
        """Every argument in the command's order: its own, then each settings spec's fields
        (``into`` order) -- the order of ``--help`` and of :meth:`argv`."""
        own = cls.own_fields()
        by = {f.name for f in fields(cls) if f.init}
        rest = [f.name for spec in cls.into.values() for f in fields(spec)
                if f.init and f.name in by and f.name not in own]
        return own + list(dict.fromkeys(rest))

    def positionals(self) -> list[str]:
        out: list[str] = []
        by = {f.name: f for f in fields(self)}
        for n in self.order():
            if by[n].metadata.get("positional"):
                v = getattr(self, n)
                if v is None:
                    continue
                out += [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
        return out

    def given(self) -> list[str]:
        """The options :meth:`argv` writes: each field whose value is not the command's default,
        every field the command would otherwise read from the environment (``envvar``: a
        default there is not the command's alone), every seed (``always``) and every field
        without a default."""
        by = {f.name: f for f in fields(self)}
        out = []
        for n in self.order():
            f = by[n]
            if f.metadata.get("positional") or not f.metadata.get("cli", True):
                continue
            if n in self.RESOLVED and n not in getattr(self, "_given", ()):
                continue  # resolved by the spec from None: the command resolves it the same
            v = getattr(self, n)
            dflt = field_default(f)
            if dflt is REQUIRED:
                out.append(n)
                continue
            if f.metadata.get("envvar") or f.metadata.get("always") or v != dflt \
                    or type(v) is not type(dflt):
                out.append(n)
        return out

    def argv(self) -> list[str]:
        """The command line (without ``popri``): the command, the positional arguments, then
        the options of :meth:`given`, in the command's order (:func:`to_argv` renders each).
        The command parses it back into this instance (tests/test_cli_options.py)."""
        given = self.given()
        return [*self.command.split(), *self.positionals(),
                *(a for n in given for a in to_argv(self, only=[n]))]

    @classmethod
    def draft(cls, **values: Any):
        """An instance whose values are not all known yet (``popri run --dry-run`` before the
        fetch: a placeholder string in a number's place): not validated; shown, never run."""
        obj = cls.__new__(cls)
        for f in fields(cls):
            if f.name in values:
                v = values[f.name]
            elif f.default is not MISSING:
                v = f.default
            elif f.default_factory is not MISSING:
                v = f.default_factory()
            else:
                raise ConfigError("is required", field=f.name)
            object.__setattr__(obj, f.name, v)
        return obj

    def settings(self, into: str = "spec"):
        """The settings spec the command's function receives as ``into``."""
        cls = self.into[into]
        mine = {f.name for f in fields(self)}
        given = getattr(self, "_given", ())
        # a setting the spec resolved from None goes on as None: the spec resolves it again
        return cls(**{f.name: None if f.name in self.RESOLVED and f.name not in given
                      else getattr(self, f.name)
                      for f in fields(cls) if f.init and f.name in mine})
