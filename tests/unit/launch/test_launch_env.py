"""Launcher detection and env:// variables from fake torchrun / srun / MPI / single environments."""

from __future__ import annotations

import socket

import pytest

from fastrl.distributed.launch import (
    LaunchError,
    LaunchInfo,
    detect_launcher,
    expand_hostlist,
    export_torch_env,
    launch_info_from_env,
    slurm_master_port,
)

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "abc",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "node07",
    "MASTER_PORT": "29500",
}
# What srun sets for task 3 of a 4-task step over two nodes (job 4242, step 1).
SRUN = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "1",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
# The batch script's own environment: job variables but no step.
BATCH = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "gpu[07-08]"}


class FakeComm:
    """Rank ``rank`` of a communicator whose collectives return what the other ranks would send."""

    def __init__(self, rank: int, hosts: list[str], root_endpoint: tuple[str, int] | None = None) -> None:
        self.rank, self.hosts, self.root_endpoint = rank, hosts, root_endpoint
        self.bcast_sent = None

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return len(self.hosts)

    def allgather(self, value):
        assert value == socket.gethostname()
        return list(self.hosts)

    def bcast(self, value, root=0):
        assert root == 0
        if self.rank == 0:
            self.bcast_sent = value
            return value
        assert value is None
        return self.root_endpoint


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TORCHRUN, "torchrun"),
        ({**SRUN, **TORCHRUN}, "torchrun"),  # srun + torchrun: the torchrun variables win
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "torchrun"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "mpi"),
        ({**SRUN, "PMIX_RANK": "3"}, "mpi"),  # srun --mpi=pmix
        ({"PMI_RANK": "1"}, "mpi"),
        (SRUN, "slurm"),
        (BATCH, "single"),
        ({}, "single"),
        ({"RANK": "1"}, "single"),
    ],
)
def test_detect_launcher(env, expected):
    assert detect_launcher(env) == expected


def test_torchrun_variables_taken_as_they_are():
    info = launch_info_from_env(TORCHRUN)
    assert info == LaunchInfo(
        launcher="torchrun", rank=5, world_size=8, local_rank=1, master_addr="node07", master_port=29500
    )


def test_torchrun_missing_variable_is_named():
    env = dict(TORCHRUN)
    del env["MASTER_PORT"]
    with pytest.raises(LaunchError, match="MASTER_PORT is not set"):
        launch_info_from_env(env)


def test_slurm_step():
    info = launch_info_from_env(SRUN)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("slurm", 3, 4, 1)
    assert info.master_addr == "gpu07"
    assert info.master_port == slurm_master_port(4242, 1) == 20000 + (4242 * 7 + 1) % 20000


def test_slurm_step_ports_differ_between_steps_and_jobs():
    ports = {slurm_master_port(job, step) for job in range(100, 110) for step in range(3)}
    assert len(ports) == 30
    assert all(20000 <= p < 40000 for p in ports)


def test_slurm_master_overrides():
    info = launch_info_from_env({**SRUN, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "31000"})
    assert (info.master_addr, info.master_port) == ("10.0.0.9", 31000)


def test_slurm_bad_integer_is_named():
    with pytest.raises(LaunchError, match=r"SLURM_PROCID='x' is not an integer"):
        launch_info_from_env({**SRUN, "SLURM_PROCID": "x"})


def test_slurm_rank_outside_world_is_refused():
    with pytest.raises(LaunchError, match=r"rank 4 is outside \[0, 4\)"):
        launch_info_from_env({**SRUN, "SLURM_PROCID": "4"})


def test_single_process_picks_a_free_port():
    info = launch_info_from_env({})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.master_addr) == ("single", 0, 1, 0, "127.0.0.1")
    assert 0 < info.master_port < 65536


def test_mpi_rank0_picks_endpoint_and_broadcasts():
    comm = FakeComm(0, ["hostA", "hostA", "hostB", "hostB"])
    info = launch_info_from_env({"PMIX_RANK": "0", "MASTER_PORT": "29999"}, comm=comm)
    assert comm.bcast_sent == ("hostA", 29999)
    assert info == LaunchInfo(launcher="mpi", rank=0, world_size=4, local_rank=0, master_addr="hostA", master_port=29999)


def test_mpi_rank0_without_master_port_picks_a_free_one():
    comm = FakeComm(0, ["hostA", "hostB"])
    info = launch_info_from_env({"OMPI_COMM_WORLD_RANK": "0"}, comm=comm)
    assert comm.bcast_sent == ("hostA", info.master_port)
    assert 0 < info.master_port < 65536


def test_mpi_other_rank_uses_broadcast_and_counts_local_rank():
    # Rank 3 on hostB, after rank 2 on hostB: local rank 1; the endpoint comes from rank 0.
    comm = FakeComm(3, ["hostA", "hostA", "hostB", "hostB"], root_endpoint=("hostA", 23456))
    info = launch_info_from_env({"PMIX_RANK": "3", "MASTER_ADDR": "ignored-on-rank-3"}, comm=comm)
    assert info == LaunchInfo(launcher="mpi", rank=3, world_size=4, local_rank=1, master_addr="hostA", master_port=23456)


def test_export_torch_env_writes_and_refuses_conflicts():
    info = launch_info_from_env(SRUN)
    env: dict[str, str] = {"UNRELATED": "1"}
    export_torch_env(info, env)
    assert env == {
        "UNRELATED": "1",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(info.master_port),
    }
    with pytest.raises(LaunchError, match=r"WORLD_SIZE='2' is already set but the launcher says '4'"):
        export_torch_env(info, {"WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("localhost", ["localhost"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a1,b[2],c", ["a1", "b2", "c"]),
    ],
)
def test_expand_hostlist(hostlist, expected):
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [("gpu[01-03", "unbalanced '\\['"), ("gpu]1", "unbalanced '\\]'"), ("n[3-1]", "descending range"), ("n[a-b]", "bad range"), ("", "empty")],
)
def test_expand_hostlist_errors(hostlist, message):
    with pytest.raises(LaunchError, match=message):
        expand_hostlist(hostlist)
