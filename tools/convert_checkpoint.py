#!/usr/bin/env python
"""Convert checkpoints between Hugging Face and megatron-core distributed checkpoints.

Import (Hugging Face -> megatron, for ``model.megatron_checkpoint`` of the trainer)::

    python tools/convert_checkpoint.py import --hf Qwen2.5-VL-7B-Instruct --out ckpt/qwen7b-tp2 --tp 2 --pp 1

Export (a trained actor -> Hugging Face safetensors + config + tokenizer/processor files)::

    python tools/convert_checkpoint.py export --ckpt runs/NAME/checkpoints --out runs/NAME/hf [--step N]

``--ckpt`` is a checkpoint root (newest complete step, or ``--step N``), one step directory, or an
imported checkpoint. Run with ``TP x PP`` processes (``torchrun --nproc-per-node``, ``srun``,
``mpirun``; one process needs no launcher). Export loads the checkpoint at its own ``--tp/--pp``,
whatever layout the checkpoint was saved with. Exit status: 0 done, 1 unusable input (the message
names the file), 2 bad arguments. Layout of the directories: docs/conversion.md.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.config import ParallelConfig

PROG = "convert_checkpoint"


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"2GiB"``, ``"1000"`` (bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 5GB, 500MB, 2GiB)")
    unit = match.group(2).upper().rstrip("B")
    base = 1024 if unit.endswith("I") else 1000
    power = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit.rstrip("I")]
    return int(float(match.group(1)) * base**power)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    imp = sub.add_parser("import", help="Hugging Face directory -> megatron distributed checkpoint")
    imp.add_argument("--hf", required=True,
                     help="Hugging Face model directory (config + safetensors) or hub id (Qwen/Qwen2.5-VL-7B-Instruct: "
                          "its snapshot in the Hugging Face cache; HF_HOME / HF_HUB_OFFLINE are respected)")
    imp.add_argument("--out", required=True, type=Path, help="checkpoint directory to create")
    imp.add_argument("--tp", type=int, default=1, help="tensor-parallel size written (default 1)")
    imp.add_argument("--pp", type=int, default=1, help="pipeline-parallel size written (default 1)")

    exp = sub.add_parser("export", help="trainer / imported checkpoint -> Hugging Face directory")
    exp.add_argument("--ckpt", "--checkpoint", dest="ckpt", required=True, type=Path,
                     help="checkpoint root (RUN_DIR/checkpoints), step directory or imported checkpoint")
    exp.add_argument("--out", "--hf-out", dest="out", required=True, type=Path, help="Hugging Face directory to create")
    exp.add_argument("--step", type=int, default=None, help="step to export (default: newest complete)")
    exp.add_argument("--hf", type=Path, default=None,
                     help="Hugging Face directory describing the model (default: from the checkpoint)")
    exp.add_argument("--tp", type=int, default=1, help="tensor-parallel size to load with (default 1)")
    exp.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to load with (default 1)")
    exp.add_argument("--max-shard-size", type=parse_size, default=parse_size("5GB"),
                     help="largest safetensors file (default 5GB)")
    exp.add_argument("--no-progress", action="store_true", help="no progress bar")
    for p in (imp, exp):
        p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                       help="weights dtype written (auto: bfloat16 for bfloat16 models, else float32)")
    return parser  # fmt: skip


@contextlib.contextmanager
def conversion_session(tp: int, pp: int) -> Iterator[ParallelConfig]:
    """The TP x PP model-parallel group of a conversion (exactly TP x PP processes, no DP) for the
    ``with`` block; yields its parallel configuration."""
    import os

    import torch

    from fastrl.config import ConfigError, ParallelConfig
    from fastrl.distributed import world
    from fastrl.distributed.session import distributed_session

    started = world.launched_world_size()
    if started != tp * pp:
        raise ConfigError(
            f"{started} processes were started but --tp {tp} x --pp {pp} = {tp * pp}; start exactly "
            f"TP x PP processes (e.g. torchrun --nproc-per-node {tp * pp})"
        )
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    with distributed_session(parallel, seed=1234):
        yield parallel


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fastrl.checkpoint.manager import CheckpointError
    from fastrl.checkpoint.resolve import read_train_state
    from fastrl.config import ConfigError
    from fastrl.distributed import world
    from fastrl.distributed.launch import LaunchError
    from fastrl.models import conversion

    if args.tp < 1 or args.pp < 1:
        print(f"{PROG}: error: --tp and --pp must be >= 1 (got {args.tp}, {args.pp})", file=sys.stderr)
        return 2
    try:
        if args.command == "export":  # cheap checks first, before starting the model-parallel group
            checkpoint = conversion.resolve_checkpoint(args.ckpt, args.step)
            if checkpoint.kind == "trainer" and args.hf is None:
                read_train_state(checkpoint.path)
        else:
            from fastrl.models.hub import resolve_model_dir

            args.hf = resolve_model_dir(args.hf)  # a hub id -> its cached snapshot (ModelNotAvailableError: one line)
            conversion.read_hf_config(args.hf)
            conversion.hf_weight_names(args.hf)
        if args.out.exists():
            raise conversion.ConversionError(f"output {args.out} already exists; remove it or choose another path")
        with conversion_session(args.tp, args.pp) as parallel:
            if args.command == "import":
                out = conversion.import_hf(args.hf, args.out, parallel=parallel, dtype=args.dtype)
            else:
                out = conversion.export_hf(
                    args.ckpt, args.out, parallel=parallel, step=args.step, hf=args.hf, dtype=args.dtype,
                    max_shard_bytes=args.max_shard_size, progress=not args.no_progress,
                )  # fmt: skip
            rank = world.rank()
    except (CheckpointError, ConfigError, LaunchError, FileNotFoundError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"{PROG}: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
