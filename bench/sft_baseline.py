#!/usr/bin/env python
"""SFT-continuation baseline of equal wall time next to an RL run.

Does RL beat simply training the warm-start policy longer with the supervised loss? Given a
finished RL run directory (``make run``'s by default), this continues the recipe's supervised warm
start (same data, seed, batch, learning rate and attribute-head loss; the first steps are exactly
the cached warm start's) for as many extra SFT steps as fit in the RL run's training time
(``time/train_elapsed``: every step's phases, validation and checkpoints excluded), validates it
on the same held-out questions with ``trainer.val_only=true`` and prints one table per question
type: the warm start, the SFT continuation and the RL policy.

    python bench/sft_baseline.py --rl-run runs/easyvqa_tiny_fastrl_grpo_cpu
    python bench/sft_baseline.py --rl-run RUN --extra-sft-steps 200   # a fixed number of steps

Writes ``OUT/sft_baseline.md`` and ``.json`` (``OUT`` defaults to ``runs/sft_baseline``). The SFT
step time comes from the RL run's own warm start record (seconds of the SFT phase / SFT steps);
the table reports the SFT seconds actually spent, so the equal-time claim is checked, not assumed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TYPES = ("yes_no", "shape", "color")


def read_records(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``.

    Raises:
        SystemExit: the file is missing (not a run directory).
    """
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"sft_baseline: {path} does not exist; pass the directory of a finished run (--rl-run)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rl_summary(records: list[dict], source: Path) -> dict:
    """Training seconds, the warm start's SFT seconds per step, and the first and last validation.

    Raises:
        SystemExit: the run has no training step, no validation or no warm-start record.
    """
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "val"]
    start = next((r for r in records if r.get("kind") == "start" and "warm_start/seconds" in r), None)
    if not train or len(val) < 2 or start is None:
        raise SystemExit(
            f"sft_baseline: {source} needs training steps, a validation before and after training and the "
            "warm-start record (run the recipe with warm_start.enabled=true to the end)"
        )
    return {
        "steps": train[-1]["step"],
        "train_seconds": train[-1]["time/train_elapsed"],
        "warm_start": start,
        "val_start": val[0],
        "val_end": val[-1],
    }


def extra_steps_for(seconds: float, warm_start: dict, sft_steps: int) -> tuple[int, float]:
    """SFT steps that take ``seconds``, from the warm start's measured SFT phase; and its s/step."""
    sft_seconds = warm_start["warm_start/seconds"] - warm_start["warm_start/vision_seconds"]
    per_step = sft_seconds / sft_steps
    return max(1, round(seconds / per_step)), per_step


def row(label: str, val: dict, seconds: float | None) -> list[str]:
    cells = [label, f"{100 * val['val/accuracy']:.1f} ± {100 * val['val/accuracy_stderr']:.1f}"]
    cells += [f"{100 * val.get(f'val/accuracy/{t}', float('nan')):.1f}" for t in TYPES]
    cells += [f"{100 * val['val/format_rate']:.0f}%", "-" if seconds is None else f"{seconds:.0f}"]
    return cells


def table(rows: list[list[str]]) -> str:
    head = ["policy", "overall (%)", "yes/no", "shape", "colour", "format", "training seconds"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rl-run", type=Path, required=True, help="finished RL run directory (holds metrics.jsonl)")
    parser.add_argument("--recipe", default="easyvqa_tiny_fastrl_grpo_cpu", help="recipe of the RL run")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "sft_baseline")
    parser.add_argument("--extra-sft-steps", type=int, default=None, help="instead of the equal-time count")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (as the RL run)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="overrides of the RL run")
    args = parser.parse_args(argv)

    from fastrl.train import resolve_config

    cfg = resolve_config(args.recipe, args.overrides)
    if not cfg.warm_start.enabled:
        raise SystemExit(f"sft_baseline: recipe {args.recipe} has no supervised warm start to continue")
    rl = rl_summary(read_records(args.rl_run), args.rl_run)
    extra, per_step = extra_steps_for(rl["train_seconds"], rl["warm_start"], cfg.warm_start.sft_steps)
    if args.extra_sft_steps is not None:
        extra = args.extra_sft_steps
    total_sft = cfg.warm_start.sft_steps + extra
    print(
        f"sft_baseline: RL trained {rl['steps']} steps in {rl['train_seconds']:.0f} s; SFT step {per_step:.2f} s "
        f"-> {extra} extra SFT steps ({total_sft} in all)",
        flush=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "fastrl.train", "--recipe", args.recipe, *args.overrides,
        f"warm_start.sft_steps={total_sft}", "trainer.val_only=true", f"trainer.torch_threads={args.threads}",
        f"logging.output_dir={args.out}", "logging.run_name=sft_continuation", "logging.tensorboard=false",
        "checkpoint.resume=none",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"sft_baseline: the validation run failed (exit {proc.returncode}): {' '.join(cmd)}")
    records = read_records(args.out / "sft_continuation")
    sft_val = [r for r in records if r.get("kind") == "val"][-1]
    sft_start = next(r for r in records if r.get("kind") == "start" and "warm_start/seconds" in r)
    sft_seconds = sft_start["warm_start/seconds"] - sft_start["warm_start/vision_seconds"]
    base_seconds = rl["warm_start"]["warm_start/seconds"] - rl["warm_start"]["warm_start/vision_seconds"]
    rows = [
        row(f"warm start ({cfg.warm_start.vision_warmup_steps} vision + {cfg.warm_start.sft_steps} SFT steps)", rl["val_start"], None),
        row(f"SFT continuation (+{extra} SFT steps)", sft_val, sft_seconds - base_seconds),
        row(f"RL: {rl['steps']} steps of {args.recipe}", rl["val_end"], rl["train_seconds"]),
    ]
    md = table(rows)
    print(md)
    (args.out / "sft_baseline.md").write_text(md + "\n")
    (args.out / "sft_baseline.json").write_text(json.dumps({
        "recipe": args.recipe, "rl_run": str(args.rl_run), "extra_sft_steps": extra,
        "sft_extra_seconds": sft_seconds - base_seconds, "rl_train_seconds": rl["train_seconds"],
        "warm_start": rl["val_start"], "sft_continuation": sft_val, "rl": rl["val_end"],
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
