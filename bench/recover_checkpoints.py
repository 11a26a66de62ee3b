"""Checkpoints lost before their evaluation, trained again: a finished run's saved checkpoints that
are gone unevaluated (the report's "not computable") are recovered by training the run again,
step for step, and saving exactly those steps.

Why it can be exact: a run's steps are deterministic given its arguments, its trainer's code and
the machine's arithmetic (seed 2 of the equal-time benchmark, resumed from step 15 on the machine
that trained it, reproduced every non-timing metric of steps 16-19 exactly but the refit check's;
seed 4's GRPO, trained twice on two machines, computed the same in all 20 steps; a warm start
rebuilt on another machine once computed other values, ``bench/heldout.py``), so the
same arguments on the same ``fastrl/`` and ``recipes/`` may give the same weights at every step.
The run again differs only in what does not change a step: it saves the lost steps
(``checkpoint.save_at_steps``, without optimizer state) instead of the time grid, has no
training-time budget (``trainer.max_train_time_s``), and stops after its last saved step with ``stage.max_steps`` (the
step horizon, hence the LR schedule and ARS, stays ``trainer.max_steps``). Whether it computed what
the original did is checked twice, not assumed, and its evaluations are used only if both hold:
every metric that is not a time (nor the engine refit check's, :data:`SCHEDULE_ONLY`), of every
train step it ran, equals the original's (:func:`verify`); and it also saves a control step, the
original's latest evaluated checkpoint at or before the last lost step (:func:`control_step`), whose
evaluation must give the original's per-question outcomes exactly (the same weights through the
same evaluator). A step's metrics are computed before its own update, so the update of the run
again's last step is checked by neither: its weights are a deterministic optimizer step from
weights whose every metric matched. Its own timing is never used: each recovered evaluation stands
at the original run's training time for that step.

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
REPLACED = ("checkpoint.save_at_train_s=", "checkpoint.save_at_steps=", "checkpoint.save_optimizer=",
            "trainer.max_train_time_s=", "logging.output_dir=")


#: Metrics that follow a schedule of the process, not the computation: the engine's refit check
#: runs at its first refit and every fifth after, counted from the process's start, so a resumed
#: original has them at other steps than a run again from step 0.
SCHEDULE_ONLY = ("refit_verify/",)


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
            "checkpoint.save_optimizer=false", f"stage.max_steps={max(steps)}", f"logging.output_dir={out_dir}"]


def _train_records(run_dir: Path, last_step: int) -> list[dict]:
    """The train records of ``run_dir`` up to ``last_step``, without :data:`SCHEDULE_ONLY` metrics."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(SCHEDULE_ONLY)}
            for r in records if r.get("kind") == "train" and int(r["step"]) <= last_step]


def verify(original: Path, again: Path) -> str | None:
    """None when the run again (``again``) computed what ``original`` did on every train step it ran
    (and ran at least one); else the first difference, as text."""
    mine = _train_records(again, 10**9)
    if not mine:
        return f"{again / 'metrics.jsonl'} has no train step"
    return same_computation(_train_records(original, max(int(r["step"]) for r in mine)), mine)


def _outcomes(run_dir: Path, entry: dict) -> dict:
    rows = [json.loads(x) for x in (run_dir / entry["per_question"]).read_text().splitlines() if x.strip()]
    return {r["id"]: r["correct"] for r in rows}


def _evaluations(run_dir: Path, test_path: str, test_size: int) -> dict[int, dict]:
    path = run_dir / "evals" / "curve.json"
    return {e["step"]: e for e in (json.loads(path.read_text()) if path.is_file() else [])
            if e.get("test_path") == test_path and e.get("test_size") == test_size}


def control_step(run_dir: Path, test_path: str, test_size: int, last_step: int) -> int:
    """The checkpoint of the run that a run again to ``last_step`` saves and evaluates too, and must
    give its per-question outcomes exactly: the run's latest checkpoint evaluated on this test split
    at or before ``last_step`` (the one that checks the most of the steps it trains), else its first
    (the run again then trains on to it, and it is its last step).

    Raises:
        SystemExit: the run has no evaluation on this split to check a run again against."""
    done = _evaluations(run_dir, test_path, test_size)
    if not done:
        raise SystemExit(f"recover_checkpoints: {run_dir} has no evaluation on {test_path} ({test_size} questions) "
                         "to check a run again against; evaluate one of its checkpoints first")
    before = [s for s in done if s <= last_step]
    return max(before) if before else min(done)


