"""The recipe kit: what a method's recipe builds its stages with (docs/architecture.md).

    from popri.kit import DPRelease, Stage, round_seed, settings
    python -m pytest -q tests/test_layers.py

Below every method (``popri.methods``), above nothing but ``core``: :mod:`popri.kit.stage`
(:class:`Stage`, :class:`DPRelease`, :class:`RunPaths`, :func:`settings`, :func:`redrawn`,
:func:`take_stage`), :mod:`popri.kit.seeds` (the named seed rules) and :mod:`popri.kit.notes`
(lines of the plan and the results table).  What a recipe may ask of the run it builds for is
:class:`popri.methods.base.RunContext`.
"""

from popri.kit.notes import fmt, pair_fields, released_line, selection_note
from popri.kit.seeds import draw_seed, final_seed, round_seed, sample_seed
from popri.kit.stage import (
    Z_LATER,
    DPRelease,
    RunPaths,
    Stage,
    mix_stage,
    redrawn,
    settings,
    take_call,
    take_stage,
)

__all__ = ["Stage", "DPRelease", "RunPaths", "Z_LATER", "settings", "redrawn", "take_call",
           "take_stage", "mix_stage", "round_seed", "final_seed", "draw_seed", "sample_seed", "released_line",
           "selection_note", "fmt", "pair_fields"]
