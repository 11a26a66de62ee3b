#!/usr/bin/env python
"""Compare two FastRL runs side by side: ``python tools/compare_runs.py RUN_A RUN_B``.

Prints, for each run: steps, training wall time (sum of step times, seconds), mean seconds per
phase, kept fraction, mean n, start / final / best validation accuracy; then the speed ratio
``time(A) / time(B)`` (B faster when > 1) and the accuracy difference ``B - A`` in points.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrl.training.plots import PHASES, load, phase_means  # noqa: E402


def summarize(run_dir: Path) -> dict[str, float]:
    train, val = load(run_dir)
    out: dict[str, float] = {
        "steps": float(len(train)),
        "train_time_s": sum(r.get("time/step", 0.0) for r in train),
        "kept_fraction": sum(r.get("prune/kept_fraction", 1.0) for r in train) / len(train),
        "mean_n": sum(r.get("rollout/n", 0.0) for r in train) / len(train),
    }
    out.update({f"time/{k}": v for k, v in phase_means(train).items()})
    accs = [r["val/accuracy"] for r in val if r.get("val/accuracy") is not None]
    if accs:
        out.update({"val_start": accs[0], "val_final": accs[-1], "val_best": max(accs)})
    return out


def table(a: dict[str, float], b: dict[str, float], names: tuple[str, str]) -> str:
    keys = ["steps", "train_time_s"] + [f"time/{p}" for p in PHASES] + [
        "kept_fraction", "mean_n", "val_start", "val_final", "val_best",
    ]
    width = max(len(n) for n in names) + 2
    lines = [f"{'':24s}{names[0]:>{width}s}{names[1]:>{width}s}"]
    for k in keys:
        if k in a or k in b:
            fa = f"{a[k]:.4g}" if k in a else "-"
            fb = f"{b[k]:.4g}" if k in b else "-"
            lines.append(f"{k:24s}{fa:>{width}s}{fb:>{width}s}")
    if a.get("train_time_s") and b.get("train_time_s"):
        lines.append(f"speed ratio time(A)/time(B): {a['train_time_s'] / b['train_time_s']:.2f}x")
    if "val_final" in a and "val_final" in b:
        lines.append(f"final validation accuracy B - A: {100 * (b['val_final'] - a['val_final']):+.2f} points")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args(argv)
    names = (args.run_a.name, args.run_b.name)
    if names[0] == names[1]:
        names = (f"{args.run_a.parent.name}/{names[0]}", f"{args.run_b.parent.name}/{names[1]}")
    print(table(summarize(args.run_a), summarize(args.run_b), names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
