"""popri account: epsilon <-> noise multiplier, and the total privacy cost of a pipeline's ledgers.

    popri account epsilon --noise-multiplier 2.5 --sample-rate 0.1 --steps 20 --delta 3e-6
    popri account sigma --epsilon 7.58 --sample-rate 1 --steps 11 --accountant pld --json
    popri account ledger runs/ scores.json --accountant pld
"""

from __future__ import annotations

import math
from typing import List, Optional

import typer

NEIGHBOURS = (
    "Neighbouring datasets differ by adding or removing one client's whole data (user-level DP); "
    "the noise multiplier z is (noise std on the aggregate) / (L2 sensitivity = per-client clip).")
FIXED = ("Fixed-size sampling of L of N clients is accounted with the Poisson analysis at "
         "q = L/N, as POPri did (appendix D.1, 'client sampling ratio'): the papers' convention, "
         "not a proven bound for sampling without replacement.")

app = typer.Typer(
    help="Privacy accounting for the Gaussian releases of POPri / PrE-Text (user-level DP).\n\n"
         + NEIGHBOURS + "\n\nAccountants: 'rdp' = opacus' RDP analysis of the Poisson-subsampled "
         "Gaussian (what POPri D.1 and PrE-Text D.1 used; the default); 'pld' = dp-accounting's "
         "privacy-loss-distribution accountant (pessimistic estimate, tighter: near-exact).",
    no_args_is_help=True)

OPTION = {"noise_multiplier": "--noise-multiplier", "sample_rate": "--sample-rate",
          "steps": "--steps", "delta": "--delta", "epsilon": "--epsilon",
          "accountant": "--accountant", "tol": "--tol"}

H_Q = ("Probability that a client takes part in a step (Poisson sampling); 1 = full "
       "participation, a plain Gaussian mechanism (PrE-Text D.1: q = 1). POPri Table 3: clients "
       "per round / total clients. " + FIXED)
H_T = "Number of releases composed (rounds): POPri D.1 uses 20, PrE-Text D.1 uses 11."
H_DELTA = "Target delta. Default 3e-6, as in POPri D.1 and PrE-Text D.1."
H_ACC = ("'rdp' (default; opacus RDP, as POPri D.1 and PrE-Text D.1) or 'pld' (dp-accounting PLD, "
         "tighter).")
H_JSON = "Print one JSON object on stdout instead of one line of text."


def _bad(err) -> Exception:
    from popri.core.errors import InputError

    return InputError(err.message, field=OPTION.get(err.param, err.param))


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


def _emit(obj: dict, as_json: bool, line: str) -> None:
    from popri.core.io import dumps

    typer.echo(dumps(obj) if as_json else line)


@app.command("epsilon", help=(
    "Epsilon spent by --steps Gaussian releases with noise multiplier z at sample rate q.\n\n"
    "Prints one line, e.g. 'epsilon = 0.9617 (rdp, q=0.1, T=20, delta=3e-06, z=2.5)' (epsilon "
    "rounded up), or with --json one object {\"epsilon\", \"noise_multiplier\", \"sample_rate\", "
    "\"steps\", \"delta\", \"accountant\", ...}; z = 0 gives 'inf' / null with a \"note\".\n\n"
    + NEIGHBOURS))
