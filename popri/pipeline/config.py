"""Configuration of ``popri run``: grouped dataclasses, YAML in, ``--set key=value`` overrides.

    popri run examples/default.yaml --set rounds=1 --set dpo.lr=2e-5 --set privacy.epsilon=7

Every key has a default here; a YAML file overrides some, ``--set`` overrides any (dotted
path, value parsed as YAML).  Unknown keys are errors (a typo must not silently fall back to a
default).  Defaults are the embedded offline setting, small enough for a 2-core CPU; where the
papers give a value it is cited and the paper-scale value is in examples/biorxiv-gpu.yaml.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from popri.core.errors import ConfigError


@dataclass
class DataConfig:
    """Private federated data and the public initial population Omega."""
    source: str = "sotu"                 # bench source (sotu | shakespeare | debian | biorxiv | ... | FILE)
    dir: str | None = None               # use an existing federated dataset directory instead
    date_from: str | None = "1900-01-01"  # private clients: addresses from this date on
    max_samples_per_client: int | None = 16
    max_clients: int | None = None
    max_tokens: int = 64                 # POPri B.1 / PrE-Text: sequence length 64
    split: str = "hash"
    public_source: str | None = "sotu"   # Omega: public text (a bench source or a JSONL file)
    public_date_to: str | None = "1899-12-31"  # ... the historical addresses (public record)
    public_max_samples_per_client: int | None = 8


@dataclass
class GeneratorConfig:
    """The server LLM (POPri: LLaMA-3-8B; offline default SmolLM2-135M-Instruct)."""
    model: str = "smollm2-135m"
    backend: str = "transformers"        # transformers | vllm
    temperature: float = 1.0             # reference code
    top_p: float = 1.0
    max_new_tokens: int = 85             # reference code
    max_tokens: int = 64
    batch_size: int = 8
    bf16: bool = True


@dataclass
class PrivacyConfig:
    """The budget: the noise multiplier is calibrated over `rounds` steps at the client
    sampling rate, unless given explicitly.  epsilon (at delta, with the accountant) is the
    budget of the whole run directory -- every ledger.jsonl below it -- and is enforced: a
    stage whose release would exceed it is refused before it runs (also with an explicit
    noise_multiplier; set epsilon to null for no budget)."""
    epsilon: float | None = 1.0          # POPri reports eps = 1 and 7
    delta: float = 3e-6                  # POPri / PrE-Text
    noise_multiplier: float | None = None  # explicit z (the budget still applies)
    accountant: str = "rdp"              # rdp (opacus, as the papers) | pld


@dataclass
class ScoreConfig:
    mode: str = "cosine"                 # cosine (POPri) | nn-histogram (ablation)
    clip: float = 1.0                    # POPri: clip to norm 1
    standardize: bool = True             # reference code z-scores before clipping
    clients_per_round: int | None = None  # default: all clients (q = 1)
    sample_rate: float | None = None
    max_samples_per_client: int = 8      # nn-histogram only (PrE-Text)
    threshold: float = 0.0               # nn-histogram only
    # also score noise-free for the recovery rate: `popri score --diagnostic` (NOT private, no
    # ledger entry, never released); skipped in release mode
    recovery_rate: bool = True


@dataclass
class DPOConfig:
    loss: str = "dpo"                    # dpo | ipo
    beta: float = 0.01                   # POPri tau
    lora_r: int = 4                      # POPri B.1 (reference code: 16)
    lora_alpha: int = 8                  # POPri B.1 (reference code: 16)
    lr: float | None = None              # None: popri dpo's default for the model
    epochs: int = 2                      # POPri B.1
    batch_size: int = 4                  # POPri B.1: 24
    rejected_rank: int = 5               # POPri B.1: 1st vs 5th
    select_checkpoint: bool = True       # false = select_on: none (kept for older configs)
    select_samples: int = 16
    # Checkpoint selection by FID (POPri B.1 picks the epoch with the lowest FID to the private
    # validation split, read WITHOUT noise: not covered by epsilon).  private: that (default, the
    # paper's); public: the public Omega embeddings (no privacy cost); none: the last epoch; dp:
    # the validation split's embedding mean + covariance released once by `popri fred stats`
    # (user level, add/remove one client, analytic Gaussian at select_epsilon / select_delta per
    # release), ledgered in the run: it is PART of privacy.epsilon (the score noise is calibrated
    # to the budget left after it, and the budget guard counts it).
    select_on: str = "private"           # private | public | dp | none
    select_epsilon: float = 0.1          # dp: epsilon of each of the two FreD releases
    select_delta: float | None = None    # dp: delta of each release (None: privacy.delta)


@dataclass
class PEConfig:
    """Private Evolution / PrE-Text (``method: pe``): population, variation and expansion."""
    num_syn: int = 48                    # N_syn (PrE-Text D.2: 1024 at eps 1.29, 2048 at eps 7.58)
    variation: str = "paraphrase"        # mask-fill (PrE-Text: RoBERTa-large) | paraphrase (Aug-PE)
    variation_model: str | None = None   # default: roberta-large (mask-fill) / generator.model
    mask_ratio: float = 0.3              # PrE-Text D.2: MASK% = 30
    mask_steps: int = 2                  # PrE-Text D.2: W_steps = 2
    lookahead: int = 0                   # K variations averaged for the vote (PrE-Text; 0 = off)
    threshold: float | None = None       # H; None = the noise std z * M (PrE-Text D.2)
    fallback: bool = True                # mask-fill without a loadable MLM -> paraphrase


@dataclass
class DownstreamConfig:
    model: str = "smollm2-135m"          # POPri: DistilGPT2
    epochs: int = 2                      # POPri: 80 (on 1M samples)
    batch_size: int = 16                 # POPri: 160
    lr: float = 2e-4                     # POPri B.1
    max_length: int = 64
    lora: bool = False
    eval_max_samples: int | None = 400   # cap test/val samples for CPU runs (None = all)
    bootstrap: int = 1000


@dataclass
class RunConfig:
    run_dir: str = "runs/default"
    method: str = "popri"                # popri | pe (PrE-Text) | pe-sft (POPri's PE+SFT baseline)
    seed: int = 0
    rounds: int = 2                      # POPri T (paper: 10 / 20)
    prompts: int = 12                    # POPri K (paper: 1800)
    samples_per_prompt: int = 6          # POPri J (paper: 10)
    num_synthetic: int = 160             # final N (paper: 1,000,000)
    embedder: str = "all-MiniLM-L6-v2"   # POPri B.1
    baselines: bool = True               # eps = 0 and eps = inf runs
    # release mode: every DP stage (and every stage that samples clients) gets --release: OS
    # CSPRNG noise, nothing reproducible from a seed.  false = research mode: noise is seeded and
    # reproducible from the sidecars (fine for experiments, not for releasing data).
    release: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    pe: PEConfig = field(default_factory=PEConfig)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)


def _coerce(value: Any, typ: Any, where: str) -> Any:
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise ConfigError(f"must be a mapping (a section), got {value!r}", field=where)
        return from_dict(typ, value, where)
    if value is None:
        return None
    base = [t for t in getattr(typ, "__args__", (typ,)) if t is not type(None)]
    t = base[0] if base else typ
    try:
        if isinstance(value, (dict, list, tuple, set)):
            raise TypeError
        if t is bool:
            if isinstance(value, bool):
                return value
            raise ValueError
        if t is int:
            if isinstance(value, bool) or float(value) != int(float(value)):
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
        raise ConfigError(f"expects {t.__name__}, got {value!r}", field=where) from None
    return value


def from_dict(cls, d: dict, where: str = "") -> Any:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in d if k not in names]
    if unknown:
        k = sorted(map(str, unknown))[0]
        raise ConfigError(f"unknown key (known: {', '.join(sorted(names))})",
                          field=f"{where + '.' if where else ''}{k}")
    kw = {k: _coerce(v, hints[k], f"{where + '.' if where else ''}{k}") for k, v in d.items()}
    base = cls()  # defaults; nested sections were built from their own defaults by _coerce
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"bad key {dotted!r}", path=f"--set {dotted}")
    cur = d
    for i, p in enumerate(parts[:-1]):
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ConfigError(f"cannot set '{dotted}': '{p}' is not a section",
                              path=f"--set {dotted}", field=".".join(parts[:i + 1]))
    cur[parts[-1]] = value


def load_yaml_mapping(path: str) -> dict:
    """A YAML file whose top level is a mapping, or one clear ConfigError (exit 2)."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError("config file not found", path=path)
    if p.is_dir():
        raise ConfigError("is a directory, expected a YAML file", path=path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML: {' '.join(str(e).split())}", path=path) from None
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"cannot read: {type(e).__name__}: {e}", path=path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=path)
    return data


