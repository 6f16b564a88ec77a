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

from popri.core.io import read_json
from popri.kit import (
    DPRelease,
    Stage,
    final_seed,
    mix_stage,
    pair_fields,
    round_seed,
    selection_note,
    settings,
    take_stage,
)
from popri.methods.base import Method
from popri.methods import steps
from popri.specs.commands.dpo import DpoCall
from popri.specs.commands.embed import EmbedCall
from popri.specs.commands.eval import EvalFluencyCall, EvalProbeCall
from popri.specs.commands.fred import FredStatsCall
from popri.specs.commands.gen import GenCall
from popri.specs.commands.prefs import PrefsBuildCall, PrefsGateCall, PrefsPoolCall
from popri.specs.commands.sft import SftCall
from popri.specs.generation import GenSpec
from popri.specs.training import DPOSpec, PrefsSpec, SelectSpec, SFTSpec

#: examples per prompt of every gen stage of a run (GenSpec's default: popri run does not set it)
SHOTS = GenSpec.__dataclass_fields__["shots"].default


def select_stats_stage(run) -> Stage:
    """dpo.select_on: dp -- the validation split's embedding mean (and covariance, for select_by
    fid), released once under DP ('popri fred stats', user level, add/remove one client: the relation of the
    score releases, so one accountant totals them)."""
    out = run.paths.select_stats
    call = FredStatsCall(private=str(run.paths.emb_val), out=str(out), seed=run.cfg.seed,
                         **steps.select_settings(run.cfg))
    return Stage("select-stats", call, outputs=[str(out)], inputs=[str(run.paths.emb_val)],
        release=DPRelease(run.selection_entries(call), out.parent / "ledger.jsonl",
                          lambda e: e.stage == "fred"))


def select_target(run) -> Path | None:
    """What dpo's checkpoint selection compares with, for dpo.select_on (None: no selection)."""
    return {"private": run.paths.emb_val, "public": run.paths.emb_public,
            "dp": run.paths.select_stats}.get(run.select)


def gen_stage(run, t: int, adapter: str | None, omega: tuple | None = None) -> Stage:
    """Round t's K x J samples; ``omega``: (path, inputs) of the population its few-shot
    examples come from (default Omega; an evolving pool: round t-1's pool file)."""
    c, R = run.cfg, run.paths.root / f"round{t}"
    samples = R / "samples.jsonl"
    o_path, o_inputs = omega or (run.omega, run.omega_inputs)
    return Stage(f"round{t}-gen", GenCall(
        omega=o_path, prompts=c.prompts, samples_per_prompt=c.samples_per_prompt, round_=t,
        out=str(samples), prompts_out=str(R / "prompts.jsonl"),
        stats_out=str(R / "gen_stats.json"),
        **steps.gen_settings(run, adapter=adapter, seed=round_seed(c.seed, t))),
        outputs=[str(samples), str(R / "prompts.jsonl")],
        inputs=[*o_inputs, *([adapter] if adapter else [])])


def fluency_stages(run, t: int) -> Iterator[Stage]:
    """Issue 44's remedies that read the public model's fluency of round t's samples (null
    settings: none, POPri): ``popri eval fluency`` (per-sample NLL, RUN/roundT/fluency.jsonl)
    when ``dpo.pair_rule: fluent`` or ``dpo.fluency_gate`` is set, then with the gate ``popri
    prefs gate`` (RUN/roundT/samples_gated.jsonl, what the clients score).  Public
    post-processing: no ledger entry."""
    c, dp = run.cfg, run.cfg.dpo
    if dp.pair_rule != "fluent" and not dp.fluency_gate:
        return
    R = run.paths.root / f"round{t}"
    flu = R / "fluency.jsonl"
    yield Stage(f"round{t}-fluency", EvalFluencyCall(
        samples=str(R / "samples.jsonl"), model=c.generator.model, bf16=c.generator.bf16,
        out=str(flu), json_out=True),
        outputs=[str(flu), str(R / "fluency.json")], inputs=[str(R / "samples.jsonl")],
        stdout_to=str(R / "fluency.json"))
    if dp.fluency_gate:
        out = R / "samples_gated.jsonl"
        yield Stage(f"round{t}-gate", PrefsGateCall(
            samples=str(R / "samples.jsonl"), fluency=str(flu), drop=dp.fluency_gate,
            min_per_prompt=dp.rejected_rank, out=str(out)),
            outputs=[str(out)], inputs=[str(R / "samples.jsonl"), str(flu)])


