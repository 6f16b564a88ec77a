"""popri account: epsilon <-> noise multiplier, and the total privacy cost of a pipeline's ledgers.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20 --delta 3e-6
    popri account sigma --epsilon 7.58 --sample-rate 1 --steps 11 --accountant pld --json
    popri account ledger runs/ scores.json --accountant pld

Settings: :mod:`popri.specs.privacy` (EpsilonSpec, SigmaSpec, LedgerTotalSpec); the maths:
:func:`popri.privacy.accounting.epsilon_details`,
:func:`popri.privacy.calibration.noise_multiplier_details`, :func:`popri.privacy.ledger.total`.
"""

from __future__ import annotations

import math
from typing import List

import typer

from popri.cli.options import param_error
from popri.core import log
from popri.core.io import dumps
from popri.privacy import accounting as A
from popri.privacy.calibration import noise_multiplier_details
from popri.privacy.ledger import total
from popri.privacy.relations import of_sampling
from popri.specs.privacy import FIXED, EpsilonSpec, LedgerTotalSpec, SigmaSpec
from popri.cli.options import command
from popri.specs.commands.account import AccountEpsilonCall, AccountLedgerCall, AccountSigmaCall

NEIGHBOURS = (
    "Neighbouring datasets differ by one client's whole data (user-level DP): added or removed "
    "under Poisson sampling and full participation (the default), replaced under fixed-size "
    "sampling (--sampling fixed, at any q: a fixed L = N is still L of the N + 1 clients of an "
    "added-to neighbour); every ledger entry names its relation (docs/privacy.md), and so does "
    "every line printed here. The noise multiplier z is (noise std on the aggregate) / (L2 "
    "sensitivity under that relation: the per-client clip C for add/remove, 2C for replace).")

app = typer.Typer(
    help="Privacy accounting for the Gaussian releases of POPri / PrE-Text (user-level DP).\n\n"
         + NEIGHBOURS + "\n\nAccountants: 'rdp' = opacus' RDP analysis of the Poisson-subsampled "
         "Gaussian (what POPri D.1 and PrE-Text D.1 used; the default); 'pld' = dp-accounting's "
         "privacy-loss-distribution accountant (pessimistic estimate, tighter: near-exact).",
    no_args_is_help=True)

OPTION = {"noise_multiplier": "--noise-multiplier", "sample_rate": "--sample-rate",
          "steps": "--steps", "delta": "--delta", "epsilon": "--epsilon",
          "accountant": "--accountant", "tol": "--tol"}
H_JSON = "Print one JSON object on stdout instead of one line of text."


def _g(x: float) -> str:
    return f"{x:g}"


def _up(x: float, places: int = 4) -> str:
    """x rounded UP at ``places`` decimals (a displayed epsilon or z never flatters)."""
    if not math.isfinite(x):
        return "inf"
    if 0 < x < 0.01:  # keep 3 significant digits
        m = 10.0 ** (math.floor(math.log10(x)) - 2)
        return f"{math.ceil(x / m - 1e-9) * m:.3g}"
    return f"{math.ceil(x * 10 ** places - 1e-9) / 10 ** places:.{places}f}"


def _relation(spec) -> str:
    """The relation the printed number holds under: the stages' rule
    (popri.privacy.relations.of_sampling): Poisson (and q = 1 of it: everyone) add/remove one
    client, z relative to C; a fixed L of N replace one client, z relative to 2C -- at q = 1
    too (popri.federated.participation.sample_clients records a fixed L = N as 'fixed': on an
    added-to neighbour it is L of N + 1).  At q = 1 the number is the Gaussian's at z either
    way (popri.privacy.accounting.history_of); the relation says what z is relative to."""
    return of_sampling(spec.sampling)


def _emit(obj: dict, as_json: bool, line: str) -> None:
    typer.echo(dumps(obj) if as_json else line)


@app.command("epsilon", help=(
    "Epsilon spent by --steps Gaussian releases with noise multiplier z at sample rate q.\n\n"
    "Prints one line, e.g. 'epsilon = 0.9617 (rdp, q=0.1, T=20, delta=3e-06, z=2.5)' (epsilon "
    "rounded up), or with --json one object {\"epsilon\", \"noise_multiplier\", \"sample_rate\", "
    "\"steps\", \"delta\", \"accountant\", ...}; z = 0 gives 'inf' / null with a \"note\".\n\n"
    + NEIGHBOURS))
@command(AccountEpsilonCall)
def epsilon_cmd(
    noise_multiplier: float, sample_rate: float, steps: int, as_json: bool, *, spec: EpsilonSpec
) -> None:
    """Epsilon of a Gaussian mechanism run --steps times at sample rate q."""
    try:
        r = A.epsilon_details(spec.noise_multiplier, spec.sample_rate, spec.steps, spec.delta,
                              spec.accountant, sampling=spec.sampling)
    except A.ParameterError as e:
        raise param_error(e, OPTION) from None
    for w in r.warnings:
        if w != A.INF_NOTE:
            log.warn(w)
    obj = {"epsilon": r.epsilon if math.isfinite(r.epsilon) else None,
           "noise_multiplier": noise_multiplier, "sample_rate": sample_rate, "steps": steps,
           "delta": spec.delta, "accountant": spec.accountant, "sampling": spec.sampling,
           "neighbouring": _relation(spec)}
    if r.order is not None:
        obj["order"] = r.order
    if spec.accountant == "pld":
        obj["value_discretization_interval"] = A.PLD_INTERVAL
    if not math.isfinite(r.epsilon):  # z = 0, or z too small / steps too many to account
        obj["note"] = r.warnings[0] if r.warnings else A.INF_NOTE
    _emit(obj, as_json, f"epsilon = {_up(r.epsilon)} ({spec.accountant}, q={_g(sample_rate)}, "
                        f"T={steps}, delta={_g(spec.delta)}, z={_g(noise_multiplier)}; "
                        f"{_relation(spec)})")


