"""Session fixture: a real local Slurm cluster (munged, slurmctld, slurmd) stopped by pid at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import LocalSlurmCluster  # this folder is on sys.path (no __init__.py: prepend import mode)

REPO = Path(__file__).resolve().parents[2]
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
#: Tries of one ``scontrol show job`` query that a signal ends (:meth:`SlurmSession.job`).
SCONTROL_ATTEMPTS = 5


class SlurmSession:
    """Client side of the test cluster: commands run with its SLURM_CONF and the project's Python."""

    def __init__(self, cluster: LocalSlurmCluster) -> None:
        self.cluster = cluster
        env = cluster.env
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["OMP_NUM_THREADS"] = "1"
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            env.pop(key, None)
        self.env = env

    def run(self, cmd: list[str], *, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO
        )

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` fields of ``job_id`` (JobState, ExitCode, Dependency, Reason...).

        A query that a signal ends (scontrol dies of SIGPIPE when slurmctld, busy on a loaded
        machine, drops its connection) is asked again, up to :data:`SCONTROL_ATTEMPTS` times one
        second apart; an answer with an exit status, and the last attempt, stand as they are.
        """
        for attempt in range(1, SCONTROL_ATTEMPTS + 1):
            out = self.run(["scontrol", "show", "job", "-o", job_id])
            if out.returncode >= 0 or attempt == SCONTROL_ATTEMPTS:
                break
            time.sleep(1.0)
        assert out.returncode == 0, (
            f"scontrol show job {job_id}: exit {out.returncode} after {attempt} attempts: {out.stderr}\n"
            f"{self.cluster.log_text()}"
        )
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout))

    def wait_job(self, job_id: str, timeout: float = 90) -> dict[str, str]:
        """Poll until ``job_id`` reaches a terminal state; returns its fields."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in TERMINAL_STATES:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not finished after {timeout} s: {self.job(job_id)}\n{self.cluster.log_text()}")


@pytest.fixture(scope="session")
def slurm(request) -> SlurmSession:
    cluster = LocalSlurmCluster()
    cluster.start()
    request.addfinalizer(cluster.stop)
    return SlurmSession(cluster)