def scored_samples(run, t: int) -> Path:
    """The samples of round t the clients score: the gated ones with ``dpo.fluency_gate``."""
    R = run.paths.root / f"round{t}"
    return R / ("samples_gated.jsonl" if run.cfg.dpo.fluency_gate else "samples.jsonl")


def pool_stage(run, t: int, omega: tuple) -> Stage:
    """Round t's evolving few-shot pool (``pool: union | chosen``; :mod:`popri.methods.popri.pool`):
    the previous population plus round t's top-scored sample per prompt under the released
    scores (post-processing: no ledger entry)."""
    R = run.paths.root / f"round{t}"
    o_path, o_inputs = omega
    out = R / "pool.jsonl"
    return Stage(f"round{t}-pool", PrefsPoolCall(
        samples=str(scored_samples(run, t)), scores=str(R / "scores.npy"), base=o_path,
        round_=t, pool=run.cfg.pool, min_size=SHOTS, out=str(out)),
        outputs=[str(out)], inputs=[str(scored_samples(run, t)), str(R / "scores.npy"),
                                    *o_inputs])


def dpo_stages(run, t: int, adapter: str | None) -> Iterator[Stage]:
    c, dp = run.cfg, run.cfg.dpo
    R, seed = run.paths.root / f"round{t}", round_seed(c.seed, t)
    samples, scores = scored_samples(run, t), R / "scores.npy"
    prefs = {}
    prefs_inputs = [str(samples), str(scores)]
    if dp.pair_rule == "fluent":
        prefs["fluency"] = str(R / "fluency.jsonl")
        prefs_inputs.append(str(R / "fluency.jsonl"))
    if dp.pair_rule == "divpo":
        # the public samples' embeddings, for the diversity of the DivPO rule (issue 67)
        emb = R / "samples_emb.npy"
        yield Stage(f"round{t}-embed-samples", EmbedCall(
            input=str(samples), out=str(emb), model=c.embedder),
            outputs=[str(emb)], inputs=[str(samples)])
        prefs["embeddings"] = str(emb)
        prefs_inputs.append(str(emb))
    exact = steps.exact_stage(run, t, samples, seed)
    if exact is not None:
        yield exact
        prefs["true_scores"] = exact.outputs[0]
        prefs_inputs.append(exact.outputs[0])
    yield Stage(f"round{t}-prefs", PrefsBuildCall(
        samples=str(samples), scores=str(scores),
        # pair_rule 'score' is POPri's rule, as unset: the same command (and cache)
        **settings(PrefsSpec, dp, pair_rule=dp.pair_rule if dp.pair_rule in ("fluent", "divpo")
                   else None),
        out=str(R / "prefs.jsonl"), report_out=str(R / "prefs_report.json"), **prefs),
        outputs=[str(R / "prefs.jsonl")], inputs=prefs_inputs)
    dpo_dir = R / "dpo"
    inputs = [str(R / "prefs.jsonl"), *([adapter] if adapter else [])]
    target = select_target(run)
    sel = {}
    if target is not None:
        sel = {"select_on": str(target), "select_prompts": str(R / "prompts.jsonl"),
               **settings(SelectSpec, dp), "embed_model": c.embedder}
        inputs += [str(target), str(R / "prompts.jsonl")]
    # a rerun with other pairs or settings starts over in its directory (the checkpoints of
    # another attempt there are stale); a stopped attempt with the same key resumes
    yield Stage(f"round{t}-dpo", DpoCall(
        pairs=str(R / "prefs.jsonl"), model=c.generator.model, out=str(dpo_dir),
        **settings(DPOSpec, dp, bf16=c.generator.bf16), seed=seed, adapter=adapter, **sel),
        outputs=[str(dpo_dir / "adapter")], inputs=inputs, fresh={"resume": False})