def load(path: str | None, overrides: list[str] = ()) -> RunConfig:
    """The config of ``popri run``: defaults < YAML ``path`` < ``--set`` overrides, every value
    checked (types, ranges, choices, combinations) before anything runs.  Errors are
    :class:`ConfigError` (exit 2) naming the YAML file or the ``--set`` and the dotted key."""
    import yaml

    raw: dict = load_yaml_mapping(path) if path else {}
    set_keys: list[str] = []
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"--set expects key=value, got {o!r}")
        k, v = o.split("=", 1)
        try:
            val = yaml.safe_load(v)
        except yaml.YAMLError:
            val = v
        set_dotted(raw, k.strip(), val)
        set_keys.append(k.strip())
    try:
        cfg = from_dict(RunConfig, raw)
        check(cfg)
    except ConfigError as e:
        if e.path is not None:
            raise
        f = e.field or ""
        src = [s for s in set_keys if s == f or f.startswith(s + ".") or s.startswith(f + ".")]
        where = f"--set {src[-1]}" if src else path
        raise ConfigError(e.message, path=where, field=e.field) from None
    return cfg


METHODS = ("popri", "pe", "pe-sft")
SELECT_ON = ("private", "public", "dp", "none")

# Every number's range: key -> (low, high, low open, high open); None = unbounded.  A value of
# None is allowed where the type is Optional (it means "default"/"off", see the dataclasses).
RANGES: dict[str, tuple] = {
    "seed": (0, None), "rounds": (1, 10_000), "prompts": (1, None), "samples_per_prompt": (1, None),
    "num_synthetic": (1, None),
    "data.max_samples_per_client": (1, None), "data.max_clients": (1, None),
    "data.max_tokens": (1, None), "data.public_max_samples_per_client": (1, None),
    "generator.temperature": (0, None), "generator.top_p": (0, 1, True),
    "generator.max_new_tokens": (1, None), "generator.max_tokens": (1, None),
    "generator.batch_size": (1, None),
    "privacy.epsilon": (0, None, True), "privacy.delta": (0, 1, True, True),
    "privacy.noise_multiplier": (0, 1e6, True),
    "score.clip": (0, 1e6, True), "score.clients_per_round": (1, None),
    "score.sample_rate": (0, 1, True), "score.max_samples_per_client": (1, None),
    "score.threshold": (0, None),
    "dpo.beta": (0, None, True), "dpo.lora_r": (1, None), "dpo.lora_alpha": (1, None),
    "dpo.lr": (0, None, True), "dpo.epochs": (1, None), "dpo.batch_size": (1, None),
    "dpo.rejected_rank": (2, None), "dpo.select_samples": (2, None),
    "dpo.select_epsilon": (0, None, True), "dpo.select_delta": (0, 1, True, True),
    "pe.num_syn": (1, None), "pe.mask_ratio": (0, 1, True), "pe.mask_steps": (1, None),
    "pe.lookahead": (0, None), "pe.threshold": (0, None),
    "downstream.epochs": (1, None), "downstream.batch_size": (1, None),
    "downstream.lr": (0, None, True), "downstream.max_length": (2, None),
    "downstream.eval_max_samples": (1, None), "downstream.bootstrap": (0, None),
}
CHOICES: dict[str, tuple] = {
    "method": METHODS, "score.mode": ("cosine", "nn-histogram"),
    "pe.variation": ("mask-fill", "paraphrase"), "generator.backend": ("transformers", "vllm"),
    "privacy.accountant": ("rdp", "pld"), "dpo.loss": ("dpo", "ipo"), "dpo.select_on": SELECT_ON,
    "data.split": ("hash", "date"),
}
NONEMPTY = ("run_dir", "embedder", "generator.model", "downstream.model")


