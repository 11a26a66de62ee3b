"""mpirun -n 4: MPI bootstrap of torch.distributed, and mpi_allgatherv against gloo all_gather_object."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[3]
WORLD, TP = 4, 2


def _worker_module():
    spec = importlib.util.spec_from_file_location("dist_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    assert shutil.which("mpirun"), "mpirun missing: run `bash tools/setup_system.sh` (openmpi-bin)"
    out = tmp_path_factory.mktemp("mpi")
    env = {
        **os.environ,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    cmd = ["mpirun", "-n", str(WORLD), "--oversubscribe", sys.executable, str(WORKER), str(out), str(TP)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"mpirun failed (rc={result.returncode}):\n{result.stdout}\n{result.stderr}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_mpi_bootstrap_forms_the_process_group(records):
    endpoints = {(r["info"]["master_addr"], r["info"]["master_port"]) for r in records}
    assert len(endpoints) == 1, f"ranks disagree on the master endpoint: {endpoints}"
    for rank, record in enumerate(records):
        assert record["launcher"] == "mpi"
        assert record["rank"] == record["mpi_rank"] == record["info"]["rank"] == rank
        assert record["world_size"] == WORLD
        assert record["all_reduce"] == sum(range(1, WORLD + 1))  # 1 + 2 + 3 + 4
        assert record["env"]["RANK"] == str(rank) and record["env"]["WORLD_SIZE"] == str(WORLD)
    # All four processes run on this host: local ranks are 0..3.
    assert sorted(r["info"]["local_rank"] for r in records) == list(range(WORLD))


def test_allgatherv_matches_torch_all_gather_object_on_dp_groups(records):
    ragged_arrays = _worker_module().ragged_arrays
    for rank, record in enumerate(records):
        group = list(range(rank % TP, WORLD, TP))
        assert record["dp_group"] == group and record["dp_comm_rank"] == group.index(rank)
        for key, got in record["gathered"].items():
            expected = [ragged_arrays(member)[key] for member in group]
            assert got["mpi"] == got["torch"] == [a.tolist() for a in expected]
            assert got["mpi_dtypes"] == [str(a.dtype) for a in expected]
            assert got["mpi_shapes"] == [list(a.shape) for a in expected]
    # The data really is ragged, including an empty contribution (rank 1 has none).
    lengths = [len(records[0]["gathered"]["index"]["mpi"][i]) for i in range(2)]
    assert lengths == [3, 5]
    assert records[1]["gathered"]["advantage"]["mpi_shapes"] == [[0, 3], [2, 3]]


def test_allgatherv_refuses_ranks_that_disagree_on_dtype(records):
    for record in records:
        message = record["mismatch_error"]
        assert message is not None
        assert "rank 0: float32 (2,)" in message and "rank 1: float64 (2,)" in message


def test_allgatherv_matches_numpy_roundtrip_of_float32_exactly(records):
    # float32 values survive both paths bit for bit (compared as float32, not via JSON doubles).
    ragged_arrays = _worker_module().ragged_arrays
    got = np.asarray(records[0]["gathered"]["advantage"]["mpi"][1], dtype=np.float32)
    np.testing.assert_array_equal(got, ragged_arrays(2)["advantage"])
