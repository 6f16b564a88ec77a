"""Does POPri's DPO improve the generator at CPU scale?  The study of issue 24, as `popri run`s.

    python benchmarks/learning_study.py --list                       # the study's settings
    python benchmarks/learning_study.py --only oracle                # one setting, seed 0
    python benchmarks/learning_study.py --only oracle --seeds 0 1 2  # three seeds
    python benchmarks/learning_study.py --table                      # the table of what ran
    python benchmarks/learning_study.py --only oracle --draws 3      # + 3 more synthetic draws
    python benchmarks/learning_study.py --only oracle --draws 3 --draw-gen top-p=0.9

Each setting is `popri run examples/learning.yaml` with `--set` overrides, in
RUNS/SETTING-sSEED (cached stage by stage: a killed study resumes; add settings and rerun).  The
table (stdout, and benchmarks/results/learning_study.md / .json) has, per setting and seed:

- **distance** (the fixed-prompt probe, a private diagnostic): mean-embedding cosine of round 0
  (the untuned generator) and of round T to the private validation split, the change and its
  SE, and the same for MMD^2; the probe's distinct-2 and perplexity at round 0 and round T;
- **DPO**: reward margin and preference accuracy on held-out pairs in the last round;
- **downstream**: the method's accuracy, its T = 0 row's (the untuned generator's synthetic set:
  same prompts, N, seed and recipe), and the method minus T = 0, paired over the test clients,
  with its SE; "beats T = 0" when that difference is above 2 SEs (paired over dozens of test
  clients); over draws, when the mean is above t(0.95, n - 1) SEs between the n draws (2.92 for 3);
- the probe's curves of issue 44's full comparison (every round, every run: cosine to the
  private validation split and the public model's perplexity, a column per corpus) in
  benchmarks/results/NAME_probe.png;
- minutes the run took on this machine (with `examples/learning.yaml`'s `draws: 3`, runs from
  this stop on include two more draws of both final sets; older runs have one).

``--draws N`` (after a run finished) draws the final synthetic set and its T = 0 control N more
times from the same two generators (generation and downstream-training seeds + k, as `popri run`'s
``draws: D``, which does the same inside a run), with the run's own stage commands (its
commands.sh), and trains and evaluates
downstream on each pair: the spread of "minus T = 0" between draws is the synthetic-set sampling
noise that the paired SE over test clients leaves out.  Results in RUN/study_draws/dK/ (resumable) and a
third table: per run, the mean difference over the draws and its SE between draws.

The settings: `oracle` (z ~ 0, every client: is it the tuning or the privacy?) and its knobs
(learning rate, epochs, beta, loss, RPO's NLL term, rejected rank, temperature), `eps7` and `eps1` at the paper's q, and the out-of-domain pair
(`ood-*`: private shakespeare, public sotu; `ood2-*`: private sotu, public shakespeare;
`deb-*`: private Debian package descriptions, public sotu; `pypi-*`: private PyPI release
descriptions by author, public sotu); `*-pool`: the evolving few-shot pool (`pool: chosen`);
issue 44's remedies `ood-eps1-{fluent,gate,beta0.1,topp0.9,tokens}` (and `ood-eps1-rpo-*`),
diagnosed by benchmarks/fluency_diagnosis.py.

A setting that adds only `final_top_p` / `final_match_tokens` to another (`ood-eps1-topp0.9`,
`ood-eps1-tokens`) is a final-set variant (:func:`final_variant`): those overrides change only a
run's final-set lines, so it is computed from the other setting's run (run first if missing) by
replaying those lines with the variant's options, draws 0 .. D-1, in RUN/study_draws/<tag>-dK;
its row shares the base row's rounds, probe and eps = 0 / inf.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from popri.core.io import atomic_write

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "examples" / "learning.yaml"

#: z ~ 0 and every client: the tuning alone (popri run refuses z = 0 itself)
ORACLE = ["privacy.epsilon=null", "privacy.noise_multiplier=1e-9",
          "score.clients_per_round=null", "score.sample_rate=null"]
#: private shakespeare (roles as clients), public sotu: a public set out of the private domain
#: each client joins a round independently at q = 50 / N (Poisson: add/remove one client, the
#: accounting is proven), about the 50 a round the study drew as a fixed count before issue 36
#: (which was accounted as Poisson at that q: not a DP guarantee); N = 1,051 train roles
OOD = ["data.source=shakespeare", "data.date_from=null", "data.max_samples_per_client=16",
       "data.public_source=sotu", "data.public_date_to=1899-12-31", "score.sample_rate=0.0476"]

#: the reverse pair: private sotu (the in-domain study's clients), public shakespeare roles
OOD2 = ["data.public_source=shakespeare", "data.public_date_to=null"]

#: a second private corpus with many clients: Debian package descriptions (one client per
#: maintainer, ~1,700 train clients: the apt indexes, `apt-get update -o Acquire::Languages=en`),
#: public sotu before 1900 as in the default
DEB = ["data.source=debian", "data.date_from=null", "data.max_samples_per_client=16",
       "score.sample_rate=0.0296"]  # q = 50 / 1,691 train maintainers (see OOD)

#: a corpus built from a package registry for issue 44 (nobody tuned popri on it): PyPI
#: release descriptions, one client per author (popri/data/pypi.py; 2,289 train authors from
#: the pinned releases), public sotu before 1900 as in the default
PYPI = ["data.source=pypi", "data.date_from=null", "data.max_samples_per_client=16",
        "score.sample_rate=0.0218"]  # q = 50 / 2,289 train authors (see OOD)

#: issue 44's remedies, each a setting whose unset value is POPri's behaviour
#: (docs/results.md, "Why the tuned generator writes worse text"): pairs whose chosen sample is
#: no less fluent than the rejected one; a fluency gate before scoring; a stronger anchor to the
#: reference model (DPO's beta, POPri's tau, 10x); the final set's nucleus
REMEDIES = {"fluent": ["dpo.pair_rule=fluent"], "gate": ["dpo.fluency_gate=0.25"],
            "beta0.1": ["dpo.beta=0.1"], "topp0.9": ["final_top_p=0.9"],
            "tokens": ["final_match_tokens=true"],
            "rpo": ["dpo.sft_weight=1.0"]}

#: eps = 1 with RPO (the chosen sample's NLL, alpha = 1): the setting every DP row builds on
EPS1_RPO = ["privacy.epsilon=1", "dpo.sft_weight=1.0"]

SETTINGS: dict[str, list[str]] = {
    "oracle": ORACLE,
    "oracle-lr1e-4": ORACLE + ["dpo.lr=1e-4"],
    "oracle-epochs1": ORACLE + ["dpo.epochs=1"],
    "oracle-beta0.1": ORACLE + ["dpo.beta=0.1"],
    "oracle-ipo": ORACLE + ["dpo.loss=ipo"],
    "oracle-rank3": ORACLE + ["dpo.rejected_rank=3"],
    "oracle-temp0.7": ORACLE + ["generator.temperature=0.7"],
    # DPO + the chosen sample's NLL (RPO, arXiv:2404.19733, alpha = 1): keeps the generator fluent
    "oracle-rpo": ORACLE + ["dpo.sft_weight=1.0"],
    "ood-oracle-rpo": OOD + ORACLE + ["dpo.sft_weight=1.0"],
    "eps7": ["privacy.epsilon=7"],
    "eps1": ["privacy.epsilon=1"],
    "ood-oracle": OOD + ORACLE,
    "ood-eps1": OOD + ["privacy.epsilon=1"],
    # the best oracle setting (RPO: the largest move, no significant loss against T = 0) under DP
    "eps1-rpo": EPS1_RPO,
    "ood-eps1-rpo": OOD + EPS1_RPO,
    # beyond the paper: round t+1's few-shot examples are round t's DP-chosen samples
    # (popri/methods/popri/pool.py; post-processing of the released scores)
    "eps1-rpo-pool": EPS1_RPO + ["pool=chosen"],
    "ood-eps1-rpo-pool": OOD + EPS1_RPO + ["pool=chosen"],
    "ood2-eps1-rpo": OOD2 + EPS1_RPO,
    "deb-eps1-rpo": DEB + EPS1_RPO,
    # far from Omega (software descriptions prompted with 19th-century addresses): the pool lets
    # later rounds' prompts follow the DP-chosen samples instead of anchoring them to Omega
    "deb-eps1-rpo-pool": DEB + EPS1_RPO + ["pool=chosen"],
    # the paper's other budget, where the tuning is seen at eps = 1
    "ood-eps7-rpo": OOD + ["privacy.epsilon=7", "dpo.sft_weight=1.0"],
    # knobs where the tuning is seen: IPO's squared loss, a 5x lower learning rate
    "ood-eps1-ipo-rpo": OOD + EPS1_RPO + ["dpo.loss=ipo"],
    "ood-eps1-rpo-lr1e-4": OOD + EPS1_RPO + ["dpo.lr=1e-4"],
    # issue 44: POPri as the paper (DPO, no RPO) at eps = 1 on the registry corpus
    "pypi-eps1": PYPI + ["privacy.epsilon=1"],
}
# issue 44's screening: each remedy on the out-of-domain pair at eps = 1, and with RPO
for _k, _v in REMEDIES.items():
    if _k != "rpo":
        SETTINGS[f"ood-eps1-{_k}"] = OOD + ["privacy.epsilon=1"] + _v
        SETTINGS[f"ood-eps1-rpo-{_k}"] = OOD + EPS1_RPO + _v

#: issue 44's full comparison (docs/results.md, "The full comparison's plan"): the four corpora
#: (private data; public sotu before 1900 on each, shakespeare's q = 50 / N as OOD's), POPri as
#: the paper (`C-eps1`) and each remedy on top of it (`C-eps1-R`)
CORPORA = {"sotu": [], "ood": OOD, "deb": DEB, "pypi": PYPI}
#: what each corpus's clients are (the figure's titles)
CORPUS_LABEL = {"sotu": "sotu (1900 on)", "ood": "shakespeare", "deb": "Debian descriptions",
                "pypi": "PyPI descriptions"}
for _c, _base in CORPORA.items():
    SETTINGS.setdefault(f"{_c}-eps1", _base + ["privacy.epsilon=1"])
    for _k, _v in REMEDIES.items():
        if _k != "rpo":
            SETTINGS.setdefault(f"{_c}-eps1-{_k}", _base + ["privacy.epsilon=1"] + _v)


#: overrides that change nothing before a run's final set (tests/test_remedies.py checks the
#: plans): a setting that adds only these to another is a final-set variant of that one's run
FINAL_ONLY = ("final_top_p=", "final_match_tokens=")


def final_variant(name: str) -> tuple[str, dict] | None:
    """(base setting, final-set options) when ``name`` is another setting plus overrides of
    :data:`FINAL_ONLY` and nothing else: a final-set variant of that setting's run, computed as
    draws 0, 1, ... of the base run (:func:`draw`), not as a run of its own.  Those overrides
    change only the final set's lines of a run's plan (and of its draws), so the rounds, the
    DP releases, the probe and the eps = 0 / inf rows are the base run's, bit for bit.
    Options: ``gen`` (``popri gen`` flags of both final sets, e.g. ``--top-p 0.9``) and
    ``match`` (``final_match_tokens``: the method's set is a pool of 3 N cut to its control's
    tokens by ``popri take``; the control's lines are the base's own, so its files are
    reused)."""
    mine = [o for o in SETTINGS[name] if o.startswith(FINAL_ONLY)]
    if not mine:
        return None
    rest = [o for o in SETTINGS[name] if not o.startswith(FINAL_ONLY)]
    same = sorted((b for b, ov in SETTINGS.items() if ov == rest),  # `sotu-eps1` over `eps1`
                  key=lambda b: -len(os.path.commonprefix([b, name])))
    for base in same[:1]:
            opts: dict = {"gen": [], "match": False}
            for o in mine:
                k, v = o.split("=", 1)
                if k == "final_top_p":
                    opts["gen"] += ["--top-p", v]
                elif v.lower() in ("true", "1", "yes"):
                    opts["match"] = True
            return base, opts
    return None


def lenders(name: str, seed: int, runs: Path) -> list[str]:
    """``--reuse-from`` every other run of this seed (the settings sharing most overrides
    first): a stage one of them finished that is this run's -- the same command on the same
    inputs, e.g. everything before `ood-eps1-fluent`'s first preference pairs and its T = 0
    and eps = 0 / inf controls in `ood-eps1` -- is copied, not run again
    (popri/pipeline/reuse.py; the lender's marker and hashes decide, never the name)."""
    mine = set(SETTINGS.get(name, []))
    others = [(len(mine & set(SETTINGS.get(b, []))), b) for b in SETTINGS if b != name]
    out = []
    for _, b in sorted(others, key=lambda x: (-x[0], x[1])):
        d = runs / f"{b}-s{seed}"
        if (d / ".stages").is_dir():
            out += ["--reuse-from", str(d)]
    return out


def run_setting(name: str, seed: int, runs: Path, extra: list[str]) -> dict:
    d = runs / f"{name}-s{seed}"
    cmd = [sys.executable, "-m", "popri.cli.app", "run", str(CONFIG),
           *[f"--set={o}" for o in SETTINGS[name] + extra],
           f"--set=seed={seed}", f"--set=run_dir={d}", *lenders(name, seed, runs)]
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ))
    if p.returncode != 0:
        print(f"learning_study: {name} seed {seed} failed (exit {p.returncode})",
              file=sys.stderr)
    return {"minutes": (time.time() - t0) / 60.0, "rc": p.returncode}


