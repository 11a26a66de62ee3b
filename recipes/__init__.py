"""Recipes: functions returning a :class:`fastrl.config.RunConfig`, looked up by name.

A recipe's name says the run (model, method, data, hardware, precision) and its docstring says the
layout. New recipes derive from a base recipe in a few lines (``dataclasses.replace``).

    from recipes import get_recipe, list_recipes
    config = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")

The registry lives in :mod:`recipes.registry`; importing this package registers the recipes of
:mod:`recipes.cpu`, :mod:`recipes.gpu` and :mod:`recipes.smollm2`.
"""

from recipes import cpu, gpu, smollm2  # noqa: F401  (importing the modules registers their recipes)
from recipes.registry import DEFAULT_RECIPE, RecipeFn, get_recipe, list_recipes, recipe_function, register

__all__ = ["DEFAULT_RECIPE", "RecipeFn", "get_recipe", "list_recipes", "recipe_function", "register"]
