"""What a method's recipe builds its stages with: the stage, its DP release, the run's paths,
and a stage's options.

    from popri.kit import DPRelease, Stage, settings
    from popri.specs.commands.gen import GenCall
    Stage("round1-gen", GenCall(omega="omega.jsonl", prompts=4, out="r1.jsonl"),
          outputs=["r1.jsonl"], inputs=["omega.jsonl"])

A recipe (``popri/methods/NAME/recipe.py``) yields :class:`Stage` objects -- each one ``popri``
subcommand as a typed call (:mod:`popri.specs.commands`) with its inputs and outputs -- built,
not run; ``popri run``'s driver
(:mod:`popri.pipeline.driver`) runs them through its cached runner
(:mod:`popri.pipeline.stages`).  A stage that releases something under DP declares it
(:class:`DPRelease`), so the driver's budget guard can check it before it runs.

This package sits below every method and above nothing a method does not already use: it
imports only ``core`` and the commands' calls in ``specs`` (the layers of
docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from popri.core.spec import Call
from popri.core.urls import redact_arg
from popri.kit.seeds import draw_seed
from popri.specs.commands.gen import GenCall
from popri.specs.commands.take import TakeCall

#: the dry-run placeholder for a noise multiplier that depends on the fetched client count
Z_LATER = "<z: set after the fetch>"


@dataclass
class Stage:
    """One ``popri`` command of a run: its :class:`~popri.core.spec.Call` (the command and
    every argument, typed), the paths it reads and writes, and how the runner treats it.  The
    command line is rendered from the call when the stage runs (and for ``commands.sh`` and the
    dry-run plan); the cache key is derived from the call's fields and the inputs."""

    name: str
    call: Call                            # the command and its arguments
    outputs: list[str]                    # paths (files or dirs) that must exist afterwards
    inputs: list[str] = field(default_factory=list)  # files/dirs this stage reads
    stdout_to: str | None = None          # capture stdout into this file (atomically)
    # called with the stage's key right before it runs (not when it is skipped, not in a dry
    # run): e.g. the budget guard of a DP stage, which raises to stop the run
    before: Callable[[str], None] | None = None
    # a DP stage declares the ledger entries it will record (the driver's budget guard and
    # plan check compose them with every release already under the run directory)
    release: "DPRelease | None" = None
    # fields that make the command start over in its output directory (dpo / sft:
    # {"resume": False}), set when the runner runs it with a key no earlier attempt there had:
    # the checkpoints of another attempt are stale, and the stage owns its directory.  Not part
    # of the key or of commands.sh (a replay by hand resumes, as the command does by default)
    fresh: dict = field(default_factory=dict)
    # ``popri --quiet CMD``: a client's stage in release mode (its log lines would count the
    # private samples)
    quiet: bool = False

    @property
    def args(self) -> list[str]:
        """The command line after ``popri`` (rendered from :attr:`call`)."""
        return (["--quiet"] if self.quiet else []) + self.call.argv()

    def fresh_args(self) -> list[str]:
        """The command line that starts over (:attr:`fresh` applied to the call)."""
        return (["--quiet"] if self.quiet else []) + \
            dataclasses.replace(self.call, **self.fresh).argv()

    def key_fields(self) -> dict:
        """What the cache key hashes of the stage itself: the command and every field of its
        call but those declared ``keyed=False`` (a mark that changes no output's content, such
        as ``bench fetch --public``); the inputs' contents are hashed beside it."""
        unkeyed = {f.name for f in dataclasses.fields(self.call)
                   if f.metadata.get("keyed") is False}
        call = {k: v for k, v in dataclasses.asdict(self.call).items() if k not in unkeyed}
        return {"command": self.call.command, "quiet": self.quiet, "call": call}

    def shown(self) -> str:
        """The command line as a user would type it (commands.sh, the dry-run plan, the log),
        with any URL password hidden (``--base-url http://user:***@host``)."""
        s = "popri " + " ".join(shlex.quote(redact_arg(a)) for a in self.args)
        return s + (f" > {shlex.quote(self.stdout_to)}" if self.stdout_to else "")


@dataclass
class DPRelease:
    """What a DP stage will spend: its prospective ledger ``entries``, the ``ledger`` file it
    appends to, and ``match(entry)``: is a recorded entry one of this stage's releases."""
    entries: list
    ledger: Path
    match: Callable[[Any], bool]