#: where this script's extra draws of a finished run go (``popri run``'s own: RUN/draws)
STUDY_DRAWS = "study_draws"


def _stage_lines(run: Path, method: str, text: str | None = None) -> list[list[str]]:
    """The run's commands (commands.sh, or ``text``) for the final set, its T = 0 control,
    their downstream training and evaluation, and the paired difference, in order."""
    want = (f"{run}/synthetic.jsonl", f"{run}/synthetic_t0.jsonl", f"{run}/downstream/{method}",
            f"{run}/downstream/t0", f"{run}/eval/{method}.json", f"{run}/eval/t0.json",
            f"{run}/eval/control.json")
    out = []
    for line in (text if text is not None else (run / "commands.sh").read_text()).splitlines():
        if line.startswith("#") or not line.strip():
            continue
        argv = shlex.split(line)
        dest = argv[argv.index(">") + 1] if ">" in argv else (
            argv[argv.index("--out") + 1] if "--out" in argv else None)
        if dest in want:
            out.append(argv)
    if len(out) != len(want):
        raise SystemExit(f"learning_study: {run}/commands.sh lacks the final-set stages "
                         f"(found {len(out)} of {len(want)})")
    return out


def moved(argv: list[str], run: Path, dest: Path) -> list[str]:
    """A final-set command of ``run`` (:func:`_stage_lines`) writing under ``dest`` instead."""
    return [a.replace(f"{run}/synthetic", f"{dest}/synthetic")
            .replace(f"{run}/downstream/", f"{dest}/downstream/")
            .replace(f"{run}/eval/", f"{dest}/eval/") for a in argv]