def sft_stage(run, t: int, adapter: str | None) -> Stage:
    """PE+SFT (POPri section 5, baseline (2)): supervised tuning on each prompt's top-scored
    sample, with the same LoRA, epochs, batch and learning rate as the DPO stage."""
    c, dp = run.cfg, run.cfg.dpo
    R = run.paths.root / f"round{t}"
    samples, scores, out = scored_samples(run, t), R / "scores.npy", R / "sft"
    return Stage(f"round{t}-sft", SftCall(
        samples=str(samples), scores=str(scores), model=c.generator.model, out=str(out),
        **settings(SFTSpec, dp, bf16=c.generator.bf16), seed=round_seed(c.seed, t),
        adapter=adapter),
        outputs=[str(out / "adapter")],
        inputs=[str(samples), str(scores), *([adapter] if adapter else [])],
        fresh={"resume": False})


def synthetic_stage(run, adapter: str | None, *, name: str = "synthetic",
                    out: Path | None = None, omega: tuple | None = None) -> Stage:
    """The final adapter writes N samples from Omega prompts (``adapter`` None with ``name``
    synthetic-t0: the control, the untuned generator on the same prompts and seeds; ``omega``:
    an evolving pool's last population instead of Omega)."""
    c = run.cfg
    n = c.num_synthetic
    if out is None and c.final_match_tokens:  # a pool, cut to the control's tokens (driver)
        out, n = run.paths.synthetic_pool, MATCH_POOL * c.num_synthetic
    if out is None and c.final_untuned_share:  # mixed with the control's set by prompt
        out = run.paths.synthetic_tuned
    out = out or run.paths.synthetic
    o_path, o_inputs = omega or (run.omega, run.omega_inputs)
    return Stage(name, GenCall(
        omega=o_path, num_samples=n,
        samples_per_prompt=c.final_samples_per_prompt or c.samples_per_prompt,
        round_=c.rounds + 1, out=str(out),
        stats_out=str(Path(out).with_name(Path(out).stem + "_stats.json")
                      if name != "synthetic" or c.final_match_tokens
                      else run.paths.root / "synthetic_stats.json"),
        **steps.gen_settings(run, adapter=adapter, seed=final_seed(c.seed), top_p=c.final_top_p)),
        outputs=[str(out)], inputs=[*o_inputs, *([adapter] if adapter else [])])


#: ``final_match_tokens``: the tuned generator's pool is this many times N (its samples were
#: 37-46 % shorter than the untuned generator's in the study: 1.6-1.9 N of them match N)
MATCH_POOL = 3


def control_stage(run) -> Stage:
    """The T = 0 control (issue 24): the untuned generator writes the synthetic set with the
    final stage's prompts, N and seed; the driver trains and evaluates it like the method's."""
    return synthetic_stage(run, None, name="synthetic-t0",
                           out=run.paths.root / "synthetic_t0.jsonl")


def probe_seed(seed: int) -> int:
    """The probe's prompts and sampling seeds: the same every round (``seed * 1000 + 998``)."""
    return seed * 1000 + 998


def probe_stages(run, t: int, adapter: str | None) -> Iterator[Stage]:
    """Round t's generator (round 0: untuned) on the held prompts, then its distance to the
    private validation split, fluency and diversity (``popri eval probe``, a private
    diagnostic): a row of RUN/metrics.jsonl."""
    c, pr = run.cfg, run.cfg.probe
    if not pr.enabled:
        return
    P = run.paths.root / "probe"
    samples = P / f"round{t}.jsonl"
    yield Stage(f"probe{t}-gen", GenCall(
        omega=run.omega, prompts=pr.prompts, samples_per_prompt=pr.samples_per_prompt,
        round_=t, out=str(samples), **steps.gen_settings(run, adapter=adapter, seed=probe_seed(c.seed))),
        outputs=[str(samples)], inputs=[*run.omega_inputs, *([adapter] if adapter else [])])
    yield Stage(f"probe{t}", EvalProbeCall(
        samples=str(samples), target=str(run.paths.emb_val), embed_model=c.embedder,
        model=c.generator.model if pr.perplexity else None, bf16=c.generator.bf16,
        seed=c.seed, json_out=True),
        outputs=[str(P / f"round{t}.json")], inputs=[str(samples), str(run.paths.emb_val)],
        stdout_to=str(P / f"round{t}.json"))


