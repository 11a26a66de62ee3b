#!/usr/bin/env python
"""FastRL against GRPO, DAPO, GSPO and CPPO, side by side, measured in one run on one machine.

Runs the CPU recipe family one after the other (never two training jobs at once), each as
``python -m fastrl.train --recipe NAME`` with the same seed, data, warm start and number of steps,
in its own run directory ``OUT/seed<S>/<recipe>``, then writes:

- ``OUT/algorithms.md``, ``.csv``, ``.json``: per recipe, training wall time (sum of step times)
  and mean seconds per step of each phase (gen, reward, prune, old, ref, update, refit), the
  speedup over its base algorithm (GRPO for the GRPO variants, DAPO for DAPO + FastRL, GSPO for
  GSPO + FastRL), final and best validation accuracy, kept fraction and mean group size n; with
  several seeds, the mean and the sample standard deviation over seeds; per seed, the final
  accuracy, the speedup and (``--target-accuracy``) the seconds to a target accuracy; and the drift
  control (:func:`drift_control`) of the rows that compute what their base computed for a prefix of
  steps (GRPO + ARS only, the GRESO-style row), whose speedup is then corrected for machine drift;
- ``OUT/cost_model_check.md``: the per-step cost model (``bench/cost_model.py``) predicting each
  pruned run's phases from its base run's seconds per token, against what was measured;
- ``OUT/plots/accuracy_vs_time.png``: validation accuracy against training wall time, one panel per
  base algorithm with its FastRL variants and peers; ``OUT/plots/ars_n.png``: the group size n
  against steps for the rows with adaptive sampling; ``OUT/plots/time_breakdown.png``: seconds per step of
  each phase, per recipe (the paper's per-step table as bars).

Modes:
    python bench/algorithms.py --quick            # tiny model, 8 steps: the CI smoke run (minutes)
    python bench/algorithms.py --seeds 3          # the recipes as they are (120 steps, 2,000
                                                  # validation questions) x 3 seeds: hours
    python bench/algorithms.py --seeds 3 --peer-seeds 3   # the peer rows on three seeds as well
    python bench/algorithms.py --recipes grpo,fastrl_grpo --steps 20
    python bench/algorithms.py --report-only --out runs/bench_algorithms   # tables from finished runs
    python bench/algorithms.py --report-only --target-accuracy 0.76        # + seconds to 76% per seed

A run directory holding a finished run (``FINISHED``) is reused, so an interrupted full
benchmark continues where it stopped (``--fresh`` deletes the run directories first); a
partly trained one resumes from its newest checkpoint (the trainer's ``checkpoint.resume=auto``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cost_model import check_against_runs  # noqa: E402
from tools.compare_runs import summarize  # noqa: E402
from tools.plot_run import load  # noqa: E402

#: Phases of the table (``save`` is left out: checkpoints are not part of the method's cost).
PHASES = ("gen", "reward", "prune", "old", "ref", "update", "refit")


@dataclass(frozen=True)
class Entry:
    """One recipe of the family: short label, recipe name, base label (None for a base); ``quick``:
    part of ``--quick`` (the peer rows of issue 18 are not, so the smoke run keeps its length)."""

    label: str
    recipe: str
    base: str | None
    title: str
    quick: bool = True


FAMILY = (
    Entry("grpo", "easyvqa_tiny_grpo_cpu", None, "GRPO"),
    Entry("fastrl_mdap_grpo", "easyvqa_tiny_fastrl_mdap_grpo_cpu", "grpo", "GRPO + MDAP (published, no ARS)"),
    Entry("fastrl_grpo", "easyvqa_tiny_fastrl_grpo_cpu", "grpo", "GRPO + FastRL (weighted MDAP + ARS)"),
    Entry("fastrl_paper_grpo", "easyvqa_tiny_fastrl_paper_grpo_cpu", "grpo", "GRPO + FastRL as published (MDAP + ARS)", quick=False),
    Entry("cppo_grpo", "easyvqa_tiny_cppo_grpo_cpu", "grpo", "GRPO + CPPO"),
    Entry("dapo", "easyvqa_tiny_dapo_cpu", None, "DAPO"),
    Entry("fastrl_dapo", "easyvqa_tiny_fastrl_dapo_cpu", "dapo", "DAPO + FastRL"),
    Entry("gspo", "easyvqa_tiny_gspo_cpu", None, "GSPO"),
    Entry("fastrl_gspo", "easyvqa_tiny_fastrl_gspo_cpu", "gspo", "GSPO + FastRL"),
    # issue 18: ARS alone, the paper's refill geometry, and the peer selectors (full mode only)
    Entry("ars_grpo", "easyvqa_tiny_ars_grpo_cpu", "grpo", "GRPO + ARS only", quick=False),
    Entry("fastrl_refill_grpo", "easyvqa_tiny_fastrl_refill_grpo_cpu", "grpo", "GRPO + FastRL (paper refill geometry)", quick=False),
    Entry("pods_grpo", "easyvqa_tiny_pods_grpo_cpu", "grpo", "GRPO + PODS", quick=False),
    Entry("random_grpo", "easyvqa_tiny_random_grpo_cpu", "grpo", "GRPO + random 50%", quick=False),
    Entry("zeroadv_grpo", "easyvqa_tiny_zeroadv_grpo_cpu", "grpo", "GRPO + zero-advantage skip", quick=False),
    # GRESO skips a prompt from its own history: it and its GRPO baseline train 640 questions x 6 epochs
    Entry("grpo_6ep", "easyvqa_tiny_grpo_6ep_cpu", None, "GRPO (640 questions x 6 epochs)", quick=False),
    Entry("greso_grpo", "easyvqa_tiny_greso_grpo_cpu", "grpo_6ep", "GRPO + GRESO-style skip (6 epochs)", quick=False),
    Entry("fastrl_unbiased_gspo", "easyvqa_tiny_fastrl_unbiased_gspo_cpu", "gspo", "GSPO + FastRL (weighted MDAP + ARS)", quick=False),
)
QUICK_FAMILY = tuple(e for e in FAMILY if e.quick)
BY_LABEL = {e.label: e for e in FAMILY} | {e.recipe: e for e in FAMILY}

#: ``--quick``: the recipes' model and their cached warm start (shared with ``make run``), 8 prompts x
#: 8 rollouts, mini-batches of 4 prompts (2 optimizer updates per step in the free geometry),
#: 8 steps, 64 validation questions, adaptive sampling periods of 3 steps so that ARS acts. Only the
#: ``quick`` entries (the base and FastRL rows) run.
QUICK = [
    "rollout.prompts_per_step=8", "trainer.mini_batch_prompts=4", "parallel.micro_batch_size=8",
    "data.val_size=64", "trainer.val_every=4", "adaptive_sampling.period_steps=3", "reward.num_workers=1",
]
QUICK_STEPS = 8
#: Overrides of every run (both modes): no progress bar or TensorBoard, one checkpoint kept.
COMMON = ["logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.keep_last=1"]


def seed_overrides(seed: int) -> list[str]:
    """A seed sets the global seed, the rollout sampling seed and the data shuffling seed."""
    return [f"trainer.seed={seed}", f"rollout.seed={seed}", f"data.shuffle_seed={seed}"]


def train_args(recipe: str, seed_dir: Path, overrides: list[str], *, threads: int) -> list[str]:
    """The arguments of ``python -m fastrl.train`` for one run (stored beside it as ``<recipe>.args.json``)."""
    return ["--recipe", recipe, *overrides, f"logging.output_dir={seed_dir}", f"trainer.torch_threads={threads}"]


def run_recipe(entry: Entry, seed_dir: Path, overrides: list[str], *, threads: int, timeout: float) -> dict:
    """Train one recipe in a subprocess; returns its wall seconds.

    A finished run with the same arguments is reused, a partial one resumes from its newest
    checkpoint; a run directory trained with other arguments is an error (``--fresh`` deletes it).
    """
    run_dir = seed_dir / entry.recipe
    log_path = seed_dir / f"{entry.recipe}.log"
    args_path = seed_dir / f"{entry.recipe}.args.json"
    cmd = [sys.executable, "-m", "fastrl.train", *train_args(entry.recipe, seed_dir, overrides, threads=threads)]
    if run_dir.exists():
        previous = json.loads(args_path.read_text()) if args_path.exists() else None
        if previous != cmd[3:]:
            raise SystemExit(
                f"algorithms: {run_dir} holds a run with other settings ({args_path}: {previous}); "
                "pass --fresh to delete it or choose another --out"
            )
        if (run_dir / "FINISHED").exists():
            print(f"  {entry.label}: reusing the finished run in {run_dir}", flush=True)
            return {"reused": True}
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    seed_dir.mkdir(parents=True, exist_ok=True)
    args_path.write_text(json.dumps(cmd[3:]))
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"algorithms: {entry.recipe} ran past --timeout {timeout:.0f} s; its log is {log_path}")
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"algorithms: {entry.recipe} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    load = os.getloadavg()[1]
    print(f"  {entry.label}: {wall:.0f} s, load average {load:.1f} ({run_dir})", flush=True)
    return {"reused": False, "process_seconds": wall, "load_average_5min": load}


def measure_run(run_dir: Path, *, skip_steps: int = 1) -> dict[str, float]:
    """Per-run numbers: compare_runs' validation summary plus per-step means over the steps after
    the first ``skip_steps`` (warm-up: numba compilation, first forward passes, allocator growth),
    including the counts the cost model uses."""
    summary = summarize(run_dir)
    out = {k: summary[k] for k in ("val_start", "val_final", "val_best") if k in summary}
    train, val = load(run_dir)
    n_curve = [(float(r["step"]), float(r["rollout/n"])) for r in train if "rollout/n" in r]
    if len(train) > skip_steps:
        train = train[skip_steps:]
    steps = len(train)

    def mean(key: str, default: float = 0.0) -> float:
        return sum(float(r.get(key, default) or 0.0) for r in train) / steps

    gen_tokens = mean("rollout/generated_tokens")
    rollouts = mean("prune/num_rollouts")
    kept_rollouts = mean("prune/num_kept")
    kept_tokens = sum(float(r.get("prune/kept_tokens", r.get("rollout/generated_tokens", 0.0))) for r in train) / steps
    out.update({f"time/{p}": mean(f"time/{p}") for p in PHASES if any(f"time/{p}" in r for r in train)})
    # per step after the warm-up: (step, phase seconds, generated tokens, mean reward); the train time
    # sums it, drift_control compares it between runs
    step_trace = [(int(r["step"]), sum(float(r.get(f"time/{p}", 0.0) or 0.0) for p in PHASES),
                   float(r.get("rollout/generated_tokens", 0.0)), float(r.get("reward/mean", math.nan)))
                  for r in train]
    out.update({
        "steps": float(steps),
        "kept_fraction": mean("prune/kept_fraction", 1.0),
        "mean_n": mean("rollout/n"),
        "gen_tokens": gen_tokens,
        "rollouts": rollouts,
        "kept_rollouts": kept_rollouts,
        "kept_tokens": kept_tokens,
        "response_length": gen_tokens / rollouts if rollouts else 0.0,
        "response_length_kept": kept_tokens / kept_rollouts if kept_rollouts else 0.0,
        "step_seconds": sum(out.get(f"time/{p}", 0.0) for p in PHASES),
        "train_time_s": sum(t[1] for t in step_trace),
        "val_curve": [(float(r.get("time/train_elapsed", 0.0)), float(r["val/accuracy"])) for r in val],
        "n_curve": n_curve,
        "step_trace": step_trace,
    })
    return out


def drift_control(base: dict, run: dict, *, min_steps: int = 10) -> dict | None:
    """Machine drift measured inside a pair of runs, where a run computes exactly what its base
    computed for its first steps (e.g. GRPO + ARS only is bit-identical to GRPO until ARS first
    changes n): over that shared prefix both runs did the same work, so the ratio of their phase
    times is drift alone, and dividing it out of the run's train time gives the speedup on an
    unchanging machine.

    ``base``, ``run``: :func:`measure_run` results (``step_trace``: ``(step, seconds, generated
    tokens, mean reward)`` per step after the warm-up). The shared prefix is the longest run of
    steps, from the first, whose generated tokens and mean reward are equal in both. Returns None
    when it is shorter than ``min_steps`` (no control: the runs differ from the start, as every
    pruned row does); else ``prefix_steps``, ``drift`` (run seconds / base seconds over the
    prefix; > 1: the run's machine was slower), ``speedup`` (base train time / run train time) and
    ``corrected_speedup`` (``speedup * drift``)."""
    a, b = base.get("step_trace", []), run.get("step_trace", [])
    k = 0
    while k < min(len(a), len(b)) and a[k][0] == b[k][0] and a[k][2] == b[k][2] and a[k][3] == b[k][3]:
        k += 1
    if k < min_steps:
        return None
    drift = sum(t[1] for t in b[:k]) / sum(t[1] for t in a[:k])
    speedup = base["train_time_s"] / run["train_time_s"]
    return {"prefix_steps": k, "drift": drift, "speedup": speedup, "corrected_speedup": speedup * drift}


def drift_table(entries: list[Entry], per_seed: dict[int, dict[str, dict]]) -> str:
    """Markdown: :func:`drift_control` of every (row, seed) whose run shares a prefix of steps with
    its base run; empty when none does."""
    lines = []
    for e in entries:
        for s in sorted(per_seed):
            if e.base is None or e.label not in per_seed[s] or e.base not in per_seed[s]:
                continue
            c = drift_control(per_seed[s][e.base], per_seed[s][e.label])
            if c is not None:
                lines.append(f"| {e.title} | {s} | {c['prefix_steps']} | {c['drift']:.3f} | {c['speedup']:.2f}x | "
                             f"{c['corrected_speedup']:.2f}x |")
    if not lines:
        return ""
    return ("| recipe | seed | steps identical to the base run | drift (run s / base s over them) | speedup | "
            "drift-corrected speedup |\n| --- | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(lines))


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(entries: list[Entry], per_seed: dict[int, dict[str, dict]]) -> list[dict]:
    """One row per recipe: mean and standard deviation over seeds of every reported number.

    The speedup is ``train time(base) / train time(recipe)`` within each seed, then averaged.
    """
    rows = []
    for e in entries:
        runs = [per_seed[s][e.label] for s in sorted(per_seed) if e.label in per_seed[s]]
        row: dict = {"label": e.label, "recipe": e.recipe, "title": e.title, "base": e.base, "seeds": len(runs)}
        keys = ["train_time_s", *[f"time/{p}" for p in PHASES], "step_seconds", "val_start", "val_final", "val_best",
                "kept_fraction", "mean_n", "gen_tokens", "kept_tokens", "steps"]
        for k in keys:
            row[k], row[f"{k}_sd"] = _mean_sd([r[k] for r in runs if k in r])
        speed = []
        for s in sorted(per_seed):
            base = e.base or e.label
            if e.label in per_seed[s] and base in per_seed[s]:
                speed.append(per_seed[s][base]["train_time_s"] / per_seed[s][e.label]["train_time_s"])
        row["speedup"], row["speedup_sd"] = _mean_sd(speed)
        rows.append(row)
    return rows


def _cell(row: dict, key: str, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    v, sd = row.get(key, math.nan), row.get(f"{key}_sd", math.nan)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    text = format(v * scale, fmt) + suffix
    if row["seeds"] > 1 and not math.isnan(sd):
        text += " ± " + format(sd * scale, fmt) + suffix
    return text


def markdown_table(rows: list[dict]) -> str:
    head = ["recipe", "seeds", "train time (s)", "speedup", *[f"{p} (s/step)" for p in PHASES], "val start (%)",
            "val final (%)", "val best (%)", "kept fraction", "mean n"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in rows:
        if not r["seeds"]:
            continue  # not run yet
        cells = [r["title"], str(r["seeds"]), _cell(r, "train_time_s", ".1f"), _cell(r, "speedup", ".2f", suffix="x"),
                 *[_cell(r, f"time/{p}", ".3f") for p in PHASES], _cell(r, "val_start", ".1f", 100),
                 _cell(r, "val_final", ".1f", 100), _cell(r, "val_best", ".1f", 100), _cell(r, "kept_fraction", ".3f"),
                 _cell(r, "mean_n", ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_to_accuracy(val_curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds (the trainer's ``time/train_elapsed``, validation excluded) at the first
    validation whose accuracy (a fraction in [0, 1]) is at or above ``target``; None if none is."""
    return next((t for t, acc in val_curve if acc >= target), None)


def per_seed_table(entries: list[Entry], per_seed: dict[int, dict[str, dict]], target: float | None = None) -> str:
    """Markdown: per recipe and seed, the final validation accuracy (%) and the speedup over the
    base run of the same seed (``-`` where that seed did not run; no speedup without its base);
    with ``target`` (a fraction), also the training seconds to the first validation at or above
    it (:func:`time_to_accuracy`; ``>= T%: -`` if no validation reached it)."""
    seeds = sorted(per_seed)
    what = "val final (%), speedup" + (f", s to >= {100 * target:g}%" if target is not None else "")
    lines = ["| recipe | " + " | ".join(f"seed {s}: {what}" for s in seeds) + " |",
             "| --- |" + " ---: |" * len(seeds)]
    for e in entries:
        if not any(e.label in per_seed[s] for s in seeds):
            continue
        cells = []
        for s in seeds:
            run = per_seed[s].get(e.label)
            base = per_seed[s].get(e.base or e.label)
            if run is None:
                cells.append("-")
                continue
            cell = f"{100 * run['val_final']:.2f}" if "val_final" in run else "-"
            if base is not None:
                cell += f", {base['train_time_s'] / run['train_time_s']:.2f}x"
            if target is not None:
                reached = time_to_accuracy(run.get("val_curve", []), target)
                cell += f", >= {100 * target:g}%: " + ("-" if reached is None else f"{reached:.0f} s")
            cells.append(cell)
        lines.append(f"| {e.title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_tables(out: Path, rows: list[dict], meta: dict, seeds_md: str = "", drift_md: str = "") -> list[Path]:
    md = out / "algorithms.md"
    md.write_text(
        f"# Algorithms on CPU ({meta['mode']} mode)\n\n"
        f"Seeds: {meta['seeds']}; steps per run: {meta['steps']}; overrides: `{' '.join(meta['overrides']) or '-'}`.\n"
        f"Train time = sum over the steps after the first {meta['skip_steps']} (warm-up) of the phases below "
        "(validation, checkpoints and start-up excluded); "
        "speedup = train time of the base algorithm / train time of the recipe, per seed, then averaged; "
        "± is the standard deviation over seeds; `seeds`: how many seeds the row has.\n\n" + markdown_table(rows) + "\n"
        + (f"\nPer seed:\n\n{seeds_md}\n" if seeds_md else "")
        + (f"\nDrift control: runs that compute exactly what their base run computed over their first steps "
           f"(the same generated tokens and mean reward per step); over those steps the ratio of phase times is "
           f"machine drift alone, and the corrected speedup divides it out "
           f"(`drift_control`):\n\n{drift_md}\n" if drift_md else "") + _load_note(meta)
    )
    rows = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]
    csv_path = out / "algorithms.csv"
    fields = [k for k in rows[0] if k != "val_curve"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    js = out / "algorithms.json"
    js.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return [md, csv_path, js]


def _load_note(meta: dict) -> str:
    """A warning when other work shared the CPUs (timings then say little about the method)."""
    loads = meta.get("load_average_5min") or {}
    if not loads:
        return ""
    cores = len(os.sched_getaffinity(0))
    worst = max(loads.values())
    text = f"\nLoad average (5 min) at the end of each run: {min(loads.values()):.1f}-{worst:.1f} on {cores} cores.\n"
    if worst > cores:
        text += ("Other processes shared the CPUs: phase times, and so speedups, carry that noise "
                 "(compare the generation phase, which pruning does not shrink, between runs).\n")
    return text


#: Priors of the cost model's prediction made before a run (bench/cost_model.py::predict_before_run):
#: the kept fraction each selector is expected to keep, set from what is known before the run (the
#: selectors' keep ratios; MDAP's Phase 1 keeps ~0.22-0.25 of the default recipe's rollouts, issue 18),
#: and the mean n as a fraction of n_max (1: ARS is not assumed to act). Rows not listed: 0.5, 1.
COST_PRIORS: dict[str, tuple[float, float]] = {
    # the free geometry (the default) keeps what MDAP chose; the paper's refill geometry
    # (pruning.refill_to=mini_batch) refills MDAP's ~0.25 to the mini-batch multiple, 0.5 here
    "fastrl_mdap_grpo": (0.25, 1.0), "fastrl_grpo": (0.25, 1.0), "fastrl_dapo": (0.25, 1.0),
    "fastrl_gspo": (0.25, 1.0), "fastrl_paper_grpo": (0.25, 1.0), "fastrl_unbiased_gspo": (0.25, 1.0),
    "fastrl_refill_grpo": (0.5, 1.0),
    "cppo_grpo": (0.5, 1.0), "random_grpo": (0.5, 1.0), "pods_grpo": (0.5, 1.0),
    "ars_grpo": (1.0, 1.0), "greso_grpo": (1.0, 1.0),
}


def write_cost_check(out: Path, entries: list[Entry], per_seed: dict[int, dict[str, dict]]) -> Path:
    """The cost model's predictions of each pruned run, made before it from its base run's measured
    per-token phase costs and the priors :data:`COST_PRIORS`, against the measurement."""
    seed = min(per_seed)
    runs = per_seed[seed]
    parts = [f"# Cost model against the measured runs (seed {seed})\n",
             "Predicted before each run from the base run's measured seconds per generated token, per rollout "
             "(rewards) and per trained response token (old, ref, update), and two priors (kept fraction, mean n; "
             "`COST_PRIORS` in bench/algorithms.py); nothing of the pruned run is read. The prune phase is "
             "predicted as 0 s.\n"]
    for e in entries:
        if e.base is None or e.label not in runs or e.base not in runs:
            continue
        kept, n_frac = COST_PRIORS.get(e.label, (0.5, 1.0))
        n_max = runs[e.base].get("mean_n") or 8.0
        rows = check_against_runs(runs[e.base], runs[e.label], kept_fraction=kept, n=n_frac * n_max, n_max=n_max)
        parts += [f"\n## {e.title} (base: {BY_LABEL[e.base].title})\n", "| quantity | model | measured | model / measured |",
                  "| --- | ---: | ---: | ---: |"]
        for name, predicted, measured in rows:
            ratio = predicted / measured if measured else math.nan
            parts.append(f"| {name} | {predicted:.4g} | {measured:.4g} | {ratio:.2f} |")
    path = out / "cost_model_check.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def write_plots(out: Path, entries: list[Entry], per_seed: dict[int, dict[str, dict]], rows: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    bases = [e for e in entries if e.base is None] or [BY_LABEL[e.base] for e in entries if e.base][:1]
    fig, axes = plt.subplots(1, len(bases), figsize=(5.5 * len(bases), 4), squeeze=False)
    for ax, base in zip(axes[0], bases):
        members = [e for e in entries if e.label == base.label or e.base == base.label]
        colours = plt.get_cmap("tab20" if len(members) > 10 else "tab10")
        for i, e in enumerate(members):
            labelled = False
            for j, s in enumerate(sorted(per_seed)):
                curve = per_seed[s].get(e.label, {}).get("val_curve", [])
                if curve:
                    xs, ys = zip(*curve)
                    ax.plot(xs, [100 * y for y in ys], "o-", color=colours(i), alpha=1.0 if j == 0 else 0.4,
                            label=None if labelled else e.title, markersize=3)
                    labelled = True
        ax.set_title(f"base: {base.title}", fontsize=10)
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    acc = plots / "accuracy_vs_time.png"
    _save(fig, acc, plt)

    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    for i, phase in enumerate(PHASES):
        values = [0.0 if math.isnan(r[f"time/{phase}"]) else r[f"time/{phase}"] for r in rows]
        ax.bar(range(len(rows)), values, bottom=bottom, label=phase, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(rows)), [r["title"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds per step (mean)")
    ax.set_title("time per phase")
    ax.legend(fontsize=8, ncol=2)
    bars = plots / "time_breakdown.png"
    _save(fig, bars, plt)

    # the group size n against steps for the rows with adaptive sampling (seed 1 dark, others light)
    ars_rows = [e for e in entries if e.label.startswith(("fastrl", "ars")) and "mdap" not in e.label]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, e in enumerate(ars_rows):
        for j, s in enumerate(sorted(per_seed)):
            curve = per_seed[s].get(e.label, {}).get("n_curve", [])
            if curve:
                xs, ys = zip(*curve)
                ax.step(xs, ys, where="post", color=f"C{i % 10}", alpha=1.0 if j == 0 else 0.4,
                        label=e.title if j == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("group size n")
    ax.set_title("adaptive rollout sampling: n per step")
    ax.grid(alpha=0.3)
    if ars_rows:
        ax.legend(fontsize=7)
    n_plot = plots / "ars_n.png"
    _save(fig, n_plot, plt)
    return [acc, bars, n_plot]


def _save(fig, path: Path, plt) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def select_entries(spec: str | None, *, quick: bool = False) -> list[Entry]:
    """The named entries in the family's order; none named: the whole family (``quick``: the
    entries of the smoke run)."""
    if not spec:
        return list(QUICK_FAMILY if quick else FAMILY)
    out = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name not in BY_LABEL:
            raise SystemExit(f"algorithms: unknown recipe {name!r}; choose from {', '.join(e.label for e in FAMILY)} "
                             "(or the full recipe names)")
        out.append(BY_LABEL[name])
    return [e for e in FAMILY if e in out]  # the family's order


def finished_runs(out: Path, seeds: list[int], entries: list[Entry]) -> list[tuple[int, str, Path]]:
    """``(seed, label, run_dir)`` of the finished runs (``FINISHED`` written) under ``out``; a run
    directory still training or interrupted is left out of the tables, with a note."""
    found = []
    for seed in seeds:
        for e in entries:
            run_dir = out / f"seed{seed}" / e.recipe
            if (run_dir / "FINISHED").exists():
                found.append((seed, e.label, run_dir))
            elif (run_dir / "metrics.jsonl").exists():
                print(f"algorithms: note: {run_dir} is not finished (no FINISHED); left out of the tables", flush=True)
    return found


def add_run_arguments(p: argparse.ArgumentParser, *, seeds: int, seeds_help: str, steps_help: str,
                      out: Path | None, out_help: str | None = None) -> None:
    """Add the options every benchmark of this folder takes: ``--seeds`` (default ``seeds``),
    ``--steps``, ``--out`` (default ``out``), ``--threads``, ``--timeout``, ``--report-only`` and the
    trailing ``overrides``; :func:`check_run_arguments` validates them after parsing."""
    p.add_argument("--seeds", type=int, default=seeds, help=seeds_help)
    p.add_argument("--steps", type=int, help=steps_help)
    p.add_argument("--out", type=Path, default=out, help=out_help)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each training process")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one training run may take")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    p.add_argument("overrides", nargs="*", help="extra dotted key=value overrides for every run")


def check_run_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``p.error``, exit 2) ``--seeds`` below 1 and ``--steps`` below 1."""
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (the CI smoke run)")
    p.add_argument("--recipes", help="comma-separated subset, e.g. grpo,fastrl_grpo (default: every row; "
                   "--quick: the eight base and FastRL rows)")
    p.add_argument("--peer-seeds", type=int, default=1,
                   help="seeds of the peer rows (FastRL as published, ARS only, paper refill, PODS, random, zero-advantage, "
                        "GRESO, GSPO + weighted MDAP): 1..N, at most --seeds (default 1; the base/FastRL pairs run every seed)")
    add_run_arguments(p, seeds=1, seeds_help="seeds 1..N per recipe (mean and spread over seeds)",
                      steps_help=f"training steps per run (default: the recipes' own; {QUICK_STEPS} with --quick)",
                      out=None, out_help="output directory (default runs/bench_algorithms[_quick])")
    p.add_argument("--target-accuracy", type=float, metavar="FRACTION",
                   help="also report, per seed, the training seconds to the first validation at or above this "
                        "accuracy (a fraction in (0, 1], e.g. 0.76)")
    p.add_argument("--fresh", action="store_true", help="delete existing run directories first")
    p.add_argument("--skip-steps", type=int, default=1, help="warm-up steps left out of the timings (default 1)")
    args = p.parse_args(argv)
    check_run_arguments(p, args)
    if args.target_accuracy is not None and not 0.0 < args.target_accuracy <= 1.0:
        p.error(f"--target-accuracy is a fraction in (0, 1] (0.76 for 76%), got {args.target_accuracy}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    entries = select_entries(args.recipes, quick=args.quick)
    missing_bases = sorted({e.base for e in entries if e.base and BY_LABEL[e.base] not in entries})
    if missing_bases:
        print(f"algorithms: note: base run(s) {', '.join(missing_bases)} not selected; their speedups are left empty")
    out = args.out or REPO / "runs" / ("bench_algorithms_quick" if args.quick else "bench_algorithms")
    steps = args.steps or (QUICK_STEPS if args.quick else None)
    overrides = [*(QUICK if args.quick else []), *COMMON, *([f"trainer.max_steps={steps}"] if steps else []), *args.overrides]
    seeds = list(range(1, args.seeds + 1))
    start = time.perf_counter()
    processes: dict[str, float] = {}
    loads: dict[str, float] = {}
    if not args.report_only:
        for seed in seeds:
            seed_dir = out / f"seed{seed}"
            print(f"seed {seed}: {len(entries)} runs into {seed_dir}", flush=True)
            for e in entries:
                if not e.quick and seed > args.peer_seeds:
                    continue
                if args.fresh and (seed_dir / e.recipe).exists():
                    shutil.rmtree(seed_dir / e.recipe)
                info = run_recipe(e, seed_dir, [*overrides, *seed_overrides(seed)], threads=args.threads, timeout=args.timeout)
                if "process_seconds" in info:
                    processes[f"seed{seed}/{e.label}"] = info["process_seconds"]
                    loads[f"seed{seed}/{e.label}"] = info["load_average_5min"]
    per_seed: dict[int, dict[str, dict]] = {}
    for seed, label, run_dir in finished_runs(out, seeds, entries):
        per_seed.setdefault(seed, {})[label] = measure_run(run_dir, skip_steps=args.skip_steps)
    if not per_seed:
        raise SystemExit(f"algorithms: no run found under {out}")
    rows = aggregate(entries, per_seed)
    meta = {"mode": "quick" if args.quick else "full", "seeds": sorted(per_seed), "steps": steps or "recipe default",
            "overrides": [*(QUICK if args.quick else []), *args.overrides], "skip_steps": args.skip_steps,
            "target_accuracy": args.target_accuracy, "process_seconds": processes,
            "load_average_5min": loads,
            "bench_seconds": time.perf_counter() - start}
    written = write_tables(out, rows, meta, per_seed_table(entries, per_seed, args.target_accuracy),
                           drift_table(entries, per_seed))
    written.append(write_cost_check(out, entries, per_seed))
    written += write_plots(out, entries, per_seed, rows)
    print(markdown_table(rows))
    print(f"\nbenchmark wall time: {meta['bench_seconds']:.0f} s")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