def epsilon_cmd(
    noise_multiplier: float = typer.Option(
        ..., "--noise-multiplier", "-z",
        help="Noise std on the aggregate / L2 sensitivity. POPri Table 3 lists it as sigma; "
             "PrE-Text D.1: sigma / (max samples per client). 0 gives epsilon = inf."),
    sample_rate: float = typer.Option(..., "--sample-rate", "-q", help=H_Q),
    steps: int = typer.Option(..., "--steps", "-T", help=H_T),
    delta: float = typer.Option(3e-6, "--delta", help=H_DELTA),
    accountant: str = typer.Option("rdp", "--accountant", "-a", help=H_ACC),
    as_json: bool = typer.Option(False, "--json", help=H_JSON),
) -> None:
    """Epsilon of a Gaussian mechanism run --steps times at sample rate q."""
    from popri.core import log
    from popri.privacy import accounting as A

    try:
        r = A.epsilon_details(noise_multiplier, sample_rate, steps, delta, accountant)
    except A.ParameterError as e:
        raise _bad(e) from None
    for w in r.warnings:
        if w != A.INF_NOTE:
            log.warn(w)
    obj = {"epsilon": r.epsilon if math.isfinite(r.epsilon) else None,
           "noise_multiplier": noise_multiplier, "sample_rate": sample_rate, "steps": steps,
           "delta": delta, "accountant": accountant, "neighbouring": A.NEIGHBOURING}
    if r.order is not None:
        obj["order"] = r.order
    if accountant == "pld":
        obj["value_discretization_interval"] = A.PLD_INTERVAL
    if not math.isfinite(r.epsilon):  # z = 0, or z too small / steps too many to account
        obj["note"] = r.warnings[0] if r.warnings else A.INF_NOTE
    _emit(obj, as_json, f"epsilon = {_up(r.epsilon)} ({accountant}, q={_g(sample_rate)}, "
                        f"T={steps}, delta={_g(delta)}, z={_g(noise_multiplier)})")


@app.command("sigma", help=(
    "Smallest noise multiplier z whose epsilon is <= --epsilon (bracket, then bisection to "
    "--tol).\n\nThe upper end of the final interval is returned, so the target is met; the text "
    "line shows z rounded up, e.g. 'noise_multiplier = 2.3098 (rdp, q=1, T=11, delta=3e-06, "
    "epsilon=7.5800 <= 7.58)'. --json: {\"noise_multiplier\", \"epsilon_achieved\", \"epsilon\" "
    "(the target), the other inputs, \"accountant\"}.\n\n" + NEIGHBOURS))
def sigma_cmd(
    eps: float = typer.Option(..., "--epsilon", "-e",
                              help="Target epsilon: POPri uses 1 and 7, PrE-Text 1.29 and 7.58."),
    sample_rate: float = typer.Option(..., "--sample-rate", "-q", help=H_Q),
    steps: int = typer.Option(..., "--steps", "-T", help=H_T),
    delta: float = typer.Option(3e-6, "--delta", help=H_DELTA),
    accountant: str = typer.Option("rdp", "--accountant", "-a", help=H_ACC),
    tol: float = typer.Option(1e-4, "--tol", help="Bisection tolerance on z (default 1e-4)."),
    as_json: bool = typer.Option(False, "--json", help=H_JSON),
) -> None:
    """Calibrate the noise multiplier to a privacy budget."""
    from popri.core import log
    from popri.privacy import accounting as A

    from popri.core.validate import finite

    finite(tol, "--tol", lo=1e-12, hi=1)  # z is found to within tol; 1e-300 never finished
    try:
        z = A.noise_multiplier(eps, sample_rate, steps, delta, accountant, tol)
        r = A.epsilon_details(z, sample_rate, steps, delta, accountant)
    except A.ParameterError as e:
        raise _bad(e) from None
    for w in r.warnings:
        log.warn(w)
    obj = {"noise_multiplier": z, "epsilon_achieved": r.epsilon, "epsilon": eps,
           "sample_rate": sample_rate, "steps": steps, "delta": delta, "accountant": accountant,
           "tol": tol, "neighbouring": A.NEIGHBOURING}
    if accountant == "pld":
        obj["value_discretization_interval"] = A.PLD_INTERVAL
    _emit(obj, as_json, f"noise_multiplier = {_up(z)} ({accountant}, q={_g(sample_rate)}, "
                        f"T={steps}, delta={_g(delta)}, epsilon={_up(r.epsilon)} <= {_g(eps)})")


