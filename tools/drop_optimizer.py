#!/usr/bin/env python
"""Drop the optimizer state of kept trainer checkpoints, keeping their weights byte for byte.

    python tools/drop_optimizer.py RUN_DIR/checkpoints/step_00000010 [RUN_DIR/checkpoints/step_00000020 ...]

Checkpoints kept for evaluation (``checkpoint.save_at_train_s`` / ``save_at_steps``) need only their
weights: evaluation (``trainer.val_only=true``) and ``tools/convert_checkpoint.py export`` read them as
before. An fp32 model's checkpoint shrinks about 4x (SmolLM2-135M: 2,154 MB -> 538 MB). A run resumes
from it only with ``checkpoint.save_optimizer=false``, from zero Adam moments (and, in bf16, from the
bf16 weights instead of the fp32 main ones). The newest checkpoint of a root, the one ``checkpoint.resume=auto``
loads, is refused unless ``--allow-latest`` (for a finished run), and so is a checkpoint whose run a
trainer holds (``RUN_DIR/trainer.lock``). Details: :mod:`fastrl.checkpoint.model_only`. One process, no
model built, memory of one copy buffer. Exit status: 0 all rewritten, 1 one or more refused or failed
(each named on stderr and left as it was; the others are rewritten), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROG = "drop_optimizer"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path, help="trainer checkpoint directories (step_XXXXXXXX)")
    parser.add_argument("--allow-latest", action="store_true",
                        help="also rewrite the newest checkpoint of its root (a finished run's last one)")
    args = parser.parse_args(argv)
    from fastrl.checkpoint.model_only import DROP_ERRORS, drop_optimizer

    refused = 0
    for path in args.checkpoints:
        try:
            done = drop_optimizer(path, allow_latest=args.allow_latest)
        except DROP_ERRORS as err:
            # CheckpointError / RunDirLocked name the file and what to do; any other error (a full disk,
            # an unreadable file) is named with the checkpoint, which is left as it was
            why = str(err) if type(err).__name__ in ("CheckpointError", "RunDirLocked") else f"{path}: {type(err).__name__}: {err}"
            print(f"{PROG}: error: {why}", file=sys.stderr)
            refused += 1
            continue
        print(f"{done.path}: {done.bytes_before / 1e6:,.0f} MB -> {done.bytes_after / 1e6:,.0f} MB", flush=True)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
