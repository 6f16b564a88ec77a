"""popri audit: empirical privacy audits.

    popri audit release --mechanism cosine -z 1 --trials 10000
    popri audit release --mechanism fred --epsilon 0.9 --delta 1e-5 --trials 10000 --json
    popri audit release --mechanism nn-histogram -z 1 --trials 10000 --break half-noise  # exit 1

Settings: :class:`popri.specs.privacy.AuditSpec`; the audit: :func:`popri.privacy.audit.run`.
"""

from __future__ import annotations

import math
from typing import Optional

import typer

from popri.cli.options import build, option, param_error, unwrap
from popri.core.spec import help_of, spec_field
from popri.specs.privacy import AuditSpec

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


@app.command("release", help=unwrap(HELP))
def release_cmd(
    mechanism: str = typer.Option(..., "--mechanism", "-m",
                                  help=help_of(spec_field(AuditSpec, "mechanism"))),
    trials: int = typer.Option(..., "--trials", "-T",
                               help=help_of(spec_field(AuditSpec, "trials"))),
    noise_multiplier: Optional[float] = option(AuditSpec, "noise_multiplier"),
    epsilon: Optional[float] = option(AuditSpec, "epsilon"),
    delta: float = option(AuditSpec, "delta",
                          help="delta of the claim and of the bound (default 3e-6, popri "
                               "score's)."),
    accountant: str = option(AuditSpec, "accountant",
                             help="Accountant of the claim: rdp (the ledger's default) or pld "
                                  "(tighter)."),
    calibration: Optional[str] = option(AuditSpec, "calibration",
                                        help="fred --epsilon: classic (default; eps < 1) or "
                                             "analytic."),
    clip: Optional[float] = option(AuditSpec, "clip",
                                   help="cosine / fred: clip norm C (default 1)."),
    max_samples_per_client: Optional[int] = option(
        AuditSpec, "max_samples_per_client",
        help="Per-client cap M: nn-histogram's sensitivity (default 8); cosine: cap (default "
             "none); fred --level user: m (default 8)."),
    clients: Optional[int] = option(AuditSpec, "clients"),
    synthetic: int = option(AuditSpec, "synthetic"),
    dim: int = option(AuditSpec, "dim"),
    relation: Optional[str] = option(AuditSpec, "relation",
                                     help="fred: replace-one (default) or add-remove."),
    level: Optional[str] = option(AuditSpec, "level", help="fred: sample (default) or user."),
    dataset: str = option(AuditSpec, "dataset"),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and of every trial's noise."),
    confidence: float = option(AuditSpec, "confidence"),
    brk: Optional[str] = option(AuditSpec, "brk"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Empirical epsilon lower bound of one release vs the claimed epsilon."""
    from popri.core import log
    from popri.core.io import dumps
    from popri.privacy import audit as A
    from popri.privacy.accounting import ParameterError

    spec = build(AuditSpec, mechanism=mechanism, trials=trials,
                 noise_multiplier=noise_multiplier, epsilon=epsilon, delta=delta,
                 accountant=accountant, calibration=calibration, clip=clip,
                 max_samples_per_client=max_samples_per_client, clients=clients,
                 synthetic=synthetic, dim=dim, relation=relation, level=level, dataset=dataset,
                 confidence=confidence, brk=brk)
    try:
        r = A.run(spec, seed=seed)
    except ParameterError as e:
        raise param_error(e, OPTION) from None
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
