#!/usr/bin/env python
"""Evaluate a finished run's kept checkpoints on the held-out test split, after training: off the
training clock, so that no evaluation perturbs the timing it is compared at.

A run that keeps checkpoints on a training-time grid (``checkpoint.save_at_train_s`` /
``checkpoint.save_at_steps``: kept for good, ``fastrl/training/time_grid.py``) is evaluated here
checkpoint by checkpoint, each with the trainer itself (``python -m fastrl.train`` with the run's
own arguments, ``trainer.val_only=true``, ``checkpoint.resume=<checkpoint>`` and the test split of
``--test-path`` / ``--test-size``): the same prompts, sampling, engine and grader as the run's own
validation. Every checkpoint gets its own directory ``<run>/evals/step_<N>/`` with its
``metrics.jsonl`` and its per-question outcomes ``evaluations/test_step<N>.jsonl`` (and
``val_step<N>.jsonl``), and ``<run>/evals/curve.json`` lists, per checkpoint, its step, its
training seconds (the checkpoint marker's ``train_seconds``), the test and validation accuracy and
the per-question file. A checkpoint already in ``curve.json`` with the same split is not evaluated
again; ``--delete-evaluated`` removes each checkpoint directory once its evaluation is recorded
(grid checkpoints with their optimizer state take 2,154 MB each for SmolLM2-135M: fp32 weights,
fp32 main weights and two Adam moments; 538 MB after ``tools/drop_optimizer.py``).

The run's arguments come from ``<run>.args.json`` beside the run directory (the benchmarks write
it: ``bench/algorithms.py``), without its ``logging.output_dir``.

    python bench/eval_checkpoints.py bench/results/word_arith_time/seed1/<recipe> \\
        --test-path recipes/data/word_arith_test_large.jsonl --test-size 1800 [--delete-evaluated]

Cost: a test evaluation of 300 word problems took 58-155 s in the committed SmolLM2 runs
(``bench/results/word_arith``), so 1,800 take about 6-15 minutes per checkpoint on that machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastrl.checkpoint.manager import CheckpointInfo, CheckpointManager  # noqa: E402
from fastrl.training.validation import evaluation_file  # noqa: E402

CURVE = "curve.json"


def run_arguments(run_dir: Path) -> list[str]:
    """The run's ``python -m fastrl.train`` arguments (``<run>.args.json``) without
    ``logging.output_dir``.

    Raises:
        SystemExit: no ``<run>.args.json`` beside the run directory.
    """
    path = run_dir.parent / f"{run_dir.name}.args.json"
    if not path.is_file():
        raise SystemExit(f"eval_checkpoints: {path} not found: the run's arguments are read from it "
                         "(bench/algorithms.py writes it beside each run)")
    return [a for a in json.loads(path.read_text()) if not a.startswith("logging.output_dir=")]


def checkpoints_to_evaluate(run_dir: Path) -> list[CheckpointInfo]:
    """The run's checkpoints kept for good and its newest one, oldest first."""
    mgr = CheckpointManager(run_dir / "checkpoints")
    kept = {c.step: c for c in mgr.kept_for_good()}
    latest = mgr.find_latest()
    if latest is not None:
        kept.setdefault(latest.step, latest)
    return [kept[k] for k in sorted(kept)]


def eval_arguments(run_args: Sequence[str], checkpoint: Path, out_dir: Path, *, test_path: str | None,
                   test_size: int) -> list[str]:
    """``run_args`` plus what evaluates ``checkpoint`` alone into ``out_dir`` (its parent is the
    output directory, its name the run name)."""
    return [*run_args, "trainer.val_only=true", f"checkpoint.resume={checkpoint}", f"data.test_size={test_size}",
            *([f"data.test_path={test_path}"] if test_path else []), f"logging.output_dir={out_dir.parent}",
            f"logging.run_name={out_dir.name}", "logging.plots=false"]