@app.command("sigma", help=(
    "Smallest noise multiplier z whose epsilon is <= --epsilon (bracket, then bisection to "
    "--tol).\n\nThe upper end of the final interval is returned, so the target is met; the text "
    "line shows z rounded up, e.g. 'noise_multiplier = 2.3098 (rdp, q=1, T=11, delta=3e-06, "
    "epsilon=7.5800 <= 7.58)'. --json: {\"noise_multiplier\", \"epsilon_achieved\", \"epsilon\" "
    "(the target), the other inputs, \"accountant\"}.\n\n" + NEIGHBOURS))
@command(AccountSigmaCall)
def sigma_cmd(
    epsilon: float, sample_rate: float, steps: int, as_json: bool, *, spec: SigmaSpec
) -> None:
    """Calibrate the noise multiplier to a privacy budget."""
    try:
        z, r = noise_multiplier_details(spec.epsilon, spec.sample_rate, spec.steps, spec.delta,
                                        spec.accountant, spec.tol, sampling=spec.sampling)
    except A.ParameterError as e:
        raise param_error(e, OPTION) from None
    for w in r.warnings:
        log.warn(w)
    obj = {"noise_multiplier": z, "epsilon_achieved": r.epsilon, "epsilon": epsilon,
           "sample_rate": sample_rate, "steps": steps, "delta": spec.delta, "accountant": spec.accountant,
           "tol": spec.tol, "sampling": spec.sampling, "neighbouring": _relation(spec)}
    if spec.accountant == "pld":
        obj["value_discretization_interval"] = A.PLD_INTERVAL
    _emit(obj, as_json, f"noise_multiplier = {_up(z)} ({spec.accountant}, q={_g(sample_rate)}, "
                        f"T={steps}, delta={_g(spec.delta)}, "
                        f"epsilon={_up(r.epsilon)} <= {_g(epsilon)}; {_relation(spec)})")


@app.command("ledger", help=(
    "Compose every release recorded in the ledgers (any mix of z, q and steps) into one "
    "epsilon.\n\nPrints a table (stage, mechanism, z, q, steps, sampling, entries, epsilon of that "
    "line alone; identical releases of one stage share a line) and the total; --json gives "
    "{\"epsilon\", \"delta\", \"accountant\", \"entries\", \"groups\": [...], \"note\"}. RDP adds "
    "the per-order RDP of all releases (like opacus' RDPAccountant history); PLD composes their "
    "privacy loss distributions. Mechanism 'gaussian' or sampling 'none' counts as q = 1. Every "
    "entry names its neighbouring relation; the total holds under one relation, printed on the "
    "total line: the entries' own, or one they convert to by a proven rule (a q = 1 Gaussian "
    "under add/remove counts at twice its sensitivity under replace-one or zero-out), else an "
    "error. Entries with no proven accounting (fixed-size sampling under add/remove, as popri "
    "<= 0.3 recorded) are refused unless --convention papers, whose total is NOT a DP "
    "guarantee and says so.\n\n"
    + FIXED + "\n\n" + NEIGHBOURS))
@command(AccountLedgerCall)
def ledger_cmd(paths: List[str], as_json: bool, *, spec: LedgerTotalSpec) -> None:
    """Total privacy cost of a set of ledgers."""
    try:
        t = total(paths, delta=spec.delta, accountant=spec.accountant,
                  convention=spec.convention)
    except A.ParameterError as e:
        raise param_error(e, OPTION) from None
    c, entries, research = t.composition, t.entries, t.research
    for w in c.warnings:
        log.warn(w)
    if research:
        log.warn(f"{research} of {len(entries)} entries are RESEARCH mode: their noise was drawn "
                 "from a recorded seed, so anyone holding the sidecars can regenerate it and the "
                 "epsilon below protects nobody from them. Rerun with --release for outputs you "
                 "publish.")
    over = spec.max_epsilon is not None and not (c.epsilon <= spec.max_epsilon * (1 + 1e-9))
    if as_json:
        obj = t.to_dict()
        if spec.max_epsilon is not None:
            obj["max_epsilon"] = spec.max_epsilon
            obj["within_budget"] = not over
        _emit(obj, True, "")
        if over:
            raise typer.Exit(4)
        return
    for n in c.notes:
        log.info(f"note: {n}")
    head = ("stage", "mechanism", "z", "q", "steps", "sampling", "relation", "entries",
            "epsilon alone")
    rows = [(g["stage"], g["mechanism"], _g(g["noise_multiplier"]), _g(g["sample_rate"]),
             str(g["steps"]), g["sampling"], g.get("neighbouring", ""), str(g["entries"]),
             _up(g["epsilon_alone"]) if g["epsilon_alone"] is not None else "inf")
            for g in c.groups]
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        typer.echo("  ".join(x.ljust(w) for x, w in zip(r, width)).rstrip())
    typer.echo(f"total: epsilon = {_up(c.epsilon)} ({c.accountant}, delta={_g(c.delta)}, "
               f"{c.entries} entries, {len(c.groups)} lines; {c.label})")
    for line in t.not_dp_lines():  # what this epsilon does not cover (issue 66)
        typer.echo(line)
    if over:
        log.warn(f"budget exceeded: total epsilon {_up(c.epsilon)} > --max-epsilon "
                 f"{_g(spec.max_epsilon)}")
        raise typer.Exit(4)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="account")