def run_line(argv: list[str]) -> bool:
    """Run one commands.sh line (``popri ...``, a ``> FILE`` redirection written atomically);
    False when it failed."""
    out = None
    if ">" in argv:
        out, argv = argv[argv.index(">") + 1], argv[:argv.index(">")]
    cmd = [sys.executable, "-m", "popri.cli.app", *argv[1:]]
    p = subprocess.run(cmd, stdout=subprocess.PIPE if out else None, text=True)
    if p.returncode != 0:
        return False
    if out:
        Path(out + ".tmp").write_text(p.stdout)
        os.replace(out + ".tmp", out)
    return True


def draw(run: Path, k: int, gen: list[str] | None = None, match: bool = False) -> dict | None:
    """Draw ``k`` (1, 2, ...; 0 for a final-set variant) of the final set and its control;
    cached in RUN/study_draws/dK.

    ``gen``: flags replacing the final set's (and the control's) ``popri gen`` flags of the same
    name, e.g. ``["--top-p", "0.9"]``; ``match``: the method's set drawn as a pool of 3 N and cut
    to the control's tokens (``final_match_tokens``, ``popri take``), with the control's own
    files reused from the run where it drew them with the same command (its draw 0, or its
    ``draws``' RUN/draws/dK).  Such draws go to RUN/study_draws/<tag>-dK."""
    from popri.kit import draw_seed
    from popri.methods.popri.recipe import MATCH_POOL
    from popri.kit import take_call

    def take_argv(*a):
        return take_call(*a).argv()

    res = json.loads((run / "results.json").read_text())
    method = res["method"]
    tag = _tag(gen or [], match)
    dk = run / STUDY_DRAWS / (f"{tag}-d{k}" if tag else f"d{k}")
    done = dk / "eval" / "control.json"
    if not done.is_file():
        (dk / "eval").mkdir(parents=True, exist_ok=True)
        lines = [moved(argv, run, dk) for argv in _stage_lines(run, method)]
        for argv in lines:
            if argv[1] in ("gen", "train-downstream"):  # draw k's seeds, as `popri run`'s
                i = len(argv) - argv[::-1].index("--seed")
                argv[i] = str(draw_seed(int(argv[i]), k))
            if gen and argv[1] == "gen":
                with_flags(argv, gen)
        if match:
            lines = _matched(lines, run, dk, k, MATCH_POOL, take_argv)
        for argv in lines:
            if not run_line(argv):
                print(f"learning_study: draw {k} of {run} failed: {' '.join(argv[:3])}",
                      file=sys.stderr)
                return None
    for w in (dk / "downstream").glob("*/model.safetensors"):
        w.unlink()  # 0.5 GB each; the draw's evaluations are what it keeps
    return _control(done)


