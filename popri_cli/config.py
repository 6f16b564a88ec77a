"""Configuration of ``popri run``: grouped dataclasses, YAML in, ``--set key=value`` overrides.

    popri run examples/default.yaml --set rounds=1 --set dpo.lr=2e-5 --set privacy.epsilon=7

Every key has a default here; a YAML file overrides some, ``--set`` overrides any (dotted
path, value parsed as YAML).  Unknown keys are errors (a typo must not silently fall back to a
default).  Defaults are the embedded offline setting, small enough for a 2-core CPU; where the
papers give a value it is cited and the paper-scale value is in examples/biorxiv-gpu.yaml.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from .errors import PopriError


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
    sampling rate, unless given explicitly."""
    epsilon: float | None = 1.0          # POPri reports eps = 1 and 7
    delta: float = 3e-6                  # POPri / PrE-Text
    noise_multiplier: float | None = None
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
    recovery_rate: bool = True           # also score noise-free (diagnostic, NOT private, not released)


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
    select_checkpoint: bool = True       # POPri B.1: lowest FID to the validation split
    select_samples: int = 16


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
            raise PopriError(f"config: '{where}' must be a mapping")
        return from_dict(typ, value, where)
    if value is None:
        return None
    base = [t for t in getattr(typ, "__args__", (typ,)) if t is not type(None)]
    t = base[0] if base else typ
    try:
        if t is bool:
            if isinstance(value, bool):
                return value
            raise ValueError
        if t is int:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if t is float:
            return float(value)
        if t is str:
            return str(value)
    except (TypeError, ValueError):
        raise PopriError(f"config: '{where}' expects {t.__name__}, got {value!r}") from None
    return value


def from_dict(cls, d: dict, where: str = "") -> Any:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        k = sorted(unknown)[0]
        raise PopriError(f"config: unknown key '{where + '.' if where else ''}{k}' "
                         f"(known: {', '.join(sorted(names))})")
    kw = {k: _coerce(v, hints[k], f"{where + '.' if where else ''}{k}") for k, v in d.items()}
    base = cls()  # defaults; nested sections were built from their own defaults by _coerce
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise PopriError(f"config: cannot set '{dotted}': '{p}' is not a section")
    cur[parts[-1]] = value


def load_yaml_mapping(path: str) -> dict:
    """A YAML file whose top level is a mapping, or one clear PopriError."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise PopriError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise PopriError(f"{path}: malformed YAML: {e}") from None
    if not isinstance(data, dict):
        raise PopriError(f"{path}: expected a mapping at the top level")
    return data


def load(path: str | None, overrides: list[str] = ()) -> RunConfig:
    import yaml

    raw: dict = load_yaml_mapping(path) if path else {}
    for o in overrides:
        if "=" not in o:
            raise PopriError(f"--set expects key=value, got {o!r}")
        k, v = o.split("=", 1)
        try:
            val = yaml.safe_load(v)
        except yaml.YAMLError:
            val = v
        set_dotted(raw, k.strip(), val)
    cfg = from_dict(RunConfig, raw)
    check(cfg)
    return cfg


METHODS = ("popri", "pe", "pe-sft")


def check(cfg: RunConfig) -> None:
    """Choices that the types cannot express."""
    if cfg.method not in METHODS:
        raise PopriError(f"config: method must be one of {', '.join(METHODS)} (got {cfg.method!r})")
    if cfg.score.mode not in ("cosine", "nn-histogram"):
        raise PopriError(f"config: score.mode must be cosine or nn-histogram (got {cfg.score.mode!r})")
    if cfg.pe.variation not in ("mask-fill", "paraphrase"):
        raise PopriError("config: pe.variation must be mask-fill or paraphrase "
                         f"(got {cfg.pe.variation!r})")
    if cfg.rounds < 1:
        raise PopriError("config: rounds must be >= 1")


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)