@dataclass(frozen=True)
class RunPaths:
    """The files a run's stages share, by name (``run.paths.synthetic``): under the run
    directory ``root``, except the private data when ``data.dir`` names an existing
    dataset."""

    root: Path          # the run directory itself (run_dir)
    private: Path       # the private federated dataset (bench fetch / instruct build)
    public: Path        # the public data Omega (bench fetch), when not a file
    emb_private: Path   # the private train split's embeddings
    emb_val: Path       # the private validation split's embeddings
    emb_public: Path    # Omega's embeddings
    select_stats: Path  # dpo.select_on: dp -- the DP mean and covariance of the validation split
    synthetic: Path     # the method's synthetic set
    synthetic_pool: Path  # final_match_tokens: the pool the synthetic set is cut from
    synthetic_tuned: Path  # final_untuned_share: the tuned generator's set before the mix
    eval: Path          # the evaluation's outputs

    @classmethod
    def of(cls, run: str | Path, data_dir: str | None = None) -> "RunPaths":
        run = Path(run)
        return cls(root=run, private=Path(data_dir) if data_dir else run / "data" / "private",
                   public=run / "data" / "public",
                   emb_private=run / "embeddings" / "private.npy",
                   emb_val=run / "embeddings" / "val.npy",
                   emb_public=run / "embeddings" / "public.npy",
                   select_stats=run / "selection" / "val_stats.npz",
                   synthetic=run / "synthetic.jsonl",
                   synthetic_pool=run / "synthetic_pool.jsonl",
                   synthetic_tuned=run / "synthetic_tuned.jsonl", eval=run / "eval")


def settings(spec_cls, *sections, **values) -> dict:
    """A stage's settings from config sections: the sections' fields that are fields of the
    step's spec (same name: the section declared them with ``same(spec_cls, ...)``), then
    ``values`` -- as keywords of the step's :class:`~popri.core.spec.Call`."""
    names = {f.name for f in dataclasses.fields(spec_cls)}
    vals = {}
    for sec in sections:
        vals.update({f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)
                     if f.name in names})
    vals.update(values)
    return vals


def take_call(pool, ref, out, tokenizer: str) -> TakeCall:
    """``popri take`` cutting ``pool`` to ``ref``'s tokens, counted with ``tokenizer``
    (``final_match_tokens``: the method's final set cut to its T = 0 control's tokens;
    benchmarks/learning_study.py replays it for its final-set variants)."""
    return TakeCall(samples=str(pool), tokens_of=str(ref), tokenizer=tokenizer, out=str(out),
                    stats_out=str(Path(out).with_name(Path(out).stem + "_take.json")))


def take_stage(name: str, pool, ref, out, tokenizer: str) -> Stage:
    """The stage cutting ``pool`` to ``ref``'s tokens (:func:`take_call`)."""
    return Stage(name, take_call(pool, ref, out, tokenizer), outputs=[str(out)],
                 inputs=[str(pool), str(ref)])


def mix_stage(name: str, tuned, untuned, out, share: float, seed: int) -> Stage:
    """``final_untuned_share`` (issue 67): ``popri take --mix-from``, the samples of a seeded
    share of the tuned set's prompts replaced by the untuned set's (same prompts and seeds)."""
    out = Path(out)
    return Stage(name, TakeCall(samples=str(tuned), mix_from=str(untuned), share=float(share),
                                seed=int(seed), out=str(out),
                                stats_out=str(out.with_name(out.stem + "_mix.json"))),
                 outputs=[str(out)], inputs=[str(tuned), str(untuned)])


def redrawn(st: Stage, k: int, out: Path, name: str) -> Stage:
    """Draw ``k`` of the set a ``popri gen`` stage writes: the same call with its seed
    replaced by :func:`draw_seed` (seed, k), written to ``out`` (and its stats beside it).
    ``popri run``'s ``draws`` (issue 24)."""
    call = st.call
    if not isinstance(call, GenCall):
        raise ValueError(f"stage {st.name} is not a 'popri gen' stage")
    changes = {"seed": draw_seed(call.seed, k), "out": str(out)}
    if call.stats_out:
        changes["stats_out"] = str(out.with_name(out.stem + "_stats.json"))
    return Stage(name, dataclasses.replace(call, **changes), outputs=[str(out)],
                 inputs=list(st.inputs))
