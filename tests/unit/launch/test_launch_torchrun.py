"""torchrun --nproc-per-node=2: the launcher is detected as torchrun and the gloo group is correct."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[3]


def test_torchrun_two_processes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMIX_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(WORKER), str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["info"]["master_port"] == records[1]["info"]["master_port"]
    for rank, record in enumerate(records):
        assert record["launcher"] == "torchrun"
        assert record["rank"] == rank and record["info"]["local_rank"] == rank and record["world_size"] == 2
        assert record["all_reduce"] == 3.0
