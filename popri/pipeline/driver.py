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
lists them, rewritten by every run), cached by :mod:`popri.pipeline.stages`: unchanged stages are
skipped and a killed run continues from the last finished stage.  ``--dry-run`` prints that list
(the plan) on stdout and writes nothing.

Privacy: ``privacy.epsilon`` (at ``privacy.delta``, with ``privacy.accountant``) is the budget of
the WHOLE run directory: every ``ledger.jsonl`` below it is totalled (``popri account ledger
RUN``), the noise multiplier is calibrated to it (after the DP checkpoint-selection release when
``dpo.select_on: dp``), and a budget guard refuses, before it runs, any DP stage whose release
would take the total past it.  The noise-free recovery-rate scores are a diagnostic (``popri
score --diagnostic``): no ledger entry, not released, skipped in release mode.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from popri.pipeline import config as C
from popri.core import log
from popri.pipeline.config import RunConfig, to_dict
from popri.core.errors import ConfigError, InputError, PopriError
from popri.core.io import atomic_write, read_json
from popri.pipeline.stages import Stage, StageRunner


class BudgetError(ConfigError):
    """A DP stage would take the run past its budget (privacy.epsilon): exit 2, before it runs."""


#: relative slack of the budget guard (the calibration's own tolerance is far below it)
BUDGET_RTOL = 1e-6
#: the dry-run placeholder for a noise multiplier that depends on the fetched client count
Z_LATER = "<z: set after the fetch>"

MODE_NOTES = {
    "research": ("research mode: noise is seeded and reproducible from the sidecars; "
                 "not for release"),
    "release": "release mode: OS CSPRNG, discretised Gaussian",
}