def with_flags(argv: list[str], flags: list[str]) -> list[str]:
    """``argv`` (in place) with each ``FLAG VALUE`` of ``flags`` set: replaced where the flag is
    there, appended where not."""
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def _matched(lines: list[list[str]], run: Path, dk: Path, k: int, pool: int,
             take_argv, reuse: bool = True) -> list[list[str]]:
    """``final_match_tokens`` in a draw's lines: the method's gen writes a pool of ``pool`` x N,
    ``popri take`` cuts it to the control's tokens; the control's gen, training and evaluation
    are the run's own commands (paths aside), so their outputs are copied from the run (draw 0:
    RUN/synthetic_t0.jsonl, RUN/eval/t0*; draw k: RUN/draws/dK/, RUN/eval/t0-dK*) when it has
    them, and run otherwise."""
    import shutil

    syn, t0 = str(dk / "synthetic.jsonl"), str(dk / "synthetic_t0.jsonl")
    src = (run, "t0") if k == 0 else (run / "draws" / f"d{k}", f"t0-d{k}")
    have = [src[0] / "synthetic_t0.jsonl", run / "eval" / f"{src[1]}.json",
            run / "eval" / f"{src[1]}.clients.jsonl"]
    reuse = reuse and all(f.is_file() for f in have)  # False: the lines were edited (N)
    if reuse:
        for f, dest in zip(have, (t0, dk / "eval" / "t0.json", dk / "eval" / "t0.clients.jsonl")):
            shutil.copyfile(f, dest)
    control = {t0, str(dk / "downstream" / "t0"), str(dk / "eval" / "t0.json")}
    model = next(call_of(x).model for x in lines if x[1] == "train-downstream")
    out = [] if reuse else [x for x in lines if a_out(x) == t0]  # the budget's set first
    for argv in lines:
        if a_out(argv) == syn:
            p = str(dk / "synthetic_pool.jsonl")
            n = argv.index("--num-samples") + 1
            argv = [*argv[:n], str(pool * int(argv[n])), *argv[n + 1:]]
            argv[argv.index("--out") + 1] = p
            argv[argv.index("--stats-out") + 1] = str(dk / "synthetic_pool_stats.json")
            out += [argv, ["popri", *take_argv(p, t0, syn, model)]]
        elif a_out(argv) == t0 or (reuse and a_out(argv) in control):
            continue  # already placed, or copied from the run
        else:
            out.append(argv)
    return out


def call_of(argv: list[str]):
    """A commands.sh line (``popri CMD ...``, maybe ``> FILE``) as the Call its command parses
    it into (its defaults filled in: a line writes only what differs from them)."""
    import typer

    from popri.cli.app import app
    from popri.cli.options import parse_call

    argv = argv[:argv.index(">")] if ">" in argv else argv
    return parse_call(typer.main.get_command(app), argv[1:])[1]


def a_out(argv: list[str]) -> str | None:
    """Where a commands.sh line writes (``> FILE`` or ``--out``)."""
    return argv[argv.index(">") + 1] if ">" in argv else (
        argv[argv.index("--out") + 1] if "--out" in argv else None)


def _config_draws(sets: list[str]) -> int:
    """The runs' ``draws`` (examples/learning.yaml's, or the last ``--set draws=N``)."""
    from popri.pipeline import config as C

    return C.load(str(CONFIG), [o for o in sets if o.startswith("draws=")]).draws


def _tag(gen: list[str], match: bool = False) -> str:
    return "".join(f"{f.lstrip('-')}{v}" for f, v in zip(gen[::2], gen[1::2])) + (
        "match-tokens" if match else "")


def collect_draws(runs: Path) -> list[dict]:
    """Per run with extra draws: draw 0 (the run's own) and each draw's method minus T = 0 --
    `popri run`'s own (``draws: D``: RUN/eval/control-dK.json) or this script's
    (RUN/study_draws/dK) -- and per final-set variant (``--draw-gen``) its own draws.

    Only a finished run counts (its results.json written, as in :func:`collect`): a running
    run's eval/control-dK.json files can all be there before its last stages end, and counting
    them would judge a seed whose row the first table does not show yet."""
    rows = []
    for d in sorted(runs.glob("*-s*")):
        if not (d / "results.json").is_file() or not (d / "eval" / "control.json").is_file():
            continue
        name, seed = d.name.rsplit("-s", 1)
        variants: dict[str, dict[int, tuple]] = {"": {0: _control(d / "eval" / "control.json")}}
        here = d / STUDY_DRAWS
        for dk in here.iterdir() if here.is_dir() else []:
            if (dk / "eval" / "control.json").is_file():
                tag, k = dk.name.rsplit("d", 1)
                variants.setdefault(tag.rstrip("-"), {})[int(k)] = _control(
                    dk / "eval" / "control.json")
        for f in (d / "eval").glob("control-d*.json"):  # popri run's draws (preferred)
            variants[""][int(f.stem.rsplit("d", 1)[1])] = _control(f)
        for tag, by_k in variants.items():
            if tag == "" and len(by_k) < 2:
                continue
            derived = _derived_name(name, tag)
            if derived and len(by_k) < 2:
                continue  # its draw 0 is a row of the first table
            rows.append({"setting": derived or (name + (f" [final set: {tag}]" if tag else "")),
                         "seed": int(seed), "draws": [by_k[k] for k in sorted(by_k)]})
    return rows


