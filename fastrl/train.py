"""Entry point: ``python -m fastrl.train --recipe NAME [key.path=value ...] [--dry-run]``.

Parses the recipe and overrides, then (unless ``--dry-run``) initializes the parallel state and
runs the trainer. ``--describe`` lists every config key with its value and documentation.

Exit codes: 0 finished (or a stage ended, or a stop signal was honoured after a save); 2 the
config was refused, or this machine cannot run it (FP8 without Transformer Engine; ``--dry-run``
still prints such a recipe's plan, with a line saying so): one line ``fastrl.train: config
error: ...``; 1 an error after start-up (any exception, library ``BaseException`` subclasses such as
``torch.distributed.checkpoint``'s ``CheckpointException`` included): one line ``fastrl.train:
error: ...`` and where the run's full log with the traceback is (``--debug`` prints the traceback
here too); 130 a second Ctrl-C stopped the run at once (one line ``fastrl.train: interrupted``, the
traceback in the log; the first Ctrl-C is a stop request: the run saves and exits 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Sequence

from fastrl.cli import apply_overrides, check_names, describe_config, format_config
from fastrl.config import ConfigError, RunConfig, check_machine_supports


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
    parser.add_argument(
        "--debug", action="store_true",
        help="on an error after start-up, print the traceback here (it is always in the run's log file)",
    )
    return parser


def resolve_config(recipe: str, overrides: Sequence[str]) -> RunConfig:
    """The recipe ``recipe`` with ``overrides`` applied and validated, its reward and template resolved.

    Raises:
        ConfigError: unknown recipe, bad override, refused value, unknown reward or template, a
            memory plan that does not fit (fastrl/models/memory_plan.py).
    """
    from fastrl.models.memory_plan import config_check
    from recipes import get_recipe

    config = apply_overrides(get_recipe(recipe), overrides)
    check_names(config)
    config_check(config)  # the memory plan, when parallel.world_size and parallel.gpu_memory_gib are set
    return config


#: Exit code after an interrupt that stopped the run at once (a second Ctrl-C): 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130


def one_line(err: BaseException) -> str:
    """``err`` as one line: ``Type: message`` with the message's whitespace runs collapsed."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


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
        if config.parallel.world_size is not None:  # the memory plan (fastrl/models/memory_plan.py)
            from fastrl.models.memory_plan import dry_run_report

            print(dry_run_report(config))
        try:
            check_machine_supports(config.precision)
        except ConfigError as err:  # planning needs no GPU libraries; training here would be refused
            print(f"# not trainable on this machine: {err}")
        return 0
    try:
        check_machine_supports(config.precision)
    except ConfigError as err:
        print(f"fastrl.train: config error: {err}", file=sys.stderr)
        return 2
    from fastrl.training.run import log_file, open_run_log, run  # heavy imports only when training

    try:
        return run(config)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - every error after start-up (library BaseExceptions too): one line
        from fastrl.checkpoint.run_lock import RunDirLocked

        # a trainer refused by the run directory's lock leaves the holder's log alone
        if not isinstance(err, RunDirLocked):
            open_run_log()  # an error before the lock was taken: the held start-up lines first
        log = None if isinstance(err, RunDirLocked) else _append_traceback(log_file(config))
        if args.debug:
            traceback.print_exc()
        sys.stdout.flush()
        if isinstance(err, KeyboardInterrupt):  # a second Ctrl-C (or one before the stop handler was installed)
            print("fastrl.train: interrupted (Ctrl-C): exited at once, without saving a checkpoint", file=sys.stderr)
        else:
            print(f"fastrl.train: error: {one_line(err)}", file=sys.stderr)
        if not isinstance(err, RunDirLocked):
            where = f"the full log with the traceback: {log}" if log is not None else "no log file could be written"
            hint = "" if args.debug else "; --debug prints the traceback here"
            print(f"fastrl.train: {where}{hint}", file=sys.stderr)
        return INTERRUPTED if isinstance(err, KeyboardInterrupt) else 1


def _append_traceback(path: Path) -> Path | None:
    """Append the exception being handled, with its traceback, to the log file ``path``; returns
    ``path``, or None when it cannot be written."""
    import logging

    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            # the pid tells this process's error from the run's own (a refused second trainer writes here too)
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} fastrl.train (pid {os.getpid()}): error after start-up:\n")
            traceback.print_exc(file=f)
    except OSError:
        return None
    return path


if __name__ == "__main__":
    sys.exit(main())
