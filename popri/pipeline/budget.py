"""The privacy side of ``popri run``: the noise of the DP rounds planned once, the budget of the
whole run directory, and the guard in front of every DP stage.

    popri run examples/default.yaml --set privacy.epsilon=1 --dry-run   # shows z and the budget
    python -m pytest -q tests/test_budget.py

:class:`Budget` is built from (config, method, paths) alone, as opacus' accountants are built
apart from the optimizer they watch: testable without a run, a driver or a stage.  It plans
the run's :class:`~popri.privacy.plan.Noise` (:meth:`Budget.plan`: z calibrated to
``privacy.epsilon`` over every DP release the plan declares, or given), builds the prospective
ledger entries of the score rounds and of the DP checkpoint selection from it, and checks a
set of entries against the budget -- the plan's before the first stage (the driver says which
stages still release), one stage's in its guard (:meth:`Budget.guard`).

Method-agnostic: the DP stages are those a method's recipe declares (``Stage.release``: the
ledger entries it will record); every ``ledger.jsonl`` under the run directory counts.  The
accountant (opacus RDP, as POPri D.1 / PrE-Text D.1, or dp-accounting PLD) is
:mod:`popri.privacy.accounting`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from popri.core.errors import ConfigError, InputError, PopriError
from popri.core.io import atomic_write, read_json
from popri.core.runtime import cache_dir
from popri.kit import DPRelease, RunPaths
from popri.methods.fred import stats as F
from popri.methods.steps import select_settings
from popri.pipeline.config import select_on
from popri.privacy import accounting as A
from popri.privacy.calibration import calibrate, gaussian_multiplier
from popri.privacy.ledger import LEDGER_NAME, dedupe, read_ledger
from popri.privacy.plan import Noise, mode_of
from popri.specs.privacy import FredStatsSpec


class BudgetError(ConfigError):
    """A DP stage would take the run past its budget (privacy.epsilon): exit 2, before it runs."""


#: relative slack of the budget guard (the calibration's own tolerance is far below it)
BUDGET_RTOL = 1e-6
#: POPRI_CALIBRATION_CACHE=0: every plan searches for its z (no memo)
MEMO_ENV = "POPRI_CALIBRATION_CACHE"


class CalibrationMemo:
    """:class:`popri.privacy.calibration.Memo` on disk: one small JSON file per key under
    ``$POPRI_CACHE/calibration/``, written atomically.  Whatever it holds is checked by
    ``calibrate`` before use, so a missing, unreadable or edited file costs a search, never a
    wrong z; a directory that cannot be written is skipped."""

    def __init__(self, root: Path | None = None):
        self.root = root

    def _dir(self) -> Path:
        if self.root is None:
            self.root = cache_dir() / "calibration"
        return self.root

    def get(self, key: str) -> float | None:
        try:
            d = json.loads((self._dir() / f"{key}.json").read_text())
            return float(d["z"]) if d.get("key") == key else None
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def put(self, key: str, z: float) -> None:
        try:
            self._dir().mkdir(parents=True, exist_ok=True)
            with atomic_write(self._dir() / f"{key}.json") as fh:
                json.dump({"key": key, "z": z}, fh)
        except OSError:
            pass  # a read-only or full cache: the next plan searches again


def calibration_memo() -> CalibrationMemo | None:
    return None if os.environ.get(MEMO_ENV, "1") == "0" else CalibrationMemo()


class Budget:
    """The budget of one run directory: ``cfg`` (the RunConfig), ``method`` (its
    :class:`~popri.methods.base.Method`), ``paths`` (its :class:`~popri.kit.RunPaths`).
    ``dry_run``: before the fetch, a plan that needs the client count says so instead of
    failing.  After :meth:`plan`: ``noise`` (None while z waits for the fetch), ``how`` (how it
    was set) and ``clients`` (N when it was planned)."""

    def __init__(self, cfg, method, paths: RunPaths, *, dry_run: bool = False):
        self.cfg, self.method, self.paths = cfg, method, paths
        self.run = Path(paths.root)
        self.dry_run = dry_run
        self.release = bool(cfg.release)
        self.select = select_on(cfg)       # private | public | dp | none
        self.noise: Noise | None = None
        self.how = ""
        self.clients: int | None = None

    # ------------------------------------------------------------------ the clients
    def client_count(self) -> int | None:
        """The private train split's client count N (None before the fetch): private unless
        the method's accounting makes it public (:meth:`disclosed_clients`)."""
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

    def disclosed_clients(self) -> int | None:
        """N where the method's accounting treats it as public
        (:meth:`~popri.methods.base.Method.clients_public`: a fixed L of N a round, DP-FTRL's
        blocks), else None."""
        return self.client_count() if self.method.clients_public(self.cfg) else None

    def sampling(self, q: float) -> str:
        """The sampling scheme of the DP rounds at rate q, as the stage will draw it
        (:func:`popri.federated.participation.sample_clients`): ``poisson`` for a rate, ``fixed``
        for L < N clients, ``none`` for everyone."""
        cpr, rate, _ = self.method.participation(self.cfg)
        if rate and rate < 1:
            return "poisson"
        return "fixed" if cpr else "none"  # a fixed L = N too: replace one client (q = 1)

    # ------------------------------------------------------------------ the noise
    def noise_at(self, noise: Noise, q: float, spec=None) -> Noise:
        """``noise`` (its z) on the method's rounds at rate q: their sampling, and the relation
        and sensitivity the round's spec (:meth:`~popri.methods.base.Method.round_spec`)
        gives them."""
        spec = self.method.round_spec(self.cfg) if spec is None else spec
        return noise.at(self.sampling(q), spec, sample_rate=q)

    def plan(self) -> Noise | None:
        """The noise of the DP rounds, planned once (kept as :attr:`noise`, with :attr:`how`
        and :attr:`clients`).  Before the fetch, when q = clients_per_round / N needs the
        client count: a dry run gets z = None ('set after the fetch'), a real run an error."""
        c, pr = self.cfg, self.cfg.privacy
        cpr, rate, sec = self.method.participation(c)
        n = self.client_count()
        self.clients = n
        if not self.method.dp:  # FewFedPIT: no calibration; the extension's z is explicit
            z = float(c.fewfedpit.noise_multiplier or 0.0)
            how = ("no DP guarantee (eps = inf): no noise" if not z else
                   f"popri extension: z={z:g} on clipped uploads, given")
            return self._keep(Noise(z=z, sample_rate=(min(1.0, cpr / n) if n else None),
                                    mode="release" if self.release else "research"), how)
        if rate:
            q = float(rate)
        elif cpr:
            if n is None:
                if not self.dry_run:
                    raise PopriError("internal: Budget.plan() before the fetch")
                q_how = (f"q = {sec}.clients_per_round ({cpr}) / N, the private train "
                         f"split's client count, known after the fetch")
                if pr.noise_multiplier is not None:  # z is given; only q waits for the data
                    return self._keep(Noise.of(pr.noise_multiplier, release=self.release),
                                      f"given; {q_how}")
                return self._keep(None, f"z is set after the fetch: {q_how}")
            if cpr > n:
                raise ConfigError(f"{cpr} exceeds the {n} clients of the private "
                                  f"train split ({self.paths.private}): set {sec}.clients_per_round"
                                  f" <= {n}, or {sec}.sample_rate",
                                  field=f"{sec}.clients_per_round")
            q = cpr / n
        else:
            q = 1.0
        if pr.noise_multiplier is not None:
            noise = Noise.of(pr.noise_multiplier, release=self.release)
            how = "given"
        else:
            noise = Noise.of(self._calibrate(q, self.select_entries()),
                                     release=self.release)
            how = f"calibrated to eps={pr.epsilon}, delta={pr.delta} over T={c.rounds} rounds"
            if self.select == "dp":
                how += " after the DP checkpoint-selection release"
        return self._keep(self.noise_at(noise, q), how)

    def _keep(self, noise: Noise | None, how: str) -> Noise | None:
        self.noise, self.how = noise, how
        return noise

    def noise_line(self) -> str:
        """How z is set, the dry-run plan's and the log's line."""
        n = self.noise
        if n is None or n.z is None:
            return f"noise multiplier: {self.how}"
        q = "after the fetch" if n.sample_rate is None else f"{n.sample_rate:.4g}"
        return (f"noise multiplier z={n.z:.4f} ({self.how}; "
                f"q={q}"
                # release mode: N is private (with a fixed L per round, q = L/N is the
                # accountant's and shows it: use Poisson sampling where N must stay private)
                + (f", {self.clients} clients)" if self.clients is not None
                   and not self.release else ")"))

    # ------------------------------------------------------------------ prospective entries
    def score_entries(self, t: int, call=None) -> list:
        """The prospective ledger entry of round t's DP scores; none in a dry run before the
        fetch.  With the stage's ``call`` (its :class:`~popri.specs.commands.score.ScoreCall`)
        the entry is planned from that instance, the one the stage runs and records from: its
        z, its sampling, bound and convention (the round's relation and sensitivity, by
        :meth:`Noise.of_round` as ``popri score`` applies it), its engine and delta; only q of
        a fixed L is the plan's L/N (N is read by the stage).  Without it, from the planned
        noise and :meth:`Method.round_spec`."""
        n = self.noise
        if n is None or not n.planned:
            return []  # a dry run before the fetch: z or q is not known yet
        if call is None:
            return [self._score_release(t, n)]
        rate, cpr = call.sample_rate, call.clients_per_round
        sampling = "poisson" if rate and rate < 1 else "fixed" if cpr else "none"
        q = n.sample_rate if sampling == "fixed" else float(rate or 1.0)  # L/N needs N
        noise = Noise.of_round(call.noise_multiplier, sample_rate=q, sampling=sampling,
                               spec=call, mode=n.mode)
        return [noise.entry(call, "score", delta=call.delta, params={"round": call.round_})]

    def _score_release(self, t: int, noise: Noise, spec=None):
        """Round t's score release with ``noise`` as ``popri score`` will record it: the one
        entry function of the engine's mechanism (:meth:`Noise.entry`)."""
        spec = self.method.round_spec(self.cfg) if spec is None else spec
        return noise.entry(spec, "score", delta=self.cfg.privacy.delta, params={"round": t})

    def select_entries(self, call=None) -> list:
        """The prospective ledger entries of the DP checkpoint selection (dpo.select_on: dp):
        'popri fred stats' at user level, add/remove one client, analytic Gaussian: a q = 1
        Gaussian release of each statistic the selection reads (the mean for mean-cosine; mean
        and covariance for fid) at the noise multiplier of (select_epsilon, select_delta).
        Planned from the stage's ``call`` (its :class:`~popri.specs.privacy.FredStatsSpec`) by
        the function that records them (:func:`popri.methods.fred.stats.release_entries`);
        without it (the calibration) from :func:`popri.methods.steps.select_settings`, the
        builder of that call."""
        if self.select != "dp":
            return []
        spec = FredStatsSpec(**select_settings(self.cfg)) if call is None else call
        if spec.epsilon is None or spec.delta is None or spec.calibration is None:
            raise PopriError("internal: the selection's fred stats call has no epsilon, delta "
                             "or calibration")
        z = gaussian_multiplier(spec.epsilon, spec.delta, spec.calibration)
        return F.release_entries(spec, z, mode=mode_of(bool(spec.release)))

    # ------------------------------------------------------------------ calibration
    def compose(self, entries: list):
        """The total of ``entries`` under the run's accountant and convention."""
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
        c, pr = self.cfg, self.cfg.privacy
        try:
            if fixed:
                spent = self.compose(fixed).epsilon
                if not spent < pr.epsilon:
                    raise ConfigError(f"the DP checkpoint selection alone spends epsilon="
                                      f"{spent:.4g} of the budget privacy.epsilon={pr.epsilon:g} "
                                      f"(at delta={pr.delta:g}): lower dpo.select_epsilon",
                                      field="dpo.select_epsilon")

            spec = self.method.round_spec(c)
            clients = self.disclosed_clients()

            def at(z) -> Noise:
                return self.noise_at(Noise.of(z, release=self.release), q, spec)

            if self.method.round_entries(c, 1, Noise(None, sample_rate=q),
                                         clients) is not None:
                def entries_at(z):
                    noise = at(z)
                    return [e for t in range(1, c.rounds + 1)
                            for e in self.method.round_entries(c, t, noise, clients)] + list(fixed)

                return calibrate(pr.epsilon, pr.delta, entries_at, pr.accountant,
                                 convention=pr.convention, memo=calibration_memo())

            def score_entries_at(z):
                # the entries the rounds will record (their mechanism, sampling, relation and
                # sensitivity), so the plan is the record (conformance checks it after each)
                noise = at(z)
                return [self._score_release(t, noise, spec)
                        for t in range(1, c.rounds + 1)] + list(fixed)

            return calibrate(pr.epsilon, pr.delta, score_entries_at, pr.accountant,
                             convention=pr.convention, memo=calibration_memo())
        except A.ParameterError as e:
            raise ConfigError(f"no noise multiplier meets the budget: {e.message}",
                              field="privacy.epsilon") from None

    # ------------------------------------------------------------------ the budget
    def existing_entries(self) -> list:
        """Every release already recorded under the run directory (deduplicated)."""
        if not self.run.is_dir():
            return []
        out = []
        for f in sorted(self.run.rglob(LEDGER_NAME)):
            out += read_ledger(f)
        return dedupe(out)

    def over(self, entries: list, what: str) -> None:
        """Refuse (:class:`BudgetError`) when ``entries`` total more than privacy.epsilon."""
        pr = self.cfg.privacy
        total = self.compose(entries)
        if total.epsilon > pr.epsilon * (1.0 + BUDGET_RTOL):
            raise BudgetError(
                f"{what} would take the run to epsilon={total.epsilon:.6g} > the budget "
                f"privacy.epsilon={pr.epsilon:g} (delta={pr.delta:g}, {pr.accountant}; "
                f"{total.entries} releases, those already in the ledgers under {self.run} "
                "included): use a new run_dir, a larger budget, or more noise",
                path=str(self.run), field="privacy.epsilon")

    def check(self, pending: list, what: str = "the plan") -> None:
        """The releases already in the run's ledgers plus ``pending`` (those the plan still has
        to make: the driver says which stages still release) fit the budget."""
        if pending:
            self.over(self.existing_entries() + list(pending), what)

    def guard(self, name: str, release: DPRelease, runner):
        """The budget guard of one DP stage (``Stage.before``): compose every release in the
        run's ledgers with the stage's own; refuse to start it past the budget.  A
        research-mode rerun of the same attempt (same stage key: same inputs and arguments, so
        the same seeded release and release_id) is not counted twice.  ``runner``: the stage
        runner, which keeps each stage's attempts (:class:`popri.pipeline.stages.StageRunner`)."""
        entries, own, match = release.entries, Path(release.ledger), release.match

        def before(key: str) -> None:
            mine = [e for e in read_ledger(own) if match(e)] if own.is_file() else []
            prev = runner.attempt(name)
            if self.cfg.privacy.epsilon is not None:
                # the same attempt (key and thread count): its seeded release has its id
                seen = (set(prev.get("before", [])) if runner.same_attempt(name, key)
                        else None)
                rerun = (not self.release and seen is not None
                         and any(e.release_id not in seen for e in mine))
                self.over(self.existing_entries() + ([] if rerun else entries),
                          f"stage {name}")
            runner.note_attempt(name, key, [e.release_id for e in mine])

        return before