def subprocess_runner(argv: Sequence[str], log: Path) -> int:
    """Run ``python -m fastrl.train *argv`` with its output in ``log``; its exit code."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    with open(log, "w") as fh:
        return subprocess.run([sys.executable, "-m", "fastrl.train", *argv], cwd=REPO, env=env, stdout=fh,
                              stderr=subprocess.STDOUT).returncode


def _last(records: list[dict], kind: str) -> dict:
    found = [r for r in records if r.get("kind") == kind]
    return found[-1] if found else {}


def evaluate_run(run_dir: Path, *, test_path: str | None, test_size: int, delete_evaluated: bool = False,
                 runner: Callable[[Sequence[str], Path], int] = subprocess_runner,
                 steps: Collection[int] | None = None) -> list[dict]:
    """Evaluate every checkpoint of :func:`checkpoints_to_evaluate` not yet in ``evals/curve.json``
    (for this ``test_path`` / ``test_size``), record it there, and return the curve (by step).
    ``steps``: evaluate only the checkpoints of these steps now (the others are left for a later
    call), so that what an estimand needs can be evaluated first.

    Raises:
        SystemExit: the run has no checkpoint, or an evaluation failed (its log is named).
    """
    run_dir = Path(run_dir)
    evals = run_dir / "evals"
    curve_path = evals / CURVE
    curve = json.loads(curve_path.read_text()) if curve_path.exists() else []
    split = {"test_path": test_path, "test_size": test_size}
    done = {e["step"] for e in curve if {k: e.get(k) for k in split} == split}
    todo = [c for c in checkpoints_to_evaluate(run_dir) if c.step not in done and (steps is None or c.step in steps)]
    if not todo and not done and steps is None:
        raise SystemExit(f"eval_checkpoints: {run_dir} has no complete checkpoint to evaluate")
    run_args = run_arguments(run_dir)
    for ck in todo:
        marker = CheckpointManager.verify(ck.path)
        out_dir = evals / ck.path.name
        if out_dir.exists():
            shutil.rmtree(out_dir)  # a partial evaluation: evaluated again from the start
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        log = evals / f"{ck.path.name}.log"
        code = runner(eval_arguments(run_args, ck.path, out_dir, test_path=test_path, test_size=test_size), log)
        per_question = evaluation_file(out_dir, "test", ck.step)
        if code != 0 or not per_question.is_file():
            raise SystemExit(f"eval_checkpoints: evaluating {ck.path} failed (exit {code}); log {log}")
        records = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        test, val = _last(records, "test"), _last(records, "val")
        curve = [e for e in curve if not (e["step"] == ck.step and {k: e.get(k) for k in split} == split)]
        curve.append({"step": ck.step, "train_seconds": marker.get("train_seconds"), "kept": marker.get("keep", False),
                      **split, "test_accuracy": test.get("test/accuracy"), "test_questions": test.get("test/questions"),
                      "val_accuracy": val.get("val/accuracy"),
                      "per_question": str(per_question.relative_to(run_dir))})
        curve.sort(key=lambda e: (e["step"], str(e.get("test_path")), e.get("test_size") or 0))
        tmp = curve_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(curve, indent=1) + "\n")
        os.replace(tmp, curve_path)
        print(f"{run_dir.name} step {ck.step} ({marker.get('train_seconds')} s): test "
              f"{test.get('test/accuracy')} on {test.get('test/questions')} questions", flush=True)
        if delete_evaluated:
            shutil.rmtree(ck.path)
    return sorted((e for e in curve if {k: e.get(k) for k in split} == split), key=lambda e: e["step"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with checkpoints/ and <run>.args.json beside it)")
    p.add_argument("--test-path", default=None, help="data.test_path of the evaluation (default: the run's)")
    p.add_argument("--test-size", type=int, required=True, help="data.test_size: the first N test questions")
    p.add_argument("--delete-evaluated", action="store_true", help="remove each checkpoint once evaluated")
    args = p.parse_args(argv)
    if args.test_size < 1:
        p.error(f"--test-size must be >= 1, got {args.test_size}")
    for run_dir in args.runs:
        evaluate_run(run_dir, test_path=args.test_path, test_size=args.test_size, delete_evaluated=args.delete_evaluated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
