"""The methods ``popri run`` knows: one table, one entry per method.

    popri run examples/default.yaml --set method=pe --dry-run

A method is a subclass of :class:`popri.methods.base.Method`: its ``recipe(run)`` yields the
method's stages -- a pure function of the config, the run directory's paths and the calibrated
noise, ending by writing ``run.paths.synthetic`` -- and its hooks say where its data comes from,
what a DP round spends, how it is evaluated, its fields of ``results.json``, its line in the
results table and its notes in a dry-run plan.  The driver (:mod:`popri.pipeline.driver`) does
the rest for every method without asking which one it runs: data, calibration, the budget
guard of every stage that declares a DP release (``Stage.release``), caching, evaluation
against eps = 0 / eps = inf, and the ledger total.

Adding a method: write ``popri/methods/NAME/`` (its steps, as ``popri`` subcommands, and
``recipe.py`` with a :class:`~popri.methods.base.Method` subclass) and add one line below.
"""

from __future__ import annotations

from popri.core.errors import ConfigError
from popri.methods.base import Method
from popri.methods.dpfl.recipe import DPFL
from popri.methods.fewfedpit.recipe import FewFedPIT
from popri.methods.pe.recipe import PE
from popri.methods.popri.recipe import PESFT, POPri


def _methods() -> dict[str, Method]:
    return {m.name: m for m in (
        POPri(), PE(), PESFT(), DPFL("fedavg"), DPFL("ftrl"),
        FewFedPIT("fewfedpit"), FewFedPIT("fedit"), FewFedPIT("fedmit"))}


METHODS: dict[str, Method] = _methods()


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"must be one of {', '.join(METHODS)} (got {name!r})",
                          field="method") from None


__all__ = ["METHODS", "Method", "get_method"]
