"""``popri run``: one method-agnostic driver for every method's recipe.

    popri run examples/default.yaml                      # the embedded default (POPri)
    popri run examples/pe.yaml                           # PrE-Text
    popri run examples/default.yaml --set rounds=1 --set privacy.epsilon=7 --dry-run

The driver runs, in order:

1. **data** (every method): fetch the private federated split and the public Omega, embed the
   private train and validation splits (:meth:`Run.data_stages`);
2. **privacy**: plan the noise (z calibrated to ``privacy.epsilon`` over the plan's DP
   releases, a :class:`~popri.privacy.plan.Noise`) and check the plan against the budget
   (:class:`popri.pipeline.budget.Budget`);
3. **the method's recipe**: ``METHODS[cfg.method].recipe(run)`` yields the method's stages
   (:mod:`popri.pipeline.recipes`; POPri: :mod:`popri.methods.popri.recipe`, PE:
   :mod:`popri.methods.pe.recipe`), ending with ``RUN/synthetic.jsonl``;
4. **evaluation** (every method): the downstream model trained on the synthetic set, next-token
   accuracy on the private test split, the eps = 0 / eps = inf baselines and the gap closed
   (:meth:`Run.downstream_stages`);
5. **account**: ``popri account ledger RUN`` totals every ledger under the run directory.

Each stage is one ``popri`` subcommand (a :class:`popri.kit.Stage`, built by the recipe with
the recipe kit), cached by :mod:`popri.pipeline.stages` (content hashes,
popri's version and the POPRI_* settings in the key); ``RUN/commands.sh`` lists them and
``--dry-run`` prints them with no side effects.  A stage that declares a DP release
(``Stage.release``) runs behind the budget guard.

Seeds: every stage's seed is derived from ``cfg.seed`` by a named rule (:func:`round_seed`,
:func:`final_seed`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

from popri.core import log, outdir
from popri.core.errors import ConfigError, InputError, PopriError
from popri.core.io import atomic_write, read_json
from popri.kit import (
    RunPaths,
    Stage,
)
from popri.pipeline import config as C
from popri.pipeline.budget import Budget, BudgetError
from popri.pipeline.config import RunConfig, to_dict
from popri.pipeline import results as R
from popri.pipeline.results import (  # noqa: F401  (re-exported: the API before issue 46)
    MODE_NOTES,
    draws_summary,
    draws_verdict,
    epsilon_words,
    git_commit,
    results_table,
    run_precision,
    strings_of,
)
from popri.methods.steps import is_file_source
from popri.pipeline.recipes import get_method
from popri.pipeline.reuse import COPIED, lenders_of
from popri.pipeline.stages import RunLock, StageRunner
from popri.privacy.ledger import LEDGER_NAME, read_ledger
from popri.privacy.plan import Noise
from popri.specs.commands.account import AccountLedgerCall



class Run:
    """One ``popri run``: the config, the run directory's paths, the stage runner and the
    budget (:class:`~popri.pipeline.budget.Budget`, which plans the noise).

    It is the :class:`~popri.methods.base.RunContext` the methods' recipes and hooks get:
    ``cfg``, ``paths``, ``release``, ``dry_run``, ``select``, ``omega`` / ``omega_inputs``,
    ``method``, ``noise``, :meth:`disclosed_clients`, :meth:`selection_entries` and
    :meth:`score_entries`.  It builds no stage of a method: the recipes do, with the shared
    steps of :mod:`popri.methods.steps`; it plans the budget, runs the stages and writes the
    results."""

    def __init__(self, cfg: RunConfig, *, dry_run: bool = False, rerun: bool = False,
                 inputs: Iterable[str | os.PathLike] = (),
                 reuse_from: Iterable[str | os.PathLike] = ()):
        self.cfg = cfg
        # what the command read besides the config's paths (its YAML): kept in a run directory
        self.inputs = [os.fspath(x) for x in inputs if x]
        self.method = get_method(cfg.method)
        self.run = Path(cfg.run_dir)
        self.dry_run = dry_run
        # --rerun: finished DP stages may run again (each a new release, within the budget)
        self.rerun = bool(rerun)
        self.release = bool(cfg.release)
        self.select = C.select_on(cfg)       # private | public | dp | none
        self.runner = StageRunner(self.run, dry_run=dry_run)
        self.runner.accountant = cfg.privacy.accountant
        # --reuse-from: finished stages of other runs copied instead of run (popri.pipeline.reuse)
        self.runner.lenders = lenders_of(reuse_from, self.run, self.release)
        self.runner.convention = cfg.privacy.convention
        self.notes: list[str] = []            # dry run: said in the plan's header
        self.paths = RunPaths.of(self.run, cfg.data.dir)
        self.budget = Budget(cfg, self.method, self.paths, dry_run=dry_run)
        d = cfg.data
        # Omega, the public population: a JSONL file, or the fetched dataset's train split
        # (the ``--split`` every command reading it defaults to)
        self.omega = (d.public_source if d.public_source and is_file_source(d.public_source)
                      else str(self.paths.public))
        self.omega_inputs = [self.omega]

    # ------------------------------------------------------------------ what a recipe reads
    @property
    def noise(self) -> Noise | None:
        """The planned noise of the DP rounds (:meth:`Budget.plan`); None before it is planned
        or while z waits for the client count."""
        return self.budget.noise

    def disclosed_clients(self) -> int | None:
        """N where the method's accounting makes it public, else None
        (:meth:`Budget.disclosed_clients`)."""
        return self.budget.disclosed_clients()

    def selection_entries(self, call=None) -> list:
        """The DP checkpoint selection's prospective ledger entries, planned from the stage's
        ``call`` (:meth:`Budget.select_entries`)."""
        return self.budget.select_entries(call)

    def score_entries(self, t: int, call) -> list:
        """A score stage's prospective ledger entry, planned from its call
        (:meth:`Budget.score_entries`)."""
        return self.budget.score_entries(t, call)

    # ------------------------------------------------------------------ stages
    def stage(self, st: Stage) -> bool:
        """Run one stage (cached); a declared DP release runs behind the budget guard."""
        if st.release is not None and st.before is None:
            st.before = self.budget.guard(st.name, st.release, self.runner)
        return self.runner.run(st)

    def plan(self) -> list[Stage]:
        """The method's stages, built (not run): recipes are pure functions of the config, the
        paths and the noise, so the whole plan is known before its first stage runs."""
        return list(self.method.recipe(self))

    # ------------------------------------------------------------------ the budget of the plan
    def dp_stages(self) -> list[tuple[str, list, Path, object]]:
        """Every DP release of the plan, as its stages declare them (``Stage.release``): (stage
        name, prospective entries, the ledger it appends to, a test for its entries)."""
        return [(s.name, s.release.entries, Path(s.release.ledger), s.release.match)
                for s in self.plan() if s.release is not None]

    def dp_reruns(self) -> list[tuple[str, str]]:
        """(stage, why) of every finished DP stage of the plan -- it has a marker and its
        ledger holds its release -- that would run again (its settings, inputs or outputs
        changed: the survey's reason), said before anything runs.  Not among them: a stage
        whose release committed before a stop (it is kept: :meth:`StageRunner._adopt`), and a
        stage that never finished (an attempt stopped before its outputs: research mode's
        retry of that very attempt is the same seeded release; any other attempt is counted
        as a new release by :meth:`check_plan`)."""
        todo = dict(self.survey()[1])
        keys = self.runner.planned_keys
        out = []
        for st in self.plan():
            if st.release is None or st.name not in todo or not self.runner.marker(st):
                continue
            key = keys.get(st.name)
            if key is not None and self.runner.committed(st, key):
                continue
            own = Path(st.release.ledger)
            if own.is_file() and any(st.release.match(e) for e in read_ledger(own)):
                out.append((st.name, todo[st.name]))
        return out

    def check_reruns(self) -> list[str]:
        """Refuse (one line, exit 2, nothing run) a run that would rerun finished DP stages
        unless ``--rerun`` was given; returns their names (each counted as a new release by
        :meth:`check_plan`).  A dry run notes the refusal instead and shows the plan."""
        reruns = self.dp_reruns()
        self._refused_reruns: set[str] = set()
        if not reruns or self.rerun:
            if reruns and not self.dry_run:
                log.warn("run: --rerun: " + ", ".join(f"{n} ({why})" for n, why in reruns)
                         + ": released before and run again, each a new DP release (unless "
                           "it reproduces its release bit for bit)")
            return [n for n, _ in reruns]
        shown = ", ".join(f"{n} ({why})" for n, why in reruns)
        e = ConfigError(f"{shown}: already released (its ledger under {self.run} holds it) and "
                        f"would run again, a new DP release: nothing was run; pass --rerun to "
                        f"spend it (checked against privacy.epsilon first), or use a new "
                        f"run_dir", path=str(self.run), field="rerun")
        if self.dry_run:  # the plan is still shown; the refused reruns are not counted
            self.notes.append(f"note: a real run would stop here: {e}")
            self._refused_reruns = {n for n, _ in reruns}
            return []
        raise e

    def check_plan(self) -> None:
        """Before the first stage: the releases already in the run's ledgers plus those the plan
        still has to make must fit the budget (:meth:`Budget.check`).  A DP stage counts as
        done when its cached result is current -- the same settings, inputs and outputs, not
        just a marker -- or its release committed before a stop (it is kept), or (research
        mode) it retries the very attempt that recorded its release, stopped before its outputs
        (same key and thread count: the same seeded release).  A finished DP stage that would
        run again is refused without --rerun and with it counted as a new release
        (:meth:`check_reruns`); so is every other stage still to run.  The guard before each DP
        stage is exact (:meth:`Budget.guard`)."""
        pr = self.cfg.privacy
        reruns = set(self.check_reruns())
        if pr.epsilon is None:
            log.warn(f"run: {self.cfg.method} has no DP guarantee: the ledger records eps = inf "
                     "and no budget is enforced" if not self.method.dp else
                     "run: no privacy.epsilon: the noise multiplier is given and no budget is "
                     "enforced")
            return
        if self.noise is None or self.noise.z is None:
            return  # z is set after the fetch; checked then

        add = []
        cached = set(self.survey()[0])  # current: same settings, inputs and outputs
        keys = self.runner.planned_keys
        for st in self.plan():
            if st.release is None:
                continue
            entries, own, match = st.release.entries, Path(st.release.ledger), st.release.match
            key = keys.get(st.name)
            if st.name in cached or (key is not None and self.runner.committed(st, key)):
                continue  # done, or committed before a stop (kept when it runs: adopted)
            if st.name in self._refused_reruns:
                continue  # a dry run: a real run stops before it (check_reruns)
            if (st.name not in reruns and not self.release and key is not None
                    and self.runner.same_attempt(st.name, key) and own.is_file()
                    and any(match(e) for e in read_ledger(own))):
                continue  # a retry of the attempt that recorded it: the same seeded release
            add += entries
        self.budget.check(add, "the plan")

    # ------------------------------------------------------------------ data
    def fetch_stages(self) -> Iterable[Stage]:
        """The method's data stages (:meth:`Method.data`; default
        :func:`popri.methods.steps.fetch_text`)."""
        return self.method.data(self)

    def embed_stages(self) -> Iterable[Stage]:
        """The method's embedding stages (:meth:`Method.embeddings`; default
        :func:`popri.methods.steps.embed_private`)."""
        return self.method.embeddings(self)

    # ------------------------------------------------------------------ evaluation
    def downstream_stages(self) -> Iterable[Stage]:
        """The method's evaluation stages (:meth:`Method.evaluation`; default
        :func:`popri.methods.steps.downstream_evaluation`).  None in release mode: every evaluation reads the
        private splits without noise (accuracy and losses per test client, FID to the
        validation split, the eps = inf model trained on the private data), so a release run
        ends at what it releases -- the synthetic set or the DP model, and the ledger -- and the
        benchmark's measurements are research mode's (docs/privacy.md, "Release mode")."""
        if self.release:
            return iter(())
        return self.method.evaluation(self)

    def ledgers(self) -> list[str]:
        """The ledgers under the run directory now (every DP release anywhere in it counts)."""
        return [str(f) for f in sorted(self.run.rglob(LEDGER_NAME))] if self.run.is_dir() else []

    def account_stage(self) -> bool:
        """The run's total: 'popri account ledger RUN' (every ledger.jsonl below RUN), built
        after the other stages ran so that its inputs are the ledgers they wrote."""
        c = self.cfg
        return self.stage(Stage("account", AccountLedgerCall(
            paths=(str(self.run),), delta=c.privacy.delta, accountant=c.privacy.accountant,
            convention=c.privacy.convention, as_json=True),
            outputs=[str(self.run / "privacy.json")], inputs=self.ledgers(),
            stdout_to=str(self.run / "privacy.json")))

    # ------------------------------------------------------------------ all
    def _set_noise(self) -> None:
        self.budget.plan()
        self._survey = None
        self.check_plan()
        if not self.dry_run:
            log.info(f"run: {self.budget.noise_line()}")
            if (self.noise is not None and self.noise.z is not None) or not self.method.dp:
                log.info(f"run: {self.reuse_line()}")

    def all_stages(self) -> list[Stage]:
        """Every stage of the run in order (built, not run; the ledger total excluded)."""
        return [*self.fetch_stages(), *self.embed_stages(), *self.plan(),
                *self.downstream_stages()]

    def survey(self) -> tuple[list[str], list[tuple[str, str]]]:
        """(cached stage names, [(stage to run, why)]) for the current noise: what the run will
        reuse and what it will run (:meth:`StageRunner.survey`), computed once per noise."""
        survey = getattr(self, "_survey", None)
        if survey is None:
            survey = self._survey = self.runner.survey(self.all_stages())
            self.runner.total = len(survey[0]) + len(survey[1]) + 1  # + account
            self.runner.planned_to_run = len(survey[1]) + 1
        return survey

    def reuse_line(self) -> str:
        """``N cached[, K to copy (--reuse-from): STAGE, ...], M to run: STAGE (why), ...`` --
        said before anything runs."""
        cached, todo = self.survey()
        copied = [n for n, why in todo if why.startswith(COPIED)]
        todo = [(n, why) for n, why in todo if not why.startswith(COPIED)]
        lent = ""
        if copied:
            more = f", and {len(copied) - 12} more" if len(copied) > 12 else ""
            lent = f", {len(copied)} to copy (--reuse-from): {', '.join(copied[:12])}{more}"
        if not todo:
            return (f"{len(cached)} cached{lent}, 0 to run"
                    + ("" if copied else ": everything is up to date"))
        shown = ", ".join(f"{n} ({why})" for n, why in todo[:12])
        more = f", and {len(todo) - 12} more" if len(todo) > 12 else ""
        return f"{len(cached)} cached{lent}, {len(todo)} to run: {shown}{more}"

    def execute(self) -> dict:
        """Run (or with dry_run plan) every stage.  Config values were checked by config.load;
        here, before the first stage: the calibration and the budget of the whole plan (when z
        does not depend on the client count; else right after the fetch).  A real run holds
        the run directory's lock (:class:`~popri.pipeline.stages.RunLock`) from the budget
        check to its last marker: a second ``popri run`` on it is refused."""
        c = self.cfg
        try:
            C.check_files(c)
        except ConfigError as e:
            if not self.dry_run:
                raise
            self.notes.append(f"note: a real run would stop here: {e}")
        if self.dry_run:
            return self._execute()
        self._check_run_dir()
        with RunLock(self.run) as lock:
            self.runner.lock_fd = lock.fd  # every stage holds it too, while it lives
            self._check_same_method()
            self.started = time.time()
            try:
                return self._execute()
            finally:
                self.runner.lock_fd = None
                self.runner.close_zygote()

    def _check_same_method(self) -> None:
        """A run directory holds one method's run: another method's config there is refused
        before anything is written (its stages, ledgers and results would mix)."""
        f = self.run / "config.resolved.json"
        if not f.is_file():
            return
        try:
            old = json.loads(f.read_text(encoding="utf-8")).get("method")
        except (OSError, ValueError, AttributeError):
            return
        if old is not None and old != self.cfg.method:
            raise ConfigError(f"holds a {old!r} run; this config's method is "
                              f"{self.cfg.method!r}: use another run_dir", path=str(self.run),
                              field="method")

    #: the files ``popri run`` writes at the top of its run directory
    RUN_FILES = ("config.resolved.json", "commands.sh", "results.json", "results.md",
                 "privacy.json")

    #: what a directory popri did not write may hold and still become a run directory, besides
    #: the run's own inputs and ledgers: a prepared dataset where a fetch puts it (RUN/data)
    PREPARED = ("data",)

    def _kept(self, entry: Path) -> bool:
        """``entry`` (at the top of a run directory popri did not write) is something the run
        reads: :data:`PREPARED`, a ledger (``ledger.jsonl``, or a folder of nothing but
        ledgers: the budget counts their releases), or one of the run's inputs (its YAML,
        ``self.inputs``; a path the config names: data.dir, a data source, a model)."""
        if entry.name in self.PREPARED or entry.name == LEDGER_NAME:
            return True
        if entry.is_dir() and not entry.is_symlink():
            files = [f for _r, _d, fs in os.walk(entry) for f in fs]
            if files and all(f == LEDGER_NAME for f in files):
                return True
        here = entry.resolve()
        for v in [*self.inputs, *strings_of(to_dict(self.cfg))]:
            try:
                p = Path(v).resolve() if os.path.lexists(v) else None
            except (OSError, RuntimeError, ValueError):
                continue
            if p is not None and (p == here or here in p.parents):
                return True
        return False

    def _check_run_dir(self) -> None:
        """A run directory is written into, never replaced (:func:`popri.core.outdir.check`
        without the ledger rule): '-', a file, a device or a link is refused, and so is a
        directory popri did not write that holds one of the files a run writes at its top
        (the user's own ``results.json`` would be overwritten) or anything the run does not
        read (:meth:`_kept`) -- the rule of every ``--out`` (``popri report --out`` among
        them): a non-empty directory is filled only when it is popri's own
        (:func:`popri.core.outdir.is_ours`: its marker, or ``.stages/`` of a run older than the
        marker).  A directory that merely holds a prepared dataset (``data/private``), the
        run's inputs or a ledger is fine; so is an empty or a missing one (hostile-0.4 N10)."""
        run = outdir.check(self.run, whole=False, force=True, what="run_dir")
        if run.is_dir() and not outdir.is_ours(run, legacy=lambda p: (p / ".stages").is_dir()):
            clash = [f for f in self.RUN_FILES if os.path.lexists(run / f)]
            if clash:
                raise ConfigError(f"holds {', '.join(clash)}, which popri run would overwrite, "
                                  "and popri did not write it: choose another run_dir",
                                  path=str(run), field="run_dir")
            other = sorted(e.name for e in run.iterdir() if not self._kept(e))
            if other:
                shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more"
                                                if len(other) > 3 else "")
                raise ConfigError(f"directory is not empty and was not written by popri (no "
                                  f"{outdir.MARKER}; it holds {shown}): choose another run_dir "
                                  "(one popri did not write may hold only what the run reads: "
                                  "a prepared dataset, data/, its inputs and ledgers)",
                                  path=str(run), field="run_dir")

    def _execute(self) -> dict:
        early = not self.budget.needs_clients() or self.budget.client_count() is not None
        if early:
            self._set_noise()
            self._check_data()  # the data is already there (data.dir, an earlier fetch)
            self._write_config()
        else:
            self.runner.hold = True
        if not self.dry_run:
            if not (self.run / outdir.MARKER).is_file():
                outdir.mark(self.run, "popri-run")
        for st in self.fetch_stages():
            self.stage(st)
        if not early:
            self._set_noise()
        self._check_data()  # after the fetch: before any stage reads a split
        if not early:
            self._write_config()
            self.runner.hold = False
            self.runner.flush()
        for st in self.embed_stages():
            self.stage(st)
        for st in self.plan():
            self.stage(st)
        for st in self.downstream_stages():
            self.stage(st)
        self.account_stage()
        if self.dry_run:
            return {}
        rows = self.method.metrics(self)
        if rows is not None:
            with atomic_write(self.run / "metrics.jsonl") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in rows))
        results = R.collect(self, self.noise)
        rp = results["release_provenance"]
        if self.release and rp["status"] not in ("public", "dp"):  # issue 66: never a
            # release-mode result whose chain holds a not-dp link
            raise InputError("release mode: the release's chain is NOT A DP GUARANTEE: "
                             + "; ".join(rp["links"]), path=rp["path"])
        results["run"] = R.identity(self)
        # every DP stage's recorded ledger entries against the ones its budget guard composed
        checks = self.runner.ledger_checks(self.all_stages())
        results["ledger_check"] = {"stages": checks,
                                   "agree": all(v.get("agree") for v in checks.values())}
        with atomic_write(self.run / "results.json") as fh:
            json.dump(results, fh, indent=2)
        with atomic_write(self.run / "results.md") as fh:
            fh.write(results_table(results) + "\n")
        return results

    def _split_counts(self) -> dict | None:
        """The private dataset's manifest counts (``{"train": {"clients", "samples"}, ...}``),
        or None before the fetch / for a dataset without them."""
        man = self.paths.private / "manifest.json"
        try:
            counts = read_json(man).get("counts")
        except (OSError, ValueError, AttributeError, PopriError):
            return None
        return counts if isinstance(counts, dict) else None

    def data_needs(self) -> list[tuple[str, str, int, str]]:
        """What the planned stages need of the private splits: (split, "samples" | "clients",
        at least, who needs it).  Read from the plan, so every method is covered: a stage that
        reads the validation split's embeddings needs 2 samples (statistics of a set: the
        probe's MMD, FID, the DP mean); the evaluation needs a test sample; a paired
        comparison over test clients (the control's difference, the gap's bootstrap) needs 2
        test clients."""
        stages = self.all_stages()
        val = str(self.paths.emb_val)
        needs = []
        if any(val in st.inputs for st in stages):
            readers = sorted({st.name.rstrip("0123456789") if st.name.startswith("probe")
                              else st.name for st in stages if val in st.inputs})
            needs.append(("val", "samples", 2, ", ".join(readers)))
        names = {st.name for st in stages}
        if any(n.startswith("eval-") for n in names):
            needs.append(("test", "samples", 1, "the evaluation on the test split"))
        paired = [w for n, w in (("control-diff", "the control's paired difference"),
                                 ("gap-closed", "the gap's paired bootstrap")) if n in names]
        if paired:
            needs.append(("test", "clients", 2, " and ".join(paired)))
        return needs

    def _check_data(self) -> None:
        """Before any stage reads the private splits: each split holds what the planned stages
        need of it (a split drawn per client can come out empty: sotu at data.max_clients 12
        and seed 3 put no client in the validation split, and the run died at the probe with a
        traceback; one test client left the control's paired difference undefined after every
        stage had run).  Checked when the data is there: before the first stage for data.dir
        or an earlier fetch, else right after the fetch.  A dry run notes it; a real run stops
        with one line naming the split."""
        counts = self._split_counts()
        if counts is None:
            return
        for split, what, least, who in self.data_needs():
            try:
                have = int((counts.get(split) or {}).get(what, 0))
            except (TypeError, ValueError):
                continue
            if have >= least:
                continue
            fix = ("set data.dir to a dataset whose split holds more" if self.cfg.data.dir else
                   "raise data.max_clients (the splits are drawn per client) or use another "
                   "seed")
            optional = all(r.startswith(("probe", "select-stats")) or r.endswith("-dpo")
                           for r in who.split(", "))
            off = {"val": "; or turn off what reads it (probe.enabled: false, dpo.select_on: "
                          "none)" if optional else "",
                   "test": "; or set control: false and baselines: false" if what == "clients"
                   else ""}[split]
            e = ConfigError(f"the {split} split has {have} {what[:-1] if have == 1 else what}; "
                            f"{who} need"
                            f"{'s' if ' and ' not in who and ', ' not in who else ''} at least "
                            f"{least}: {fix}{off}",
                            path=str(self.paths.private / f"{split}.jsonl"), field="data")
            if self.dry_run:
                note = f"note: a real run would stop here: {e}"
                if note not in self.notes:
                    self.notes.append(note)
                return
            raise e

    def _write_config(self) -> None:
        """RUN/config.resolved.json, written only once the budget and plan checks passed (a
        refused run leaves the directory as it was)."""
        if not self.dry_run:
            with atomic_write(self.run / "config.resolved.json") as fh:
                json.dump(to_dict(self.cfg), fh, indent=2)

    def plan_text(self) -> str:
        """The dry-run plan: how z is set, then every command (no side effects)."""
        pr = self.cfg.privacy
        lines = [f"# popri run {self.run}: plan (dry run: nothing runs, nothing is written)",
                 f"# {MODE_NOTES['release' if self.release else 'research']}",
                 f"# {self.budget.noise_line()}"]
        if pr.epsilon is not None:
            lines.append(f"# budget: epsilon={pr.epsilon:g} at delta={pr.delta:g} "
                         f"({pr.accountant}) for every ledger under {self.run}")
        lines += [f"# {n}" for n in self.method.plan_notes(self)]
        lines.append(f"# {self.reuse_line()}")
        lines += [f"# {n}" for n in self.notes]
        return "\n".join(lines + self.runner.commands)


__all__ = ["Run", "BudgetError", "results_table", "draws_summary", "PopriError"]
