"""Methods, one package each, each with its steps and a ``recipe.py`` (the stages of ``popri run``).

The registry of recipes is :mod:`popri.pipeline.recipes`."""
