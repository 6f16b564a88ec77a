"""Configuration of ``popri run``: grouped dataclasses, YAML in, ``--set key=value`` overrides.

    popri run examples/default.yaml --set rounds=1 --set dpo.lr=2e-5 --set privacy.epsilon=7

Every key has a default here; a YAML file overrides some, ``--set`` overrides any (dotted
path, value parsed as YAML).  Unknown keys are errors (a typo must not silently fall back to a
default).  Defaults are the embedded offline setting, small enough for a 2-core CPU; where the
papers give a value it is cited and the paper-scale value is in examples/biorxiv-gpu.yaml.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Sequence

from popri.core.errors import ConfigError
from popri.methods.base import Method
from popri.pipeline.recipes import METHODS
from popri.privacy.accounting import ParameterError
from popri.privacy.calibration import gaussian_multiplier as fred_z
from popri.specs.feedback import COSINE_CLIP, COSINE_STANDARDIZE
from popri.specs.run import (  # noqa: F401  (re-exported: popri.pipeline.config.RunConfig)
    SEED_MAX,
    DPOConfig,
    DataConfig,
    DownstreamConfig,
    FLConfig,
    FewFedPITConfig,
    GeneratorConfig,
    InstructConfig,
    PEConfig,
    PrivacyConfig,
    ProbeConfig,
    RunConfig,
    ScoreConfig,
)


def from_dict(cls, d: dict, where: str = "") -> Any:
    """``cls`` (a config section) from a mapping: strict keys, coerced values (Spec.from_dict)."""
    return cls.from_dict(d, where)


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    """``d[a][b][c] = value`` for ``a.b.c``.  A mapping set on a section merges into it, key by
    key (``--set 'data={max_clients: 5}'`` changes data.max_clients and keeps the YAML's other
    data keys), as ``--set data.max_clients=5`` would."""
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"bad key {dotted!r}", path=f"--set {dotted}")
    cur = d
    for i, p in enumerate(parts[:-1]):
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ConfigError(f"cannot set '{dotted}': '{p}' is not a section",
                              path=f"--set {dotted}", field=".".join(parts[:i + 1]))
    _merge(cur, parts[-1], value)


def _merge(d: dict, key: str, value: Any) -> None:
    """``d[key] = value``, except that a mapping merges into a mapping already there."""
    old = d.get(key)
    if isinstance(value, dict) and isinstance(old, dict):
        for k, v in value.items():
            _merge(old, k, v)
    else:
        d[key] = value


#: control characters a --set value or a path may not hold (a newline in a --set value is
#: folded into a space by YAML: ``run_dir=./nl<LF>dir`` silently became './nl dir')
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_char(s: str) -> str | None:
    """The first control character of ``s``, named (``newline``, ``U+0007``), or None."""
    m = _CONTROL.search(s)
    if m is None:
        return None
    c = m.group(0)
    return {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}.get(
        c, f"the control character U+{ord(c):04X}")


class DuplicateKey(Exception):
    """A mapping of a YAML config names a key twice (YAML's last-wins would hide it)."""

    def __init__(self, field: str, line: int, first: int):
        super().__init__(f"duplicate key on line {line} (first on line {first}): YAML would "
                         f"silently keep the last value")
        self.field = field


def check_unique_keys(text: str) -> None:
    """Refuse a YAML document whose mapping names a key twice (hostile case N5, issue 66:
    ``privacy.epsilon`` given twice silently took the last, epsilon 100): :class:`DuplicateKey`
    naming the dotted key and both lines.  The composed node tree is walked before loading."""
    import yaml

    def walk(node, trail: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else repr(k)
                if key in seen:
                    raise DuplicateKey(".".join((*trail, str(key))), k.start_mark.line + 1,
                                       seen[key] + 1)
                seen[key] = k.start_mark.line
                walk(v, (*trail, str(key)))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, (*trail, str(i)))

    walk(yaml.compose(text, Loader=yaml.SafeLoader), ())


def load_yaml_mapping(path: str) -> dict:
    """A YAML file whose top level is a mapping, or one clear ConfigError (exit 2)."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError("config file not found", path=path)
    if p.is_dir():
        raise ConfigError("is a directory, expected a YAML file", path=path)
    try:
        text = p.read_text(encoding="utf-8")
        check_unique_keys(text)
        data = yaml.safe_load(text) or {}
    except DuplicateKey as e:
        raise ConfigError(str(e), path=path, field=e.field) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML: {' '.join(str(e).split())}", path=path) from None
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"cannot read: {type(e).__name__}: {e}", path=path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=path)
    return data


def load(path: str | None, overrides: Sequence[str] = (), *, base: RunConfig | None = None
         ) -> RunConfig:
    """The config of ``popri run``: defaults < YAML ``path`` (None: the defaults alone, the
    embedded default that examples/default.yaml spells out; ``base``: a config object instead)
    < ``--set`` overrides, every value checked (types, ranges, choices, combinations) before
    anything runs.  Errors are
    :class:`ConfigError` (exit 2) naming the YAML file or the ``--set`` and the dotted key."""
    import yaml

    if base is not None:
        raw: dict = to_dict(base)
        path = None
    else:
        raw = load_yaml_mapping(path) if path else {}
        _fixed_count_replaces_the_default_rate(raw, None)
    set_keys: list[str] = []
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"--set expects key=value, got {o!r}")
        k, v = o.split("=", 1)
        bad = control_char(v)
        if bad is not None:
            raise ConfigError(f"the value holds {bad}: a --set value is one line (YAML would "
                              f"fold it into something else; a path with control characters "
                              f"is refused)", path=f"--set {k.strip()}")
        try:
            val = yaml.safe_load(v)
        except yaml.YAMLError:
            val = v
        set_dotted(raw, k.strip(), val)
        set_keys.append(k.strip())
    _fixed_count_replaces_the_default_rate(raw, set_keys)
    try:
        _sizes_make_a_curve(raw)
        cfg = RunConfig.from_dict(raw)
    except ConfigError as e:
        if e.path is not None:
            raise
        f = e.field or ""
        src = [s for s in set_keys if s == f or f.startswith(s + ".") or s.startswith(f + ".")]
        where = f"--set {src[-1]}" if src else path
        raise ConfigError(e.message, path=where, field=e.field) from None
    return cfg


def _sizes_make_a_curve(raw: dict) -> None:
    """``num_synthetic: [96, 384, 1536]`` (a list of final-set sizes, issue 65) is
    ``num_synthetic: 1536`` (the largest, generated once) with ``curve: [96, 384, 1536]``;
    anything else is left to the field's own check."""
    n = raw.get("num_synthetic")
    if isinstance(n, str) and "," in n:  # --set num_synthetic=96,384,1536
        n = [x.strip() for x in n.split(",")]
    if not isinstance(n, (list, tuple)):
        return
    if "curve" in raw:
        raise ConfigError("give the sizes once: a list num_synthetic is the curve itself",
                          field="curve")
    sizes = []
    for x in n:
        try:
            v = int(x)
        except (TypeError, ValueError):
            raise ConfigError(f"expects an int or a list of ints, got {n!r}",
                              field="num_synthetic") from None
        if isinstance(x, bool) or isinstance(x, float) and x != v:
            raise ConfigError(f"expects an int or a list of ints, got {n!r}",
                              field="num_synthetic")
        sizes.append(v)
    if not sizes:
        raise ConfigError("an empty list of sizes", field="num_synthetic")
    raw["num_synthetic"], raw["curve"] = max(sizes), sorted(set(sizes))


def _fixed_count_replaces_the_default_rate(raw: dict, set_keys: list[str] | None) -> None:
    """A section that is given ``clients_per_round`` (L of N, replace one client) and no
    ``sample_rate`` drops the DEFAULT Poisson rate (score 0.5, fl 0.1) instead of failing as
    "both": in a YAML mapping (``set_keys`` None) or among the ``--set`` overrides.  Giving both
    explicitly is still an error."""
    for sec in ("score", "fl"):
        s = raw.get(sec)
        if not isinstance(s, dict) or s.get("clients_per_round") is None:
            continue
        if set_keys is None:
            if "sample_rate" not in s:
                s["sample_rate"] = None
        elif f"{sec}.clients_per_round" in set_keys and f"{sec}.sample_rate" not in set_keys:
            s["sample_rate"] = None


SELECT_ON = ("private", "public", "dp", "none")


def get(cfg: RunConfig, dotted: str) -> Any:
    cur = cfg
    for p in dotted.split("."):
        cur = getattr(cur, p)
    return cur


def _check_remedies(cfg: RunConfig) -> None:
    """Issue 44's and 67's remedies act on the rounds' ranked samples and the generator's final
    set: refused where the method has none, and where two of them contradict each other."""
    dp = cfg.dpo
    for key, on in (("dpo.pair_rule", dp.pair_rule in ("fluent", "divpo")),
                    ("dpo.fluency_gate", bool(dp.fluency_gate)),
                    ("final_top_p", cfg.final_top_p is not None),
                    ("final_match_tokens", cfg.final_match_tokens),
                    ("final_untuned_share", bool(cfg.final_untuned_share)),
                    ("final_samples_per_prompt", cfg.final_samples_per_prompt is not None)):
        m = METHODS[cfg.method]
        ok = m.selects if key == "dpo.pair_rule" else m.pairs  # selects: tunes with DPO
        if on and not ok:
            raise ConfigError(f"{key} acts on " + ("DPO's preference pairs" if key ==
                              "dpo.pair_rule" else "a tuned generator's rounds and final set")
                              + f"; {cfg.method} has none", field=key)
    if cfg.score.mode == "coverage":  # its votes are normalised: the cosine settings are idle
        for k, default in (("clip", COSINE_CLIP), ("standardize", COSINE_STANDARDIZE)):
            if getattr(cfg.score, k) != default:
                raise ConfigError("applies to score.mode cosine; coverage votes are normalised "
                                  "to L2 norm 1 (the sensitivity)", field=f"score.{k}")
    if cfg.final_untuned_share and cfg.final_match_tokens:
        raise ConfigError("mixes the final set with its T = 0 control's by prompt; "
                          "final_match_tokens cuts it to the control's tokens: give one",
                          field="final_untuned_share")
    if cfg.final_match_tokens and not cfg.control:
        raise ConfigError("matches the final set's tokens to its T = 0 control's: it needs "
                          "control: true", field="final_match_tokens")


def check(cfg: RunConfig) -> None:
    """The combinations of values, before the first stage runs (each value's own range and
    choices are checked by its spec, from the field metadata)."""
    d, pr, sc, dp = cfg.data, cfg.privacy, cfg.score, cfg.dpo
    for name in ("run_dir", "data.dir", "data.source", "data.public_source"):
        v = get(cfg, name)
        bad = control_char(v) if isinstance(v, str) else None
        if bad is not None:
            raise ConfigError(f"holds {bad} ({v!r}): a path with control characters is refused",
                              field=name)
    if not d.dir and not str(d.source or "").strip():
        raise ConfigError("give data.source (a bench source or a file) or data.dir",
                          field="data.source")
    if not str(d.public_source or "").strip():
        raise ConfigError("is needed (the initial population Omega: a bench source or a JSONL "
                          "file)", field="data.public_source")

    if not METHODS[cfg.method].dp:
        if pr.noise_multiplier is not None:  # no stage of this recipe reads it
            raise ConfigError(f"{cfg.method} takes no privacy.noise_multiplier: its only noise "
                              "is the popri extension on the clipped uploads; set "
                              "fewfedpit.noise_multiplier together with fewfedpit.clip instead",
                              field="privacy.noise_multiplier")
        if pr.epsilon is not None and not cfg.fewfedpit.noise_multiplier:
            raise ConfigError(f"{cfg.method} has no DP guarantee (eps = inf: FewFedPIT is an "
                              "empirical defence against extraction), so no budget can hold: "
                              "set privacy.epsilon: null (the ledger then records eps = inf), "
                              "or add the popri extension fewfedpit.clip + "
                              "fewfedpit.noise_multiplier", field="privacy.epsilon")
        if cfg.fewfedpit.noise_multiplier and cfg.fewfedpit.clip is None:
            raise ConfigError("needs fewfedpit.clip: the noise is z * clip on clipped updates",
                              field="fewfedpit.noise_multiplier")
    elif pr.epsilon is None and pr.noise_multiplier is None:
        raise ConfigError("set privacy.epsilon (a budget) or privacy.noise_multiplier",
                          field="privacy.epsilon")
    if sc.clients_per_round is not None and sc.sample_rate is not None:
        raise ConfigError("give score.clients_per_round or score.sample_rate, not both (the "
                          "default is sample_rate: 0.5, Poisson; a fixed L of N, accounted under "
                          "replace one client, needs sample_rate: null)", field="score.sample_rate")

    if cfg.pool != "static" and not METHODS[cfg.method].pairs:
        raise ConfigError(f"an evolving pool needs a method that ranks each prompt's J samples "
                          f"by their released scores (popri, pe-sft); {cfg.method} does not",
                          field="pool")
    if cfg.draws > 1 and not (cfg.control and METHODS[cfg.method].has_control()):
        raise ConfigError(f"draws > 1 redraws the final set and its control row: it needs "
                          f"control: true and a method with a T = 0 row (popri, pe-sft); "
                          f"{cfg.method}" + ("" if cfg.control else " with control: false"),
                          field="draws")
    if cfg.curve:
        m = METHODS[cfg.method]
        if any(n < 1 or n > cfg.num_synthetic for n in cfg.curve):
            raise ConfigError(f"every size must be in 1 .. num_synthetic ({cfg.num_synthetic}), "
                              f"got {', '.join(map(str, cfg.curve))}", field="curve")
        if len(set(cfg.curve)) != len(cfg.curve):
            raise ConfigError("names a size twice", field="curve")
        if not m.writes_synthetic or type(m).evaluation is not Method.evaluation:
            raise ConfigError(f"a curve trains the downstream model on prefixes of the "
                              f"synthetic set; {cfg.method} evaluates otherwise", field="curve")
        if cfg.final_match_tokens:
            raise ConfigError("final_match_tokens matches the final set's tokens at N alone; "
                              "a curve's prefixes would not be matched", field="curve")
        if cfg.release:
            raise ConfigError("a curve is an evaluation on the private test split: research "
                              "mode only", field="curve")
    if cfg.draw_sources and len(set(cfg.draw_sources)) != len(cfg.draw_sources):
        raise ConfigError(f"names a source twice: {', '.join(cfg.draw_sources)}",
                          field="draw_sources")
    if not cfg.draw_sources and cfg.draws > 1:
        raise ConfigError("draws > 1 need a source to redraw (generation, training, test)",
                          field="draw_sources")
    if "test" in cfg.draw_sources and cfg.downstream.eval_max_samples is None:
        raise ConfigError("test redraws which downstream.eval_max_samples test records are "
                          "evaluated: it needs that cap (null evaluates all of them, every draw)",
                          field="draw_sources")
    _check_remedies(cfg)
    if METHODS[cfg.method].pairs and dp.rejected_rank > cfg.samples_per_prompt:
        raise ConfigError(f"must be <= samples_per_prompt ({cfg.samples_per_prompt}): the "
                          f"rejected sample is the l-th best of J per prompt (got "
                          f"{dp.rejected_rank})", field="dpo.rejected_rank")
    if cfg.baselines and cfg.downstream.bootstrap < 2:
        raise ConfigError("must be >= 2 with baselines (the gap's paired bootstrap)",
                          field="downstream.bootstrap")
    if not dp.select_checkpoint and dp.select_on not in ("dp", "none"):
        raise ConfigError(f"dpo.select_checkpoint: false turns selection off, but dpo.select_on "
                          f"is {dp.select_on!r}: set one of them", field="dpo.select_on")
    if select_on(cfg) == "dp" and dp.select_by == "mmd":
        raise ConfigError("mmd needs validation samples; dpo.select_on: dp releases a mean (and "
                          "a covariance for fid): select_by mean-cosine or fid",
                          field="dpo.select_by")
    if cfg.release:  # release mode writes no exact statistic of the clients' data
        if cfg.probe.enabled:
            raise ConfigError("the probe reads the private validation split without noise (a "
                              "research diagnostic); release mode writes no exact statistic of "
                              "the clients' data: set probe.enabled: false",
                              field="probe.enabled")
        if select_on(cfg) == "private":
            raise ConfigError("private checkpoint selection reads the private validation split "
                              "without noise (POPri B.1; not covered by epsilon); release mode "
                              "needs dpo.select_on: dp (ledgered, part of epsilon), public or "
                              "none", field="dpo.select_on")
    if select_on(cfg) == "dp":
        try:
            fred_z(dp.select_epsilon, cfg.selection_delta, "analytic")
        except ParameterError as e:
            raise ConfigError(e.message, field=f"dpo.select_{e.param}") from None


def check_files(cfg: RunConfig) -> None:
    """The input files the config names exist (checked before a real run's first stage; a dry
    run only notes them, so a plan can be previewed before the data is in place)."""
    d = cfg.data
    if d.dir and not (Path(d.dir) / "manifest.json").is_file():
        raise ConfigError(f"{d.dir} is not a popri dataset directory (no manifest.json; "
                          "'popri bench fetch' writes one)", field="data.dir")
    if d.public_source and d.public_source.endswith((".jsonl", ".json", ".csv", ".parquet")) \
            and not Path(d.public_source).is_file():
        raise ConfigError(f"no such file: {d.public_source}", field="data.public_source")


def select_on(cfg: RunConfig) -> str:
    """The checkpoint selection in effect: none for methods without DPO or when turned off."""
    if not METHODS[cfg.method].selects or not cfg.dpo.select_checkpoint:
        return "none"
    return cfg.dpo.select_on


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def _check_run(cfg: RunConfig) -> None:
    """:class:`RunConfig`'s run-level check: the method exists, then :func:`check`."""
    if cfg.method not in METHODS:
        raise ConfigError(f"must be one of {', '.join(METHODS)} (got {cfg.method!r})",
                          field="method")
    check(cfg)


RunConfig.CHECKS.append(_check_run)
