"""The names of every file and directory of a FastRL checkpoint (the one place that spells them).

A trainer checkpoint root (``RUN_DIR/checkpoints``)::

    step_00000010/                 one complete checkpoint
        actor/                     megatron dist_checkpointing of the actor (+ optimizer)
        rng/rank_00000.pt          each rank's RNG states
        train_state.pt             TrainState + the config it was written with
        COMPLETE                   marker: step and every file with its size (written last)
    .tmp-step_00000020/            being written (never loaded)
    latest                         "step_00000010", written after the rename
    best                           the best validation checkpoint (kept by retention)

An imported checkpoint (``tools/convert_checkpoint.py import``)::

    DIR/actor/  DIR/hf/  DIR/fastrl_import.json  DIR/COMPLETE

Who reads and writes what: :mod:`fastrl.checkpoint.manager` (markers, publication, retention),
:mod:`fastrl.checkpoint.actor_state` (``actor/``, ``rng/``), :mod:`fastrl.checkpoint.train_state`
(``train_state.pt``), :mod:`fastrl.checkpoint.resolve` (finding and verifying a checkpoint),
:mod:`fastrl.checkpoint.io` (a trainer's save and resume).
"""

from __future__ import annotations

import re

COMPLETE_MARKER = "COMPLETE"
LATEST_FILE = "latest"
BEST_FILE = "best"
ACTOR_DIR = "actor"
RNG_DIR = "rng"
TRAIN_STATE = "train_state.pt"
IMPORT_INFO = "fastrl_import.json"
EXPORT_INFO = "fastrl_export.json"
HF_FILES_DIR = "hf"
#: Version of the imported-checkpoint / export formats written into their JSON files.
FORMAT_VERSION = 1

STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    """``step_00000042`` for step 42."""
    return f"step_{step:08d}"


def rng_file_name(rank: int) -> str:
    """The RNG state file of global rank ``rank`` under ``RNG_DIR``."""
    return f"rank_{rank:05d}.pt"