def _rounds(run, tune) -> Iterator[Stage]:
    c = run.cfg
    adapter, omega = None, (run.omega, run.omega_inputs)
    yield from probe_stages(run, 0, None)
    for t in range(1, c.rounds + 1):
        R = run.paths.root / f"round{t}"
        yield gen_stage(run, t, adapter, omega)
        yield from fluency_stages(run, t)
        yield steps.score_stage(run, t, scored_samples(run, t), R / "scores.npy", round_seed(c.seed, t))
        last = None
        for st in tune(run, t, adapter):
            yield st
            last = st
        adapter = last.outputs[0]
        if c.pool != "static":  # the next round draws its shots from the evolved pool
            st = pool_stage(run, t, omega)
            yield st
            omega = (st.outputs[0], [st.outputs[0]])
        yield from probe_stages(run, t, adapter)
    yield synthetic_stage(run, adapter, omega=omega)
    if c.final_match_tokens:  # the control's set (public: the untuned generator's) sizes it
        ctl = control_stage(run)
        yield ctl
        yield take_stage("synthetic-take", run.paths.synthetic_pool, ctl.outputs[0],
                         run.paths.synthetic, c.downstream.model)
    if c.final_untuned_share:  # the untuned generator's set (public) writes a share of it
        ctl = control_stage(run)
        yield ctl
        yield mix_stage("synthetic-mix", run.paths.synthetic_tuned, ctl.outputs[0],
                        run.paths.synthetic, c.final_untuned_share, final_seed(c.seed))


def round_metrics(run) -> list[dict]:
    """RUN/metrics.jsonl (docs/formats.md): one row per round and stage -- the released scores
    (mean over the round's samples, of the chosen and of the rejected: post-processing of the
    release), the tuning (DPO / SFT loss, reward margin and preference accuracy on the training
    and the held-out pairs), the recovery rate (a private diagnostic) and the probe's distance,
    fluency and diversity (a private diagnostic)."""
    import json

    import numpy as np

    c, rows = run.cfg, []

    def probe_row(t):
        f = run.paths.root / "probe" / f"round{t}.json"
        if f.is_file():
            p = read_json(f, expect=dict)
            rows.append({"round": t, "stage": "probe", "private_diagnostic": True,
                         **{k: p.get(k) for k in (
                             "mean_cosine", "mean_cosine_se", "mmd2", "mmd2_se", "self_cosine",
                             "distinct_1", "distinct_2", "perplexity", "loss", "samples")}})

    probe_row(0)
    for t in range(1, c.rounds + 1):
        R = run.paths.root / f"round{t}"
        if (R / "scores.npy").is_file():
            s = np.load(R / "scores.npy")
            row = {"round": t, "stage": "score", "released_mean": float(np.mean(s)),
                   "samples": int(s.size)}
            if (R / "prefs.jsonl").is_file():
                pairs = [json.loads(x) for x in (R / "prefs.jsonl").read_text().splitlines()
                         if x.strip()]
                if pairs:
                    row |= {"chosen_mean": float(np.mean([p["chosen_score"] for p in pairs])),
                            "rejected_mean": float(np.mean([p["rejected_score"] for p in pairs])),
                            "pairs": len(pairs)}
            rows.append(row)
        rep = R / "prefs_report.json"
        if rep.is_file() and read_json(rep, expect=dict).get("recovery_rate") is not None:
            rows.append({"round": t, "stage": "prefs", "private_diagnostic": True,
                         "recovery_rate": read_json(rep, expect=dict)["recovery_rate"]})
        for kind in ("dpo", "sft"):
            m = R / kind / "metrics.json"
            if m.is_file():
                d = read_json(m, expect=dict)
                ep = (d.get("epochs") or [{}])[-1]
                row = {"round": t, "stage": kind, "train_loss": d.get("train_loss"),
                       "last_epoch_loss": ep.get("loss"), "steps": d.get("global_step"),
                       "seconds_per_step": d.get("seconds_per_step")}
                row |= pair_fields(d)
                rows.append(row)
        probe_row(t)
    return rows


def recipe(run) -> Iterator[Stage]:
    """POPri, Algorithm 1."""
    if run.select == "dp":
        yield select_stats_stage(run)
    yield from _rounds(run, dpo_stages)


def recipe_sft(run) -> Iterator[Stage]:
    """PE+SFT: the same rounds with SFT on the top-scored samples instead of prefs + DPO."""
    yield from _rounds(run, lambda run, t, adapter: iter([sft_stage(run, t, adapter)]))


