"""popri prefs build: scored samples -> DPO preference pairs (maths: popri/methods/popri/prefs.py).

    popri prefs build --samples runs/r0/samples.jsonl --scores runs/r0/scores.npy --out runs/r0/pairs.jsonl
    popri prefs build --samples s.jsonl --scores s.npy --true-scores exact.npy --report-out rep.json
"""

from __future__ import annotations

from typing import Optional

import typer

HELP = """Build DPO preference pairs from scored samples (POPri Algorithm 1, lines 21-26).

Per prompt (prompt_id) the J samples are ranked by score: chosen = rank 1, rejected = rank L
(--rejected-rank, 1-based; default 5 as POPri 4.2 / E.5 with J = 10; the reference code's
zero-based reject_rank 4). Ties are broken by sample_idx. Prompts with fewer than L samples are
skipped (counted, warned).

Inputs: --samples, the JSONL of 'popri gen' ({"id", "round", "prompt_id", "sample_idx", "prompt",
"text", "model"}); --scores, SCORES.npy + SCORES.json from 'popri score' / 'popri aggregate'
(matched by the sidecar's "ids", else row-aligned), or JSONL {"id", "score"}.

Output: JSONL {"prompt", "chosen", "rejected", "prompt_id", "chosen_score", "rejected_score",
"chosen_id", "rejected_id"}, one line per prompt, on stdout or --out (atomic).

--true-scores: exact, noise-free scores of the same samples (e.g. 'popri score
--noise-multiplier 0 --no-standardize'): the recovery rate (POPri Figure 6, right: share of
pairs with true(chosen) > true(rejected)) is printed on stderr and written to --report-out. It
is a diagnostic: exact scores are not private and must not be released."""


def build(
    samples: str = typer.Option(..., "--samples", "-s", help="Samples JSONL ('popri gen'), or '-'."),
    scores: str = typer.Option(..., "--scores", help="SCORES.npy (+ SCORES.json sidecar with 'ids') "
                               "or JSONL {\"id\", \"score\"}."),
    rejected_rank: int = typer.Option(5, "--rejected-rank", "-l", help="1-based rank of the rejected "
                                      "sample (POPri B.1 / E.5: 5th of 10)."),
    true_scores: Optional[str] = typer.Option(None, "--true-scores", help="Exact scores of the same "
                                              "samples: report the recovery rate (POPri Fig. 6)."),
    out: str = typer.Option("-", "--out", "-o", help="Pairs JSONL, or '-' for stdout."),
    report_out: Optional[str] = typer.Option(None, "--report-out", help="JSON report: counts, "
                                             "skipped prompts, mean score gap, recovery rate."),
) -> None:
    from popri.core import io, log
    from popri.core.errors import InputError
    from popri.methods.popri.prefs import build_pairs, load_score_vector, read_samples

    from popri.core.guard import check_outputs

    check_outputs([out, report_out], [samples, scores, true_scores])
    recs = read_samples(samples)
    arr, ids = load_score_vector(scores)
    t_arr = t_ids = None
    if true_scores:
        t_arr, t_ids = load_score_vector(true_scores)
    pairs, report = build_pairs(recs, arr, ids, rejected_rank=rejected_rank, true_scores=t_arr,
                                true_ids=t_ids, scores_path=scores,
                                true_scores_path=true_scores or "true-scores")
    if not pairs:
        raise InputError(f"no prompt has {rejected_rank} samples: nothing to pair "
                         f"(lower --rejected-rank or generate more samples per prompt)", path=samples)
    report.update({"samples_path": samples, "scores_path": scores, "true_scores_path": true_scores})
    if report_out:  # staged first: a failing report leaves no pairs file either
        with io.AtomicOutputs() as staged:
            with open(staged.path(report_out), "w", encoding="utf-8") as fh:
                import json

                fh.write(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
            if out != "-":
                with open(staged.path(out), "w", encoding="utf-8") as fh:
                    for p in pairs:
                        fh.write(io.dumps(p) + "\n")
        if out == "-":
            io.write_jsonl(pairs, "-")
    else:
        io.write_jsonl(pairs, out)
    if report["skipped_prompts"]:
        log.warn(f"prefs: skipped {report['skipped_prompts']} prompt(s) with fewer than "
                 f"{rejected_rank} samples")
    msg = (f"prefs: {report['pairs']} pairs from {report['samples']} samples "
           f"(chosen = rank 1, rejected = rank {rejected_rank})")
    if "mean_score_gap" in report:
        msg += f", mean score gap {report['mean_score_gap']:.4g}"
    log.info(msg)
    if report.get("recovery_rate") is not None:
        log.info(f"prefs: recovery rate {report['recovery_rate']:.3f} "
                 f"({report['recovered']}/{report['pairs']} pairs in true order)")


def _unwrap(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Preference data for DPO (POPri).", no_args_is_help=True)
    group.command("build", help=_unwrap(HELP))(build)
    app.add_typer(group, name="prefs")
