"""The steps methods share, as stages built from a :class:`~popri.methods.base.RunContext`:
fetching and embedding the data, the generator's settings, a round's DP scores (and its
noise-free diagnostic twin), and the downstream evaluation with its baselines, control and
draws.  A recipe composes them with its own stages (``steps.score_stage(run, t, ...)``); the
driver (:class:`popri.pipeline.driver.Run`) only runs what the recipes build.

    python -m pytest -q tests/test_api.py tests/test_entries.py -k "toy or own_call"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from popri.core.errors import ConfigError
from popri.kit import (
    Z_LATER,
    DPRelease,
    Stage,
    draw_seed,
    final_seed,
    mix_stage,
    redrawn,
    sample_seed,
    settings,
    take_stage,
)
from popri.methods.context import RunContext
from popri.specs.commands.bench import BenchFetchCall
from popri.specs.commands.embed import EmbedCall
from popri.specs.commands.eval import (
    EvalAccuracyCall,
    EvalDiffCall,
    EvalFidCall,
    EvalGapCall,
    EvalQualityCall,
)
from popri.specs.commands.score import ScoreCall
from popri.specs.commands.train_downstream import TrainDownstreamCall
from popri.specs.run import DRAW_SOURCES
from popri.specs.training import DownstreamSpec, GapSpec

def is_file_source(src: str) -> bool:
    """Is a data source a file (Omega as JSONL, JSON, CSV, Parquet), not a dataset to fetch."""
    return src.endswith((".jsonl", ".json", ".csv", ".parquet")) or Path(src).is_file()


# ------------------------------------------------------------------ data
def private_fetch(cfg, out: str) -> BenchFetchCall:
    """The ``bench fetch`` of a config's private federated text (data.source) into ``out``."""
    d = cfg.data
    return BenchFetchCall(name=d.source, out=out, split=d.split, max_tokens=d.max_tokens,
                          seed=cfg.seed, date_from=d.date_from,
                          max_samples_per_client=d.max_samples_per_client,
                          max_clients=d.max_clients)


def public_fetch(cfg, out: str) -> BenchFetchCall:
    """The ``bench fetch`` of a config's public data Omega (data.public_source) into ``out``."""
    d = cfg.data
    return BenchFetchCall(name=d.public_source, out=out, max_tokens=d.max_tokens,
                          seed=cfg.seed, public=True, date_to=d.public_date_to,
                          max_samples_per_client=d.public_max_samples_per_client)


def fetch_text(run: RunContext, *, public: bool = True) -> Iterable[Stage]:
    """``bench fetch`` of the private federated text (unless data.dir) and, with ``public``,
    of Omega (unless it is a file)."""
    d = run.cfg.data
    if not d.dir:
        yield Stage("fetch-private", private_fetch(run.cfg, str(run.paths.private)),
                    outputs=[str(run.paths.private)])
    if not d.public_source:
        raise ConfigError("is needed (the initial population Omega)",
                          field="data.public_source")
    if public and not is_file_source(d.public_source):
        yield Stage("fetch-public", public_fetch(run.cfg, str(run.paths.public)),
                    outputs=[str(run.paths.public)])

def embed_private(run: RunContext) -> Iterable[Stage]:
    """``embed`` of the private train and validation splits, and of Omega when checkpoint
    selection reads it."""
    c = run.cfg
    for split, out in (("train", run.paths.emb_private), ("val", run.paths.emb_val)):
        # the clients' own stages: their log lines count the private samples (release: quiet)
        yield Stage(f"embed-{split}", EmbedCall(
            input=str(run.paths.private), split=split, out=str(out), model=c.embedder),
            outputs=[str(out)], inputs=[str(run.paths.private)], quiet=run.release)
    if run.select == "public":
        yield Stage("embed-public", EmbedCall(
            input=run.omega, out=str(run.paths.emb_public), model=c.embedder),
            outputs=[str(run.paths.emb_public)], inputs=run.omega_inputs)

