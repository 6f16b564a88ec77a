"""The Python API: the same steps as the CLI, writing the same files and ledger entries.

    import popri
    r = popri.score("runs/priv.npy", "runs/r1/samples.jsonl", noise_multiplier=6.09,
                    out="runs/r1/scores.npy", seed=1)          # == popri score ...
    popri.account("runs/")                                      # == popri account ledger runs/
    cfg = popri.load_config("examples/default.yaml", ["rounds=1"])
    popri.run(cfg, dry_run=True)                                # == popri run --dry-run

Each function is a thin entry to the library function the command calls; settings are the
step's spec fields (``popri.specs``), given as a spec or as keywords.
"""

from __future__ import annotations

from typing import Any

from popri.core import log
from popri.feedback.release import release_scores
from popri.pipeline.config import RunConfig, load
from popri.pipeline.driver import Run
from popri.pipeline.runs import load_run as _load
from popri.privacy import accounting as A
from popri.privacy.ledger import total
from popri.specs.privacy import TargetDeltaSpec


def score(private: str, synthetic: str, spec: Any = None, *, out: str | None = None,
          seed: int = 0, round: int = 0, **settings: Any) -> dict:
    """``popri score``: one round of DP client feedback (POPri cosine or PE nn-histogram) on
    ``synthetic`` from the clients in ``private``; with ``out``, the scores, their sidecar and
    the ledger entry are written exactly as the CLI writes them.  ``settings``: fields of
    :class:`popri.specs.feedback.ScoreSpec` (``noise_multiplier``, ``clip``, ...)."""
    return release_scores(private, synthetic, spec, out=out, seed=seed, round_=round,
                          **settings)


def account(*paths: str, delta: float | None = None, accountant: str = "rdp",
            convention: str | None = None):
    """``popri account ledger``: the total (epsilon, delta) of every ledger entry in ``paths``
    (ledger files, directories -- every ledger.jsonl below --, or score sidecars); a release
    recorded twice counts once.  Returns :class:`popri.privacy.accounting.Composition`, whose
    ``neighbouring`` names the relation it holds under and ``label`` says it in words
    (``convention="papers"``: NOT a DP guarantee).  A file under ``paths`` whose chain holds a
    not-dp link (popri.core.provenance) is named on stderr, ``NOT A DP GUARANTEE: FILE:
    LINK``, as ``popri account ledger`` prints it: the epsilon does not cover it."""
    t = total(paths, delta=delta, accountant=accountant, convention=convention)
    for line in t.not_dp_lines():
        log.warn(line)
    return t.composition


def epsilon(noise_multiplier: float, sample_rate: float, steps: int,
            delta: float | None = None, accountant: str = "rdp",
            sampling: str = "poisson") -> float:
    """``popri account epsilon``: epsilon of ``steps`` subsampled Gaussian releases: Poisson
    sampling at ``sample_rate`` under add/remove one client, or ``sampling="fixed"`` (L of N,
    sample_rate = L/N) under replace one client, z relative to that relation's sensitivity.
    ``delta``: the command's default (3e-6, POPri D.1 / PrE-Text D.1) when not given."""
    if delta is None:
        delta = _default_delta()
    return A.epsilon(noise_multiplier, sample_rate, steps, delta, accountant, sampling=sampling)


def _default_delta() -> float:
    """``popri account epsilon``'s default --delta (TargetDeltaSpec's, declared once)."""
    import dataclasses

    return next(f.default for f in dataclasses.fields(TargetDeltaSpec) if f.name == "delta")


def load_config(path: str | None = None, overrides: Any = ()):
    """``popri run``'s config: defaults < YAML < ``key=value`` overrides (a list of strings, a
    single string or a mapping ``{key: value}``, as :func:`run` takes them), validated."""
    import os

    return load(None if path is None else os.fspath(path), _overrides(overrides))


