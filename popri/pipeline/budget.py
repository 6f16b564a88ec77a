"""The privacy side of ``popri run``: calibration of the noise multiplier to the budget, the
budget of the whole run directory, and the guard in front of every DP stage.

    popri run examples/default.yaml --set privacy.epsilon=1 --dry-run   # shows z and the budget

Method-agnostic: the DP stages are those a method's recipe declares (``Stage.release``: the
ledger entries it will record); every ``ledger.jsonl`` under the run directory counts.  The
accountant (opacus RDP, as POPri D.1 / PrE-Text D.1, or dp-accounting PLD) is
:mod:`popri.privacy.accounting`.
"""

from __future__ import annotations

from pathlib import Path

from popri.core import log
from popri.core.errors import ConfigError, InputError, PopriError
from popri.core.io import read_json


class BudgetError(ConfigError):
    """A DP stage would take the run past its budget (privacy.epsilon): exit 2, before it runs."""


#: relative slack of the budget guard (the calibration's own tolerance is far below it)
BUDGET_RTOL = 1e-6


class Budget:
    """Mixed into :class:`popri.pipeline.driver.Run` (which provides ``cfg``, ``run``, ``p``,
    ``release``, ``select``, ``dry_run``, ``runner``, ``noise``, ``plan()`` and ``method``)."""

    def _clients(self) -> int | None:
        """The private train split's client count N (None before the fetch)."""
        man = self.paths.private / "manifest.json"
        if not man.exists():
            return None
        try:
            return int(read_json(man)["counts"]["train"]["clients"])
        except (KeyError, TypeError, ValueError):
            raise InputError("no counts.train.clients: not a popri dataset manifest",
                             path=str(man), field="counts") from None

    def needs_clients(self) -> bool:
        """Does z depend on N (q = clients_per_round / N, calibrated)?"""
        cpr, rate, _ = self.method.participation(self.cfg)
        return bool(cpr) and not rate

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
        'popri fred stats' at user level, add/remove one client, analytic Gaussian: a q = 1
        Gaussian release of each statistic the selection reads (the mean for mean-cosine; mean
        and covariance for fid) at the noise multiplier of (select_epsilon, select_delta) -- in
        release mode its lower bound after snapping."""
        if self.select != "dp":
            return []
        from popri.methods.fred import stats as F
        from popri.privacy.calibration import gaussian_multiplier
        from popri.privacy.entries import gaussian

        dp = self.cfg.dpo
        z = gaussian_multiplier(dp.select_epsilon, self.cfg.selection_delta, "analytic")
        z /= 1.0 + self._snap()
        design = F.Design("add-remove", "user", 1.0, None)
        return [gaussian("fred", noise_multiplier=z, sample_rate=1.0,
                         delta=self.cfg.selection_delta, sensitivity=sens, sampling="none",
                         neighbouring=design.neighbouring,
                         mode="release" if self.release else "research", params={"release": what})
                for what, sens in (("mean", design.mean_sensitivity),
                                   ("covariance", design.cov_sensitivity))
                if what == "mean" or dp.select_by == "fid"]

    def score_entry(self, t: int) -> list:
        """The prospective ledger entry of round t's DP scores (z, q, sensitivity; steps 1)."""
        n = self.noise
        if n.get("noise_multiplier") is None or n.get("sample_rate") is None:
            return []  # a dry run before the fetch: z or q is not known yet
        return [self._score_release(t, float(n["noise_multiplier"]), float(n["sample_rate"]))]

    def sampling(self, q: float) -> str:
        """The sampling scheme of the DP rounds at rate q, as the stage will draw it
        (:func:`popri.federated.participation.sample_clients`): ``poisson`` for a rate, ``fixed``
        for L < N clients, ``none`` for everyone."""
        cpr, rate, _ = self.method.participation(self.cfg)
        if rate and rate < 1:
            return "poisson"
        return "fixed" if cpr and q < 1 else "none"

    def _score_release(self, t: int, z: float, q: float):
        """Round t's score release at (z, q) as ``popri score`` will record it: the one entry
        function of the engine's mechanism (:func:`popri.privacy.entries.round_release`), under
        the relation and sensitivity of :func:`popri.privacy.relations.round_relation`."""
        from popri.privacy.entries import round_release
        from popri.privacy.relations import round_relation
        from popri.specs.engine import EngineSpec

        sc = self.cfg.score
        nn = self.method.score_mode(self.cfg) == "nn-histogram"
        sampling = self.sampling(q)
        relation, sens = round_relation(float(sc.max_samples_per_client if nn else sc.clip),
                                        sampling, self.cfg.privacy.convention, nonnegative=nn)
        return round_release(
            EngineSpec.of(sc), "score", noise_multiplier=z, sample_rate=q, sensitivity=sens,
            sampling=sampling, neighbouring=relation, delta=self.cfg.privacy.delta,
            mode="release" if self.release else "research", params={"round": t})

    def _compose(self, entries: list):
        from popri.privacy import accounting as A

        pr = self.cfg.privacy
        try:
            return A.compose(entries, pr.delta, pr.accountant, alone=False,
                             convention=pr.convention)
        except A.ParameterError as e:
            raise BudgetError(f"cannot total the run's ledgers: {e.message}",
                              path=str(self.run), field="privacy.epsilon") from None

    def _calibrate(self, q: float, fixed: list) -> float:
        """Smallest z (to 1e-4) with the composition of T releases at (z, q) and the ``fixed``
        entries within privacy.epsilon."""
        from popri.privacy import accounting as A

        c, pr = self.cfg, self.cfg.privacy
        try:
            if fixed:
                spent = self._compose(fixed).epsilon
                if not spent < pr.epsilon:
                    raise ConfigError(f"the DP checkpoint selection alone spends epsilon="
                                      f"{spent:.4g} of the budget privacy.epsilon={pr.epsilon:g} "
                                      f"(at delta={pr.delta:g}): lower dpo.select_epsilon",
                                      field="dpo.select_epsilon")
            from popri.privacy.calibration import calibrate

            if self.method.round_entries(self, 1, None, q) is not None:
                def entries_at(z):
                    return [e for t in range(1, c.rounds + 1)
                            for e in self.method.round_entries(self, t, z, q)] + list(fixed)

                return calibrate(pr.epsilon, pr.delta, entries_at, pr.accountant,
                                 convention=pr.convention)

            def score_entries_at(z):
                # the entries the rounds will record (their mechanism, sampling, relation and
                # sensitivity), so the plan is the record (conformance checks it after each)
                return [self._score_release(t, z, q) for t in range(1, c.rounds + 1)] + list(fixed)

            return calibrate(pr.epsilon, pr.delta, score_entries_at, pr.accountant,
                             convention=pr.convention)
        except A.ParameterError as e:
            raise ConfigError(f"no noise multiplier meets the budget: {e.message}",
                              field="privacy.epsilon") from None

    def calibrate(self) -> dict:
        """z and q of the score rounds.  Before the fetch, when q = clients_per_round / N needs
        the client count: a dry run gets z = None ('set after the fetch'), a real run an error."""
        c, pr = self.cfg, self.cfg.privacy
        cpr, rate, sec = self.method.participation(c)
        n = self._clients()
        if not self.method.dp:  # FewFedPIT: no calibration; the extension's z is explicit
            z = float(c.fewfedpit.noise_multiplier or 0.0)
            how = ("no DP guarantee (eps = inf): no noise" if not z else
                   f"popri extension: z={z:g} on clipped uploads, given")
            return {"noise_multiplier": z, "noise_arg": z,
                    "sample_rate": (min(1.0, cpr / n) if n else None), "clients": n,
                    "how": how}
        if rate:
            q = float(rate)
        elif cpr:
            if n is None:
                if not self.dry_run:
                    raise PopriError("internal: calibrate() before the fetch")
                q_how = (f"q = {sec}.clients_per_round ({cpr}) / N, the private train "
                         f"split's client count, known after the fetch")
                if pr.noise_multiplier is not None:  # z is given; only q waits for the data
                    arg = float(pr.noise_multiplier)
                    return {"noise_multiplier": arg / (1.0 + self._snap()), "noise_arg": arg,
                            "sample_rate": None, "clients": None, "how": f"given; {q_how}"}
                return {"noise_multiplier": None, "noise_arg": None, "sample_rate": None,
                        "clients": None, "how": f"z is set after the fetch: {q_how}"}
            if cpr > n:
                raise ConfigError(f"{cpr} exceeds the {n} clients of the private "
                                  f"train split ({self.paths.private}): set {sec}.clients_per_round"
                                  f" <= {n}, or {sec}.sample_rate",
                                  field=f"{sec}.clients_per_round")
            q = cpr / n
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
        q = "after the fetch" if n.get("sample_rate") is None else f"{n['sample_rate']:.4g}"
        return (f"noise multiplier z={n['noise_multiplier']:.4f} ({n['how']}; "
                f"q={q}"
                # release mode: N is private (with a fixed L per round, q = L/N is the
                # accountant's and shows it: use Poisson sampling where N must stay private)
                + (f", {n['clients']} clients)" if n.get("clients") is not None
                   and not self.release else ")"))

    # ------------------------------------------------------------------ budget guard
    def dp_stages(self) -> list[tuple[str, list, Path, object]]:
        """Every DP release of the plan, as its stages declare them (``Stage.release``): (stage
        name, prospective entries, the ledger it appends to, a test for its entries)."""
        return [(s.name, s.release.entries, Path(s.release.ledger), s.release.match)
                for s in self.plan() if s.release is not None]

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

    def dp_reruns(self) -> list[tuple[str, str]]:
        """(stage, why) of every finished DP stage of the plan -- it has a marker and its
        ledger holds its release -- that would run again (its settings, inputs or outputs
        changed: the survey's reason), said before anything runs.  Not among them: a stage
        whose release committed before a stop (it is kept: :meth:`StageRunner._adopt`), and a
        stage that never finished (an attempt stopped before its outputs: research mode's
        retry of that very attempt is the same seeded release; any other attempt is counted
        as a new release by :meth:`check_plan`)."""
        from popri.privacy.ledger import read_ledger

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
        if not reruns or getattr(self, "rerun", False):
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
        still has to make must fit the budget.  A DP stage counts as done when its cached result
        is current -- the same settings, inputs and outputs, not just a marker -- or its
        release committed before a stop (it is kept), or (research mode) it retries the very
        attempt that recorded its release, stopped before its outputs (same key and thread
        count: the same seeded release).  A finished DP stage that would run again is refused
        without --rerun and with it counted as a new release (:meth:`check_reruns`); so is
        every other stage still to run.  The guard before each DP stage is exact."""
        pr = self.cfg.privacy
        reruns = set(self.check_reruns())
        if pr.epsilon is None:
            log.warn(f"run: {self.cfg.method} has no DP guarantee: the ledger records eps = inf "
                     "and no budget is enforced" if not self.method.dp else
                     "run: no privacy.epsilon: the noise multiplier is given and no budget is "
                     "enforced")
            return
        if self.noise.get("noise_multiplier") is None:
            return  # z is set after the fetch; checked then
        from popri.privacy.ledger import read_ledger

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
        if add:
            self._over(self.existing_entries() + add, "the plan")

    def guard(self, name: str, entries: list, own: Path, match):
        """The budget guard of one DP stage (Stage.before): compose every release in the run's
        ledgers with the stage's own; refuse to start it past the budget.  A research-mode
        rerun of the same attempt (same stage key: same inputs and arguments, so the same
        seeded release and release_id) is not counted twice."""
        def before(key: str) -> None:
            from popri.privacy.ledger import read_ledger

            mine = [e for e in read_ledger(own) if match(e)] if own.is_file() else []
            prev = self.runner.attempt(name)
            if self.cfg.privacy.epsilon is not None:
                # the same attempt (key and thread count): its seeded release has its id
                seen = (set(prev.get("before", [])) if self.runner.same_attempt(name, key)
                        else None)
                rerun = (not self.release and seen is not None
                         and any(e.release_id not in seen for e in mine))
                self._over(self.existing_entries() + ([] if rerun else entries),
                           f"stage {name}")
            self.runner.note_attempt(name, key, [e.release_id for e in mine])

        return before