# ------------------------------------------------------------------ the DP selection
def select_settings(cfg) -> dict:
    """``popri fred stats``' settings of the DP checkpoint selection (dpo.select_on: dp): the
    validation split's embedding mean (and covariance, for select_by fid) at user level under
    add/remove one client (the relation of the score releases, so one accountant totals
    them), analytic Gaussian at dpo.select_epsilon.  The one builder of the stage's call and of
    the budget's plan of it (:meth:`popri.pipeline.budget.Budget.select_entries`)."""
    dp = cfg.dpo
    return dict(epsilon=dp.select_epsilon, delta=cfg.selection_delta, level="user",
                relation="add-remove", calibration="analytic",
                statistics="both" if dp.select_by == "fid" else "mean",
                release=bool(cfg.release))


# ------------------------------------------------------------------ a round
def gen_settings(run: RunContext, *, adapter: str | None, seed: int,
                 top_p: float | None = None) -> dict:
    """The generator section (a :class:`~popri.specs.generation.GeneratorSpec`) as
    fields of ``popri gen``'s / ``popri expand``'s call, plus the stage's seed and adapter;
    ``top_p``: instead of the section's (the final set's ``final_top_p``)."""
    g = run.cfg.generator if top_p is None else run.cfg.generator.replace(top_p=top_p)
    return {**g.to_dict(), "seed": seed, "adapter": adapter}

def score_call(run: RunContext, t: int, synthetic: str | Path, out: Path, seed: int, *,
               mode: str | None = None, threshold: float | str | None = None) -> ScoreCall:
    """``popri score``'s call: the score section + privacy.delta + the mode, at the planned
    noise multiplier (a dry run before the fetch shows a placeholder: a draft call)."""
    values: dict[str, Any] = dict(
        synthetic=str(synthetic), out=str(out), private=str(run.paths.emb_private),
        seed=seed, round_=t, model=run.cfg.embedder,
        noise_multiplier=run.noise.z if run.noise else Z_LATER,
        **run.method.score_settings(run.cfg, mode=mode, threshold=threshold))
    later = values["noise_multiplier"] == Z_LATER or isinstance(values.get("threshold"), str)
    return ScoreCall.draft(**values) if later else ScoreCall(**values)

def score_stage(run: RunContext, t: int, synthetic: str | Path, out: Path, seed: int, *,
                mode: str | None = None, threshold: float | str | None = None) -> Stage:
    """Round t's DP scores: a DP release, recorded in the ledger next to ``out``."""
    ledger = Path(out).parent / "ledger.jsonl"
    call = score_call(run, t, synthetic, out, seed, mode=mode, threshold=threshold)
    return Stage(f"round{t}-score", call,
                 outputs=[str(out)], inputs=[str(synthetic), str(run.paths.emb_private)],
                 release=DPRelease(run.score_entries(t, call), ledger,
                                   lambda e, t=t: e.stage == "score"
                                   and e.params.get("round") == t))

def exact_stage(run: RunContext, t: int, synthetic: str | Path, seed: int) -> Stage | None:
    """The noise-free scores of round t's samples for the recovery rate (POPri Fig. 6):
    ``popri score --diagnostic`` (no ledger entry, marked not private), kept in
    RUN/diagnostics.  Not in release mode: they are an exact function of private data."""
    c = run.cfg
    if not c.score.recovery_rate or run.release:
        return None
    exact = run.paths.root / "diagnostics" / f"round{t}" / "exact.npy"
    # no clipping in effect: a client's vector of mean cosines has norm <= sqrt(n_syn),
    # below 1e6 (score's largest --clip) for any n_syn < 1e12
    own: dict[str, Any] = ({"standardize": False, "clip": 1e6} if c.score.mode == "cosine"
           else {} if c.score.mode == "coverage"
           else {"max_samples_per_client": c.score.max_samples_per_client})
    return Stage(f"round{t}-exact-scores", ScoreCall(
        synthetic=str(synthetic), out=str(exact), diagnostic=True, noise_multiplier=0.0,
        seed=seed, model=c.embedder, private=str(run.paths.emb_private),
        mode=c.score.mode, **own),
        outputs=[str(exact)], inputs=[str(synthetic), str(run.paths.emb_private)],
        quiet=True)