def _recovery(run) -> dict:
    c, out, recov = run.cfg, {}, []
    for t in range(1, c.rounds + 1):
        rep = run.paths.root / f"round{t}" / "prefs_report.json"
        if rep.exists():
            recov.append(read_json(rep).get("recovery_rate"))
    out["recovery_rate_per_round"] = recov
    if c.score.recovery_rate and run.release:
        out["recovery_rate_note"] = ("not computed in release mode (the noise-free "
                                     "diagnostic scores are not private)")
    return out


def _probe(run) -> dict:
    """The probe's first and last rounds: how the generator's fixed-prompt sample moved (a
    private diagnostic).  The SE of the change combines the two rounds' bootstrap SEs as if
    independent (the rounds share prompts and seeds, so this is conservative)."""
    import math

    P = run.paths.root / "probe"
    got = {t: read_json(P / f"round{t}.json", expect=dict) for t in range(run.cfg.rounds + 1)
           if (P / f"round{t}.json").is_file()}
    if 0 not in got or len(got) < 2:
        return {}
    last = max(got)
    a, b = got[0], got[last]
    se = math.sqrt((a.get("mean_cosine_se") or 0) ** 2 + (b.get("mean_cosine_se") or 0) ** 2)
    sm = math.sqrt((a.get("mmd2_se") or 0) ** 2 + (b.get("mmd2_se") or 0) ** 2)
    return {"probe": {
        "private_diagnostic": True, "last_round": last, "samples": b.get("samples"),
        "first_mean_cosine": a["mean_cosine"], "last_mean_cosine": b["mean_cosine"],
        "delta_mean_cosine": b["mean_cosine"] - a["mean_cosine"], "delta_mean_cosine_se": se,
        "first_mmd2": a["mmd2"], "last_mmd2": b["mmd2"], "delta_mmd2": b["mmd2"] - a["mmd2"],
        "delta_mmd2_se": sm, "first_distinct_2": a.get("distinct_2"),
        "last_distinct_2": b.get("distinct_2"), "first_perplexity": a.get("perplexity"),
        "last_perplexity": b.get("perplexity")}}


def results(run, noise) -> dict:
    c = run.cfg
    return {"checkpoint_selection": {
        "on": run.select, "note": selection_note(run.select, c),
        **({"epsilon": c.dpo.select_epsilon, "delta": c.selection_delta}
           if run.select == "dp" else {})}, **_recovery(run), **_probe(run)}


def results_sft(run, noise) -> dict:
    return {**_recovery(run), **_probe(run)}


def plan_notes(run) -> list[str]:
    return [selection_note(run.select, run.cfg)]


class POPri(Method):
    """POPri (arXiv:2504.16438, Algorithm 1)."""
    name, label, pairs, selects = "popri", "POPri", True, True
    colour = "#1f77b4"  # blue
    variants = {"popri-nn": ("POPri-NN", "#6baed6")}  # light blue: examples/popri-nn-histogram
    feedback = "the DP-released scores"
    summary = "POPri: T rounds of gen, DP scores, preference pairs, DPO; then N samples"

    def recipe(self, run) -> Iterator[Stage]:
        return recipe(run)

    def control(self, run) -> Stage:
        return control_stage(run)

    def metrics(self, run) -> list[dict]:
        return round_metrics(run)

    def results(self, run, noise) -> dict:
        return results(run, noise)

    def plan_notes(self, run) -> list[str]:
        return plan_notes(run)


class PESFT(POPri):
    """POPri's PE+SFT baseline (section 5, baseline (2)): SFT on each prompt's top sample."""
    name, label, selects = "pe-sft", "PE+SFT", False
    colour, variants = "#9467bd", {}  # purple
    summary = "POPri's PE+SFT baseline: SFT on each prompt's top-scored sample"

    def recipe(self, run) -> Iterator[Stage]:
        return recipe_sft(run)

    def results(self, run, noise) -> dict:
        return results_sft(run, noise)

    def plan_notes(self, run) -> list[str]:
        return []


__all__ = ["POPri", "PESFT", "recipe", "recipe_sft", "results", "results_sft", "plan_notes",
           "Path"]
