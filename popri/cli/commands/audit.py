"""popri audit: empirical privacy audits (the maths: popri/privacy/audit.py).

    popri audit release --mechanism cosine -z 1 --trials 10000
    popri audit release --mechanism fred --epsilon 0.9 --delta 1e-5 --trials 10000 --json
    popri audit release --mechanism nn-histogram -z 1 --trials 10000 --break half-noise  # exit 1
"""

from __future__ import annotations

import math
from typing import Optional

import typer

app = typer.Typer(
    help="Empirical privacy audits: replay a DP mechanism on neighbouring datasets and bound its "
         "epsilon from below (Jagielski et al. 2020; Nasr et al. 2021, 2023).",
    no_args_is_help=True)

HELP = """Audit one release: an empirical lower bound on its epsilon, next to the claimed one.

Replays the library's own mechanism (cosine: scoring.cosine_round + finish; nn-histogram:
scoring.histogram_round + finish; fred: fred.release, release 1) --trials times on a small
seeded random private set D (--clients, --dim, --synthetic; everyone takes part, q = 1) and as
many times on D' = D + one worst-case canary record (a client whose contribution before the
clip / cap is 10x the sensitivity), with research-mode seeded noise (one seed per trial).  The
attacker projects each output on the canary's known effect (the likelihood-ratio test for
Gaussian noise), picks its threshold on half of the trials and is scored on the other half.

Prints a table (mechanism, z, claimed eps, eps lower bound with its confidence interval, the GDP
bound mu >= ... and its epsilon, trials, FPR, FNR, verdict) or with --json one object.  The
(eps, delta) bound is max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR)) at
Clopper-Pearson upper bounds of the rates; the GDP bound (Nasr et al. 2023) tests the noise
multiplier z itself.  Both hold at --confidence jointly.  The claim: accounting.epsilon(z, q=1,
steps=1, --delta, --accountant) for cosine / nn-histogram (the ledger entry's worth), FreD's
--epsilon per release.

--break no-clip | half-noise audits a deliberately broken copy (clipping / the cap off, or the
noise multiplier halved while z is still claimed); the library is untouched.  When a lower bound
exceeds the claim a line 'VIOLATION: empirical lower bound X > claimed eps Y' is printed and the
exit status is 1.  Writes nothing (no release happens, no ledger)."""

OPTION = {"noise_multiplier": "--noise-multiplier", "epsilon": "--epsilon", "delta": "--delta",
          "accountant": "--accountant", "calibration": "--calibration", "clip": "--clip",
          "relation": "--relation", "level": "--level",
          "max_samples_per_client": "--max-samples-per-client"}


def _check(ok: bool, field: str, message: str) -> None:
    from popri.core.errors import InputError

    if not ok:
        raise InputError(message, field=field)


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "inf"
    return f"{x:.4f}"


def _table(r: dict) -> list[str]:
    head = ("mechanism", "z", "claimed eps", "eps lower bound", "CI", "mu lb (GDP)",
            "eps (GDP)", "trials", "FPR", "FNR", "verdict")
    name = r["mechanism"] + (f" [{r['break']}]" if r["break"] else "")
    lo, hi = r["ci"]
    row = (name, f"{r['noise_multiplier']:g}", _fmt(r["claimed_epsilon"]),
           _fmt(r["epsilon_lower_bound"]), f"[{_fmt(lo)}, {_fmt(hi)}]",
           f"{r['mu_lower_bound']:.4f} (1/z {1 / r['noise_multiplier']:.4f})",
           _fmt(r["gdp_epsilon"]), str(r["trials"]), f"{r['fpr']:.4f}", f"{r['fnr']:.4f}",
           r["verdict"].upper() if r["verdict"] != "ok" else "ok")
    width = [max(len(a), len(b)) for a, b in zip(head, row)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, width)).rstrip() for line in (head, row)]


