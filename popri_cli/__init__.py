"""Deprecated import name: ``popri_cli`` is now ``popri`` (kept for one release).

``import popri_cli.scoring`` and the other old module names resolve to their new homes in the
layered package (``popri.feedback.scoring`` ...) with a DeprecationWarning; ``python -m
popri_cli`` still runs the CLI.  Will be removed in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

warnings.warn("the import name popri_cli is deprecated: use popri", DeprecationWarning,
              stacklevel=2)

#: old module name -> new module name
ALIASES = {
    "popri_cli.cli": "popri.cli.app",
    "popri_cli.commands": "popri.cli.commands",
    "popri_cli.errors": "popri.core.errors",
    "popri_cli.io": "popri.core.io",
    "popri_cli.log": "popri.core.log",
    "popri_cli.runtime": "popri.core.runtime",
    "popri_cli.validate": "popri.core.validate",
    "popri_cli.compat": "popri.core.compat",
    "popri_cli.guard": "popri.core.guard",
    "popri_cli.ledger": "popri.privacy.ledger",
    "popri_cli.privacy": "popri.privacy",
    "popri_cli.privacy.accounting": "popri.privacy.accounting",
    "popri_cli.privacy.noise": "popri.privacy.noise",
    "popri_cli.privacy.release": "popri.privacy.release",
    "popri_cli.audit": "popri.privacy.audit",
    "popri_cli.scoring": "popri.feedback.scoring",
    "popri_cli.score_release": "popri.feedback.release",
    "popri_cli.embed": "popri.models.embed",
    "popri_cli.llm": "popri.models.llm",
    "popri_cli.fid": "popri.models.fid",
    "popri_cli.generation": "popri.models.generation",
    "popri_cli.dpo": "popri.methods.popri.dpo",
    "popri_cli.prefs": "popri.methods.popri.prefs",
    "popri_cli.pe": "popri.methods.pe.draw",
    "popri_cli.variation": "popri.methods.pe.variation",
    "popri_cli.expand": "popri.methods.pe.expand",
    "popri_cli.fred": "popri.methods.fred.stats",
    "popri_cli.downstream": "popri.eval.downstream",
    "popri_cli.data": "popri.data",
    "popri_cli.config": "popri.pipeline.config",
    "popri_cli.stages": "popri.pipeline.stages",
    "popri_cli.pipeline": "popri.pipeline.driver",
    "popri_cli.commands.account": "popri.cli.commands.account",
    "popri_cli.commands.aggregate": "popri.cli.commands.aggregate",
    "popri_cli.commands.audit": "popri.cli.commands.audit",
    "popri_cli.commands.bench": "popri.cli.commands.bench",
    "popri_cli.commands.dpo": "popri.cli.commands.dpo",
    "popri_cli.commands.embed": "popri.cli.commands.embed",
    "popri_cli.commands.eval": "popri.cli.commands.eval",
    "popri_cli.commands.expand": "popri.cli.commands.expand",
    "popri_cli.commands.fred": "popri.cli.commands.fred",
    "popri_cli.commands.gen": "popri.cli.commands.gen",
    "popri_cli.commands.pe": "popri.cli.commands.pe",
    "popri_cli.commands.prefs": "popri.cli.commands.prefs",
    "popri_cli.commands.run": "popri.cli.commands.run",
    "popri_cli.commands.score": "popri.cli.commands.score",
    "popri_cli.commands.sft": "popri.cli.commands.sft",
    "popri_cli.commands.train_downstream": "popri.cli.commands.train_downstream",
    "popri_cli.commands.vary": "popri.cli.commands.vary",
    "popri_cli.data.build": "popri.data.build",
    "popri_cli.data.chunking": "popri.data.chunking",
    "popri_cli.data.debian": "popri.data.debian",
    "popri_cli.data.hub": "popri.data.hub",
    "popri_cli.data.shakespeare": "popri.data.shakespeare",
    "popri_cli.data.sources": "popri.data.sources",
    "popri_cli.data.splits": "popri.data.splits",
    "popri_cli.data.stats": "popri.data.stats",
    "popri_cli.data.tokenize": "popri.data.tokenize",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(ALIASES[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

from popri import __version__  # noqa: E402,F401
