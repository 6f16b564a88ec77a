"""The whole POPri loop (and PE / PE+SFT) as cached, resumable stages (popri.txt Algorithm 1).

    popri run examples/default.yaml                      # the embedded default, ~12 min on 2 CPUs
    popri run examples/default.yaml --set rounds=1 --set privacy.epsilon=7
    popri run examples/biorxiv-gpu.yaml                  # the paper's bioRxiv setting, GPU box

For t = 1..T: gen (K prompts x J samples) -> score (DP client feedback) -> prefs build (best vs
l-th best per prompt) -> dpo (LoRA, continuing round t-1's adapter; checkpoint chosen by FID to
the validation split).  Then the final LLM writes N synthetic samples -> train-downstream ->
eval (next-token accuracy on the private test split), with the eps = 0 (public model) and
eps = inf (trained on private data) baselines, the gap closed, and the ledger totalled.

Each step is one ``popri`` subcommand (the same a user can run by hand: ``RUN/commands.sh``
lists them), cached by :mod:`popri_cli.stages`: unchanged stages are skipped and a killed run
continues from the last finished stage.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import log
from .config import RunConfig, to_dict
from .errors import PopriError
from .io import atomic_write, read_json
from .stages import Stage, StageRunner


def _opt(flag: str, value) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _flag(name: str, on: bool) -> list[str]:
    return [f"--{name}" if on else f"--no-{name}"]


def _is_file_source(src: str) -> bool:
    return src.endswith((".jsonl", ".json", ".csv", ".parquet")) or Path(src).is_file()


class POPriRun:
    """Builds the stage list from a config and runs it."""

    def __init__(self, cfg: RunConfig, *, dry_run: bool = False):
        self.cfg = cfg
        self.run = Path(cfg.run_dir)
        self.run.mkdir(parents=True, exist_ok=True)
        self.runner = StageRunner(self.run, dry_run=dry_run)
        self.p = {
            "private": Path(cfg.data.dir) if cfg.data.dir else self.run / "data" / "private",
            "public": self.run / "data" / "public",
            "emb_private": self.run / "embeddings" / "private.npy",
            "emb_val": self.run / "embeddings" / "val.npy",
            "synthetic": self.run / "synthetic.jsonl",
            "eval": self.run / "eval",
        }

    # ------------------------------------------------------------------ data
    def data_stages(self) -> None:
        c, d = self.cfg, self.cfg.data
        common = ["--max-tokens", str(d.max_tokens), "--seed", str(c.seed)]
        if not d.dir:
            self.runner.run(Stage("fetch-private", [
                "bench", "fetch", d.source, "--out", str(self.p["private"]), "--split", d.split,
                *common, *_opt("--date-from", d.date_from),
                *_opt("--max-samples-per-client", d.max_samples_per_client),
                *_opt("--max-clients", d.max_clients)],
                outputs=[str(self.p["private"] / "manifest.json")]))
        if d.public_source and _is_file_source(d.public_source):
            self.omega = [d.public_source]
        elif d.public_source:
            self.runner.run(Stage("fetch-public", [
                "bench", "fetch", d.public_source, "--out", str(self.p["public"]), *common,
                *_opt("--date-to", d.public_date_to),
                *_opt("--max-samples-per-client", d.public_max_samples_per_client)],
                outputs=[str(self.p["public"] / "manifest.json")]))
            self.omega = [str(self.p["public"]), "--split", "train"]
        else:
            raise PopriError("config: data.public_source is needed (the initial population Omega)")
        for split, key in (("train", "emb_private"), ("val", "emb_val")):
            self.runner.run(Stage(f"embed-{split}", [
                "embed", str(self.p["private"]), "--split", split, "--out", str(self.p[key]),
                "--model", c.embedder],
                outputs=[str(self.p[key])], inputs=[str(self.p["private"] / "manifest.json")]))

    # ------------------------------------------------------------------ privacy
    def calibrate(self) -> dict:
        c, pr, sc = self.cfg, self.cfg.privacy, self.cfg.score
        if self.runner.dry_run and not (self.p["private"] / "manifest.json").exists():
            n = 0
        else:
            n = int(read_json(self.p["private"] / "manifest.json")["counts"]["train"]["clients"])
        if sc.clients_per_round and sc.sample_rate:
            raise PopriError("config: give score.clients_per_round or score.sample_rate, not both")
        q = sc.sample_rate or (min(1.0, sc.clients_per_round / n) if sc.clients_per_round and n else 1.0)
        if pr.noise_multiplier is not None:
            z = float(pr.noise_multiplier)
            how = "given"
        elif pr.epsilon is None:
            raise PopriError("config: set privacy.epsilon (a budget) or privacy.noise_multiplier")
        else:
            from .privacy.accounting import noise_multiplier

            z = noise_multiplier(pr.epsilon, q, c.rounds, pr.delta, pr.accountant)
            how = f"calibrated to eps={pr.epsilon}, delta={pr.delta} over T={c.rounds} rounds"
        log.info(f"run: noise multiplier z={z:.4f} ({how}; q={q:.4g}, {n} clients)")
        return {"noise_multiplier": z, "sample_rate": q, "clients": n, "how": how}

    # ------------------------------------------------------------------ rounds
    def gen_args(self, *, adapter: str | None, seed: int) -> list[str]:
        g = self.cfg.generator
        return ["--model", g.model, "--backend", g.backend, "--temperature", str(g.temperature),
                "--top-p", str(g.top_p), "--max-new-tokens", str(g.max_new_tokens),
                "--max-tokens", str(g.max_tokens), "--batch-size", str(g.batch_size),
                "--seed", str(seed), *_flag("bf16", g.bf16), *_opt("--adapter", adapter)]

    def score_args(self, z: float, seed: int, t: int, *, mode: str | None = None,
                   threshold: float | None = None) -> list[str]:
        sc, pr = self.cfg.score, self.cfg.privacy
        mode = mode or sc.mode
        a = ["--mode", mode, "--private", str(self.p["emb_private"]), "--noise-multiplier",
             repr(z), "--seed", str(seed), "--delta", repr(pr.delta), "--round", str(t),
             "--model", self.cfg.embedder, *_opt("--clients-per-round", sc.clients_per_round),
             *_opt("--sample-rate", sc.sample_rate)]
        if mode == "cosine":
            a += ["--clip", repr(sc.clip), *_flag("standardize", sc.standardize)]
        else:
            a += ["--max-samples-per-client", str(sc.max_samples_per_client),
                  "--threshold", repr(sc.threshold if threshold is None else threshold)]
        return a

    def round_stages(self, t: int, adapter: str | None, z: float) -> str:
        c, dp = self.cfg, self.cfg.dpo
        R = self.run / f"round{t}"
        seed = c.seed * 1000 + t
        samples, scores = R / "samples.jsonl", R / "scores.npy"
        prev = [adapter] if adapter else []
        self.runner.run(Stage(f"round{t}-gen", [
            "gen", *self.omega, "--prompts", str(c.prompts), "--samples-per-prompt",
            str(c.samples_per_prompt), "--round", str(t), "--out", str(samples),
            "--prompts-out", str(R / "prompts.jsonl"), "--stats-out", str(R / "gen_stats.json"),
            *self.gen_args(adapter=adapter, seed=seed)],
            outputs=[str(samples), str(R / "prompts.jsonl")], inputs=[*self._omega_inputs(), *prev]))
        self.runner.run(Stage(f"round{t}-score", [
            "score", "--synthetic", str(samples), "--out", str(scores), *self.score_args(z, seed, t)],
            outputs=[str(scores)], inputs=[str(samples), str(self.p["emb_private"])]))
        if c.method == "pe-sft":
            return self.sft_stage(t, samples, scores, adapter, seed)
        prefs_extra, prefs_inputs = [], [str(samples), str(scores)]
        if c.score.recovery_rate:
            # not private, never released: the noise-free scores of the same samples, kept out of
            # the round's directory so its ledger holds only the DP release
            exact = self.run / "diagnostics" / f"round{t}" / "exact.npy"
            ex = ["--noise-multiplier", "0", "--seed", str(seed), "--model", c.embedder,
                  "--private", str(self.p["emb_private"]), "--mode", c.score.mode]
            ex += (["--no-standardize", "--clip", "1e9"] if c.score.mode == "cosine"
                   else ["--max-samples-per-client", str(c.score.max_samples_per_client)])
            self.runner.run(Stage(f"round{t}-exact-scores", [
                "--quiet", "score", "--synthetic", str(samples), "--out", str(exact), *ex],
                outputs=[str(exact)], inputs=[str(samples), str(self.p["emb_private"])]))
            prefs_extra = ["--true-scores", str(exact)]
            prefs_inputs.append(str(exact))
        self.runner.run(Stage(f"round{t}-prefs", [
            "prefs", "build", "--samples", str(samples), "--scores", str(scores),
            "--rejected-rank", str(dp.rejected_rank), "--out", str(R / "prefs.jsonl"),
            "--report-out", str(R / "prefs_report.json"), *prefs_extra],
            outputs=[str(R / "prefs.jsonl")], inputs=prefs_inputs))
        dpo_dir = R / "dpo"
        args = ["dpo", "--pairs", str(R / "prefs.jsonl"), "--model", c.generator.model,
                "--out", str(dpo_dir), "--loss", dp.loss, "--beta", repr(dp.beta),
                "--lora-r", str(dp.lora_r), "--lora-alpha", str(dp.lora_alpha),
                "--epochs", str(dp.epochs), "--batch-size", str(dp.batch_size),
                "--seed", str(seed), *_flag("bf16", c.generator.bf16), *_opt("--lr", dp.lr),
                *_opt("--adapter", adapter)]
        inputs = [str(R / "prefs.jsonl"), *prev]
        if dp.select_checkpoint:
            args += ["--select-on", str(self.p["emb_val"]), "--select-prompts",
                     str(R / "prompts.jsonl"), "--select-samples", str(dp.select_samples),
                     "--embed-model", c.embedder]
            inputs += [str(self.p["emb_val"]), str(R / "prompts.jsonl")]
        self.runner.run(Stage(f"round{t}-dpo", args, outputs=[str(dpo_dir / "adapter")],
                              inputs=inputs))
        return str(dpo_dir / "adapter")

    def sft_stage(self, t: int, samples: Path, scores: Path, adapter: str | None, seed: int) -> str:
        """PE+SFT (POPri section 3, baseline (2)): supervised tuning on each prompt's top-scored
        sample, with the same LoRA, epochs, batch and learning rate as the DPO stage."""
        c, dp = self.cfg, self.cfg.dpo
        out = self.run / f"round{t}" / "sft"
        self.runner.run(Stage(f"round{t}-sft", [
            "sft", "--samples", str(samples), "--scores", str(scores), "--model", c.generator.model,
            "--out", str(out), "--lora-r", str(dp.lora_r), "--lora-alpha", str(dp.lora_alpha),
            "--epochs", str(dp.epochs), "--batch-size", str(dp.batch_size), "--seed", str(seed),
            *_flag("bf16", c.generator.bf16), *_opt("--lr", dp.lr), *_opt("--adapter", adapter)],
            outputs=[str(out / "adapter")], inputs=[str(samples), str(scores), *([adapter] if adapter else [])]))
        return str(out / "adapter")

    # ------------------------------------------------------------------ PE / PrE-Text
    def pe_threshold(self, z: float) -> float:
        from .pe import default_threshold

        pe = self.cfg.pe
        return float(pe.threshold) if pe.threshold is not None else default_threshold(
            z, self.cfg.score.max_samples_per_client)

    def vary_args(self) -> list[str]:
        pe, g = self.cfg.pe, self.cfg.generator
        model = pe.variation_model or (None if pe.variation == "mask-fill" else g.model)
        return ["--method", pe.variation, *_opt("--model", model), "--mask-ratio", repr(pe.mask_ratio),
                "--steps", str(pe.mask_steps), "--temperature", repr(g.temperature),
                "--top-p", repr(g.top_p), "--max-tokens", str(g.max_tokens),
                "--max-new-tokens", str(g.max_new_tokens), "--batch-size", str(g.batch_size),
                *_flag("bf16", g.bf16),
                *(["--fallback-model", g.model] if pe.fallback else ["--no-fallback"])]

    def pe_stages(self, z: float) -> str:
        """PrE-Text Algorithm 1: S_1 from public text; per round the DP nearest-neighbour vote
        (with lookahead), survivors drawn from P_t, their variations as the next population; the
        union of the survivor sets is the DP seed set.  Returns the seed set's path."""
        c, pe = self.cfg, self.cfg.pe
        H = self.pe_threshold(z)
        pop = self.run / "round1" / "population.jsonl"
        self.runner.run(Stage("pe-init", [
            "pe", "init", *self.omega, "--num", str(pe.num_syn), "--seed", str(c.seed),
            "--out", str(pop)], outputs=[str(pop)], inputs=self._omega_inputs()))
        survivors = []
        for t in range(1, c.rounds + 1):
            R = self.run / f"round{t}"
            seed = c.seed * 1000 + t
            if pe.lookahead > 0:
                syn = R / "lookahead.npy"
                self.runner.run(Stage(f"round{t}-lookahead", [
                    "vary", str(pop), *self.vary_args(), "--lookahead", str(pe.lookahead),
                    "--lookahead-out", str(syn), "--embedder", c.embedder, "--round", str(t),
                    "--seed", str(seed), "--out", str(R / "lookahead_variations.jsonl")],
                    outputs=[str(syn)], inputs=[str(pop)]))
            else:
                syn = R / "population_emb.npy"
                self.runner.run(Stage(f"round{t}-embed", [
                    "embed", str(pop), "--out", str(syn), "--model", c.embedder],
                    outputs=[str(syn)], inputs=[str(pop)]))
            hist = R / "hist.npy"
            self.runner.run(Stage(f"round{t}-score", [
                "score", "--synthetic", str(syn), "--out", str(hist),
                *self.score_args(z, seed, t, mode="nn-histogram", threshold=H)],
                outputs=[str(hist)], inputs=[str(syn), str(self.p["emb_private"])]))
            surv = R / "survivors.jsonl"
            self.runner.run(Stage(f"round{t}-draw", [
                "pe", "draw", "--population", str(pop), "--scores", str(hist), "--num",
                str(pe.num_syn), "--round", str(t), "--seed", str(seed), "--out", str(surv),
                "--stats-out", str(R / "draw_stats.json")],
                outputs=[str(surv)], inputs=[str(pop), str(hist)]))
            survivors.append(str(surv))
            if t < c.rounds:  # S_{T+1} is never voted on: no variation after the last round
                nxt = self.run / f"round{t + 1}" / "population.jsonl"
                self.runner.run(Stage(f"round{t}-vary", [
                    "vary", str(surv), *self.vary_args(), "--round", str(t + 1), "--seed",
                    str(seed), "--out", str(nxt)], outputs=[str(nxt)], inputs=[str(surv)]))
                pop = nxt
        seeds = self.run / "pe_seeds.jsonl"
        self.runner.run(Stage("pe-seeds", ["pe", "seeds", *survivors, "--out", str(seeds)],
                              outputs=[str(seeds)], inputs=survivors))
        return str(seeds)

    def _omega_inputs(self) -> list[str]:
        src = self.omega[0]
        return [str(Path(src) / "manifest.json")] if Path(src).is_dir() else [src]

    # ------------------------------------------------------------------ downstream
    def synthetic_stage(self, adapter: str | None) -> None:
        """POPri / PE+SFT: the final adapter writes N samples from Omega prompts."""
        c = self.cfg
        self.runner.run(Stage("synthetic", [
            "gen", *self.omega, "--num-samples", str(c.num_synthetic), "--samples-per-prompt",
            str(c.samples_per_prompt), "--round", str(c.rounds + 1), "--out", str(self.p["synthetic"]),
            "--stats-out", str(self.run / "synthetic_stats.json"),
            *self.gen_args(adapter=adapter, seed=c.seed * 1000 + 999)],
            outputs=[str(self.p["synthetic"])], inputs=[*self._omega_inputs(), *([adapter] if adapter else [])]))

    def expand_stage(self, seeds: str) -> None:
        """PrE-Text: Expand the DP seed set to N samples with the (untuned) generator."""
        c, g = self.cfg, self.cfg.generator
        self.runner.run(Stage("expand", [
            "expand", seeds, "--num-samples", str(c.num_synthetic), "--out", str(self.run / "expand"),
            "--merged-out", str(self.p["synthetic"]), "--model", g.model, "--backend", g.backend,
            "--temperature", repr(g.temperature), "--top-p", repr(g.top_p),
            "--max-new-tokens", str(g.max_new_tokens), "--max-tokens", str(g.max_tokens),
            "--batch-size", str(g.batch_size), "--seed", str(c.seed * 1000 + 999), *_flag("bf16", g.bf16)],
            outputs=[str(self.p["synthetic"])], inputs=[seeds]))

    def downstream_stages(self) -> dict:
        c, ds = self.cfg, self.cfg.downstream
        name = c.method
        priv = str(self.p["private"])
        man = [str(self.p["private"] / "manifest.json")]
        syn = str(self.p["synthetic"])
        # FID of the synthetic set to the private validation split (POPri's checkpoint criterion;
        # reported, like the accuracy, for the comparison table)
        self.runner.run(Stage("fid-synthetic", [
            "eval", "fid", syn, str(self.p["emb_val"]), "--model", c.embedder, "--json"],
            outputs=[str(self.p["eval"] / "fid.json")], inputs=[syn, str(self.p["emb_val"])],
            stdout_to=str(self.p["eval"] / "fid.json")))

        def train(name: str, data: list[str], inputs: list[str], max_samples: int | None = None):
            out = self.run / "downstream" / name
            self.runner.run(Stage(f"downstream-{name}", [
                "train-downstream", *data, "--out", str(out), "--val", priv, "--model", ds.model,
                "--epochs", str(ds.epochs), "--batch-size", str(ds.batch_size), "--lr", repr(ds.lr),
                "--max-length", str(ds.max_length), ("--lora" if ds.lora else "--full"), "--seed", str(c.seed),
                "--force", *_opt("--max-val-samples", ds.eval_max_samples),
                *_opt("--max-samples", max_samples)],
                outputs=[str(out)], inputs=[*inputs, *man]))
            return str(out)

        def evaluate(name: str, model_args: list[str], inputs: list[str]) -> str:
            E = self.p["eval"]
            per = E / f"{name}.clients.jsonl"
            self.runner.run(Stage(f"eval-{name}", [
                "eval", "accuracy", *model_args, "--data", priv, "--split", "test",
                "--max-length", str(ds.max_length), "--per-client-out", str(per),
                "--bootstrap", str(ds.bootstrap), "--seed", str(c.seed), "--json",
                *_opt("--max-samples", ds.eval_max_samples)],
                outputs=[str(E / f"{name}.json"), str(per)], inputs=[*inputs, *man],
                stdout_to=str(E / f"{name}.json")))
            return str(per)

        per = {}
        ckpt = train(name, [syn], [syn])
        per[name] = evaluate(name, ["--model", ckpt], [ckpt])
        if c.baselines:
            per["eps0"] = evaluate("eps0", ["--model", ds.model], [])
            # eps = inf: the same recipe on the private train split, size-matched to the
            # synthetic set so the comparison is about the data, not its amount
            inf = train("epsinf", [priv, "--train-split", "train"], [],
                        max_samples=c.num_synthetic)
            per["epsinf"] = evaluate("epsinf", ["--model", inf], [inf])
            self.runner.run(Stage("gap-closed", [
                "eval", "gap", "--method", per[name], "--eps0", per["eps0"],
                "--epsinf", per["epsinf"], "--bootstrap", str(ds.bootstrap), "--seed", str(c.seed),
                "--allow-undefined", "--json"],
                outputs=[str(self.p["eval"] / "gap.json")], inputs=list(per.values()),
                stdout_to=str(self.p["eval"] / "gap.json")))
        return per

    # ------------------------------------------------------------------ all
    def ledgers(self) -> list[str]:
        return [str(self.run / f"round{t}" / "ledger.jsonl") for t in range(1, self.cfg.rounds + 1)]

    def execute(self) -> dict:
        c = self.cfg
        with atomic_write(self.run / "config.resolved.json") as fh:
            json.dump(to_dict(c), fh, indent=2)
        self.data_stages()
        noise = self.calibrate()
        if c.method == "pe":
            self.expand_stage(self.pe_stages(noise["noise_multiplier"]))
        else:
            adapter = None
            for t in range(1, c.rounds + 1):
                adapter = self.round_stages(t, adapter, noise["noise_multiplier"])
            self.synthetic_stage(adapter)
        self.downstream_stages()
        self.runner.run(Stage("account", [
            "account", "ledger", *self.ledgers(), "--delta", repr(c.privacy.delta),
            "--accountant", c.privacy.accountant, "--json"],
            outputs=[str(self.run / "privacy.json")], inputs=self.ledgers(),
            stdout_to=str(self.run / "privacy.json")))
        if self.runner.dry_run:
            return {}
        results = self.results(noise)
        with atomic_write(self.run / "results.json") as fh:
            json.dump(results, fh, indent=2)
        with atomic_write(self.run / "results.md") as fh:
            fh.write(results_table(results) + "\n")
        return results

    def results(self, noise: dict) -> dict:
        c, E = self.cfg, self.p["eval"]
        priv = read_json(self.run / "privacy.json")
        out = {"run_dir": str(self.run), "epsilon": priv.get("epsilon"), "delta": priv.get("delta"),
               "accountant": priv.get("accountant"), "noise_multiplier": noise["noise_multiplier"],
               "sample_rate": noise["sample_rate"], "rounds": c.rounds, "prompts": c.prompts,
               "samples_per_prompt": c.samples_per_prompt, "num_synthetic": c.num_synthetic,
               "generator": c.generator.model, "downstream": c.downstream.model,
               "method": c.method, "seed": c.seed, "methods": {}}
        if c.method == "pe":
            out["pe"] = {"num_syn": c.pe.num_syn, "variation": c.pe.variation,
                         "lookahead": c.pe.lookahead,
                         "threshold": self.pe_threshold(noise["noise_multiplier"])}
            seeds = self.run / "pe_seeds.jsonl"
            if seeds.exists():
                with open(seeds, encoding="utf-8") as fh:
                    out["pe"]["seed_set"] = sum(1 for line in fh if line.strip())
        for name in (c.method, "eps0", "epsinf"):
            f = E / f"{name}.json"
            if f.exists():
                r = read_json(f)
                out["methods"][name] = {k: r.get(k) for k in ("accuracy", "accuracy_se", "loss",
                                                                "tokens", "clients")}
        if (E / "gap.json").exists():
            out["gap_closed"] = read_json(E / "gap.json")
        if (E / "fid.json").exists():
            out["fid_to_val"] = read_json(E / "fid.json").get("fid")
        recov = []
        for t in range(1, c.rounds + 1):
            rep = self.run / f"round{t}" / "prefs_report.json"
            if rep.exists():
                recov.append(read_json(rep).get("recovery_rate"))
        out["recovery_rate_per_round"] = recov
        out["stage_seconds"] = {k: round(v, 1) for k, v in self.runner.timings.items()}
        return out