def selection_note(on: str, cfg: RunConfig | None = None) -> str:
    """The checkpoint-selection line of the results table (what it reads, what it costs)."""
    if on == "private":
        return ("checkpoint selection: private validation split, not covered by epsilon "
                "(as POPri B.1)")
    if on == "public":
        return "checkpoint selection: public Omega embeddings (no privacy cost)"
    if on == "dp":
        e = f"{cfg.dpo.select_epsilon:g}, {C.select_delta(cfg):g}" if cfg else "eps_s, delta_s"
        return ("checkpoint selection: DP mean + covariance of the private validation split "
                f"('popri fred stats', ({e})-DP per release), included in the total epsilon")
    return "checkpoint selection: none (the last epoch's adapter)"


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
        self.dry_run = dry_run
        self.release = bool(cfg.release)
        self.select = C.select_on(cfg)       # private | public | dp | none
        self.runner = StageRunner(self.run, dry_run=dry_run)
        self.noise: dict = {}
        self.notes: list[str] = []            # dry run: said in the plan's header
        self.p = {
            "private": Path(cfg.data.dir) if cfg.data.dir else self.run / "data" / "private",
            "public": self.run / "data" / "public",
            "emb_private": self.run / "embeddings" / "private.npy",
            "emb_val": self.run / "embeddings" / "val.npy",
            "emb_public": self.run / "embeddings" / "public.npy",
            "select_stats": self.run / "selection" / "val_stats.npz",
            "synthetic": self.run / "synthetic.jsonl",
            "eval": self.run / "eval",
        }

    # ------------------------------------------------------------------ data
    def fetch_stages(self) -> None:
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
            raise ConfigError("is needed (the initial population Omega)",
                              field="data.public_source")

    def embed_stages(self) -> None:
        c = self.cfg
        for split, key in (("train", "emb_private"), ("val", "emb_val")):
            self.runner.run(Stage(f"embed-{split}", [
                "embed", str(self.p["private"]), "--split", split, "--out", str(self.p[key]),
                "--model", c.embedder],
                outputs=[str(self.p[key])], inputs=[str(self.p["private"] / "manifest.json")]))
        if self.select == "public":
            self.runner.run(Stage("embed-public", [
                "embed", *self.omega, "--out", str(self.p["emb_public"]), "--model", c.embedder],
                outputs=[str(self.p["emb_public"])], inputs=self._omega_inputs()))

    def data_stages(self) -> None:
        self.fetch_stages()
        self.embed_stages()

    # ------------------------------------------------------------------ privacy
    def _clients(self) -> int | None:
        """The private train split's client count N (None before the fetch)."""
        man = self.p["private"] / "manifest.json"
        if not man.exists():
            return None
        try:
            return int(read_json(man)["counts"]["train"]["clients"])
        except (KeyError, TypeError, ValueError):
            raise InputError("no counts.train.clients: not a popri dataset manifest",
                             path=str(man), field="counts") from None

    def needs_clients(self) -> bool:
        """Does z depend on N (q = clients_per_round / N, calibrated)?"""
        sc = self.cfg.score
        return bool(sc.clients_per_round) and not sc.sample_rate

    def _snap(self) -> float:
        """Release mode: the discretised Gaussian records z / (1 + SNAP_SHARE) at worst."""
        if not self.release:
            return 0.0
        try:
            from popri.privacy.noise import SNAP_SHARE
        except ImportError:
            return 0.0
        return float(SNAP_SHARE)

    def select_entries(self) -> list:
        """The prospective ledger entries of the DP checkpoint selection (dpo.select_on: dp):
        'popri fred stats' at user level, add/remove one client, analytic Gaussian: two q = 1
        Gaussian releases (mean, covariance) at the noise multiplier of (select_epsilon,
        select_delta) -- in release mode its lower bound after snapping."""
        if self.select != "dp":
            return []
        from popri.methods.fred import stats as F
        from popri.privacy.ledger import LedgerEntry

        dp = self.cfg.dpo
        z = F.noise_multiplier(dp.select_epsilon, C.select_delta(self.cfg), "analytic")
        z /= 1.0 + self._snap()
        design = F.Design("add-remove", "user", 1.0, None)
        return [LedgerEntry(stage="fred", mechanism="gaussian", noise_multiplier=z,
                            sample_rate=1.0, steps=1, delta=C.select_delta(self.cfg),
                            sensitivity=sens, sampling="none", neighbouring=design.neighbouring,
                            mode="release" if self.release else "research",
                            params={"release": what})
                for what, sens in (("mean", design.mean_sensitivity),
                                   ("covariance", design.cov_sensitivity))]

    def score_entry(self, t: int) -> list:
        """The prospective ledger entry of round t's DP scores (z, q, sensitivity; steps 1)."""
        from popri.privacy.ledger import LedgerEntry

        sc, n = self.cfg.score, self.noise
        if n.get("noise_multiplier") is None:
            return []  # a dry run before the fetch: z is not known yet
        q = float(n["sample_rate"])
        nn = self.cfg.method == "pe" or sc.mode == "nn-histogram"
        sampling = ("poisson" if sc.sample_rate else "fixed" if sc.clients_per_round else "none")
        return [LedgerEntry(stage="score", mechanism="subsampled_gaussian" if q < 1 else "gaussian",
                            noise_multiplier=float(n["noise_multiplier"]), sample_rate=q, steps=1,
                            delta=self.cfg.privacy.delta,
                            sensitivity=float(sc.max_samples_per_client if nn else sc.clip),
                            sampling=sampling, mode="release" if self.release else "research",
                            params={"round": t})]

    def _compose(self, entries: list):
        from popri.privacy import accounting as A

        pr = self.cfg.privacy
        try:
            return A.compose(entries, pr.delta, pr.accountant, alone=False)
        except A.ParameterError as e:
            raise BudgetError(f"cannot total the run's ledgers: {e.message}",
                              path=str(self.run), field="privacy.epsilon") from None

    def _calibrate(self, q: float, fixed: list) -> float:
        """Smallest z (to 1e-4) with the composition of T releases at (z, q) and the ``fixed``
        entries within privacy.epsilon."""
        from popri.privacy import accounting as A

        c, pr = self.cfg, self.cfg.privacy
        try:
            if not fixed:
                return A.noise_multiplier(pr.epsilon, q, c.rounds, pr.delta, pr.accountant)
            spent = self._compose(fixed).epsilon
            if not spent < pr.epsilon:
                raise ConfigError(f"the DP checkpoint selection alone spends epsilon={spent:.4g} "
                                  f"of the budget privacy.epsilon={pr.epsilon:g} (at delta="
                                  f"{pr.delta:g}): lower dpo.select_epsilon",
                                  field="dpo.select_epsilon")
            f = lambda z: self._compose([(z, q, c.rounds), *fixed]).epsilon  # noqa: E731
            return A._bisect(f, pr.epsilon, *A._bracket(f, pr.epsilon), 1e-4)[1]
        except A.ParameterError as e:
            raise ConfigError(f"no noise multiplier meets the budget: {e.message}",
                              field="privacy.epsilon") from None

    def calibrate(self) -> dict:
        """z and q of the score rounds.  Before the fetch, when q = clients_per_round / N needs
        the client count: a dry run gets z = None ('set after the fetch'), a real run an error."""
        c, pr, sc = self.cfg, self.cfg.privacy, self.cfg.score
        n = self._clients()
        if sc.sample_rate:
            q = float(sc.sample_rate)
        elif sc.clients_per_round:
            if n is None:
                if not self.dry_run:
                    raise PopriError("internal: calibrate() before the fetch")
                how = (f"z is set after the fetch: q = score.clients_per_round "
                       f"({sc.clients_per_round}) / N, the private train split's client count")
                return {"noise_multiplier": None, "noise_arg": None, "sample_rate": None,
                        "clients": None, "how": how}
            if sc.clients_per_round > n:
                raise ConfigError(f"{sc.clients_per_round} exceeds the {n} clients of the private "
                                  f"train split ({self.p['private']})",
                                  field="score.clients_per_round")
            q = sc.clients_per_round / n
        else:
            q = 1.0
        snap = self._snap()
        if pr.noise_multiplier is not None:
            arg = float(pr.noise_multiplier)
            z = arg / (1.0 + snap)
            how = "given"
        else:
            z = self._calibrate(q, self.select_entries())
            arg = z * (1.0 + snap)
            how = f"calibrated to eps={pr.epsilon}, delta={pr.delta} over T={c.rounds} rounds"
            if self.select == "dp":
                how += " after the DP checkpoint-selection release"
        if snap:
            how += f"; passed as {arg!r} (release mode: the snapped mechanism keeps >= z)"
        return {"noise_multiplier": z, "noise_arg": arg, "sample_rate": q, "clients": n,
                "how": how}

    def _noise_line(self) -> str:
        n = self.noise
        if n.get("noise_multiplier") is None:
            return f"noise multiplier: {n.get('how')}"
        return (f"noise multiplier z={n['noise_multiplier']:.4f} ({n['how']}; "
                f"q={n['sample_rate']:.4g}"
                + (f", {n['clients']} clients)" if n.get("clients") is not None else ")"))

    # ------------------------------------------------------------------ budget guard
    def dp_stages(self) -> list[tuple[str, list, Path, object]]:
        """Every DP release of the plan: (stage name, prospective entries, its ledger, a test
        for entries of that stage)."""
        out = []
        if self.select == "dp":
            out.append(("select-stats", self.select_entries(),
                        self.p["select_stats"].parent / "ledger.jsonl",
                        lambda e: e.stage == "fred"))
        for t in range(1, self.cfg.rounds + 1):
            out.append((f"round{t}-score", self.score_entry(t),
                        self.run / f"round{t}" / "ledger.jsonl",
                        lambda e, t=t: e.stage == "score" and e.params.get("round") == t))
        return out

    def existing_entries(self) -> list:
        """Every release already recorded under the run directory (deduplicated)."""
        from popri.privacy.ledger import LEDGER_NAME, dedupe, read_ledger

        if not self.run.is_dir():
            return []
        out = []
        for f in sorted(self.run.rglob(LEDGER_NAME)):
            out += read_ledger(f)
        return dedupe(out)

    def _over(self, entries: list, what: str) -> None:
        pr = self.cfg.privacy
        total = self._compose(entries)
        if total.epsilon > pr.epsilon * (1.0 + BUDGET_RTOL):
            raise BudgetError(
                f"{what} would take the run to epsilon={total.epsilon:.6g} > the budget "
                f"privacy.epsilon={pr.epsilon:g} (delta={pr.delta:g}, {pr.accountant}; "
                f"{total.entries} releases, those already in the ledgers under {self.run} "
                "included): use a new run_dir, a larger budget, or more noise",
                path=str(self.run), field="privacy.epsilon")

    def check_plan(self) -> None:
        """Before the first stage: the releases already in the run's ledgers plus those the plan
        still has to make must fit the budget.  (A stage with a finished marker counts as done,
        and in research mode one whose ledger already holds its entry as a seeded rerun, which
        is not a new release: a lower bound; the guard before each DP stage is exact.)"""
        pr = self.cfg.privacy
        if pr.epsilon is None:
            log.warn("run: no privacy.epsilon: the noise multiplier is given and no budget is "
                     "enforced")
            return
        if self.noise.get("noise_multiplier") is None:
            return  # z is set after the fetch; checked then
        from popri.privacy.ledger import read_ledger

        add = []
        for name, entries, own, match in self.dp_stages():
            if (self.runner.marker_dir / f"{name}.json").exists():
                continue
            if not self.release and own.is_file() and any(match(e) for e in read_ledger(own)):
                continue
            add += entries
        if add:
            self._over(self.existing_entries() + add, "the plan")

    def guard(self, name: str, entries: list, own: Path, match):
        """The budget guard of one DP stage (Stage.before): compose every release in the run's
        ledgers with the stage's own; refuse to start it past the budget.  A research-mode
        rerun of the same attempt (same stage key: same inputs and arguments, so the same
        seeded release and release_id) is not counted twice."""
        def before(key: str) -> None:
            from popri.privacy.ledger import read_ledger

            pending = self.runner.marker_dir / f"{name}.guard.json"
            mine = [e for e in read_ledger(own) if match(e)] if own.is_file() else []
            prev = {}
            if pending.is_file():
                try:
                    prev = json.loads(pending.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    prev = {}
            if self.cfg.privacy.epsilon is not None:
                seen = set(prev.get("before", [])) if prev.get("key") == key else None
                rerun = (not self.release and seen is not None
                         and any(e.release_id not in seen for e in mine))
                self._over(self.existing_entries() + ([] if rerun else entries), f"stage {name}")
            if prev.get("key") != key:
                with atomic_write(pending) as fh:
                    json.dump({"key": key, "before": [e.release_id for e in mine]}, fh)

        return before

    # ------------------------------------------------------------------ rounds
    def gen_args(self, *, adapter: str | None, seed: int) -> list[str]:
        g = self.cfg.generator
        return ["--model", g.model, "--backend", g.backend, "--temperature", str(g.temperature),
                "--top-p", str(g.top_p), "--max-new-tokens", str(g.max_new_tokens),
                "--max-tokens", str(g.max_tokens), "--batch-size", str(g.batch_size),
                "--seed", str(seed), *_flag("bf16", g.bf16), *_opt("--adapter", adapter)]

    def score_args(self, z: float | None, seed: int, t: int, *, mode: str | None = None,
                   threshold: float | str | None = None) -> list[str]:
        """``z``: the noise multiplier passed to score (None in a dry run before the fetch)."""
        sc, pr = self.cfg.score, self.cfg.privacy
        mode = mode or sc.mode
        a = ["--mode", mode, "--private", str(self.p["emb_private"]), "--noise-multiplier",
             Z_LATER if z is None else repr(z), "--seed", str(seed), "--delta", repr(pr.delta),
             "--round", str(t), "--model", self.cfg.embedder,
             *_opt("--clients-per-round", sc.clients_per_round),
             *_opt("--sample-rate", sc.sample_rate), *(["--release"] if self.release else [])]
        if mode == "cosine":
            a += ["--clip", repr(sc.clip), *_flag("standardize", sc.standardize)]
        else:
            th = sc.threshold if threshold is None else threshold
            a += ["--max-samples-per-client", str(sc.max_samples_per_client),
                  "--threshold", th if isinstance(th, str) else repr(th)]
        return a

    def score_stage(self, t: int, synthetic: str | Path, out: Path, seed: int, *,
                    mode: str | None = None, threshold: float | str | None = None) -> None:
        """Round t's DP scores (ledger next to ``out``), behind the budget guard."""
        name = f"round{t}-score"
        _, entries, own, match = next(d for d in self.dp_stages() if d[0] == name)
        self.runner.run(Stage(name, [
            "score", "--synthetic", str(synthetic), "--out", str(out),
            *self.score_args(self.noise.get("noise_arg"), seed, t, mode=mode,
                             threshold=threshold)],
            outputs=[str(out)], inputs=[str(synthetic), str(self.p["emb_private"])],
            before=self.guard(name, entries, own, match)))

    def exact_stage(self, t: int, synthetic: str | Path, seed: int) -> Path | None:
        """The noise-free scores of round t's samples for the recovery rate (POPri Fig. 6):
        ``popri score --diagnostic`` (no ledger entry, marked not private), kept in
        RUN/diagnostics.  Not in release mode: they are an exact function of private data."""
        c = self.cfg
        if not c.score.recovery_rate or self.release:
            return None
        exact = self.run / "diagnostics" / f"round{t}" / "exact.npy"
        ex = ["--diagnostic", "--noise-multiplier", "0", "--seed", str(seed), "--model",
              c.embedder, "--private", str(self.p["emb_private"]), "--mode", c.score.mode]
        # no clipping in effect: a client's vector of mean cosines has norm <= sqrt(n_syn),
        # below 1e6 (score's largest --clip) for any n_syn < 1e12
        ex += (["--no-standardize", "--clip", "1e6"] if c.score.mode == "cosine"
               else ["--max-samples-per-client", str(c.score.max_samples_per_client)])
        self.runner.run(Stage(f"round{t}-exact-scores", [
            "--quiet", "score", "--synthetic", str(synthetic), "--out", str(exact), *ex],
            outputs=[str(exact)], inputs=[str(synthetic), str(self.p["emb_private"])]))
        return exact

    def select_args(self) -> tuple[list[str], list[str]]:
        """dpo's checkpoint-selection options and inputs for dpo.select_on."""
        target = {"private": self.p["emb_val"], "public": self.p["emb_public"],
                  "dp": self.p["select_stats"]}.get(self.select)
        if target is None:
            return [], []
        return ["--select-on", str(target)], [str(target)]

    def select_stats_stage(self) -> None:
        """dpo.select_on: dp -- the validation split's embedding mean and covariance, released
        once under DP ('popri fred stats', user level, add/remove one client: the relation of
        the score releases, so one accountant totals them), behind the budget guard."""
        c, dp = self.cfg, self.cfg.dpo
        name = "select-stats"
        _, entries, own, match = next(d for d in self.dp_stages() if d[0] == name)
        out = self.p["select_stats"]
        self.runner.run(Stage(name, [
            "fred", "stats", "--private", str(self.p["emb_val"]), "--out", str(out),
            "--epsilon", repr(dp.select_epsilon), "--delta", repr(C.select_delta(c)),
            "--level", "user", "--relation", "add-remove", "--calibration", "analytic",
            "--seed", str(c.seed), *(["--release"] if self.release else [])],
            outputs=[str(out)], inputs=[str(self.p["emb_val"])],
            before=self.guard(name, entries, own, match)))

    def round_stages(self, t: int, adapter: str | None) -> str:
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
        self.score_stage(t, samples, scores, seed)
        if c.method == "pe-sft":
            return self.sft_stage(t, samples, scores, adapter, seed)
        prefs_extra, prefs_inputs = [], [str(samples), str(scores)]
        exact = self.exact_stage(t, samples, seed)
        if exact is not None:
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
        sel, sel_inputs = self.select_args()
        if sel:
            args += [*sel, "--select-prompts", str(R / "prompts.jsonl"), "--select-samples",
                     str(dp.select_samples), "--embed-model", c.embedder]
            inputs += [*sel_inputs, str(R / "prompts.jsonl")]
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
    def pe_threshold(self, z: float | None) -> float | str:
        """H (PrE-Text D.2: the noise std z * M unless pe.threshold); a placeholder while z is
        unknown (dry run before the fetch)."""
        from popri.methods.pe.draw import default_threshold

        pe = self.cfg.pe
        if pe.threshold is not None:
            return float(pe.threshold)
        if z is None:
            return "<H = z * M: set after the fetch>"
        return default_threshold(z, self.cfg.score.max_samples_per_client)

    def vary_args(self) -> list[str]:
        pe, g = self.cfg.pe, self.cfg.generator
        model = pe.variation_model or (None if pe.variation == "mask-fill" else g.model)
        return ["--method", pe.variation, *_opt("--model", model), "--mask-ratio", repr(pe.mask_ratio),
                "--steps", str(pe.mask_steps), "--temperature", repr(g.temperature),
                "--top-p", repr(g.top_p), "--max-tokens", str(g.max_tokens),
                "--max-new-tokens", str(g.max_new_tokens), "--batch-size", str(g.batch_size),
                *_flag("bf16", g.bf16),
                *(["--fallback-model", g.model] if pe.fallback else ["--no-fallback"])]

    def pe_stages(self) -> str:
        """PrE-Text Algorithm 1: S_1 from public text; per round the DP nearest-neighbour vote
        (with lookahead), survivors drawn from P_t, their variations as the next population; the
        union of the survivor sets is the DP seed set.  Returns the seed set's path."""
        c, pe = self.cfg, self.cfg.pe
        H = self.pe_threshold(self.noise.get("noise_arg"))
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
            self.score_stage(t, syn, hist, seed, mode="nn-histogram", threshold=H)
            surv = R / "survivors.jsonl"
            self.runner.run(Stage(f"round{t}-draw", [
                "pe", "draw", "--population", str(pop), "--scores", str(hist), "--num",
                str(pe.num_syn), "--round", str(t), "--seed", str(seed), "--out", str(surv),
                "--stats-out", str(R / "draw_stats.json"),
                *(["--release"] if self.release else [])],
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
        """The ledgers under the run directory now (every DP release anywhere in it counts)."""
        from popri.privacy.ledger import LEDGER_NAME

        return [str(f) for f in sorted(self.run.rglob(LEDGER_NAME))] if self.run.is_dir() else []

    def account_stage(self) -> None:
        """The run's total: 'popri account ledger RUN' (every ledger.jsonl below RUN)."""
        c = self.cfg
        self.runner.run(Stage("account", [
            "account", "ledger", str(self.run), "--delta", repr(c.privacy.delta),
            "--accountant", c.privacy.accountant, "--json"],
            outputs=[str(self.run / "privacy.json")], inputs=self.ledgers(),
            stdout_to=str(self.run / "privacy.json")))

    def execute(self) -> dict:
        """Run (or with dry_run plan) every stage.  Config values were checked by config.load;
        here, before the first stage: the calibration and the budget of the whole plan (when z
        does not depend on the client count; else right after the fetch)."""
        c = self.cfg
        try:
            C.check_files(c)
        except ConfigError as e:
            if not self.dry_run:
                raise
            self.notes.append(f"note: a real run would stop here: {e}")
        early = not self.needs_clients() or self._clients() is not None
        if early:
            self.noise = self.calibrate()
            self.check_plan()
            if not self.dry_run:
                log.info(f"run: {self._noise_line()}")
        if not self.dry_run:
            with atomic_write(self.run / "config.resolved.json") as fh:
                json.dump(to_dict(c), fh, indent=2)
        self.fetch_stages()
        if not early:
            self.noise = self.calibrate()
            self.check_plan()
            if not self.dry_run:
                log.info(f"run: {self._noise_line()}")
        self.embed_stages()
        if self.select == "dp":
            self.select_stats_stage()
        if c.method == "pe":
            self.expand_stage(self.pe_stages())
        else:
            adapter = None
            for t in range(1, c.rounds + 1):
                adapter = self.round_stages(t, adapter)
            self.synthetic_stage(adapter)
        self.downstream_stages()
        self.account_stage()
        if self.dry_run:
            return {}
        results = self.results(self.noise)
        with atomic_write(self.run / "results.json") as fh:
            json.dump(results, fh, indent=2)
        with atomic_write(self.run / "results.md") as fh:
            fh.write(results_table(results) + "\n")
        return results

    def plan_text(self) -> str:
        """The dry-run plan: how z is set, then every command (no side effects)."""
        pr = self.cfg.privacy
        lines = [f"# popri run {self.run}: plan (dry run: nothing runs, nothing is written)",
                 f"# {MODE_NOTES['release' if self.release else 'research']}",
                 f"# {self._noise_line()}"]
        if pr.epsilon is not None:
            lines.append(f"# budget: epsilon={pr.epsilon:g} at delta={pr.delta:g} "
                         f"({pr.accountant}) for every ledger under {self.run}")
        if self.cfg.method == "popri":
            lines.append(f"# {selection_note(self.select, self.cfg)}")
        lines += [f"# {n}" for n in self.notes]
        return "\n".join(lines + self.runner.commands)

    def results(self, noise: dict) -> dict:
        c, E = self.cfg, self.p["eval"]
        priv = read_json(self.run / "privacy.json")
        out = {"run_dir": str(self.run), "epsilon": priv.get("epsilon"), "delta": priv.get("delta"),
               "accountant": priv.get("accountant"), "noise_multiplier": noise["noise_multiplier"],
               "sample_rate": noise["sample_rate"], "rounds": c.rounds, "prompts": c.prompts,
               "samples_per_prompt": c.samples_per_prompt, "num_synthetic": c.num_synthetic,
               "generator": c.generator.model, "downstream": c.downstream.model,
               "method": c.method, "seed": c.seed, "methods": {},
               "budget": {"epsilon": c.privacy.epsilon, "delta": c.privacy.delta,
                          "accountant": c.privacy.accountant},
               "mode": "release" if self.release else "research",
               "mode_note": MODE_NOTES["release" if self.release else "research"]}
        if c.method == "popri":
            out["checkpoint_selection"] = {
                "on": self.select, "note": selection_note(self.select, c),
                **({"epsilon": c.dpo.select_epsilon, "delta": C.select_delta(c)}
                   if self.select == "dp" else {})}
        if c.method == "pe":
            out["pe"] = {"num_syn": c.pe.num_syn, "variation": c.pe.variation,
                         "lookahead": c.pe.lookahead,
                         "threshold": self.pe_threshold(noise.get("noise_arg"))}
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
        if c.score.recovery_rate and self.release and c.method != "pe":
            out["recovery_rate_note"] = ("not computed in release mode (the noise-free "
                                         "diagnostic scores are not private)")
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
    b = r.get("budget") or {}
    if b.get("epsilon") is not None:
        lines.append(f"budget: epsilon={b['epsilon']:g} at delta={b['delta']:g} "
                     f"({b['accountant']}), every ledger.jsonl under the run directory")
    mode = r.get("mode")
    if mode:
        lines.append(r.get("mode_note") or MODE_NOTES.get(mode, mode))
    sel = r.get("checkpoint_selection")
    if sel:
        lines.append(sel.get("note") or selection_note(sel.get("on", "private")))
    if r.get("recovery_rate_note"):
        lines.append(f"recovery rate: {r['recovery_rate_note']}")
    return "\n".join(lines)
