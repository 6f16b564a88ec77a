"""popri audit: empirical privacy audits.

    popri audit release --mechanism cosine -z 1 --trials 10000
    popri audit release --mechanism fred --epsilon 0.9 --delta 1e-5 --trials 10000 --json
    popri audit release --mechanism nn-histogram -z 1 --trials 10000 --break half-noise  # exit 1
    popri audit extract --model runs/x/downstream/popri --data runs/x/data/private --split train
    popri audit extract --model smollm2-135m --data data/instruct-debian -n 100 --out ex.jsonl --json
    popri audit canaries examples/dpfl.yaml --run-dir runs/canary-dpfl --canaries 200

Settings: :class:`popri.specs.privacy.AuditSpec`; the audit: :func:`popri.apps.audit.run`.
canaries: :class:`popri.specs.privacy.CanarySpec`; the run and the bound:
:func:`popri.pipeline.canaries.audit` (maths: popri/privacy/onerun.py).
extract: :class:`popri.specs.privacy.ExtractSpec`; the attack: :func:`popri.eval.extract.run`.
"""

from __future__ import annotations

import math
from typing import Optional

import typer

from popri.apps import audit as A
from popri.cli.options import param_error, unwrap
from popri.core import log
from popri.core.guard import check_outputs
from popri.core.io import dumps, write_jsonl
from popri.eval.extract import run as do_extract
from popri.pipeline import canaries as canary_audit
from popri.privacy.accounting import ParameterError
from popri.specs.privacy import AuditSpec, ExtractSpec
from popri.cli.options import command
from popri.specs.commands.audit import AuditCanariesCall, AuditExtractCall, AuditReleaseCall
from popri.specs.privacy import CanarySpec

app = typer.Typer(
    help="Empirical privacy audits: replay a DP mechanism on neighbouring datasets and bound its "
         "epsilon from below (Jagielski et al. 2020; Nasr et al. 2021, 2023).",
    no_args_is_help=True)

HELP = """Audit one release: an empirical lower bound on its epsilon, next to the claimed one.

Replays the library's own mechanism (cosine: scoring.cosine_round + finish; nn-histogram:
scoring.histogram_round + finish; fred: fred.release, release 1; ddg: a cosine round through the
Flower nodes' encoding, node.upload + ddg.decode, on --nodes SuperNodes; tree: a DP-FTRL tree of
--leaves rounds, every prefix sum; subsampled: a cosine round on a Poisson sample at
--sample-rate; fixed: a cosine round on --clients-per-round L of --clients N, the displacement
pair of issue 36: N clients at +C and, in D', one more at -C that displaces a sampled one)
--trials times on a small
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
noise multiplier halved while z is still claimed); two-leaves (tree: the canary in two leaves of
one tree, what epoch-wise participation forbids) and public-sample (subsampled: the canary always
in the sample while the claim keeps q) break the participation instead; the library is
untouched.  ddg, tree, subsampled and fixed are held to the epsilon of the ledger entry they
would record (distributed_discrete_gaussian, tree_aggregation, subsampled_gaussian; fixed: the
entry of ONE round, under replace one client, or with --convention papers the add/remove entry
popri <= 0.3 recorded, labelled NOT A DP GUARANTEE); the GDP bound
judges only the claims that are a Gaussian's (not the DDG's concentrated-DP bound, not a
subsampled Gaussian).  When a lower bound
exceeds the claim a line 'VIOLATION: empirical lower bound X > claimed eps Y' is printed and the
exit status is 1.  Writes nothing (no release happens, no ledger)."""

OPTION = {"noise_multiplier": "--noise-multiplier", "epsilon": "--epsilon", "delta": "--delta",
          "clients_per_round": "--clients-per-round", "convention": "--convention",
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
           f"{r['mu_lower_bound']:.4f} (claim {r['claimed_mu']:.4f})",
           _fmt(r["gdp_epsilon"]), str(r["trials"]), f"{r['fpr']:.4f}", f"{r['fnr']:.4f}",
           r["verdict"].upper() if r["verdict"] != "ok" else "ok")
    width = [max(len(a), len(b)) for a, b in zip(head, row)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, width)).rstrip() for line in (head, row)]


@app.command("release", help=unwrap(HELP))
@command(AuditReleaseCall)
def release_cmd(
    mechanism: str, trials: int, max_samples_per_client: Optional[int], seed: int, as_json: bool, *,
    spec: AuditSpec
) -> None:
    """Empirical epsilon lower bound of one release vs the claimed epsilon."""
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


