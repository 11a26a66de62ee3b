#!/usr/bin/env python
"""The trainer's passes before and after the on-policy old log-probs and the length grouping.

One sitting, one code version: every recipe trains ``--steps`` steps under each variant, in
rotated order (the first recipe's variants in the listed order, the next recipe's rotated by one,
...), one run at a time, with ``bench_run.json`` beside each run (the CPU seconds other processes
used meanwhile: :func:`bench.heldout.run_one`). Validation is cut to ``data.val_size=8`` after
training (outside the step times) and no test split is evaluated.

Variants (``trainer.*`` settings, docs/algorithm.md, "Old-policy log-probs" and "Length grouping"):

- ``before``: ``old_log_probs=recompute group_by_length=false micro_batch_tokens=0``, the trainer
  as it was: the old-policy pass over every kept row, rows in the order pruning left them,
  micro-batches of ``parallel.micro_batch_size`` rows;
- ``on_policy``: ``group_by_length=false``: the first update's rows take their own forward's
  log-probs (no old-policy pass with one update per step);
- ``grouped``: ``old_log_probs=recompute``: rows grouped by length only;
- ``after``: the defaults (both);
- ``tokens``: the defaults with micro-batches cut by a budget of 600 real tokens
  (``trainer.micro_batch_tokens=600``, at most ``parallel.micro_batch_size`` rows an update
  micro-batch, 8x that a log-prob one): fewer rows of similar length a micro-batch, so less
  padding where a few kept rows spread over a wide range of lengths. The SmolLM2 recipes set
  this budget themselves, so there ``after`` and ``tokens`` are the same settings.

Report (``OUT/passes.md`` and ``.json``), per run, means over the steps after the first: the phase
seconds (old, ref, update and their sum: the trainer's passes), the step, ``actor/padding_fraction``
(the update's computed tokens that are padding) and ``actor/log_prob_padding_fraction`` (the old /
reference passes'; 0.0% for runs that do not log it), the kept and total response tokens; per
recipe the passes' change against ``before``; per pruning recipe its passes against the kept-token
prediction (the GRPO run of the same variant, per response token, times the pruning run's kept
response tokens; and per real prompt + response token, ``actor/update_tokens``); and step 1's loss
and gradient norm in every variant (identical rollouts: the variants must agree to float tolerance
there).

    python bench/passes_bench.py --out bench/results/passes/2026-12-07 --steps 3
    python bench/passes_bench.py --quick --out /tmp/passes                # tiny easy-vqa rows, 2 steps
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.algorithms import COMMON, load, measure_run  # noqa: E402
from bench.heldout import Row, run_one  # noqa: E402

VARIANTS = {
    "before": ["trainer.old_log_probs=recompute", "trainer.group_by_length=false", "trainer.micro_batch_tokens=0"],
    "on_policy": ["trainer.group_by_length=false"],
    "grouped": ["trainer.old_log_probs=recompute"],
    "after": [],
    "tokens": ["trainer.micro_batch_tokens=600"],
}
#: (GRPO recipe, pruning recipe) pairs; the pruning row's kept-token prediction uses the GRPO row.
PAIRS = {
    "smollm2": ("smollm2_135m_grpo_wordarith_vllm_cpu", "smollm2_135m_fastrl_grpo_wordarith_vllm_cpu"),
    "easyvqa": ("easyvqa_tiny_grpo_cpu", "easyvqa_tiny_fastrl_grpo_cpu"),
}
PASSES = ("old", "ref", "update")
#: Step-1 metrics every variant must reproduce (the same rollouts, float tolerance).
STEP1 = ("actor/loss", "actor/grad_norm")


def overrides(steps: int, variant: str) -> list[str]:
    return [
        *COMMON, f"trainer.max_steps={steps}", "trainer.val_before_train=false", "data.val_size=8", "data.test_size=0",
        "logging.rollouts_every=0", "logging.plots=false", *VARIANTS[variant],
    ]


def rotated(items: list[str], k: int) -> list[str]:
    k %= len(items)
    return items[k:] + items[:k]


def summarize(run_dir: Path) -> dict:
    """Means over the steps after the first, and step 1's loss and gradient norm."""
    out = measure_run(run_dir)
    train, _ = load(run_dir)
    later = train[1:] or train

    def mean(key: str) -> float:
        return sum(float(r.get(key, 0.0) or 0.0) for r in later) / len(later)

    passes = {p: out.get(f"time/{p}", 0.0) for p in PASSES}
    return {
        "passes": passes, "passes_s": sum(passes.values()), "step_s": mean("time/step"), "gen_s": out.get("time/gen", 0.0),
        "padding_fraction": mean("actor/padding_fraction"), "log_prob_padding_fraction": mean("actor/log_prob_padding_fraction"),
        "update_tokens": mean("actor/update_tokens"), "kept_tokens": mean("prune/kept_tokens"),
        "total_tokens": mean("prune/total_tokens"), "steps": len(train),
        "step1": {k: float(train[0][k]) for k in STEP1 if k in train[0]},
    }