def _unwrap(text: str) -> str:
    """One line per paragraph, so the terminal (rich) does the wrapping."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


@app.command("release", help=_unwrap(HELP))
def release_cmd(
    mechanism: str = typer.Option(..., "--mechanism", "-m",
                                  help="cosine (popri score), nn-histogram (popri score --mode "
                                       "nn-histogram) or fred (popri fred stats)."),
    trials: int = typer.Option(..., "--trials", "-T",
                               help="Releases per world (D and D'); half pick the threshold, "
                                    "half measure it. 10,000 runs in seconds."),
    noise_multiplier: Optional[float] = typer.Option(
        None, "--noise-multiplier", "-z", help="Claimed noise multiplier z (noise std / "
                                               "sensitivity). Exclusive with --epsilon."),
    epsilon: Optional[float] = typer.Option(
        None, "--epsilon", "-e",
        help="Claimed epsilon of the release: z is calibrated to it (fred: its --epsilon per "
             "release, via --calibration; others: the smallest z the accountant accepts)."),
    delta: float = typer.Option(3e-6, "--delta", help="delta of the claim and of the bound "
                                                      "(default 3e-6, popri score's)."),
    accountant: str = typer.Option("rdp", "--accountant", "-a",
                                   help="Accountant of the claim: rdp (the ledger's default) or "
                                        "pld (tighter)."),
    calibration: str = typer.Option("classic", "--calibration",
                                    help="fred --epsilon: classic (eps < 1) or analytic."),
    clip: Optional[float] = typer.Option(None, "--clip", "-c",
                                         help="cosine / fred: clip norm C (default 1)."),
    max_samples_per_client: Optional[int] = typer.Option(
        None, "--max-samples-per-client", "-M",
        help="Per-client cap M: nn-histogram's sensitivity (default 8); cosine: cap (default "
             "none); fred --level user: m (default 8)."),
    clients: Optional[int] = typer.Option(
        None, "--clients", "-N", help="Records / clients in D besides the canary (default 20; "
                                      "fred 3: it is replayed once per trial)."),
    synthetic: int = typer.Option(100, "--synthetic", "-n",
                                  help="cosine / nn-histogram: synthetic samples (default 100: "
                                       "the canary's unclipped cosine vector is then 10 C)."),
    dim: int = typer.Option(16, "--dim", "-d", help="Embedding dimension (default 16)."),
    relation: Optional[str] = typer.Option(None, "--relation",
                                           help="fred: replace-one (default) or add-remove."),
    level: Optional[str] = typer.Option(None, "--level", help="fred: sample (default) or user."),
    dataset: str = typer.Option(
        "random", "--dataset",
        help="random (default): seeded Gaussian records; adversarial: every other record "
             "mirrors the canary (the adversary also picks D, Nasr et al. 2021)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and of every trial's noise."),
    confidence: float = typer.Option(0.95, "--confidence",
                                     help="Joint confidence of the bounds (default 0.95)."),
    brk: Optional[str] = typer.Option(
        None, "--break", help="Audit a deliberately broken mechanism: no-clip or half-noise."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Empirical epsilon lower bound of one release vs the claimed epsilon."""
    import time

    from popri.privacy import audit as A
    from popri.core import log
    from popri.core.errors import InputError
    from popri.methods.fred.stats import CALIBRATIONS, LEVELS, RELATIONS
    from popri.core.io import dumps
    from popri.privacy.accounting import ParameterError

    _check(mechanism in A.MECHANISMS, "--mechanism",
           f"must be one of {', '.join(A.MECHANISMS)} (got {mechanism!r})")
    _check(brk is None or brk in A.BREAKS, "--break",
           f"must be one of {', '.join(A.BREAKS)} (got {brk!r})")
    _check(dataset in ("random", "adversarial"), "--dataset",
           f"must be random or adversarial (got {dataset!r})")
    _check(100 <= trials <= 10_000_000, "--trials", f"must be in [100, 1e7] (got {trials})")
    _check(clients is None or 1 <= clients <= 10_000, "--clients",
           f"must be in [1, 10000] (got {clients})")
    _check(2 <= synthetic <= 10_000, "--synthetic", f"must be in [2, 10000] (got {synthetic})")
    _check(1 <= dim <= 1024, "--dim", f"must be in [1, 1024] (got {dim})")
    _check(math.isfinite(confidence) and 0.5 <= confidence < 1, "--confidence",
           f"must be in [0.5, 1) (got {confidence})")
    _check(max_samples_per_client is None or 1 <= max_samples_per_client <= 1000,
           "--max-samples-per-client", f"must be in [1, 1000] (got {max_samples_per_client})")
    if mechanism == "nn-histogram":
        _check(clip is None, "--clip", "applies to cosine and fred; nn-histogram's sensitivity "
                                       "is --max-samples-per-client")
    else:
        _check(clip is None or (math.isfinite(clip) and 0 < clip <= 1e6), "--clip",
               f"must be a number in (0, 1e6] (got {clip})")
    if mechanism == "fred":
        _check(relation is None or relation in RELATIONS, "--relation",
               f"must be one of {', '.join(RELATIONS)} (got {relation!r})")
        _check(level is None or level in LEVELS, "--level",
               f"must be one of {', '.join(LEVELS)} (got {level!r})")
        _check(calibration in CALIBRATIONS, "--calibration",
               f"must be one of {', '.join(CALIBRATIONS)} (got {calibration!r})")
        _check(max_samples_per_client is None or level == "user", "--max-samples-per-client",
               "applies to fred --level user only")
    else:
        for flag, v in (("--relation", relation), ("--level", level)):
            _check(v is None, flag, "applies to --mechanism fred only")
    _check(noise_multiplier is None or (math.isfinite(noise_multiplier)
                                        and 0 < noise_multiplier <= 1e6),
           "--noise-multiplier", f"must be a number in (0, 1e6] (got {noise_multiplier})")
    try:
        z, claimed, how = A.claimed_epsilon(mechanism, delta=delta, accountant=accountant,
                                            noise_multiplier=noise_multiplier, epsilon=epsilon,
                                            calibration=calibration)
    except ParameterError as e:
        raise InputError(e.message, field=OPTION.get(e.param, e.param)) from None

    setup = A.Setup(mechanism, z, trials, seed=seed, clients=clients, synthetic=synthetic,
                    dim=dim, clip=1.0 if clip is None else float(clip),
                    max_samples_per_client=max_samples_per_client,
                    relation=relation or "replace-one", level=level or "sample", brk=brk,
                    dataset=dataset)
    t0 = time.perf_counter()
    r = A.audit(setup, claimed=claimed, delta=delta, confidence=confidence, claim_from=how)
    log.info(f"audit: {2 * trials} releases of {mechanism} replayed in "
             f"{time.perf_counter() - t0:.1f} s")
    if as_json:
        typer.echo(dumps(r))
        for v in r["violations"]:
            log.warn(v)
    else:
        for line in _table(r) + r["violations"]:
            typer.echo(line)
    if r["violations"]:
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="audit")