@app.command("ledger", help=(
    "Compose every release recorded in the ledgers (any mix of z, q and steps) into one "
    "epsilon.\n\nPrints a table (stage, mechanism, z, q, steps, sampling, entries, epsilon of that "
    "line alone; identical releases of one stage share a line) and the total; --json gives "
    "{\"epsilon\", \"delta\", \"accountant\", \"entries\", \"groups\": [...], \"note\"}. RDP adds "
    "the per-order RDP of all releases (like opacus' RDPAccountant history); PLD composes their "
    "privacy loss distributions. Mechanism 'gaussian' or sampling 'none' counts as q = 1. All "
    "entries must protect one neighbouring relation (e.g. 'popri fred stats' at sample level "
    "records 'replace one sample'); the total holds for that relation, named in the JSON and on "
    "the total line when it is not the default.\n\n"
    + FIXED + "\n\n" + NEIGHBOURS))
def ledger_cmd(
    paths: List[str] = typer.Argument(
        ..., help="ledger.jsonl files, directories (every ledger.jsonl below them) or score "
                  "sidecars (.json with a 'ledger' key). A release_id seen twice counts once."),
    delta: Optional[float] = typer.Option(
        None, "--delta", help="Target delta. Default: the entries' delta when they all agree "
                              "(POPri and PrE-Text use 3e-6); otherwise required."),
    accountant: str = typer.Option("rdp", "--accountant", "-a", help=H_ACC),
    as_json: bool = typer.Option(False, "--json", help=H_JSON),
    max_epsilon: Optional[float] = typer.Option(
        None, "--max-epsilon",
        help="Budget guard: exit with status 4 (after printing the total) when the total epsilon "
             "exceeds E. For scripts and CI: 'popri account ledger runs/x --max-epsilon 1'."),
) -> None:
    """Total privacy cost of a set of ledgers."""
    from popri.core import log
    from popri.core.errors import InputError
    from popri.privacy.ledger import collect
    from popri.privacy import accounting as A

    if max_epsilon is not None and not (0 < max_epsilon < math.inf):
        raise InputError(f"must be a finite number > 0 (got {max_epsilon})", field="--max-epsilon")
    entries = collect(paths)
    try:
        if delta is None:
            delta = A.common_delta(entries)
        c = A.compose(entries, delta, accountant)
    except A.ParameterError as e:
        raise _bad(e) from None
    for w in c.warnings:
        log.warn(w)
    research = sum(e.mode == "research" for e in entries)
    if research:
        log.warn(f"{research} of {len(entries)} entries are RESEARCH mode: their noise was drawn "
                 "from a recorded seed, so anyone holding the sidecars can regenerate it and the "
                 "epsilon below protects nobody from them. Rerun with --release for outputs you "
                 "publish.")
    over = max_epsilon is not None and not (c.epsilon <= max_epsilon * (1 + 1e-9))
    if as_json:
        obj = c.to_dict()
        obj["modes"] = {"research": research, "release": len(entries) - research}
        if max_epsilon is not None:
            obj["max_epsilon"] = max_epsilon
            obj["within_budget"] = not over
        _emit(obj, True, "")
        if over:
            raise typer.Exit(4)
        return
    for n in c.notes:
        log.info(f"note: {n}")
    head = ("stage", "mechanism", "z", "q", "steps", "sampling", "entries", "epsilon alone")
    rows = [(g["stage"], g["mechanism"], _g(g["noise_multiplier"]), _g(g["sample_rate"]),
             str(g["steps"]), g["sampling"], str(g["entries"]),
             _up(g["epsilon_alone"]) if g["epsilon_alone"] is not None else "inf")
            for g in c.groups]
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        typer.echo("  ".join(x.ljust(w) for x, w in zip(r, width)).rstrip())
    rel = "" if c.neighbouring == A.NEIGHBOURING else f"; neighbours: {c.neighbouring}"
    typer.echo(f"total: epsilon = {_up(c.epsilon)} ({accountant}, delta={_g(delta)}, "
               f"{c.entries} entries, {len(c.groups)} lines{rel})")
    if over:
        log.warn(f"budget exceeded: total epsilon {_up(c.epsilon)} > --max-epsilon "
                 f"{_g(max_epsilon)}")
        raise typer.Exit(4)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="account")