def _derived_name(base: str, tag: str) -> str | None:
    """The setting that is ``base``'s run with the final-set flags ``tag`` (None: none is)."""
    for name in SETTINGS:
        var = final_variant(name)
        if var and var[0] == base and _tag(var[1]["gen"], var[1]["match"]) == tag:
            return name
    return None


def _control(path: Path) -> dict:
    return json.loads(path.read_text())


def t_crit(n: int, alpha: float = 0.05) -> float:
    """One-sided critical value of Student's t with n - 1 degrees of freedom: a mean of n draws
    beats 0 at level alpha when mean > t_crit(n) * SE between draws (t_{0.95, 2} = 2.92 for 3
    draws; the old rule, 2 SEs, was a normal critical value that 3 draws do not support)."""
    from scipy.stats import t

    return float(t.ppf(1.0 - alpha, n - 1))


def beats(mean: float, se: float, n: int, alpha: float = 0.05) -> bool:
    """mean > t_{1-alpha, n-1} SE, with n >= 2 draws and a positive SE."""
    return n >= 2 and se > 0 and mean > t_crit(n, alpha) * se


def with_previous(rows: list[dict], drows: list[dict], name: str) -> tuple[list[dict], list[str]]:
    """``rows`` plus the rows of benchmarks/results/NAME.json whose (setting, seed) did not run
    here, and those runs' lines of NAME.md's draws table (copied: the draws' own files went with
    their run directory)."""
    res = HERE / "results"
    here = {(r["setting"], r["seed"]) for r in rows} | {(r["setting"], r["seed"]) for r in drows}
    old = [r for r in json.loads((res / f"{name}.json").read_text())
           if (r["setting"], r["seed"]) not in here]
    keys = {(r["setting"], str(r["seed"])) for r in old}
    per_draw: dict[tuple[str, ...], str] = {}  # the draws-table line's printed draws
    lines = []
    for ln in (res / f"{name}.md").read_text().splitlines():
        cells = [c.strip() for c in ln.split("|")]
        if ln.startswith("| ") and len(cells) == 10 and tuple(cells[1:3]) in keys:
            lines.append(ln)
            per_draw[tuple(cells[1:3])] = cells[4]
    for r in old:  # a table written before the rows kept their draws: its printed values
        got = per_draw.get((r["setting"], str(r["seed"])))
        if not r.get("draws_d") and got:
            d = [float(x) for x in got.split(",")]
            if r.get("diff") is not None:  # the run's own draw (draw 0): exact in the row
                d[0] = float(r["diff"])
            r["draws_d"] = d
            r["draws_d_from"] = f"{name}.md (draws after the first printed to 4 decimals)"
    return sorted(rows + old, key=lambda r: (r["setting"], r["seed"])), lines


def keep_draws(rows: list[dict], drows: list[dict]) -> None:
    """Each row of a run with draws keeps them (``draws_d``: method minus T = 0 per draw, the
    run's own draw first) in NAME.json, so that a table written after the run directory is gone
    (``--with``) still judges that seed by all its draws (:func:`seed_means`)."""
    by = {(r["setting"], r["seed"]): r for r in drows}
    for r in rows:
        d = by.get((r["setting"], r["seed"]))
        if d is not None:
            r["draws_d"] = _draw_diffs(d)


def _draw_diffs(drow: dict) -> list[float]:
    """Method minus T = 0 per draw of a :func:`collect_draws` row."""
    return [float(x["acc_minus_control"]) for x in drow["draws"]]


def draws_table(rows: list[dict], kept: list[str] = ()) -> str:
    """Per run and final-set variant: `popri run`'s own summary of its draws (draws_summary);
    ``kept``: lines of an earlier table (:func:`with_previous`)."""
    from popri.pipeline.driver import draws_summary

    out = ["| setting | seed | draws | minus T=0 per draw | mean | SE within (clients) | "
           "SE between draws | above T=0 over this seed's draws (mean > t(0.95, n-1) SE between "
           "draws; one seed: not a verdict) |",
           "|" + "---|" * 8, *kept]
    for r in rows:
        if len(r["draws"]) < 2:
            continue
        s = draws_summary(r["draws"])
        d, m, se_b = s["acc_minus_control"], s["mean"], s["se_between"]
        out.append(f"| {r['setting']} | {r['seed']} | {s['n']} | "
                   f"{', '.join(f'{x:+.4f}' for x in d)} | {m:+.4f} | {s['se_within']:.4f} | "
                   f"{se_b:.4f} | {'yes' if beats(m, se_b, s['n']) else 'no'} "
                   f"(t = {t_crit(s['n']):.2f}) |")
    return "\n".join(out)


#: the full comparison's rule (docs/results.md, "The full comparison's plan"): >= 3 seeds per
#: corpus and setting, each seed's d the mean over its draws of method minus T = 0
MIN_SEEDS = 3


def corpus_of(setting: str) -> tuple[str, str] | None:
    """(corpus, remedy) of a full-comparison setting ``C-eps1`` / ``C-eps1-R`` (remedy "" for
    POPri as the paper); None for any other setting."""
    for c in CORPORA:
        if setting == f"{c}-eps1":
            return c, ""
        for k in REMEDIES:
            if setting == f"{c}-eps1-{k}":
                return c, k
    return None


