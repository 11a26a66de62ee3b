"""Recipes: functions returning a :class:`fastrl.config.RunConfig`, looked up by name.

A recipe's name says the run (model, method, data, hardware, precision) and its docstring says the
layout. New recipes derive from a base recipe in a few lines (``dataclasses.replace``).

    from recipes import get_recipe, list_recipes
    config = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
"""

from __future__ import annotations

import difflib
from typing import Callable

from fastrl.config import ConfigError, RunConfig

RecipeFn = Callable[[], RunConfig]
_REGISTRY: dict[str, RecipeFn] = {}

DEFAULT_RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"


def register(name: str | None = None) -> Callable[[RecipeFn], RecipeFn]:
    """Decorator: register a recipe function under ``name`` (default: the function name)."""

    def wrap(fn: RecipeFn) -> RecipeFn:
        key = name or fn.__name__
        if key in _REGISTRY:
            raise ValueError(f"recipe {key!r} registered twice")
        _REGISTRY[key] = fn
        return fn

    return wrap


def _load_all() -> None:
    # Importing the modules registers their recipes.
    from recipes import cpu, gpu  # noqa: F401


def list_recipes() -> list[str]:
    """Names of every registered recipe, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def recipe_function(name: str) -> RecipeFn:
    """The function registered under ``name``.

    Raises:
        ConfigError: unknown name (with the closest registered names).
    """
    _load_all()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown recipe {name!r}{hint} (python -m fastrl.train --list-recipes)")
    return _REGISTRY[name]


def get_recipe(name: str) -> RunConfig:
    """Build (and validate) the recipe ``name``."""
    config = recipe_function(name)()
    if config.recipe != name:
        import dataclasses

        config = dataclasses.replace(config, recipe=name)
    return config
