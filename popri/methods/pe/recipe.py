"""Private Evolution / PrE-Text as stages of ``popri run`` (PrE-Text = "PrE-Text: Training
Language Models on Private Federated Data in the Age of LLMs", arXiv:2406.02958, Algorithm 1).

    popri run examples/pe.yaml --dry-run                 # lists exactly these stages

``pe init`` draws S_1 from the public Omega; per round t: embed the population (or ``vary
--lookahead``: the mean embedding of K variations, section 3), the clients' DP nearest-neighbour
vote (``score --mode nn-histogram``, threshold H = z * M by default, D.2), ``pe draw`` survivors
from P_t, and ``vary`` them into the next population; ``pe seeds`` unions the survivor sets
(the DP seed set) and ``expand`` writes N samples from it with the untuned generator.
"""

from __future__ import annotations

from typing import Iterator

from popri.kit import Stage, final_seed, fmt, round_seed
from popri.methods.base import Method
from popri.methods import steps
from popri.methods.pe.draw import default_threshold
from popri.privacy.plan import Noise
from popri.specs.commands.embed import EmbedCall
from popri.specs.commands.expand import ExpandCall
from popri.specs.commands.pe import PeDrawCall, PeInitCall, PeSeedsCall
from popri.specs.commands.vary import VaryCall
from popri.specs.generation import EXPAND_BATCH, sampling_of


def threshold(run, noise: Noise | None) -> float | str:
    """H (PrE-Text D.2: the noise std on the vote histogram, z * M -- z sqrt(2) M for a fixed
    L of N, whose sensitivity is the replace-one one -- unless pe.threshold): the value the
    vote stage is passed times the planned round's sensitivity; a placeholder while z is
    unknown (dry run before the fetch).  Before the fetch with z given, q = L/N (so the
    sampling) is not known yet: H is shown at the bound M itself, as under Poisson sampling."""
    pe = run.cfg.pe
    if pe.threshold is not None:
        return float(pe.threshold)
    if noise is None or noise.z is None:
        return "<H = z * M: set after the fetch>"
    if noise.sensitivity is None:  # q waits for the fetch: add/remove's sensitivity, M
        noise = noise.at("poisson", PE().round_spec(run.cfg))
    return default_threshold(noise.z, noise.sensitivity)


def vary_settings(run) -> dict:
    """``popri vary``'s settings: the pe section's variation settings and the generator's
    sampling settings (fields of :class:`~popri.specs.generation.VarySpec`)."""
    pe, g = run.cfg.pe, run.cfg.generator
    model = pe.variation_model or (None if pe.variation == "mask-fill" else g.model)
    vals = {**sampling_of(g), "method": pe.variation, "model": model,
            "mask_ratio": pe.mask_ratio, "steps": pe.mask_steps, "fallback": pe.fallback,
            **({"fallback_model": g.model} if pe.fallback else {})}
    return {k: v for k, v in vals.items() if v is not None}


def expand_settings(run, seed: int) -> dict:
    """``popri expand``'s generator settings: the generator section (fields of
    :class:`~popri.specs.generation.ExpandSpec`), whose batch is ``pe.expand_batch_size`` or,
    unset, the backend's (:data:`popri.specs.generation.EXPAND_BATCH`) -- not the generator's
    sampling batch.  The value in effect is passed, so the plan shows it and a stage's key does
    not move when only the table's default would."""
    g = run.cfg.generator
    batch = run.cfg.pe.expand_batch_size or EXPAND_BATCH[g.backend]
    return {**g.to_dict(), "batch_size": batch, "seed": seed}


