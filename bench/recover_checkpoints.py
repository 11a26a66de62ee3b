"""Checkpoints lost before their evaluation, trained again: a finished run's saved checkpoints that
are gone unevaluated (the report's "not computable") are recovered by training the run again,
step for step, and saving exactly those steps.

Why it is exact: a run's steps are deterministic given its arguments and its trainer's code (seed 2
of the equal-time benchmark, resumed from step 15, reproduced the 66 non-timing metrics of steps
16-19 exactly), so the same arguments on the same ``fastrl/`` and ``recipes/`` give the same
weights at every step. The run again differs only in what does not change a step: it saves the
lost steps (``checkpoint.save_at_steps``) instead of the time grid, has no training-time budget
(``trainer.max_train_time_s``), and stops after the last lost step with ``stage.max_steps`` (the
step horizon, hence the LR schedule and ARS, stays ``trainer.max_steps``). Whether it computed what
the original did is checked, not assumed: every metric that is not a time, of every train step
up to the last lost one, must be equal (:func:`bench.heldout.same_computation`), else its
evaluations are not used. Its own timing is never used: each recovered evaluation stands at the
original run's training time for that step.

Layout: ``seed<S>/recovered/<recipe>/`` beside the original (with its ``<recipe>.args.json``), its
evaluations in its ``evals/curve.json`` (``bench/eval_checkpoints.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from bench.heldout import same_computation

#: Arguments of the original run that the run again replaces (a time grid and budget that would
#: save or stop at other steps, and where it writes).
REPLACED = ("checkpoint.save_at_train_s=", "checkpoint.save_at_steps=", "trainer.max_train_time_s=",
            "logging.output_dir=")


def recovered_dir(run_dir: Path) -> Path:
    """Where the run again of ``run_dir`` (``seed<S>/<recipe>``) lives: ``seed<S>/recovered/<recipe>``."""
    return run_dir.parent / "recovered" / run_dir.name


def recovery_arguments(original: list[str], steps: list[int], out_dir: Path) -> list[str]:
    """The ``python -m fastrl.train`` arguments of the run again: ``original`` (its ``args.json``)
    without :data:`REPLACED`, saving ``steps`` and stopping after the last of them, into ``out_dir``.

    Raises:
        ValueError: ``steps`` is empty or not positive."""
    if not steps or min(steps) < 1:
        raise ValueError(f"recover_checkpoints: steps to save must be positive step numbers, got {steps}")
    kept = [a for a in original if not a.startswith(REPLACED)]
    return [*kept, f"checkpoint.save_at_steps=[{','.join(str(s) for s in sorted(set(steps)))}]",
            f"stage.max_steps={max(steps)}", f"logging.output_dir={out_dir}"]


def _train_records(run_dir: Path, last_step: int) -> list[dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in records if r.get("kind") == "train" and int(r["step"]) <= last_step]


def verify(original: Path, again: Path) -> str | None:
    """None when the run again (``again``) computed what ``original`` did on every train step it ran
    (and ran at least one); else the first difference, as text."""
    mine = _train_records(again, 10**9)
    if not mine:
        return f"{again / 'metrics.jsonl'} has no train step"
    return same_computation(_train_records(original, max(int(r["step"]) for r in mine)), mine)


def recovered_evaluations(run_dir: Path, test_path: str, test_size: int) -> dict[int, dict]:
    """Step -> the run again's ``evals/curve.json`` entry (of this test split) for each recovered
    checkpoint of ``run_dir``; {} when there is no run again.

    Raises:
        SystemExit: the run again computed other values than the original (its evaluations are
            not the original's checkpoints)."""
    again = recovered_dir(run_dir)
    path = again / "evals" / "curve.json"
    if not path.is_file():
        return {}
    differs = verify(run_dir, again)
    if differs is not None:
        raise SystemExit(f"recover_checkpoints: {again} computed other values than {run_dir} ({differs}); its "
                         "evaluations are not of the original's checkpoints: was it trained with another trainer? "
                         "Move it aside and train it again from a checkout of the original's commit.")
    return {e["step"]: {**e, "per_question": str(Path("..") / "recovered" / run_dir.name / e["per_question"])}
            for e in json.loads(path.read_text())
            if e.get("test_path") == test_path and e.get("test_size") == test_size}


def check_checkout(checkout: Path, commit: str) -> None:
    """Raises SystemExit unless ``checkout``'s ``fastrl/`` and ``recipes/`` (tracked files, as
    checked out) equal ``commit``'s: the trainer that trained the original."""
    diff = subprocess.run(["git", "diff", "--quiet", commit.removesuffix("+dirty"), "--", "fastrl", "recipes"],
                          cwd=checkout, capture_output=True, text=True)
    if diff.returncode != 0 or commit.endswith("+dirty"):
        raise SystemExit(f"recover_checkpoints: {checkout}'s fastrl/ and recipes/ are not those of {commit}, which "
                         f"trained the original{' (dirty: not reproducible)' if commit.endswith('+dirty') else ''}; "
                         f"check out {commit.removesuffix('+dirty')} there (git worktree add)"
                         + (f": {diff.stderr.strip()}" if diff.stderr.strip() else ""))


def recover(run_dir: Path, steps: list[int], checkout: Path, *, test_path: str, test_size: int, threads: int,
            timeout: float) -> Path:
    """Train ``run_dir`` again in ``checkout`` (its ``.venv``; a checkout of the original's commit,
    :func:`check_checkout`) saving ``steps``, check it (:func:`verify`), then evaluate and delete its
    checkpoints there (``bench/eval_checkpoints.py``). Returns the run again's directory.

    Raises:
        SystemExit: the checkout is of another trainer, training or evaluation failed (its log is
            named), or the run again computed other values than the original."""
    commit = json.loads((run_dir.parent / f"{run_dir.name}.bench_run.json").read_text())["commit"]
    check_checkout(checkout, commit)
    again = recovered_dir(run_dir)
    original = json.loads((run_dir.parent / f"{run_dir.name}.args.json").read_text())
    args = recovery_arguments(original, steps, again.parent)
    again.parent.mkdir(parents=True, exist_ok=True)
    (again.parent / f"{run_dir.name}.args.json").write_text(json.dumps(args))
    python = str(checkout / ".venv" / "bin" / "python")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    log = again.parent / f"{run_dir.name}.log"
    trained = _train_records(again, 10**9) if (again / "metrics.jsonl").is_file() else []
    if max((int(r["step"]) for r in trained), default=0) < max(steps):  # else trained already (a stage ends unfinished)
        with open(log, "a") as f:
            code = subprocess.run([python, "-m", "fastrl.train", *args], cwd=checkout, env=env, stdout=f,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
        if code != 0:
            raise SystemExit(f"recover_checkpoints: training {again} again failed (exit {code}); log {log}")
    differs = verify(run_dir, again)
    if differs is not None:
        raise SystemExit(f"recover_checkpoints: {again} computed other values than {run_dir}: {differs}")
    code = subprocess.run([python, "bench/eval_checkpoints.py", str(again), "--test-path", test_path,
                           "--test-size", str(test_size), "--delete-evaluated"], cwd=checkout, env=env).returncode
    if code != 0:
        raise SystemExit(f"recover_checkpoints: evaluating {again} failed (exit {code}); logs under {again / 'evals'}")
    return again