# ------------------------------------------------------------------ evaluation
def downstream_evaluation(run: RunContext) -> Iterable[Stage]:
    """The synthetic set's FID to the validation split, the downstream model on it, its
    accuracy on the private test split; with baselines eps = 0 / eps = inf and the gap;
    with the method's control (:meth:`Method.control`) its T = 0 row and the paired
    difference.  A method that trained the model itself (:meth:`Method.model_out`) is
    evaluated as it is."""
    c, ds = run.cfg, run.cfg.downstream
    name = c.method
    priv = str(run.paths.private)
    syn = str(run.paths.synthetic)
    E = run.paths.eval
    model = run.method.model_out(run)
    if model is None:
        yield Stage("fid-synthetic", EvalFidCall(
            a=syn, b=str(run.paths.emb_val), model=c.embedder, json_out=True),
            outputs=[str(E / "fid.json")], inputs=[syn, str(run.paths.emb_val)],
            stdout_to=str(E / "fid.json"))

    def train(name: str, data: str, inputs: list[str], max_samples: int | None = None,
              seed: int = c.seed, **more):
        out = run.paths.root / "downstream" / name
        st = Stage(f"downstream-{name}", TrainDownstreamCall(
            train=data, out=str(out), val=priv, **settings(DownstreamSpec, ds, model=ds.model),
            max_val_samples=ds.eval_max_samples, max_samples=max_samples, seed=seed,
            force=True, **more),
            outputs=[str(out)], inputs=[*inputs, priv])
        return st, str(out)

    def evaluate(name: str, model: str, inputs: list[str], k: int = 0):
        per = E / f"{name}.clients.jsonl"
        st = Stage(f"eval-{name}", EvalAccuracyCall(
            model=model, data=priv, split="test", max_length=ds.max_length,
            bootstrap=ds.bootstrap, max_samples=ds.eval_max_samples,
            sample_seed=eval_sample_seed(c, k), per_client_out=str(per), seed=c.seed,
            json_out=True),
            outputs=[str(E / f"{name}.json"), str(per)], inputs=[*inputs, priv],
            stdout_to=str(E / f"{name}.json"))
        return st, str(per)

    def diff(stage: str, method: str, control: str, out: Path) -> Stage:
        """``eval diff``: the method minus the control, paired over test clients."""
        return Stage(stage, EvalDiffCall(method=method, control=control,
                                         bootstrap=ds.bootstrap, seed=c.seed, json_out=True),
                     outputs=[str(out)], inputs=[method, control], stdout_to=str(out))

    ctl = run.method.control(run) if c.control else None
    per = {}
    quality = []  # the second opinion (downstream.quality): after the accuracy stages
    if model is not None:  # DP-FL: the method trained the model itself
        ckpt = str(model)
        st, per[name] = evaluate(name, ckpt, [str(Path(ckpt).parent)])
        yield st
    else:
        st, ckpt = train(name, syn, [syn])
        yield st
        st, per[name] = evaluate(name, ckpt, [ckpt])
        yield st
        quality.append(quality_stage(run, name, syn, 0))
    st = ctl
    control = st is not None
    if control:  # the untuned generator's T = 0 row (issue 24): same prompts, N, recipe
        if not c.final_match_tokens:  # else the recipe's: its tokens cut the final set
            yield st
        t0_set = st.outputs[0]
        st, ck = train("t0", t0_set, [t0_set])
        yield st
        st, per["t0"] = evaluate("t0", ck, [ck])
        yield st
        quality.append(quality_stage(run, "t0", t0_set, 0))
        yield diff("control-diff", per[name], per["t0"], E / "control.json")
        if c.draws > 1:
            yield from draw_stages(run, name, synthetic_stage(run), train, evaluate, diff)
    if c.baselines:
        st, per["eps0"] = evaluate("eps0", ds.model, [])
        yield st
        # eps = inf: the same recipe on the private train split, size-matched to the
        # synthetic set so the comparison is about the data, not its amount
        st, inf = train("epsinf", priv, [], max_samples=c.num_synthetic,
                        train_split="train")
        yield st
        st, per["epsinf"] = evaluate("epsinf", inf, [inf])
        yield st
        yield Stage("gap-closed", EvalGapCall(
            method=per[name], eps0=per["eps0"], epsinf=per["epsinf"],
            **settings(GapSpec, ds), allow_undefined=True,
            control=per["t0"] if control else None, seed=c.seed, json_out=True),
            outputs=[str(E / "gap.json")], inputs=list(per.values()),
            stdout_to=str(E / "gap.json"))
    if ds.quality:
        yield from quality
    if c.curve and model is None:  # issue 65: the learning curve in N, draw 0's
        sets = {name: syn, **({"t0": ctl.outputs[0]} if ctl is not None else {}),
                **({"epsinf": priv} if c.baselines else {})}
        yield from curve_stages(run, name, sets, 0, train, evaluate, diff)
        if c.baselines:  # the ceiling: eps = inf on all of the private training text
            st, top = train("epsinf-all", priv, [], train_split="train")
            yield st
            st, _ = evaluate("epsinf-all", top, [top])
            yield st