def seed_means(rows: list[dict], drows: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (setting, seed) of the full comparison: d_s, the mean over the run's draws of method
    minus T = 0 (each paired over the test clients), and the draws it averages.  A run's draws
    are `popri run`'s own (``draws: D``) or, for a final-set variant, its replays; a run of one
    draw counts with n = 1 (the rule needs the draws the plan names: see :func:`verdict`)."""
    out: dict[tuple[str, int], dict] = {}
    for r in rows:  # a kept row's draws (:func:`with_previous`), else its own draw
        d = r.get("draws_d") or ([r["diff"]] if r.get("diff") is not None else None)
        if corpus_of(r["setting"]) and d:
            out[(r["setting"], r["seed"])] = {"d": [float(x) for x in d]}
    for r in drows:
        if corpus_of(r["setting"]):
            out[(r["setting"], r["seed"])] = {"d": _draw_diffs(r)}
    for v in out.values():
        v["mean"] = statistics.fmean(v["d"])
    return out


def verdict(rows: list[dict], drows: list[dict], draws: int = 3) -> list[dict]:
    """Issue 44's rule, per full-comparison setting: over its seeds (each with ``draws``
    draws), the mean d and its SE between seeds, sd(d_s) / sqrt(n); it **beats** T = 0 when
    d > t(0.95, n - 1) SE and **loses** when d < -t(0.95, n - 1) SE, with n >= 3 seeds of
    ``draws`` draws each; "incomplete" otherwise (never a verdict from fewer)."""
    by: dict[str, list[tuple[int, dict]]] = {}
    for (setting, seed), v in seed_means(rows, drows).items():
        by.setdefault(setting, []).append((seed, v))
    out = []
    for setting, v in sorted(by.items()):
        v.sort()
        full = [x for _, x in v if len(x["d"]) >= draws]
        ds = [x["mean"] for _, x in v]
        n = len(ds)
        mean = statistics.fmean(ds)
        se = statistics.stdev(ds) / math.sqrt(n) if n > 1 else float("nan")
        t = t_crit(n) if n > 1 else float("nan")
        if len(full) < len(v) or n < MIN_SEEDS:
            word = "incomplete"
        elif beats(mean, se, n):
            word = "beats"
        elif beats(-mean, se, n):
            word = "loses"
        else:
            word = "neither"
        c, k = corpus_of(setting) or ("", "")
        out.append({"setting": setting, "corpus": c, "remedy": k, "seeds": [s for s, _ in v],
                    "draws": [len(x["d"]) for _, x in v], "d_s": ds, "mean": mean, "se": se,
                    "t": t, "verdict": word})
    return out


def rule(verdicts: list[dict]) -> list[dict]:
    """Per remedy (and POPri as the paper, remedy ""): the corpora it beats and loses on, and
    whether it meets the rule (beats on >= 2 of the corpora, loses on none, every corpus
    complete)."""
    out = []
    for k in sorted({v["remedy"] for v in verdicts}):
        mine = {v["corpus"]: v for v in verdicts if v["remedy"] == k}
        done = [c for c in CORPORA if c in mine and mine[c]["verdict"] != "incomplete"]
        beat = [c for c in done if mine[c]["verdict"] == "beats"]
        lose = [c for c in done if mine[c]["verdict"] == "loses"]
        complete = len(done) == len(CORPORA)
        out.append({"remedy": k or "(POPri as the paper)", "complete": done, "beats": beat,
                    "loses": lose,
                    "meets_rule": (len(beat) >= 2 and not lose) if complete else None})
    return out


def verdict_table(verdicts: list[dict]) -> str:
    """The full comparison's table (issue 44's rule) and, per remedy, the rule's outcome."""
    if not verdicts:
        return ""
    out = ["| setting | corpus | seeds (draws each) | d per seed (mean over its draws) | "
           "mean d | SE between seeds | t(0.95, n-1) | verdict |", "|" + "---|" * 8]
    for v in verdicts:
        out.append(
            f"| {v['setting']} | {v['corpus']} | "
            f"{', '.join(f'{s} ({n})' for s, n in zip(v['seeds'], v['draws']))} | "
            f"{', '.join(f'{x:+.4f}' for x in v['d_s'])} | {v['mean']:+.4f} | "
            f"{_f(v['se'])} | {_f(v['t'], 2)} | {v['verdict']} |")
    out += ["", "| remedy | corpora complete | beats T = 0 on | loses on | meets the rule "
            "(beats on >= 2, loses on none) |", "|---|---|---|---|---|"]
    for r in rule(verdicts):
        ok = {None: "not yet (corpora incomplete)", True: "yes", False: "no"}[r["meets_rule"]]
        out.append(f"| {r['remedy']} | {', '.join(r['complete']) or '-'} | "
                   f"{', '.join(r['beats']) or '-'} | {', '.join(r['loses']) or '-'} | {ok} |")
    return "\n".join(out)


