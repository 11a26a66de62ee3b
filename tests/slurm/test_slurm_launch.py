"""On the local Slurm cluster: srun --mpi=pmix and plain srun form correct gloo process groups through
fastrl.distributed.launch; a rank that exits early ends the whole step at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fastrl.distributed.launch import expand_hostlist, slurm_master_port

pytestmark = pytest.mark.slurm

HERE = Path(__file__).parent
WORKER = HERE.parent / "unit" / "launch" / "dist_worker.py"


def _records(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_srun_offers_pmix(slurm):
    out = slurm.run(["srun", "--mpi=list"])
    assert out.returncode == 0, out.stderr
    assert "pmix" in out.stdout.split()


@pytest.mark.parametrize("hostlist", ["localhost", "gpu[01-03,07],login1", "n[8-10]", "n[08-10]", "r[1-2]n[1-2]", "a1,b[2],c"])
def test_hostlist_parser_matches_scontrol(slurm, hostlist):
    out = slurm.run(["scontrol", "show", "hostnames", hostlist])
    assert out.returncode == 0, out.stderr
    assert expand_hostlist(hostlist) == out.stdout.split()


def test_srun_pmix_bootstrap_forms_process_group(slurm, tmp_path):
    out = slurm.run(["srun", "--mpi=pmix", "-n", "2", "python", str(WORKER), str(tmp_path), "1"])
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    records = _records(tmp_path, 2)
    assert {(r["info"]["master_addr"], r["info"]["master_port"]) for r in records} == {
        (records[0]["info"]["master_addr"], records[0]["info"]["master_port"])
    }
    for rank, record in enumerate(records):
        assert record["launcher"] == "mpi"
        assert record["rank"] == record["mpi_rank"] == rank and record["world_size"] == 2
        assert record["info"]["local_rank"] == rank  # both tasks on the one node
        assert record["all_reduce"] == 3.0  # 1 + 2
        # The data-parallel group is the whole world here; MPI and gloo gathers agree.
        for got in record["gathered"].values():
            assert got["mpi"] == got["torch"]
            assert len(got["mpi"]) == 2


def test_plain_srun_uses_slurm_variables(slurm, tmp_path):
    out = slurm.run(["srun", "--mpi=none", "-n", "2", "python", str(WORKER), str(tmp_path)])
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    records = _records(tmp_path, 2)
    for rank, record in enumerate(records):
        assert record["launcher"] == "slurm"
        assert record["rank"] == rank and record["info"]["local_rank"] == rank
        assert record["all_reduce"] == 3.0
        assert record["info"]["master_addr"] == "localhost"
    port = records[0]["info"]["master_port"]
    assert records[1]["info"]["master_port"] == port
    assert port in {slurm_master_port(job, step) for job in range(1, 200) for step in range(4)}


def test_rank_exiting_early_fails_the_job_fast(slurm):
    # Rank 0 would sleep 600 s; --kill-on-bad-exit ends the step as soon as rank 1 exits with 3.
    start = time.monotonic()
    out = slurm.run(
        ["srun", "--mpi=pmix", "-n", "2", "--kill-on-bad-exit=1", "python", str(HERE / "early_exit_worker.py")],
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert elapsed < 120, f"the step took {elapsed:.0f} s to fail; rank 0 was not killed"
    assert "rank 1: simulated failure" in out.stderr
    assert "task 1: Exited with exit code 3" in out.stderr, out.stderr