def _overrides(overrides: Any, what: str = "overrides") -> list[str]:
    """``key=value`` strings from a single ``"key=value"`` string, a mapping ``{key: value}``
    (nested mappings give dotted keys; values are Python objects, as YAML would give them) or
    an iterable of ``"key=value"`` strings; a TypeError for anything else."""
    from collections.abc import Iterable, Mapping

    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        import yaml

        out: list[str] = []

        def walk(m: Mapping, prefix: str) -> None:
            for k, v in m.items():
                if not isinstance(k, str):
                    raise TypeError(f"{what}: keys must be strings, got {k!r}")
                key = f"{prefix}{k}"
                if isinstance(v, Mapping) and v:
                    walk(v, key + ".")
                    continue
                try:
                    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30)
                except yaml.YAMLError:
                    raise TypeError(f"{what}: {key}: a value YAML cannot hold "
                                    f"({type(v).__name__})") from None
                text = text.strip()
                if text.endswith("\n..."):  # a scalar's end-of-document marker
                    text = text[:-4].strip()
                out.append(f"{key}={text}")

        walk(overrides, "")
        return out
    if isinstance(overrides, (bytes, bytearray)) or not isinstance(overrides, Iterable):
        raise TypeError(f"{what} must be a 'key=value' string, a mapping {{key: value}} or a "
                        f"list of 'key=value' strings, not {type(overrides).__name__}")
    out = list(overrides)
    for o in out:
        if not isinstance(o, str):
            raise TypeError(f"{what}: each override must be a 'key=value' string, got "
                            f"{type(o).__name__} {o!r}")
    return out


def run(config=None, *, overrides: Any = (), dry_run: bool = False,
        rerun: bool = False, reuse_from: Any = ()) -> dict | str:
    """``popri run``: every stage of the configured method (cached); returns the results dict,
    or with ``dry_run`` the plan text (nothing runs, nothing is written).

    ``config``: a YAML path (str or ``os.PathLike``), a
    :class:`~popri.pipeline.config.RunConfig` (``load_config``), a mapping with the YAML's
    keys (``{"rounds": 2, "privacy": {"epsilon": 7}}``; the defaults fill the rest), or None
    for the embedded default (examples/default.yaml).  ``overrides``, as ``popri run --set``:
    ``"key=value"`` strings (a list, or a single string), or a mapping ``{key: value}`` (dotted
    keys or nested mappings; Python values).  A TypeError for any other type.  ``rerun``: as
    ``popri run --rerun``, let finished DP stages run again as new releases (counted against
    the budget before anything runs); without it such a resume is refused with one error
    naming them.  ``reuse_from``: run directories (a path or a list), as ``popri run
    --reuse-from``: their finished stages that are this run's are copied, not run again."""
    import os
    from collections.abc import Mapping

    sets = _overrides(overrides)
    if isinstance(config, RunConfig):
        cfg = load(None, sets, base=config) if sets else config
    elif isinstance(config, Mapping):
        # the mapping's keys first, then the overrides: one validation, as a YAML file gets
        cfg = load(None, _overrides(config, "config") + sets)
    elif config is None or isinstance(config, (str, os.PathLike)):
        cfg = load(None if config is None else os.fspath(config), sets)
    else:
        raise TypeError(f"config must be a YAML path, a RunConfig (popri.load_config), a "
                        f"mapping of its keys or None, not {type(config).__name__}")
    lenders = [reuse_from] if isinstance(reuse_from, (str, os.PathLike)) else list(reuse_from)
    r = Run(cfg, dry_run=dry_run, rerun=rerun,
            inputs=[config] if isinstance(config, (str, os.PathLike)) else [],
            reuse_from=lenders)
    res = r.execute()
    return r.plan_text() if dry_run else res


def load_run(path: str):
    """A finished (or unfinished) run directory: ``.config`` (config.resolved.json),
    ``.results`` (results.json), ``.metrics`` (metrics.jsonl as a pandas DataFrame where pandas
    is installed, else a list of dicts), ``.rows`` (metrics.jsonl's rows as written) and
    ``.notes``; :class:`popri.pipeline.runs.LoadedRun`.  A metrics.jsonl line that is not a
    JSON object with an integer ``round`` is skipped with a warning (and a note); an
    unreadable config.resolved.json / results.json, or one that is not a JSON object, raises
    :class:`popri.core.errors.InputError`.  ``.guarantee`` says whether its epsilon is a DP
    guarantee for what it releases; when it is not, a warning says ``NOT A DP GUARANTEE`` and
    why (the papers' convention, a not-dp link in the release's chain: issue 66)."""
    import warnings

    run = _load(path)
    for note in run.notes:  # metrics.jsonl lines skipped (torn, not an object, no round)
        warnings.warn(note, stacklevel=2)
    g = run.guarantee
    if not g["dp_guarantee"]:
        warnings.warn(f"{run.path}: NOT A DP GUARANTEE: " + "; ".join(g["links"]), stacklevel=2)
    return run