def collect(runs: Path) -> list[dict]:
    rows = []
    for d in sorted(runs.glob("*-s*")):
        f = d / "results.json"
        if not f.is_file():
            continue
        r = json.loads(f.read_text())
        name, seed = d.name.rsplit("-s", 1)
        pr, ctl = r.get("probe") or {}, r.get("control") or {}
        m = r.get("methods", {})
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()
                   if x.strip()] if (d / "metrics.jsonl").is_file() else []
        dpo = [x for x in metrics if x["stage"] == "dpo"]
        secs = sum(json.loads(s.read_text()).get("seconds") or 0
                   for s in (d / ".stages").glob("*.json")
                   if not s.name.endswith(".attempt.json"))
        rows.append({
            "setting": name, "seed": int(seed), "epsilon": r.get("epsilon"),
            "rounds": r.get("rounds"), "minutes": secs / 60.0,
            "cos0": pr.get("first_mean_cosine"), "cosT": pr.get("last_mean_cosine"),
            "dcos": pr.get("delta_mean_cosine"), "dcos_se": pr.get("delta_mean_cosine_se"),
            "dmmd": pr.get("delta_mmd2"), "dmmd_se": pr.get("delta_mmd2_se"),
            "d2_0": pr.get("first_distinct_2"), "d2_T": pr.get("last_distinct_2"),
            "ppl0": pr.get("first_perplexity"), "pplT": pr.get("last_perplexity"),
            "hold_margin": dpo[-1].get("holdout_margin") if dpo else None,
            "hold_acc": dpo[-1].get("holdout_accuracy") if dpo else None,
            "acc": (m.get(r.get("method")) or {}).get("accuracy"),
            "acc_t0": (m.get("t0") or {}).get("accuracy"),
            "diff": ctl.get("acc_minus_control"), "diff_se": ctl.get("acc_minus_control_se"),
            "gap": (r.get("gap_closed") or {}).get("gap_closed"),
            # what the epsilon holds under (issue 36): the total's relation (runs before popri
            # 0.4 recorded none: they claimed add/remove, and with a fixed count per round that
            # claim was the papers' convention, not a DP guarantee), q, and what checkpoint
            # selection read
            "relation": r.get("neighbouring"), "dp_guarantee": r.get("dp_guarantee"),
            "q": r.get("sample_rate"),
            "selection": (r.get("checkpoint_selection") or {}).get("on"),
            # the fixed-prompt probe of every round (the figure's curves)
            "probe_rounds": sorted(({"round": int(x["round"]), "cos": x.get("mean_cosine"),
                                     "cos_se": x.get("mean_cosine_se"),
                                     "ppl": x.get("perplexity")}
                                    for x in metrics if x.get("stage") == "probe"),
                                   key=lambda x: x["round"]),
        })
        for dk in sorted((d / STUDY_DRAWS).glob("*-d0")):  # final-set variants (final_variant)
            derived = _derived_name(name, dk.name[:-3])
            if derived is None or not (dk / "eval" / "control.json").is_file():
                continue
            c = _control(dk / "eval" / "control.json")
            acc0, acc_inf = ((m.get(k) or {}).get("accuracy") for k in ("eps0", "epsinf"))
            rows.append({**rows[-1], "setting": derived, "minutes": None, "shared": name,
                         "acc": c.get("acc"), "acc_t0": c.get("acc_control"),
                         "diff": c.get("acc_minus_control"),
                         "diff_se": c.get("acc_minus_control_se"),
                         "gap": (None if None in (c.get("acc"), acc0, acc_inf) or acc_inf == acc0
                                 else (c["acc"] - acc0) / (acc_inf - acc0))})
    return sorted(rows, key=lambda r: (r["setting"], r["seed"]))


def probe_curves(rows: list[dict]) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """Per corpus, setting and seed of the full comparison: the fixed-prompt probe of each
    round, in order (:func:`collect`'s ``probe_rounds``, from the run's metrics.jsonl: cosine to
    the private validation split with its SE over probe samples, and the public model's
    perplexity of the probe's samples).  A final-set variant's row shares its base run's probe
    and is left out.  A private diagnostic of each run, never a release."""
    out: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for r in rows:
        cr = corpus_of(r["setting"])
        if cr is not None and not r.get("shared") and r.get("probe_rounds"):
            out.setdefault(cr[0], {}).setdefault(r["setting"], {})[int(r["seed"])] = \
                r["probe_rounds"]
    return out


def probe_figure(curves: dict, path: Path) -> bool:
    """The probe's curves (issue 44 asks for them with every row): one column per corpus;
    top, cosine to the private validation split (bars: 95 % over probe samples); bottom, the
    public model's perplexity of the probe's samples; a colour per setting, a line style per
    seed.  False (nothing written) when no run of the full comparison finished."""
    if not curves:
        return False
    from matplotlib.figure import Figure

    corpora = [c for c in CORPORA if c in curves]
    remedy = {s: corpus_of(s)[1] for c in corpora for s in curves[c]}  # type: ignore[index]
    kinds = sorted(set(remedy.values()), key=lambda k: (k != "", k))  # POPri as the paper first
    colours = {k: f"C{i}" for i, k in enumerate(kinds)}
    styles = ["-", "--", ":", "-."]
    fig = Figure(figsize=(3.6 * len(corpora) + 1.0, 6.4), layout="constrained")
    axes = fig.subplots(2, len(corpora), squeeze=False)
    for j, c in enumerate(corpora):
        top, bot = axes[0][j], axes[1][j]
        for s in sorted(curves[c], key=lambda s: kinds.index(remedy[s])):
            for seed, pts in sorted(curves[c][s].items()):
                xs = [p["round"] for p in pts]
                kw = {"color": colours[remedy[s]], "ls": styles[seed % len(styles)],
                      "marker": "o", "ms": 3,
                      "label": f"{remedy[s] or 'POPri as the paper'}, seed {seed}"}
                top.errorbar(xs, [p["cos"] for p in pts], capsize=2, **kw,
                             yerr=[1.96 * (p["cos_se"] or 0) for p in pts])
                bot.plot(xs, [p["ppl"] for p in pts], **kw)
        top.set_title(f"{c}: {'private ' + CORPUS_LABEL.get(c, c)}", fontsize=9)
        for ax in (top, bot):
            ax.set_xlabel("round (0: the untuned generator)", fontsize=8)
            ax.set_xticks(sorted({p["round"] for s in curves[c].values()
                                  for pts in s.values() for p in pts}))
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=8)
        top.legend(fontsize=7)
    axes[0][0].set_ylabel("probe: cosine to the private val split", fontsize=8)
    axes[1][0].set_ylabel("probe: public model's perplexity", fontsize=8)
    fig.suptitle("Issue 44's full comparison: the fixed-prompt probe per round "
                 "(a private diagnostic, not a release)", fontsize=10)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    return True


