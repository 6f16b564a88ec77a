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

from typing import Any, Iterable


def score(private: str, synthetic: str, spec: Any = None, *, out: str | None = None,
          seed: int = 0, round: int = 0, **settings: Any) -> dict:
    """``popri score``: one round of DP client feedback (POPri cosine or PE nn-histogram) on
    ``synthetic`` from the clients in ``private``; with ``out``, the scores, their sidecar and
    the ledger entry are written exactly as the CLI writes them.  ``settings``: fields of
    :class:`popri.specs.feedback.ScoreSpec` (``noise_multiplier``, ``clip``, ...)."""
    from popri.feedback.release import release_scores

    return release_scores(private, synthetic, spec, out=out, seed=seed, round_=round,
                          **settings)


def account(*paths: str, delta: float | None = None, accountant: str = "rdp",
            convention: str | None = None):
    """``popri account ledger``: the total (epsilon, delta) of every ledger entry in ``paths``
    (ledger files, directories -- every ledger.jsonl below --, or score sidecars); a release
    recorded twice counts once.  Returns :class:`popri.privacy.accounting.Composition`, whose
    ``neighbouring`` names the relation it holds under and ``label`` says it in words
    (``convention="papers"``: NOT a DP guarantee)."""
    from popri.privacy.ledger import total

    return total(paths, delta=delta, accountant=accountant, convention=convention).composition


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
            accountant: str = "rdp", sampling: str = "poisson") -> float:
    """``popri account epsilon``: epsilon of ``steps`` subsampled Gaussian releases: Poisson
    sampling at ``sample_rate`` under add/remove one client, or ``sampling="fixed"`` (L of N,
    sample_rate = L/N) under replace one client, z relative to that relation's sensitivity."""
    from popri.privacy import accounting as A

    return A.epsilon(noise_multiplier, sample_rate, steps, delta, accountant, sampling=sampling)


def load_config(path: str | None = None, overrides: Iterable[str] = ()):
    """``popri run``'s config: defaults < YAML < ``key=value`` overrides, validated."""
    from popri.pipeline.config import load

    return load(path, list(overrides))


def run(config=None, *, overrides: Iterable[str] = (), dry_run: bool = False) -> dict | str:
    """``popri run``: every stage of the configured method (cached); returns the results dict,
    or with ``dry_run`` the plan text (nothing runs, nothing is written).  ``config``: a YAML
    path, a :class:`~popri.pipeline.config.RunConfig` (``load_config``), or None for the
    embedded default (examples/default.yaml); ``overrides``: ``key=value`` strings, as
    ``popri run --set``."""
    from popri.pipeline.config import RunConfig, load
    from popri.pipeline.driver import Run

    if isinstance(config, RunConfig):
        cfg = load(None, list(overrides), base=config) if overrides else config
    else:
        cfg = load(None if config is None else str(config), list(overrides))
    r = Run(cfg, dry_run=dry_run)
    res = r.execute()
    return r.plan_text() if dry_run else res


def load_run(path: str):
    """A finished (or unfinished) run directory: ``.config`` (config.resolved.json),
    ``.results`` (results.json), ``.metrics`` (metrics.jsonl as a pandas DataFrame where pandas
    is installed, else a list of dicts); :class:`popri.pipeline.runs.LoadedRun`."""
    from popri.pipeline.runs import load_run as _load

    return _load(path)