def _fmt(x, nd=4):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


METHOD_LABELS = {"popri": "POPri", "pe": "PE (PrE-Text)", "pe-sft": "PE+SFT"}


def results_table(r: dict) -> str:
    eps = r.get("epsilon")
    method = r.get("method", "popri")
    if method == "pe":
        pe = r.get("pe", {})
        shape = (f"PE on {r['run_dir']}: T={r['rounds']} rounds, N_syn={pe.get('num_syn')}, "
                 f"variation {pe.get('variation')}, lookahead {pe.get('lookahead')}, "
                 f"H={_fmt(pe.get('threshold'), 2)}, seed set {pe.get('seed_set', '-')} -> "
                 f"N={r['num_synthetic']} expanded")
    else:
        shape = (f"{METHOD_LABELS.get(method, method)} on {r['run_dir']}: T={r['rounds']} rounds, "
                 f"K={r['prompts']} x J={r['samples_per_prompt']}, N={r['num_synthetic']} synthetic")
    lines = [f"{shape}, generator {r['generator']}, downstream {r['downstream']}", "",
             "| method | epsilon | delta | next-token accuracy | SE (clients) | loss | FID to val |",
             "|---|---|---|---|---|---|---|"]
    labels = {method: (METHOD_LABELS.get(method, method), _fmt(eps, 3)),
              "eps0": ("eps=0 (public model)", "0"), "epsinf": ("eps=inf (private data)", "inf")}
    for k, (label, e) in labels.items():
        m = r["methods"].get(k)
        if m:
            fid = _fmt(r.get("fid_to_val"), 3) if k == method else "-"
            lines.append(f"| {label} | {e} | {r.get('delta') if k == method else '-'} | "
                         f"{_fmt(m.get('accuracy'))} | {_fmt(m.get('accuracy_se'))} | "
                         f"{_fmt(m.get('loss'))} | {fid} |")
    g = r.get("gap_closed")
    if g and g.get("gap_closed") is None:
        lines += ["", f"gap closed: undefined ({g.get('undefined', 'eps=0 = eps=inf')})"]
    elif g:
        lines += ["", f"gap closed (acc - acc_eps0) / (acc_epsinf - acc_eps0): "
                      f"{_fmt(g.get('gap_closed'), 3)} +- {_fmt(g.get('gap_closed_se'), 3)} "
                      f"(paired bootstrap over test clients)"]
    rr = [x for x in r.get("recovery_rate_per_round", []) if x is not None]
    if rr:
        lines.append("recovery rate of preference pairs per round (POPri Fig. 6): "
                     + ", ".join(f"{x:.2f}" for x in rr))
    lines.append(f"noise multiplier z={r['noise_multiplier']:.4f}, q={r['sample_rate']:.4g}; "
                 f"total epsilon from the ledger ({r.get('accountant')}): {_fmt(eps, 4)}")
    return "\n".join(lines)