def _f(x, nd=4):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def _eps(x) -> str:
    """The oracle's z = 1e-9 is an epsilon of ~1e18: no privacy, shown as such."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or x > 1e6:
        return "none (z ~ 0)"
    return _f(x, 2)


def table(rows: list[dict]) -> str:
    head = ("| setting | seed | eps (relation; selection) | T | cos r0 -> rT (change +- SE) | "
            "MMD^2 change +- SE | distinct-2 r0 -> rT | ppl r0 -> rT | held-out margin / acc | "
            "acc | acc T=0 | minus T=0 +- SE | this draw > 2 paired SE (a draw, not a result) | "
            "minutes |")
    out = [head, "|" + "---|" * 14]
    for r in rows:
        # paired over the run's test clients (dozens to hundreds): t with clients - 1 degrees
        # of freedom is ~ the normal's 1.645 one-sided; 2 SEs is stricter
        win = (r["diff"] is not None and r["diff_se"] is not None and r["diff_se"] > 0
               and r["diff"] > 2 * r["diff_se"])
        rel = r.get("relation") or "add/remove claimed (before popri 0.4)"
        if r.get("dp_guarantee") is False:
            rel = "NOT a DP guarantee (papers' convention)"
        acct = f"{_eps(r['epsilon'])} ({rel}; q = {_f(r.get('q'), 4)}; selection: " \
               f"{r.get('selection') or '-'})"
        out.append(
            f"| {r['setting']} | {r['seed']} | {acct} | {r['rounds']} | "
            f"{_f(r['cos0'])} -> {_f(r['cosT'])} ({_f(r['dcos'])} +- {_f(r['dcos_se'])}) | "
            f"{_f(r['dmmd'], 5)} +- {_f(r['dmmd_se'], 5)} | {_f(r['d2_0'], 3)} -> "
            f"{_f(r['d2_T'], 3)} | {_f(r['ppl0'], 1)} -> {_f(r['pplT'], 1)} | "
            f"{_f(r['hold_margin'])} / {_f(r['hold_acc'], 2)} | {_f(r['acc'])} | "
            f"{_f(r['acc_t0'])} | {_f(r['diff'])} +- {_f(r['diff_se'])} | "
            f"{'yes' if win else 'no'} | "
            + (f"{r['minutes']:.1f} |" if r["minutes"] is not None
               else f"{r['shared']}'s run, final set redrawn |"))
    # per setting, over seeds: the mean change and the spread
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["setting"], []).append(r)
    multi = {k: v for k, v in groups.items() if len(v) > 1}
    if multi:
        # each row's own diff is its first draw (the table above); every draw is in the
        # draws table and the verdicts below
        out += ["", "| setting | seeds | cos change (mean, SE over seeds) | minus T=0, each "
                "seed's first draw (mean, SE within / between seeds; the verdicts use every "
                "draw) |", "|---|---|---|---|"]
        for k, v in multi.items():
            dc = [x["dcos"] for x in v if x["dcos"] is not None]
            dd = [x["diff"] for x in v if x["diff"] is not None]
            se_w = [x["diff_se"] for x in v if x["diff_se"] is not None]
            out.append(
                f"| {k} | {len(v)} | {statistics.mean(dc):.4f} "
                f"({statistics.stdev(dc) / math.sqrt(len(dc)) if len(dc) > 1 else float('nan'):.4f}) | "
                f"{statistics.mean(dd):+.4f} ({math.sqrt(sum(s * s for s in se_w)) / len(se_w):.4f}"
                f" / {statistics.stdev(dd) / math.sqrt(len(dd)) if len(dd) > 1 else float('nan'):.4f}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/study")
    ap.add_argument("--only", nargs="+", default=None, help="Settings to run (default: all).")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="Extra override for every run.")
    ap.add_argument("--draws", type=int, default=0,
                    help="After each run: this many more draws of the final set and its control.")
    ap.add_argument("--draw-gen", nargs="+", default=None, metavar="FLAG=VALUE",
                    help="With --draws: draw the final set and its control with these `popri gen` "
                         "options instead (e.g. top-p=0.9); draw 0 is then not the run's own.")
    ap.add_argument("--name", default="learning_study",
                    help="benchmarks/results/NAME.md and .json (default learning_study).")
    ap.add_argument("--with", dest="prev", default=None, metavar="NAME",
                    help="Also tabulate the rows of benchmarks/results/NAME.json (and their lines "
                         "of NAME.md's draws table) for the runs absent from --runs (e.g. a run "
                         "directory deleted after its table was written).")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", action="store_true", help="Only tabulate what ran.")
    a = ap.parse_args()
    runs = Path(a.runs)
    gen = None
    if a.draw_gen:
        bad = [x for x in a.draw_gen if "=" not in x]
        if bad:
            sys.exit(f"learning_study: --draw-gen takes FLAG=VALUE (e.g. top-p=0.9), got {bad[0]!r}")
        gen = [y for x in a.draw_gen for y in (f"--{x.split('=', 1)[0].lstrip('-')}",
                                                x.split("=", 1)[1])]
    if a.list:
        for k, v in SETTINGS.items():
            print(f"{k}: {' '.join(v)}")
        return
    if not a.table:
        for name in a.only or list(SETTINGS):
            if name not in SETTINGS:
                sys.exit(f"unknown setting {name!r}: see --list")
            var = final_variant(name)
            for seed in a.seeds:
                d = runs / f"{(var or (name,))[0]}-s{seed}"
                if not (d / "results.json").is_file():
                    run_setting((var or (name,))[0], seed, runs, a.sets)
                if var and (d / "results.json").is_file():  # draws 0 .. D-1 of the base run
                    for k in range(_config_draws(a.sets)):
                        draw(d, k, var[1]["gen"], match=var[1]["match"])
                for k in range(1, a.draws + 1):
                    if (d / "results.json").is_file():
                        if var:
                            draw(d, k, var[1]["gen"], match=var[1]["match"])
                        else:
                            draw(d, k, gen)
    rows = collect(runs)
    drows = collect_draws(runs)
    kept: list[str] = []
    keep_draws(rows, drows)
    if a.prev:
        rows, kept = with_previous(rows, drows, a.prev)
    md = table(rows)
    if drows or kept:
        md += "\n\n" + draws_table(drows, kept)
    vt = verdict_table(verdict(rows, drows, _config_draws(a.sets)))
    if vt:
        md += "\n\n" + vt
    print(md)
    res = HERE / "results"
    res.mkdir(exist_ok=True)
    (res / f"{a.name}.md").write_text(md + "\n")
    (res / f"{a.name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    if probe_figure(probe_curves(rows), res / f"{a.name}_probe.png"):
        print(f"probe curves: {res / (a.name + '_probe.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
