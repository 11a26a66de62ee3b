#!/usr/bin/env python
"""Plot a FastRL run: ``python tools/plot_run.py RUN_DIR [--out DIR]``.

Writes into ``RUN_DIR/plots`` (or ``--out``): ``reward.png`` (training reward and accuracy,
validation accuracy per step), ``accuracy_vs_time.png`` (validation accuracy against training
wall time), ``pruning.png`` (kept fraction and group size n per step), ``time_breakdown.png``
(mean seconds per step of each phase), ``ars.png`` (the group size n per step with the adaptive
sampler's f1, f2 per step and f3, g1 at each period boundary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrl.training.plots import PHASES, load, phase_means, plot  # noqa: E402,F401  (re-exported for scripts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output directory (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot(args.run_dir, args.out or args.run_dir / "plots")
    except (FileNotFoundError, ValueError) as err:
        print(f"plot_run: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
