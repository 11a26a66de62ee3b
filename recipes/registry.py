"""The recipe registry: recipe functions by name, the :func:`register` decorator and look-ups.

Recipe modules (``recipes/cpu.py``, ``recipes/gpu.py``) import :func:`register` from here;
``recipes/__init__.py`` imports them so that every recipe is registered once ``recipes`` is imported.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Callable

from fastrl.config import ConfigError, RunConfig

__all__ = ["DEFAULT_RECIPE", "RecipeFn", "get_recipe", "list_recipes", "recipe_function", "register"]

RecipeFn = Callable[[], RunConfig]
_REGISTRY: dict[str, RecipeFn] = {}

DEFAULT_RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"


def register(name: str | None = None) -> Callable[[RecipeFn], RecipeFn]:
    """Decorator: register a recipe function under ``name`` (default: the function name).

    Raises:
        ValueError: ``name`` is registered already.
    """

    def wrap(fn: RecipeFn) -> RecipeFn:
        key = name or fn.__name__
        if key in _REGISTRY:
            raise ValueError(f"recipe {key!r} registered twice")
        _REGISTRY[key] = fn
        return fn

    return wrap


def list_recipes() -> list[str]:
    """Names of every registered recipe, sorted."""
    return sorted(_REGISTRY)


def recipe_function(name: str) -> RecipeFn:
    """The function registered under ``name``.

    Raises:
        ConfigError: unknown name (with the closest registered names).
    """
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown recipe {name!r}{hint} (python -m fastrl.train --list-recipes)")
    return _REGISTRY[name]


def get_recipe(name: str) -> RunConfig:
    """Build (and validate) the recipe ``name``; its ``recipe`` field is set to ``name``."""
    config = recipe_function(name)()
    if config.recipe != name:
        config = dataclasses.replace(config, recipe=name)
    return config
