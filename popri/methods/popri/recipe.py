"""POPri as stages of ``popri run`` (POPri = "Private Federated Learning using
Preference-Optimized Synthetic Data", arXiv:2504.16438, Algorithm 1), and its PE+SFT baseline.

    popri run examples/default.yaml --dry-run            # lists exactly these stages

For t = 1..T: ``gen`` (K prompts x J samples from Omega, with round t-1's adapter) -> ``score``
(the clients' DP cosine feedback, section 4.1) -> ``prefs build`` (best vs l-th best per prompt,
section 4.2) -> ``dpo`` (LoRA, continuing round t-1's adapter; checkpoint chosen per
``dpo.select_on``, B.1).  Then the final adapter writes N samples (``gen``) into
``RUN/synthetic.jsonl``.  PE+SFT (section 5, baseline (2)) replaces prefs + dpo by ``sft`` on
each prompt's top-scored sample.  With ``dpo.select_on: dp`` the validation split's statistics
are first released once under DP (``fred stats``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from popri.pipeline import config as C
from popri.pipeline.driver import final_seed, opt, round_seed, selection_note, step_argv
from popri.pipeline.stages import DPRelease, Stage
from popri.specs.training import DPOSpec, PrefsSpec, SelectSpec, SFTSpec


def select_stats_stage(run) -> Stage:
    """dpo.select_on: dp -- the validation split's embedding mean and covariance, released
    once under DP ('popri fred stats', user level, add/remove one client: the relation of the
    score releases, so one accountant totals them)."""
    c, dp = run.cfg, run.cfg.dpo
    out = run.p["select_stats"]
    return Stage("select-stats", [
        "fred", "stats", "--private", str(run.p["emb_val"]), "--out", str(out),
        "--epsilon", repr(dp.select_epsilon), "--delta", repr(C.select_delta(c)),
        "--level", "user", "--relation", "add-remove", "--calibration", "analytic",
        "--seed", str(c.seed), *(["--release"] if run.release else [])],
        outputs=[str(out)], inputs=[str(run.p["emb_val"])],
        release=DPRelease(run.select_entries(), out.parent / "ledger.jsonl",
                          lambda e: e.stage == "fred"))


def select_args(run) -> tuple[list[str], list[str]]:
    """dpo's checkpoint-selection options and inputs for dpo.select_on."""
    target = {"private": run.p["emb_val"], "public": run.p["emb_public"],
              "dp": run.p["select_stats"]}.get(run.select)
    if target is None:
        return [], []
    return ["--select-on", str(target)], [str(target)]


def gen_stage(run, t: int, adapter: str | None) -> Stage:
    c, R = run.cfg, run.run / f"round{t}"
    samples = R / "samples.jsonl"
    return Stage(f"round{t}-gen", [
        "gen", *run.omega, "--prompts", str(c.prompts), "--samples-per-prompt",
        str(c.samples_per_prompt), "--round", str(t), "--out", str(samples),
        "--prompts-out", str(R / "prompts.jsonl"), "--stats-out", str(R / "gen_stats.json"),
        *run.gen_args(adapter=adapter, seed=round_seed(c.seed, t))],
        outputs=[str(samples), str(R / "prompts.jsonl")],
        inputs=[*run.omega_inputs, *([adapter] if adapter else [])])


def dpo_stages(run, t: int, adapter: str | None) -> Iterator[Stage]:
    c, dp = run.cfg, run.cfg.dpo
    R, seed = run.run / f"round{t}", round_seed(c.seed, t)
    samples, scores = R / "samples.jsonl", R / "scores.npy"
    prefs_extra, prefs_inputs = [], [str(samples), str(scores)]
    exact = run.exact_stage(t, samples, seed)
    if exact is not None:
        yield exact
        prefs_extra = ["--true-scores", exact.outputs[0]]
        prefs_inputs.append(exact.outputs[0])
    yield Stage(f"round{t}-prefs", [
        "prefs", "build", "--samples", str(samples), "--scores", str(scores),
        *step_argv(PrefsSpec, dp), "--out", str(R / "prefs.jsonl"),
        "--report-out", str(R / "prefs_report.json"), *prefs_extra],
        outputs=[str(R / "prefs.jsonl")], inputs=prefs_inputs)
    dpo_dir = R / "dpo"
    args = ["dpo", "--pairs", str(R / "prefs.jsonl"), "--model", c.generator.model,
            "--out", str(dpo_dir), *step_argv(DPOSpec, dp, bf16=c.generator.bf16),
            "--seed", str(seed), *opt("--adapter", adapter)]
    inputs = [str(R / "prefs.jsonl"), *([adapter] if adapter else [])]
    sel, sel_inputs = select_args(run)
    if sel:
        args += [*sel, "--select-prompts", str(R / "prompts.jsonl"),
                 *step_argv(SelectSpec, dp), "--embed-model", c.embedder]
        inputs += [*sel_inputs, str(R / "prompts.jsonl")]
    yield Stage(f"round{t}-dpo", args, outputs=[str(dpo_dir / "adapter")], inputs=inputs)


