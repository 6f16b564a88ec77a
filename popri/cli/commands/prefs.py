"""popri prefs build: scored samples -> DPO preference pairs (maths: popri/methods/popri/prefs.py).

    popri prefs build --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/pairs.jsonl
    popri prefs build --samples s.jsonl --scores s.npy --true-scores exact.npy --report-out rep.json
    popri prefs gate --samples s.jsonl --fluency fluency.jsonl --drop 0.25 --out kept.jsonl
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core import io, log
from popri.core.errors import InputError
from popri.core.guard import check_one_stdin, check_outputs
from popri.methods.popri.pool import pool_file
from popri.methods.popri.prefs import build_pairs_file, load_fluency, read_samples
from popri.methods.popri.prefs import gate as gate_samples
from popri.specs.training import GateSpec, PoolSpec, PrefsSpec
from popri.cli.options import command
from popri.specs.commands.prefs import PrefsBuildCall, PrefsGateCall, PrefsPoolCall

HELP = """Build DPO preference pairs from scored samples (POPri Algorithm 1, lines 21-26).

Per prompt (prompt_id) the J samples are ranked by score: chosen = rank 1, rejected = rank L
(--rejected-rank, 1-based; POPri 4.2 / E.5 pair the 1st and 5th of J = 10). Ties are broken
by sample_idx. Prompts with fewer than L samples are skipped (counted, warned).