def quality_stage(run: RunContext, who: str, data: str, k: int) -> Stage:
    """``popri eval quality`` of arm ``who``'s draw-``k`` set (``downstream.quality``, issue
    65): MAUVE against draw k's test records on the downstream model's features, and
    diversity, at N and at each size of the curve (RUN/eval/quality-WHO[-dK].json)."""
    c, ds = run.cfg, run.cfg.downstream
    tag = who if k == 0 else f"{who}-d{k}"
    out = run.paths.eval / f"quality-{tag}.json"
    return Stage(f"quality-{tag}", EvalQualityCall(
        samples=data, reference=str(run.paths.private), split="test",
        max_reference=ds.eval_max_samples, reference_seed=eval_sample_seed(c, k),
        model=ds.model, embed_model=c.embedder, sizes=tuple(curve_sizes(c)) or None,
        seed=c.seed, json_out=True),
        outputs=[str(out)], inputs=[data, str(run.paths.private)], stdout_to=str(out))


def curve_sizes(cfg) -> list[int]:
    """The curve's sizes below ``num_synthetic`` (the rows at N are the run's own), ascending."""
    return sorted(n for n in cfg.curve if n < cfg.num_synthetic)


def curve_stages(run: RunContext, name: str, sets: dict[str, str], k: int, train, evaluate,
                 diff, *, seed: int | None = None, reuse: bool = False) -> Iterable[Stage]:
    """Draw ``k``'s learning curve (``curve``, issue 65): for each size n below N, every arm
    of ``sets`` (who -> its draw-k training data: the synthetic sets, and the private train
    split for eps = inf at draw 0) trained on the first n samples (nested prefixes of the
    set at N: one generation, paired across n) with the draw's training ``seed`` and
    evaluated on the draw's test sample, then the method minus its T = 0 control at n
    (RUN/eval/control-nN[-dK].json).  ``reuse``: the draw redraws only the test sample, so
    draw 0's models at n are evaluated again."""
    c, E = run.cfg, run.paths.eval
    sfx = "" if k == 0 else f"-d{k}"
    for n in curve_sizes(c):
        per: dict[str, str] = {}
        for who, data in sets.items():
            tag = f"{who}-n{n}{sfx}"
            if reuse:
                ck = str(run.paths.root / "downstream" / f"{who}-n{n}")
            else:
                priv = who == "epsinf"
                st, ck = train(tag, data, [] if priv else [data], max_samples=n,
                               **({"seed": seed} if seed is not None else {}),
                               **({"train_split": "train"} if priv else {}))
                yield st
            ev, per[who] = evaluate(tag, ck, [ck], k)
            yield ev
        if "t0" in per:
            yield diff(f"control-diff-n{n}{sfx}", per[name], per["t0"],
                       E / f"control-n{n}{sfx}.json")

def synthetic_stage(run: RunContext) -> Stage:
    """The method's own stage writing RUN/synthetic.jsonl (its recipe's, rebuilt; with
    ``final_match_tokens`` the pool it is cut from, RUN/synthetic_pool.jsonl)."""
    want = str(run.paths.synthetic_pool if run.cfg.final_match_tokens
               else run.paths.synthetic_tuned if run.cfg.final_untuned_share
               else run.paths.synthetic)
    for st in run.method.recipe(run):
        if want in st.outputs:
            return st
    raise ConfigError(f"{run.cfg.method}'s recipe writes no {want}: nothing to redraw",
                      field="draws")