EXTRACT_HELP = """Training-data extraction audit of a checkpoint: discoverable memorisation
(Nasr et al. 2023, arXiv:2311.17035; the attack of FewFedPIT, arXiv:2403.06131, section 4.3).

Takes --num-examples training examples of --data (its --split), each from a different client
(chosen by --seed, the same for every checkpoint), prompts --model with each example's prefix
and compares the greedy continuation with the true one by Rouge-L (rouge-score). Instruction
records (instruction/output fields, 'popri instruct build'): the prefix is the example's prompt
and the continuation its response (up to --suffix-tokens). Text records: the first
--prefix-tokens tokens, then the next --suffix-tokens.

--model: any checkpoint popri writes or reads (a train-downstream directory, a LoRA adapter
directory, a DP-FL round's model/, an alias such as smollm2-135m for the pre-trained floor).

Prints a summary (examples, mean Rouge-L with its SE over clients, the share at or above
--threshold, exact-match share) to stderr, or with --json one object on stdout; --out writes
one JSONL row per example (prefix, truth, generated, rouge_l, exact_prefix_tokens), atomically
('-': stdout). A measure of leakage, not a DP guarantee: run it on the eps = inf model and the
pre-trained model too, on the same examples, to read a method's figure."""


@app.command("extract", help=unwrap(EXTRACT_HELP))
@command(AuditExtractCall)
def extract_cmd(
    model: str, data: str, split: str, seed: int, out: Optional[str], as_json: bool, *,
    spec: ExtractSpec
) -> None:
    from pathlib import Path

    if out == "-" and as_json:
        raise typer.BadParameter("--out - and --json both want stdout; give --out a file",
                                 param_hint="--out")
    check_outputs([out], [data, model if Path(model).exists() else None])
    summary, rows = do_extract(model, data, split, spec, seed=seed)
    if out:
        write_jsonl(rows, out)
    if as_json:
        typer.echo(dumps(summary))
    else:
        se = summary["rouge_l_se"]
        log.info(f"audit extract: {summary['examples']} examples, Rouge-L {summary['rouge_l']:.4f}"
                 + (f" +- {se:.4f} (SE over clients)" if se is not None else "")
                 + f", extracted (Rouge-L >= {summary['threshold']}) {summary['extracted']:.3f}, "
                 f"exact {summary['exact_match']:.3f}")


CANARIES_HELP = """An end-to-end privacy audit of one run: canary clients, the run, a lower bound
on its epsilon from what it releases (Steinke, Nasr, Jagielski, "Privacy auditing with one (1)
training run", NeurIPS 2023, arXiv:2305.08846).

Copies the private data CONFIG names (data.dir, or data.source fetched as the run would) to
RUN/data with --canaries m canary clients added to its train split, each holding --copies
copies of its own secret text (--style random: a phrase of --words words from the public
data's vocabulary; echo: a public text's opening with a random suffix), each included with
probability 1/2 by a draw seeded by --seed and recorded in RUN/canaries.jsonl (id, text,
included). Then runs 'popri run CONFIG --set data.dir=RUN/data --set run_dir=RUN/run' (every
--set passed on; cached and resumable as any run) and scores every canary from what the run
releases only: the synthetic set (embed: best cosine similarity under the run's embedder;
lcs: longest common word run), the tuned generator (generator: log-likelihood ratio against
the untuned model), DP-FL's global model (model: the same against its initial weights).
For each score and guess count k (the top k guessed in, the bottom k out) the one-run bound
at the run's delta, Bonferroni-corrected over all of them: the bound printed holds with
probability 1 - --significance over the canaries' draw.

Prints the method, the ledger's epsilon and its relation, the bound, the score and k that gave
it and the guesses right (--json: RUN/audit.json on stdout); RUN/membership_scores.jsonl holds
every canary's scores. Exit 1 when the bound exceeds the ledger's epsilon (the claim is
refuted). A lower bound, never a proof of privacy: a weak attack on a leaky run finds little.
--break no-noise runs the config at z = 1e-6 (no noise in effect, no budget) and holds it to
its privacy.epsilon (the audit's teeth; not a private run)."""


@app.command("canaries", help=unwrap(CANARIES_HELP))
@command(AuditCanariesCall)
def canaries_cmd(
    config: Optional[str], run_dir: str, set_: list, seed: int, as_json: bool, *,
    spec: CanarySpec
) -> None:
    r = canary_audit.audit(config, run_dir, list(set_ or ()), spec, seed=seed)
    if as_json:
        typer.echo(dumps(r))
    else:
        brk = f" [break {r['break']}]" if r["break"] else ""
        typer.echo(f"method {r['method']}{brk}: ledger epsilon {_fmt(r['eps_ledger'])} "
                   f"({r['neighbouring'] or 'no relation recorded'}), delta {r['delta']:g}")
        typer.echo(f"one-run lower bound {_fmt(r['eps_lower'])} at significance "
                   f"{r['significance']:g}: score {r['score']}, {r['correct']} of {r['r']} "
                   f"guesses right (top / bottom {r['k']} of {r['m']} canaries, "
                   f"{r['included']} included)")
    if r["refuted"]:
        log.warn(f"VIOLATION: one-run lower bound {_fmt(r['eps_lower'])} > claimed epsilon "
                 f"{_fmt(r['eps_claimed'])}")
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="audit")
