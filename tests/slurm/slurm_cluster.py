"""A real single-machine Slurm cluster for tests: munged, slurmctld and slurmd from the Debian packages.

Everything lives in one scratch directory (key, sockets, pid files, state, spool, logs); the daemons
listen on free ports and are stopped by their pid files, so several clusters can coexist on one
machine and nothing outside the scratch directory is touched.

Layout of the scratch directory::

    munge/      munge.key, munged.socket, munged.pid, munged.log (owned by the munge user)
    etc/        slurm.conf
    state/      slurmctld state;   spool/  slurmd spool
    log/        slurmctld.log, slurmd.log;   run/  pid files
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODE_NAME = "localhost"
PARTITION = "debug"
REQUIRED_PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")


class ClusterError(RuntimeError):
    """The local Slurm cluster could not be started; the message carries the daemon logs."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own un-reaped child) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM ``pid``, wait up to ``timeout_s``, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocalSlurmCluster:
    """One node (``localhost``, ``cpus`` CPUs) and one partition (``debug``) in a scratch directory.

    Use :meth:`start` / :meth:`stop` (or ``with``). :attr:`env` is the environment for client
    commands (``sbatch``, ``srun``, ``squeue``...): it points ``SLURM_CONF`` at this cluster.

    Raises:
        ClusterError: not root, a program missing, or a daemon that did not come up (with its log).
    """

    def __init__(self, *, cpus: int = 8, real_memory_mb: int = 20000, kill_wait_s: int = 2) -> None:
        self.cpus = cpus
        self.real_memory_mb = real_memory_mb
        self.kill_wait_s = kill_wait_s
        self.root: Path | None = None
        self._pid_files: list[Path] = []

    # ---- paths ------------------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        assert self.root is not None
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in list(env):
            if key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "OMPI_")):
                del env[key]
        env["SLURM_CONF"] = str(self.conf)
        return env

    def log_text(self) -> str:
        """The tail of every daemon log (for error messages)."""
        assert self.root is not None
        parts = []
        for log in (self.root / "munge" / "munged.log", self.root / "log" / "slurmctld.log", self.root / "log" / "slurmd.log"):
            if log.exists():
                lines = log.read_text(errors="replace").splitlines()[-25:]
                parts.append(f"--- {log.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> "LocalSlurmCluster":
        if os.geteuid() != 0:
            raise ClusterError("the local Slurm cluster needs root (munged runs as the munge user)")
        missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
        if missing:
            raise ClusterError(
                f"programs missing: {', '.join(missing)}; install the Debian packages with "
                f"`bash tools/setup_system.sh` (slurm-wlm slurm-client munge)"
            )
        self.root = Path(tempfile.mkdtemp(prefix="fastrl-slurm-"))
        os.chmod(self.root, 0o755)
        try:
            self._start_munged(timeout_s)
            self._write_conf()
            self._start_slurm(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every daemon by its pid file (slurmd, slurmctld, munged) and remove the scratch dir."""
        for pid_file in reversed(self._pid_files):
            pid = _read_pid(pid_file)
            if pid is not None:
                _stop_pid(pid)
        self._pid_files.clear()
        if self.root is not None and os.environ.get("FASTRL_KEEP_SLURM_DIR") != "1":
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalSlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- daemons ----------------------------------------------------------------------------

    def _start_munged(self, timeout_s: float) -> None:
        assert self.root is not None
        munge = pwd.getpwnam("munge")
        mdir = self.root / "munge"
        mdir.mkdir(mode=0o700)
        key = mdir / "munge.key"
        subprocess.run([_prog("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        for path in (mdir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(key, 0o400)
        pid_file = mdir / "munged.pid"
        self._pid_files.append(pid_file)
        cmd = [
            "runuser", "-u", "munge", "--", _prog("munged"), "--force",
            f"--key-file={key}", f"--socket={mdir / 'munged.socket'}", f"--pid-file={pid_file}",
            f"--log-file={mdir / 'munged.log'}", f"--seed-file={mdir / 'munged.seed'}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"munged failed to start (rc={result.returncode}): {result.stderr}")
        # The socket directory must be reachable by slurm daemons and clients (they run as root).
        os.chmod(mdir, 0o755)
        self._wait(lambda: (mdir / "munged.socket").exists(), timeout_s, "munged socket")

    def _write_conf(self) -> None:
        assert self.root is not None
        for sub in ("etc", "state", "spool", "log", "run"):
            (self.root / sub).mkdir()
        r = self.root
        text = f"""\
ClusterName=fastrltest
SlurmctldHost={NODE_NAME}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r / 'munge' / 'munged.socket'}
CredType=cred/munge
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}
SlurmdPidFile={r / 'run' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait={self.kill_wait_s}
MinJobAge=300
SlurmdParameters=config_overrides
NodeName={NODE_NAME} CPUs={self.cpus} RealMemory={self.real_memory_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        self.conf.write_text(text)

    def _start_slurm(self, timeout_s: float) -> None:
        assert self.root is not None
        env = self.env
        run = self.root / "run"
        self._pid_files.append(run / "slurmctld.pid")
        subprocess.run([_prog("slurmctld"), "-c", "-f", str(self.conf)], check=True, env=env, capture_output=True)
        self._wait(lambda: _read_pid(run / "slurmctld.pid") is not None, timeout_s, "slurmctld pid file")
        self._pid_files.append(run / "slurmd.pid")
        subprocess.run([_prog("slurmd"), "-N", NODE_NAME, "-f", str(self.conf)], check=True, env=env, capture_output=True)
        self._wait(self._node_idle, timeout_s, "node idle")

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.log_text()}")


def _prog(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    return str(Path("/usr/sbin", name))