def report(out: Path, pairs: dict[str, tuple[str, str]], variants: list[str]) -> dict:
    runs: dict = {}
    for recipes in pairs.values():
        for recipe in recipes:
            for v in variants:
                d = out / v / recipe
                if (d / "FINISHED").exists():
                    info = json.loads((out / v / f"{recipe}.bench_run.json").read_text())
                    runs.setdefault(recipe, {})[v] = {**summarize(d), "other_cores": info["other_cores"],
                                                      "position": info["position"]}
    described = ", ".join(f"`{v}` ({' '.join(VARIANTS[v]) or 'defaults'})" for v in variants)
    lines = ["# The trainer's passes: on-policy old log-probs and length grouping", "",
             f"Variants: {described}. Seconds per step, means over the steps after the first.", "",
             "| recipe | variant | old | ref | update | passes | vs before | step | padding (update) | padding (old + ref) | "
             "kept / total tokens | step-1 loss | step-1 grad norm | other cores |", "| --- " * 14 + "|"]
    for recipe, by in runs.items():
        base = by.get("before", {}).get("passes_s")
        for v, r in by.items():
            change = f"{r['passes_s'] / base - 1:+.1%}" if base else "-"
            p = r["passes"]
            lines.append(
                f"| {recipe} | {v} | {p['old']:.1f} | {p['ref']:.1f} | {p['update']:.1f} | {r['passes_s']:.1f} | {change} | "
                f"{r['step_s']:.1f} | {r['padding_fraction']:.1%} | {r.get('log_prob_padding_fraction', 0.0):.1%} | "
                f"{r['kept_tokens']:.0f} / {r['total_tokens']:.0f} | "
                f"{r['step1'].get('actor/loss', float('nan')):.6g} | {r['step1'].get('actor/grad_norm', float('nan')):.6g} | "
                f"{r['other_cores']:.2f} |"
            )
    lines += ["", "Kept-token prediction of the pruning rows: the GRPO run of the same variant, seconds of its passes "
              "per response token, times the pruning run's kept response tokens; and per real token (prompt + "
              "response, `actor/update_tokens`: the prompts of the kept rows are computed too), times the pruning "
              "run's real tokens.", "",
              "| pruning recipe | variant | passes | predicted (response tokens) | actual / predicted | "
              "predicted (prompt + response) | actual / predicted | FastRL / GRPO passes |", "| --- " * 8 + "|"]
    for grpo, pruned in pairs.values():
        for v in variants:
            g, f = runs.get(grpo, {}).get(v), runs.get(pruned, {}).get(v)
            if g and f and g["total_tokens"]:
                pred = g["passes_s"] / g["total_tokens"] * f["kept_tokens"]
                real = g.get("update_tokens") and f.get("update_tokens")
                pred_all = g["passes_s"] / g["update_tokens"] * f["update_tokens"] if real else float("nan")
                lines.append(f"| {pruned} | {v} | {f['passes_s']:.1f} | {pred:.1f} | {f['passes_s'] / pred:.2f} | "
                             f"{pred_all:.1f} | {f['passes_s'] / pred_all:.2f} | {f['passes_s'] / g['passes_s']:.3f} |")
    (out / "passes.md").write_text("\n".join(lines) + "\n")
    (out / "passes.json").write_text(json.dumps(runs, indent=1) + "\n")
    print("\n".join(lines))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=sorted(PAIRS))
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="the easy-vqa pair, 2 steps, before and after only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.steps, args.variants = ["easyvqa"], 2, ["before", "after"]
    pairs = {k: PAIRS[k] for k in args.pairs}
    if not args.report_only:
        position = 0
        for i, recipe in enumerate(r for pair in pairs.values() for r in pair):
            for v in rotated(list(args.variants), i):
                print(f"{recipe} / {v}", flush=True)
                run_one(Row(v, recipe, v), args.out / v, overrides(args.steps, v), position=position,
                        threads=args.threads, timeout=args.timeout)
                position += 1
    report(args.out, pairs, list(args.variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
