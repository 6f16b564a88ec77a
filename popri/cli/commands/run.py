"""popri run: the whole POPri loop from one YAML config (maths and stage list: popri/pipeline/driver.py).

    popri run examples/default.yaml
    popri run examples/default.yaml --set rounds=1 --set privacy.epsilon=7 --set run_dir=runs/e7
    popri run examples/default.yaml --set dpo.beta=0.2 --run-dir runs/b --reuse-from runs/e7
"""

from __future__ import annotations

from typing import List, Optional

import typer

from popri.cli.options import unwrap
from popri.core.errors import ConfigError
from popri.core.guard import check_outputs
from popri.pipeline import config as C
from popri.pipeline.config import control_char
from popri.pipeline.driver import Run
from popri.pipeline.results import results_table
from popri.pipeline.recipes import METHODS
from popri.cli.options import command
from popri.specs.commands.run import RunCall


@command(RunCall)
def run(
    config: Optional[str], set_: List[str], run_dir: Optional[str], dry_run: bool,
    show_config: bool, rerun: bool, release: bool, reuse_from: List[str]
) -> None:
    """Run POPri end to end (T rounds of gen, score, prefs, dpo; then synthetic data, downstream training, evaluation against the eps=0 / eps=inf baselines, and the ledger totalled).

    {methods}

    score.mode nn-histogram with method popri is POPri's scoring ablation.

    Every stage's output goes into the run directory; a stage whose inputs and parameters are
    unchanged is skipped, so a killed run continues from the last finished stage.  The noise
    multiplier is calibrated from privacy.epsilon / privacy.delta over the T rounds at the client
    sampling rate (opacus RDP by default, as POPri D.1), unless privacy.noise_multiplier is set.
    The results table (markdown) goes to stdout and RUN/results.md; RUN/results.json has all of it.

    Privacy: privacy.epsilon at privacy.delta is the budget of the whole run directory (every
    ledger.jsonl below it, as 'popri account ledger RUN' totals them); a stage whose release
    would exceed it is refused before it starts (exit 2), and so is a plan that would.  Config
    errors (unknown keys, values out of range, inf/nan) exit 2 before anything runs.  The table
    states the mode (research/release) and what DPO checkpoint selection reads (dpo.select_on:
    dp, the default, a DP statistic of the validation split inside the budget | public | none |
    private, the paper's, NOT covered by epsilon).  A resume that would run a finished DP stage
    again (its config or inputs changed) is refused before anything runs unless --rerun.
    """
    overrides = (list(set_) + _run_dir_override(run_dir)
                 + (["release=true"] if release else []))
    cfg = C.load(config, overrides)
    if show_config:
        import yaml

        # readable UTF-8 ('模型🙂', not "\u6A21\u578B\U0001F642"); it loads back the same
        typer.echo(yaml.safe_dump(C.to_dict(cfg), sort_keys=False, allow_unicode=True).rstrip())
        return
    from pathlib import Path

    # the run's own files (each stage guards its own outputs when it runs); config.resolved.json
    # is left out: rerunning a run from its resolved config rewrites it by design
    R = Path(cfg.run_dir)
    check_outputs([R, R / "results.json", R / "results.md", R / "commands.sh"],
                  [config, cfg.data.dir])
    pipeline = Run(cfg, dry_run=dry_run, rerun=rerun, inputs=[config] if config else [],
                   reuse_from=reuse_from)
    results = pipeline.execute()
    if dry_run:
        typer.echo(pipeline.plan_text())
    elif results:
        typer.echo(results_table(results))


def _run_dir_override(run_dir: str | None) -> list[str]:
    """``--run-dir DIR`` as the ``--set run_dir=...`` it stands for, DIR quoted so that YAML
    reads it back as the same string ('null', '7' and '~' are directory names here).  An empty
    or blank DIR, or one with a control character (the rule of --set values,
    popri.pipeline.config), is a ConfigError naming --run-dir (before: '' was ignored, so the
    YAML's run_dir was used, and ' ' read as null)."""
    import json

    if run_dir is None:
        return []
    if not run_dir.strip():
        raise ConfigError(f"{run_dir!r} is not a directory name: give --run-dir a directory "
                          "(or leave it out to use the config's run_dir)", path="--run-dir")
    bad = control_char(run_dir)
    if bad is not None:
        raise ConfigError(f"holds {bad} ({run_dir!r}): a path with control characters is "
                          "refused", path="--run-dir")
    return [f"run_dir={json.dumps(run_dir, ensure_ascii=False)}"]


def register(app: typer.Typer) -> None:
    import inspect

    app.command("run", help=unwrap(inspect.cleandoc(run.__doc__)).replace(
        "{methods}", methods_help()))(run)


def methods_help() -> str:
    """Every method ``popri run`` knows, one per line with its summary, from the registry
    (popri.pipeline.recipes.METHODS); a paragraph click keeps as written (``\\b``), each
    line within 76 columns."""
    import textwrap

    width = max(map(len, METHODS)) + 2
    lines = ["\b", "method (the config's 'method'; default popri):"]
    for name, m in METHODS.items():
        body = textwrap.wrap(m.summary, 74 - width)
        lines.append(f"  {name.ljust(width)}{body[0]}")
        lines += [" " * (2 + width) + b for b in body[1:]]
    return "\n".join(lines)
