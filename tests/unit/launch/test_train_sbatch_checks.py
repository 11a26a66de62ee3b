"""slurm/train.sbatch checks what the default launch (srun --mpi=pmix + mpi4py) needs of the cluster
before any task starts, with one line that names what is missing and what to do (issue 29, item 11).
The batch script runs under bash with stand-ins for srun and python on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TRAIN = REPO / "slurm" / "train.sbatch"


def _run(tmp_path: Path, srun_list: str, python_error: str | None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "srun").write_text(
        f"#!/bin/bash\necho \"srun $*\" >> {calls}\n"
        f"if [ \"$1\" = --mpi=list ]; then printf '{srun_list}'; exit 0; fi\nexit 0\n"
    )
    fail = f"echo '{python_error}' >&2; exit 1" if python_error else "exit 0"
    (bin_dir / "python").write_text(f"#!/bin/bash\necho \"python $*\" >> {calls}\n{fail}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FASTRL_RECIPE": "r", "FASTRL_RUN_DIR": str(tmp_path / "run"),
        "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
    }
    env.pop("FASTRL_VENV", None)
    return subprocess.run(["bash", str(TRAIN)], env=env, capture_output=True, text=True, timeout=60)


def test_no_pmix_is_one_line_with_the_torchrun_way(tmp_path):
    # Breakage caught: starting `srun --mpi=pmix` anyway, which fails in Slurm's plugin loader with a
    # message that names neither FastRL's requirement nor the alternative launch.
    proc = _run(tmp_path, "MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n", None)
    assert proc.returncode == 2
    assert "srun --mpi=list offers no pmix here" in proc.stderr and "FASTRL_LAUNCH=torchrun" in proc.stderr
    assert "fastrl.train" not in (tmp_path / "calls").read_text()  # no task was started


def test_mpi4py_without_an_mpi_library_is_one_line(tmp_path):
    proc = _run(tmp_path, "MPI plugin types are...\\n\\tnone\\n\\tpmix\\n",
                "ImportError: libmpi.so.40: cannot open shared object file: No such file or directory")
    assert proc.returncode == 2
    assert "mpi4py cannot load an MPI library (ImportError: libmpi.so.40" in proc.stderr
    assert "fastrl.train" not in (tmp_path / "calls").read_text()


def test_a_cluster_with_pmix_and_mpi_starts_the_trainer(tmp_path):
    proc = _run(tmp_path, "MPI plugin types are...\\n\\tnone\\n\\tpmix\\n", None)
    assert proc.returncode == 0, proc.stderr
    assert "srun --mpi=pmix --kill-on-bad-exit=1 python -m fastrl.train --recipe r" in (tmp_path / "calls").read_text()
