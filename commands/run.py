"""popri run: the whole POPri loop from one YAML config (maths and stage list: popri_cli/pipeline.py).

    popri run examples/default.yaml
    popri run examples/default.yaml --set rounds=1 --set privacy.epsilon=7 --set run_dir=runs/e7
"""

from __future__ import annotations

from typing import List, Optional

import typer


def run(
    config: Optional[str] = typer.Argument(
        None, help="YAML config (see examples/default.yaml; every key and its default is in "
                   "popri_cli/config.py). Without it: the embedded default."),
    set_: List[str] = typer.Option(
        [], "--set", "-s", help="Override any config key: --set dpo.lr=2e-5 (repeatable; the "
                                "value is parsed as YAML)."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Shortcut for --set run_dir=DIR."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the stage commands, run nothing."),
) -> None:
    """Run POPri end to end (T rounds of gen, score, prefs, dpo; then synthetic data, downstream training, evaluation against the eps=0 / eps=inf baselines, and the ledger totalled).

    method: popri (default) | pe (PrE-Text: T rounds of nn-histogram votes, survivor draws and
    variations, then expand the DP seed set; examples/pe.yaml) | pe-sft (POPri's PE+SFT baseline:
    SFT on the top-scored samples instead of DPO; examples/pe-sft.yaml).  score.mode
    nn-histogram with method popri is POPri's scoring ablation.

    Every stage's output goes into the run directory; a stage whose inputs and parameters are
    unchanged is skipped, so a killed run continues from the last finished stage.  The noise
    multiplier is calibrated from privacy.epsilon / privacy.delta over the T rounds at the client
    sampling rate (opacus RDP by default, as POPri D.1), unless privacy.noise_multiplier is set.
    The results table (markdown) goes to stdout and RUN/results.md; RUN/results.json has all of it.
    """
    from popri_cli import config as C
    from popri_cli.pipeline import POPriRun, results_table

    overrides = list(set_) + ([f"run_dir={run_dir}"] if run_dir else [])
    cfg = C.load(config, overrides)
    results = POPriRun(cfg, dry_run=dry_run).execute()
    if results:
        typer.echo(results_table(results))


def register(app: typer.Typer) -> None:
    app.command("run")(run)
