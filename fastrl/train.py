"""Entry point: ``python -m fastrl.train --recipe NAME [key.path=value ...] [--dry-run]``.

Parses the recipe and overrides, then (unless ``--dry-run``) initializes the parallel state and
runs the trainer. ``--describe`` lists every config key with its value and documentation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from fastrl.cli import apply_overrides, describe_config, format_config
from fastrl.config import ConfigError, RunConfig


def build_parser() -> argparse.ArgumentParser:
    from recipes import DEFAULT_RECIPE

    parser = argparse.ArgumentParser(
        prog="python -m fastrl.train",
        description="FastRL: group-relative RL (GRPO / DAPO / GSPO) with MDAP pruning and adaptive "
        "rollout sampling.",
        epilog="Overrides are dotted keys, e.g. rollout.n=4 optimizer.lr=3e-5 pruning.method=cppo. "
        "--describe lists them all.",
    )
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe name (default: {DEFAULT_RECIPE})")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--describe", action="store_true", help="list every config key with its documentation")
    parser.add_argument("--list-recipes", action="store_true", help="list the registered recipes and exit")
    return parser


def resolve_config(recipe: str, overrides: Sequence[str]) -> RunConfig:
    """The recipe ``recipe`` with ``overrides`` applied and validated."""
    from recipes import get_recipe

    return apply_overrides(get_recipe(recipe), overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    if args.list_recipes:
        from recipes import list_recipes, recipe_function

        for name in list_recipes():
            summary = (recipe_function(name).__doc__ or "").strip().splitlines()[0]
            print(f"{name:48s} {summary}")
        return 0
    try:
        config = resolve_config(args.recipe, args.overrides)
    except ConfigError as err:
        print(f"fastrl.train: config error: {err}", file=sys.stderr)
        return 2
    if args.describe:
        print(describe_config(config))
        return 0
    if args.dry_run:
        print(f"# recipe: {config.recipe}")
        print(format_config(config))
        return 0
    from fastrl.training.run import run  # heavy imports only when training

    return run(config)


if __name__ == "__main__":
    sys.exit(main())