def sft_stage(run, t: int, adapter: str | None) -> Stage:
    """PE+SFT (POPri section 5, baseline (2)): supervised tuning on each prompt's top-scored
    sample, with the same LoRA, epochs, batch and learning rate as the DPO stage."""
    c, dp = run.cfg, run.cfg.dpo
    R = run.run / f"round{t}"
    samples, scores, out = R / "samples.jsonl", R / "scores.npy", R / "sft"
    return Stage(f"round{t}-sft", [
        "sft", "--samples", str(samples), "--scores", str(scores), "--model", c.generator.model,
        "--out", str(out), *step_argv(SFTSpec, dp, bf16=c.generator.bf16),
        "--seed", str(round_seed(c.seed, t)), *opt("--adapter", adapter)],
        outputs=[str(out / "adapter")],
        inputs=[str(samples), str(scores), *([adapter] if adapter else [])])


def synthetic_stage(run, adapter: str | None) -> Stage:
    """The final adapter writes N samples from Omega prompts."""
    c = run.cfg
    return Stage("synthetic", [
        "gen", *run.omega, "--num-samples", str(c.num_synthetic), "--samples-per-prompt",
        str(c.samples_per_prompt), "--round", str(c.rounds + 1), "--out",
        str(run.p["synthetic"]), "--stats-out", str(run.run / "synthetic_stats.json"),
        *run.gen_args(adapter=adapter, seed=final_seed(c.seed))],
        outputs=[str(run.p["synthetic"])],
        inputs=[*run.omega_inputs, *([adapter] if adapter else [])])


def _rounds(run, tune) -> Iterator[Stage]:
    c = run.cfg
    adapter = None
    for t in range(1, c.rounds + 1):
        R = run.run / f"round{t}"
        yield gen_stage(run, t, adapter)
        yield run.score_stage(t, R / "samples.jsonl", R / "scores.npy", round_seed(c.seed, t))
        last = None
        for st in tune(run, t, adapter):
            yield st
            last = st
        adapter = last.outputs[0]
    yield synthetic_stage(run, adapter)


def recipe(run) -> Iterator[Stage]:
    """POPri, Algorithm 1."""
    if run.select == "dp":
        yield select_stats_stage(run)
    yield from _rounds(run, dpo_stages)


def recipe_sft(run) -> Iterator[Stage]:
    """PE+SFT: the same rounds with SFT on the top-scored samples instead of prefs + DPO."""
    yield from _rounds(run, lambda run, t, adapter: iter([sft_stage(run, t, adapter)]))


def _recovery(run) -> dict:
    from popri.core.io import read_json

    c, out, recov = run.cfg, {}, []
    for t in range(1, c.rounds + 1):
        rep = run.run / f"round{t}" / "prefs_report.json"
        if rep.exists():
            recov.append(read_json(rep).get("recovery_rate"))
    out["recovery_rate_per_round"] = recov
    if c.score.recovery_rate and run.release:
        out["recovery_rate_note"] = ("not computed in release mode (the noise-free "
                                     "diagnostic scores are not private)")
    return out


def results(run, noise: dict) -> dict:
    c = run.cfg
    return {"checkpoint_selection": {
        "on": run.select, "note": selection_note(run.select, c),
        **({"epsilon": c.dpo.select_epsilon, "delta": C.select_delta(c)}
           if run.select == "dp" else {})}, **_recovery(run)}


def results_sft(run, noise: dict) -> dict:
    return _recovery(run)


def plan_notes(run) -> list[str]:
    return [selection_note(run.select, run.cfg)]


__all__ = ["recipe", "recipe_sft", "results", "results_sft", "plan_notes", "Path"]