def recipe(run) -> Iterator[Stage]:
    """PrE-Text Algorithm 1: S_1 from public text; per round the DP nearest-neighbour vote
    (with lookahead), survivors drawn from P_t, their variations as the next population; the
    union of the survivor sets is the DP seed set, expanded to N samples."""
    c, pe = run.cfg, run.cfg.pe
    H = threshold(run, run.noise)
    pop = run.paths.root / "round1" / "population.jsonl"
    yield Stage("pe-init", PeInitCall(public=run.omega, num=pe.num_syn, seed=c.seed,
                                      out=str(pop)),
                outputs=[str(pop)], inputs=run.omega_inputs)
    survivors = []
    for t in range(1, c.rounds + 1):
        R = run.paths.root / f"round{t}"
        seed = round_seed(c.seed, t)
        if pe.lookahead > 0:
            syn = R / "lookahead.npy"
            yield Stage(f"round{t}-lookahead", VaryCall(
                input=str(pop), **vary_settings(run), lookahead=pe.lookahead,
                lookahead_out=str(syn), embedder=c.embedder, round_=t, seed=seed,
                out=str(R / "lookahead_variations.jsonl")),
                outputs=[str(syn)], inputs=[str(pop)])
        else:
            syn = R / "population_emb.npy"
            yield Stage(f"round{t}-embed", EmbedCall(input=str(pop), out=str(syn),
                                                     model=c.embedder),
                        outputs=[str(syn)], inputs=[str(pop)])
        hist = R / "hist.npy"
        yield steps.score_stage(run, t, syn, hist, seed, threshold=H)
        surv = R / "survivors.jsonl"
        yield Stage(f"round{t}-draw", PeDrawCall(
            population=str(pop), scores=str(hist), num=pe.num_syn, round_=t, seed=seed,
            out=str(surv), stats_out=str(R / "draw_stats.json"), release=run.release),
            outputs=[str(surv)], inputs=[str(pop), str(hist)])
        survivors.append(str(surv))
        if t < c.rounds:  # S_{T+1} is never voted on: no variation after the last round
            nxt = run.paths.root / f"round{t + 1}" / "population.jsonl"
            yield Stage(f"round{t}-vary", VaryCall(
                input=str(surv), **vary_settings(run), round_=t + 1, seed=seed, out=str(nxt)),
                outputs=[str(nxt)], inputs=[str(surv)])
            pop = nxt
    seeds = run.paths.root / "pe_seeds.jsonl"
    yield Stage("pe-seeds", PeSeedsCall(survivors=tuple(survivors), out=str(seeds)),
                outputs=[str(seeds)], inputs=survivors)
    yield Stage("expand", ExpandCall(
        seeds=str(seeds), num_samples=c.num_synthetic, out=str(run.paths.root / "expand"),
        merged_out=str(run.paths.synthetic), **expand_settings(run, final_seed(c.seed))),
        outputs=[str(run.paths.synthetic)], inputs=[str(seeds)])


def results(run, noise: Noise | None) -> dict:
    pe = run.cfg.pe
    out = {"pe": {"num_syn": pe.num_syn, "variation": pe.variation, "lookahead": pe.lookahead,
                  "threshold": threshold(run, noise)},
           "recovery_rate_per_round": []}
    seeds = run.paths.root / "pe_seeds.jsonl"
    if seeds.exists():
        with open(seeds, encoding="utf-8") as fh:
            out["pe"]["seed_set"] = sum(1 for line in fh if line.strip())
    return out


def shape(r: dict) -> str:
    pe = r.get("pe", {})
    return (f"PE on {r['run_dir']}: T={r['rounds']} rounds, N_syn={pe.get('num_syn')}, "
            f"variation {pe.get('variation')}, lookahead {pe.get('lookahead')}, "
            f"H={fmt(pe.get('threshold'), 2)}, seed set {pe.get('seed_set', '-')} -> "
            f"N={r['num_synthetic']} expanded")


class PE(Method):
    """PrE-Text (arXiv:2406.02958, Algorithm 1): Private Evolution with DP nearest-neighbour
    votes, then Expand."""
    name, label = "pe", "PE (PrE-Text)"
    colour = "#d62728"  # red
    feedback = "the DP-released votes"
    summary = "PrE-Text: T rounds of DP nearest-neighbour votes, draws, variations; then Expand"

    def recipe(self, run) -> Iterator[Stage]:
        return recipe(run)

    def score_mode(self, cfg) -> str:
        return "nn-histogram"

    def results(self, run, noise: Noise | None) -> dict:
        return results(run, noise)

    def shape(self, r: dict) -> str:
        return shape(r)