def get(cfg: RunConfig, dotted: str) -> Any:
    cur = cfg
    for p in dotted.split("."):
        cur = getattr(cur, p)
    return cur


def _range_text(lo, hi, lo_open=False, hi_open=False) -> str:
    if hi is None:
        return f"a finite number {'>' if lo_open else '>='} {lo:g}"
    return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def check(cfg: RunConfig) -> None:
    """Every value's range and choice, and the combinations, before the first stage runs."""
    for key, (lo, hi, *op) in RANGES.items():
        lo_open, hi_open = (list(op) + [False, False])[:2]
        v = get(cfg, key)
        if v is None:
            continue
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (v > lo if lo_open else v >= lo)
              and (hi is None or (v < hi if hi_open else v <= hi)))
        if not ok:
            raise ConfigError(f"must be {_range_text(lo, hi, lo_open, hi_open)} (got {v!r})",
                              field=key)
    for key, allowed in CHOICES.items():
        v = get(cfg, key)
        if v not in allowed:
            raise ConfigError(f"must be one of {', '.join(allowed)} (got {v!r})", field=key)
    for key in NONEMPTY:
        if not str(get(cfg, key) or "").strip():
            raise ConfigError("must not be empty", field=key)
    d, pr, sc, dp = cfg.data, cfg.privacy, cfg.score, cfg.dpo
    if not d.dir and not str(d.source or "").strip():
        raise ConfigError("give data.source (a bench source or a file) or data.dir",
                          field="data.source")
    if not str(d.public_source or "").strip():
        raise ConfigError("is needed (the initial population Omega: a bench source or a JSONL "
                          "file)", field="data.public_source")
    if pr.epsilon is None and pr.noise_multiplier is None:
        raise ConfigError("set privacy.epsilon (a budget) or privacy.noise_multiplier",
                          field="privacy.epsilon")
    if sc.clients_per_round is not None and sc.sample_rate is not None:
        raise ConfigError("give score.clients_per_round or score.sample_rate, not both",
                          field="score.sample_rate")
    if cfg.method != "pe" and dp.rejected_rank > cfg.samples_per_prompt:
        raise ConfigError(f"must be <= samples_per_prompt ({cfg.samples_per_prompt}): the "
                          f"rejected sample is the l-th best of J per prompt (got "
                          f"{dp.rejected_rank})", field="dpo.rejected_rank")
    if cfg.baselines and cfg.downstream.bootstrap < 2:
        raise ConfigError("must be >= 2 with baselines (the gap's paired bootstrap)",
                          field="downstream.bootstrap")
    if not dp.select_checkpoint and dp.select_on not in ("private", "none"):
        raise ConfigError(f"dpo.select_checkpoint: false turns selection off, but dpo.select_on "
                          f"is {dp.select_on!r}: set one of them", field="dpo.select_on")
    if select_on(cfg) == "dp":
        from popri.methods.fred.stats import noise_multiplier as fred_z
        from popri.privacy.accounting import ParameterError

        try:
            fred_z(dp.select_epsilon, select_delta(cfg), "analytic")
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
    if cfg.method != "popri" or not cfg.dpo.select_checkpoint:
        return "none"
    return cfg.dpo.select_on


def select_delta(cfg: RunConfig) -> float:
    return cfg.privacy.delta if cfg.dpo.select_delta is None else cfg.dpo.select_delta


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)