def draw_streams(cfg, k: int) -> dict[str, int]:
    """Which draw of each random source (``DRAW_SOURCES``) draw ``k`` takes: ``k`` for those in
    ``draw_sources``, 0 (draw 0's, held) for the others; results.json's ``draws[k].streams``."""
    return {s: (k if s in cfg.draw_sources else 0) for s in DRAW_SOURCES}


def eval_sample_seed(cfg, k: int) -> int | None:
    """The seed of the test records draw ``k`` evaluates every arm on (:func:`sample_seed`):
    None -- the first ``downstream.eval_max_samples`` records, as ever -- unless
    ``draw_sources`` holds test, then every draw's own sample, draw 0's included (so that draw
    0 is drawn as the others are)."""
    return sample_seed(cfg.seed, draw_streams(cfg, k)["test"]) if "test" in cfg.draw_sources \
        else None


def draw_stages(run: RunContext, name: str, synthetic: Stage, train, evaluate,
                diff) -> Iterable[Stage]:
    """Draws 1 .. draws-1 of the final set and of its T = 0 control (``draws``, issue 24),
    each redrawing the sources of ``draw_sources`` (issue 65) and holding the others at draw
    0's: generation -- both sets' generation stages with seed :func:`draw_seed` (stage seed, k)
    (RUN/draws/dK/), else draw 0's two sets; training -- each set trained downstream with
    ``draw_seed(seed, k)``, else with draw 0's seed (draw 0's models themselves when the sets
    are draw 0's too); test -- every arm evaluated on the draw's own test sample
    (:func:`eval_sample_seed`).  Then their paired difference (RUN/eval/control-dK.json); the
    builders are :meth:`downstream_evaluation`'s."""
    c, E = run.cfg, run.paths.eval
    control = run.method.control(run)
    if control is None:  # draws redraw a method's set against its control
        return
    gen, trn = "generation" in c.draw_sources, "training" in c.draw_sources
    held = {name: str(run.paths.synthetic), "t0": control.outputs[0]}  # draw 0's sets
    for k in range(1, c.draws):
        D = run.paths.root / "draws" / f"d{k}"
        per: dict[str, str] = {}
        sets = {who: redrawn(st, k, D / Path(st.outputs[0]).name, f"{st.name}-d{k}")
                for who, st in ((name, synthetic), ("t0", control))} if gen else {}
        # the control's tokens cut the method's pool, or its samples replace a share of it
        match = c.final_match_tokens or bool(c.final_untuned_share)
        if match and gen:
            yield sets["t0"]
            yield sets[name]
            sets[name] = (take_stage(f"synthetic-take-d{k}", sets[name].outputs[0],
                                     sets["t0"].outputs[0], D / run.paths.synthetic.name,
                                     c.downstream.model) if c.final_match_tokens else
                          mix_stage(f"synthetic-mix-d{k}", sets[name].outputs[0],
                                    sets["t0"].outputs[0], D / run.paths.synthetic.name,
                                    c.final_untuned_share, draw_seed(final_seed(c.seed), k)))
        data_of: dict[str, str] = {}
        seed = draw_seed(c.seed, k) if trn else c.seed
        for who in (name, "t0"):
            tag = f"{who}-d{k}"
            if gen and (not match or who == name):
                yield sets[who]
            data = data_of[who] = sets[who].outputs[0] if gen else held[who]
            if gen or trn:
                tr, ck = train(tag, data, [data], seed=seed)
                yield tr
            else:  # the same sets, the same seed: draw 0's models, on another test sample
                ck = str(run.paths.root / "downstream" / who)
            ev, per[who] = evaluate(tag, ck, [ck], k)
            yield ev
        yield diff(f"control-diff-d{k}", per[name], per["t0"], E / f"control-d{k}.json")
        if c.downstream.quality and gen:  # held sets: draw 0's quality holds (test redraws
            for who in (name, "t0"):      # only change its reference sample)
                yield quality_stage(run, who, data_of[who], k)
        if c.curve:
            yield from curve_stages(run, name, data_of, k, train, evaluate, diff, seed=seed,
                                    reuse=not (gen or trn))


__all__ = ["is_file_source", "fetch_text", "embed_private", "gen_settings", "score_call", "score_stage",
           "exact_stage", "downstream_evaluation", "synthetic_stage", "draw_stages",
           "draw_streams", "eval_sample_seed", "curve_sizes", "curve_stages", "quality_stage"]