def recovered_evaluations(run_dir: Path, test_path: str, test_size: int) -> dict[int, dict]:
    """Step -> the run again's ``evals/curve.json`` entry (of this test split) for each recovered
    checkpoint of ``run_dir``; {} when there is no evaluated run again.

    Raises:
        SystemExit: the run again computed other values than the original (:func:`verify`), or its
            control step is not evaluated or answers other questions correctly than the original's
            evaluation of that step (its evaluations are not of the original's checkpoints)."""
    again = recovered_dir(run_dir)
    if not (again / "evals" / "curve.json").is_file():
        return {}
    differs = verify(run_dir, again)
    if differs is None:
        last = max(int(r["step"]) for r in _train_records(again, 10**9))
        control = control_step(run_dir, test_path, test_size, last)
        mine = _evaluations(again, test_path, test_size)
        if control not in mine:
            differs = f"its control step {control} is not evaluated"
        elif _outcomes(again, mine[control]) != _outcomes(run_dir, _evaluations(run_dir, test_path, test_size)[control]):
            differs = f"its step {control} answers other test questions correctly than the original's"
    if differs is not None:
        raise SystemExit(f"recover_checkpoints: {again} did not compute what {run_dir} did ({differs}); its "
                         "evaluations are not of the original's checkpoints (another trainer, evaluator or machine "
                         "arithmetic?). Move it aside; the lost checkpoints stay not computable.")
    return {step: {**e, "per_question": str(Path("..") / "recovered" / run_dir.name / e["per_question"])}
            for step, e in _evaluations(again, test_path, test_size).items()}


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


def _read_json(path: Path, what: str):
    if not path.is_file():
        raise SystemExit(f"recover_checkpoints: {path} not found: {what}")
    return json.loads(path.read_text())


def recover(run_dir: Path, steps: list[int], checkout: Path, *, test_path: str, test_size: int, threads: int,
            timeout: float) -> Path:
    """Train ``run_dir`` again in ``checkout`` (its ``.venv``; a checkout of the original's commit,
    :func:`check_checkout`) saving ``steps`` and the :func:`control_step`, check it (:func:`verify`),
    then evaluate and delete its checkpoints there (``bench/eval_checkpoints.py``); the control is
    checked when the report reads it (:func:`recovered_evaluations`). Returns the run again's
    directory.

    Raises:
        SystemExit: the run's ``bench_run.json`` or ``args.json`` or the checkout's ``.venv`` is
            missing, the checkout is of another trainer, a partial run again or other files are in
            the way, training or evaluation failed or ran past ``timeout`` (its log is named), or
            the run again computed other values than the original.
        ValueError: ``steps`` is empty."""
    if not steps:
        raise ValueError("recover_checkpoints: no steps to recover")
    run_dir, checkout = run_dir.resolve(), checkout.resolve()
    commit = _read_json(run_dir.parent / f"{run_dir.name}.bench_run.json",
                        "the benchmark records the commit that trained each run there")["commit"]
    check_checkout(checkout, commit)
    again = recovered_dir(run_dir)
    steps = sorted({*steps, control_step(run_dir, test_path, test_size, max(steps))})
    python = str(checkout / ".venv" / "bin" / "python")
    if not Path(python).is_file():
        raise SystemExit(f"recover_checkpoints: {python} not found: set the checkout up first (make setup vllm-venv there)")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    log = again.parent / f"{run_dir.name}.log"
    trained = _train_records(again, 10**9) if (again / "metrics.jsonl").is_file() else []
    if trained and max(int(r["step"]) for r in trained) < max(steps):
        raise SystemExit(f"recover_checkpoints: {again} is a partial run again (stopped at step "
                         f"{max(int(r['step']) for r in trained)} of {max(steps)}); a resumed one would not stop where "
                         "it should: move it aside and run --recover again")
    if not trained and again.is_dir() and any(again.iterdir()):
        raise SystemExit(f"recover_checkpoints: {again} holds files but no trained step (an earlier run again's "
                         "evaluations would be paired with this one's metrics): move it aside and run --recover again")
    if not trained:
        original = _read_json(run_dir.parent / f"{run_dir.name}.args.json",
                              "the benchmark writes each run's arguments there")
        args = recovery_arguments(original, steps, again.parent)
        again.parent.mkdir(parents=True, exist_ok=True)
        (again.parent / f"{run_dir.name}.args.json").write_text(json.dumps(args))
        try:
            with open(log, "a") as f:
                code = subprocess.run([python, "-m", "fastrl.train", *args], cwd=checkout, env=env, stdout=f,
                                      stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise SystemExit(f"recover_checkpoints: training {again} again ran past {timeout:.0f} s; log {log} "
                             "(move the partial run again aside, then run --recover again with a larger --timeout)")
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
