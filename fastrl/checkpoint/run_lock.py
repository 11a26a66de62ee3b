"""The run-directory lock: one trainer at a time writes a run directory.

Two trainers on one run directory (a second start by hand, a requeued Slurm stage beside a
running one) would each set aside the other's metrics records and stage their checkpoint saves in
the same ``.tmp-step_*`` folder. The trainer therefore holds ``RUN_DIR/trainer.lock`` from before
it reads or moves anything in the run directory until it exits (global rank 0 takes it for all
ranks; :func:`fastrl.training.run.run`).

The lock is a JSON file created with ``O_CREAT | O_EXCL`` (atomic on local and NFS v3+ file
systems): ``{pid, host, started_at, proc_start, slurm_job_id, slurm_restart_count, token}``. A lock that is already
there is

- **live** (its pid runs on this host and, where ``/proc`` tells, started when the lock says):
  refused, with :class:`RunDirLocked` naming the holder (pid, host, start time);
- **stale** (this host, the process is gone or its pid was reused; or an earlier run of this same
  Slurm job, which Slurm requeued, e.g. after its node failed): taken over, with a warning;
- **from another host**: refused, since this host cannot see that process; the message names the
  file to remove when no trainer runs there any more (a node that died under a Slurm job).

A process killed with SIGKILL leaves its lock behind; the next start on the same host takes it
over. :meth:`RunDirLock.release` removes the lock only while it is this process's own.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("fastrl.checkpoint")

#: The lock file under the run directory.
LOCK_FILE = "trainer.lock"


class RunDirLocked(RuntimeError):
    """The run directory is held by another trainer (or by a lock this host cannot check)."""


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says about the process that holds it.

    Attributes:
        pid: the holder's process id.
        host: ``socket.gethostname()`` of the holder.
        started_at: when the holder took the lock, ISO 8601 UTC.
        proc_start: the process's start time from ``/proc/<pid>/stat`` (clock ticks since boot), or
            None where there is no ``/proc``; tells a reused pid from the holder.
        slurm_job_id: ``SLURM_JOB_ID`` of the holder, or None.
        slurm_restart_count: ``SLURM_RESTART_COUNT`` of the holder (how often Slurm requeued its
            job; None outside Slurm or before the first requeue).
        token: a random id of this lock (release removes only its own).
    """

    pid: int
    host: str
    started_at: str
    proc_start: str | None = None
    slurm_job_id: str | None = None
    slurm_restart_count: str | None = None
    token: str = ""

    def describe(self) -> str:
        """``pid 123 on host node1, started 2026-01-01T10:00:00+00:00 (Slurm job 42)``."""
        job = f" (Slurm job {self.slurm_job_id})" if self.slurm_job_id else ""
        return f"pid {self.pid} on host {self.host}, started {self.started_at}{job}"


def _proc_start(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (the process's start time), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def process_alive(holder: LockHolder) -> bool:
    """True when ``holder``'s process (on this host) still runs: its pid exists and, where
    ``/proc`` tells, started at the time the lock recorded."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    now = _proc_start(holder.pid)
    return holder.proc_start is None or now is None or now == holder.proc_start


def read_holder(path: Path) -> LockHolder | None:
    """The holder recorded in lock file ``path``; None when it is gone or unreadable (being written)."""
    try:
        data = json.loads(path.read_text())
        return LockHolder(
            pid=int(data["pid"]), host=str(data["host"]), started_at=str(data["started_at"]),
            proc_start=data.get("proc_start"), slurm_job_id=data.get("slurm_job_id"),
            slurm_restart_count=data.get("slurm_restart_count"), token=str(data.get("token", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RunDirLock:
    """The lock of run directory ``run_dir`` (``RUN_DIR/trainer.lock``).

    Usage::

        lock = RunDirLock(run_dir).acquire()   # raises RunDirLocked
        try:
            ...
        finally:
            lock.release()

    Args:
        run_dir: the run directory (created when missing).
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.holder: LockHolder | None = None

    def _me(self) -> LockHolder:
        return LockHolder(
            pid=os.getpid(), host=socket.gethostname(),
            started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            proc_start=_proc_start(os.getpid()), slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            slurm_restart_count=os.environ.get("SLURM_RESTART_COUNT"), token=uuid.uuid4().hex,
        )

    def acquire(self, *, unreadable_wait_s: float = 2.0) -> "RunDirLock":
        """Take the lock; returns ``self``.

        Raises:
            RunDirLocked: a live trainer on this host holds it; a trainer on another host holds it;
                or the lock file stays unreadable for ``unreadable_wait_s`` seconds.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        me = self._me()
        deadline = time.monotonic() + unreadable_wait_s
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = read_holder(self.path)
                if holder is None:
                    if not self.path.exists():
                        continue  # released meanwhile
                    if time.monotonic() < deadline:  # another process is writing it right now
                        time.sleep(0.1)
                        continue
                    raise RunDirLocked(
                        f"run directory {self.run_dir} is locked by {self.path}, which cannot be read; if no trainer "
                        f"runs on this run directory, remove it: rm {self.path}"
                    ) from None
                self._refuse_or_clear(holder, me)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(me.__dict__) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self.holder = me
            return self

    def _refuse_or_clear(self, holder: LockHolder, me: LockHolder) -> None:
        """Raise for a live or foreign holder; remove a stale lock (with a warning)."""
        requeued = (holder.slurm_job_id is not None and holder.slurm_job_id == me.slurm_job_id
                    and holder.slurm_restart_count != me.slurm_restart_count)  # Slurm ran this job again
        if not requeued and holder.host != me.host:
            raise RunDirLocked(
                f"run directory {self.run_dir} is in use by another trainer: {holder.describe()} ({self.path}); this "
                f"host ({me.host}) cannot check whether it still runs. If you are sure no trainer runs there, "
                f"remove the lock: rm {self.path}"
            )
        # On this host a live holder is refused even from an earlier run of this Slurm job (a requeued
        # stage beside the instance that still runs); only a requeue onto another host is trusted blindly.
        if holder.host == me.host and process_alive(holder):  # this very process too (same pid and start time)
            raise RunDirLocked(
                f"run directory {self.run_dir} is in use by another trainer: {holder.describe()} ({self.path}); "
                f"stop it first, or train into another directory (logging.output_dir / logging.run_name)"
            )
        # Stale: move it aside under a name of our own, and check it is the lock we judged (not one
        # a trainer started meanwhile took over); put such a lock back.
        aside = self.path.with_name(f".{LOCK_FILE}.stale-{me.pid}-{me.token[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        taken = read_holder(aside)
        if taken != holder:
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            raise RunDirLocked(
                f"run directory {self.run_dir} is in use by another trainer: "
                f"{taken.describe() if taken else 'unknown'} ({self.path}); it started while this one did"
            )
        aside.unlink(missing_ok=True)
        logger.warning(
            "removed the stale lock %s of %s: %s", self.path, holder.describe(),
            f"an earlier run of this Slurm job, which was requeued (on host {holder.host}, which this host cannot check)"
            if requeued and holder.host != me.host else "that process no longer runs (killed, or its node restarted)",
        )

    def release(self) -> None:
        """Remove the lock if this process holds it (a no-op otherwise)."""
        if self.holder is None:
            return
        if read_holder(self.path) == self.holder:
            self.path.unlink(missing_ok=True)
        self.holder = None

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