Inputs: --samples, the JSONL of 'popri gen' ({"id", "round", "prompt_id", "sample_idx", "prompt",
"text", "model"}); --scores, SCORES.npy + SCORES.json from 'popri score' / 'popri aggregate'
(matched by the sidecar's "ids", else row-aligned), or JSONL {"id", "score"}.

Output: JSONL {"prompt", "chosen", "rejected", "prompt_id", "chosen_score", "rejected_score",
"chosen_id", "rejected_id"}, one line per prompt, on stdout or --out (atomic).

--true-scores: exact, noise-free scores of the same samples (e.g. 'popri score
--noise-multiplier 0 --no-standardize'): the recovery rate (POPri Figure 6, right: share of
pairs with true(chosen) > true(rejected)) is printed on stderr and written to --report-out. It
is a diagnostic: exact scores are not private and must not be released.

--pair-rule fluent (a popri remedy beyond POPri, issue 44) needs --fluency, the per-text JSONL
of 'popri eval fluency SAMPLES --out FILE': the chosen sample is then the best-scored one
ranked above the rejected one whose public-model NLL is no higher than the rejected one's
(a prompt with none is skipped). --pair-rule divpo (issue 67, after DivPO) needs --embeddings,
the samples' 'popri embed' set: the most diverse sample ranked above the rejected rank is
chosen, the least diverse of the rest rejected. Post-processing: no privacy cost."""


@command(PrefsBuildCall)
def build(
    samples: str, scores: str, true_scores: Optional[str], out: str, report_out: Optional[str],
    fluency: Optional[str], embeddings: Optional[str], *, spec: PrefsSpec
) -> None:
    if fluency and spec.pair_rule != "fluent":
        raise InputError("--fluency is read only by --pair-rule fluent", field="--fluency")
    if embeddings and spec.pair_rule != "divpo":
        raise InputError("--embeddings is read only by --pair-rule divpo", field="--embeddings")
    check_one_stdin(samples=samples, scores=scores, true_scores=true_scores, fluency=fluency)
    check_outputs([out, report_out], [samples, scores, true_scores, fluency, embeddings])
    report = build_pairs_file(samples, scores, spec, out=out, report_out=report_out,
                              true_scores=true_scores, fluency=fluency, embeddings=embeddings)
    if report["skipped_prompts"]:
        log.warn(f"prefs: skipped {report['skipped_prompts']} prompt(s) with fewer than "
                 f"{spec.rejected_rank} samples" + (
                     " or no chosen sample as fluent as the rejected one"
                     if spec.pair_rule == "fluent" else ""))
    chosen = {"fluent": "the best-ranked no less fluent than the rejected one",
              "divpo": f"the most diverse above rank {spec.rejected_rank}"}.get(
        spec.pair_rule or "score", "rank 1")
    rejected = (f"the least diverse from rank {spec.rejected_rank} down"
                if spec.pair_rule == "divpo" else f"rank {spec.rejected_rank}")
    msg = (f"prefs: {report['pairs']} pairs from {report['samples']} samples "
           f"(chosen = {chosen}, rejected = {rejected})")
    if "mean_score_gap" in report:
        msg += f", mean score gap {report['mean_score_gap']:.4g}"
    log.info(msg)
    if report.get("recovery_rate") is not None:
        log.info(f"prefs: recovery rate {report['recovery_rate']:.3f} "
                 f"({report['recovered']}/{report['pairs']} pairs in true order)")


POOL_HELP = """An evolving few-shot pool (a popri extension beyond POPri, issue 24; maths:
popri/methods/popri/pool.py): round t's chosen samples -- the top-scored of J per prompt under
the released DP scores (--scores), skipping samples 'popri gen' kept as degenerate -- join the
population (--base: Omega at round 1, else round t-1's pool) that round t+1's 'popri gen' draws
its few-shot examples from. --pool union keeps the base; --pool chosen keeps only earlier chosen
samples (Private Evolution's moving population, PrE-Text section 3). Post-processing of the
release: no privacy cost.

Output: JSONL {"id", "text", "source" ("roundT" for a chosen sample), "prompt_id"} on stdout or
--out (atomic); counts on stderr."""


@command(PrefsPoolCall)
def pool(
    samples: str, scores: str, base: str, round_: int, split: str, out: str, min_size: int, *,
    spec: PoolSpec
) -> None:
    if spec.pool == "static":
        raise InputError("static is no evolving pool (gen reads Omega itself): give union or "
                         "chosen", field="--pool")
    check_one_stdin(samples=samples, scores=scores, base=base)
    check_outputs([out], [samples, scores, base])
    r = pool_file(samples, scores, base, mode=spec.pool, round_no=round_, out=out, split=split,
                  min_size=min_size)
    log.info(f"prefs pool: {r['pool']} texts ({r['mode']}: {r['base']} before, {r['chosen']} "
             f"chosen in round {r['round']})")


GATE_HELP = """A fluency gate on a round's candidates before the clients score them (a popri
remedy beyond POPri, issue 44; maths: popri/methods/popri/prefs.py gate): the --drop share of
the samples with the highest public-model NLL ('popri eval fluency SAMPLES --out FILE') is left
out, the rest written in their order. The public model's likelihood of a synthetic sample is
public: no privacy cost. A prompt left with fewer samples than the rejected rank gets no pair.

Output: the kept samples (JSONL, as 'popri gen' wrote them) on stdout or --out (atomic); counts
on stderr."""


@command(PrefsGateCall)
def gate(samples: str, fluency: str, out: str, *, spec: GateSpec) -> None:
    check_one_stdin(samples=samples, fluency=fluency)
    check_outputs([out], [samples, fluency])
    recs = read_samples(samples)
    kept, r = gate_samples(recs, load_fluency(fluency), spec.drop,
                           min_per_prompt=spec.min_per_prompt, fluency_path=fluency)
    io.write_jsonl([{k: v for k, v in x.items() if not k.startswith("_")} for x in kept], out)
    mx = r["max_kept_nll"]
    log.info(f"prefs gate: kept {r['kept']} of {r['samples']} samples (left out the "
             f"{r['dropped']} least fluent" + (f"; NLL <= {mx:.3f} kept)" if mx is not None
                                              else ")"))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Preference data for DPO (POPri).", no_args_is_help=True)
    group.command("build", help=unwrap(HELP))(build)
    group.command("pool", help=unwrap(POOL_HELP))(pool)
    group.command("gate", help=unwrap(GATE_HELP))(gate)
    app.add_typer(group, name="prefs")
