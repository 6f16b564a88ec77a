"""What ``popri run`` takes: every argument of the command as a field of one
:class:`~popri.core.spec.Call` (popri/cli/commands/run.py derives its options from it; a stage
of ``popri run`` is an instance, its command line rendered by ``Call.argv``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from popri.core.spec import Call, param


@dataclass(frozen=True, kw_only=True)
class RunCall(Call):
    """``popri run``."""

    command: ClassVar[str] = 'run'
    config: str | None = param(None,
                               'YAML config (see examples/; every key and its default is in '
                               'popri/pipeline/config.py). Without it: those defaults, the '
                               'embedded default that examples/default.yaml spells out (a test '
                               'keeps them equal).', positional=True)
    set_: tuple[str, ...] = param((),
                                  'Override any config key: --set dpo.lr=2e-5 (repeatable; the '
                                  'value is parsed as YAML).', flag='--set', short='-s')
    run_dir: str | None = param(None,
                                'Shortcut for --set run_dir=DIR (DIR taken as written, not '
                                'parsed as YAML); an empty or blank DIR is refused.')
    dry_run: bool = param(False,
                          "Print the plan on stdout (how z is set, then every stage command; '# "
                          "up to date' marks a cached one) and nothing else: no stage runs, no "
                          'file or directory is written.', negatable=False)
    show_config: bool = param(False,
                              'Print the resolved config (the embedded default or the YAML, '
                              'with every --set applied and every default filled in) as YAML on '
                              'stdout, and exit: nothing runs.', negatable=False)
    rerun: bool = param(False,
                        'Let finished DP stages run again: a resume whose config or inputs '
                        'changed so that a stage that already released (its ledger holds it) '
                        'would run again is refused before anything runs, naming the stages and '
                        'why; with --rerun each such rerun is a new DP release, counted against '
                        'privacy.epsilon before the first stage runs (a rerun that reproduces '
                        'its release bit for bit is the same release).', negatable=False)
    reuse_from: tuple[str, ...] = param((),
                                        'Another run directory whose finished stages this run '
                                        'copies instead of running them (repeatable; '
                                        'popri/pipeline/reuse.py): a stage is copied only when '
                                        'the lender ran the same command (its paths moved to '
                                        'this run) on inputs of the same content with this '
                                        'popri version, and its outputs still hash as recorded; '
                                        'the copy is hash-checked and its marker says '
                                        'reused_from. A DP release is never copied (each run '
                                        'makes its own, on its own ledger), and nothing is in '
                                        'release mode.', flag='--reuse-from', metavar='RUN')
    release: bool = param(False,
                          'Release mode (shortcut for --set release=true): every DP stage and '
                          'every stage that samples clients gets --release (OS CSPRNG, '
                          'discretised Gaussian; nothing reproducible from a seed); the '
                          'noise-free recovery-rate diagnostic is skipped, and the run stops at '
                          'its release (synthetic set or DP model, and the ledger): no '
                          'evaluation on the private splits; probe.enabled and dpo.select_on: '
                          'private are refused. Without it: research mode, seeded noise, '
                          'reproducible from the sidecars.', negatable=False,
                          envvar='POPRI_RELEASE')
