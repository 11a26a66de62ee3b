"""Checkpoint directories: atomic publication, a ``latest`` marker written last, retention.

Layout under the checkpoint root::

    step_00000010/            a complete checkpoint (its files + COMPLETE marker)
    step_00000020/
    .tmp-step_00000030/       being written (never loaded)
    latest                    text file: "step_00000020", written last, atomically

A checkpoint becomes visible only by the atomic rename of its temporary directory, after its
``COMPLETE`` marker (JSON with the step and a list of files with their sizes) was written inside.
Loading verifies the marker and every file's size, so a directory without a complete marker — a
stage killed mid-save, a copy cut short — is never loaded. ``latest`` is a hint; when it is
missing or stale the newest complete directory wins.

The manager does no collective communication: in a multi-process run, rank 0 calls
:meth:`publish` after every rank finished writing into the temporary directory (the caller
barriers), and every rank calls :meth:`find_latest` / :meth:`verify`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fastrl.checkpoint.layout import BEST_FILE, COMPLETE_MARKER, LATEST_FILE, step_dir_name
from fastrl.checkpoint.layout import STEP_DIR as _STEP_DIR


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (incomplete, truncated, corrupted, incompatible)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint directory and its step."""

    path: Path
    step: int


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove_all(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _list_files(root: Path) -> dict[str, int]:
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != COMPLETE_MARKER:
            files[str(p.relative_to(root))] = p.stat().st_size
    return files


class CheckpointManager:
    """Writes, publishes, finds and prunes checkpoints under ``root``.

    Args:
        root: checkpoint directory (created when missing).
        keep_last: complete checkpoints kept; older ones are deleted after a publish. The one
            recorded as best (:meth:`mark_best`) and those published with ``keep=True`` (their
            marker says ``"keep": true``: grid checkpoints for evaluation after training) are kept
            in addition.
        background_delete: delete in a (non-daemon) thread: a directory to delete is first renamed
            to a ``.del-`` name (atomic; from then on it is no checkpoint and no staging directory),
            then removed while the caller goes on. The trainer's rank 0 uses it so that the other
            ranks, waiting at the save's barrier, never wait for a large delete on shared storage
            (a 72B checkpoint with its optimizer state is about 1 TB). A process that ends waits for
            the thread; one that is killed leaves ``.del-`` directories, removed by the next publish.
    """

    def __init__(self, root: str | os.PathLike, *, keep_last: int = 2, background_delete: bool = False) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.background_delete = background_delete
        self._deleters: list[threading.Thread] = []

    # ---- writing ---------------------------------------------------------------------------

    def staging_dir(self, step: int) -> Path:
        """A fresh temporary directory to write the checkpoint of ``step`` into."""
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        if tmp.exists():
            self._delete([tmp])
        tmp.mkdir(parents=True)
        return tmp

    def publish(self, step: int, staging: Path, *, extra: dict | None = None, keep: bool = False) -> CheckpointInfo:
        """Seal ``staging`` with its marker, rename it into place, then update ``latest``.

        A checkpoint of the same step that already exists is replaced (the new one is complete
        before the old one is removed); it stays kept for good when the replaced one was.
        ``keep``: never delete it in retention (marker ``"keep": true``).
        """
        final = self.root / step_dir_name(step)
        keep = keep or (self.is_complete(final) and self.verify(final).get("keep") is True)
        self._seal_and_swap(final, staging, {"step": step, **(extra or {}), **({"keep": True} if keep else {})})
        _atomic_write_text(self.root / LATEST_FILE, final.name + "\n")
        self._retain()
        return CheckpointInfo(final, step)

    def rewrite(self, step: int, staging: Path, marker: dict) -> CheckpointInfo:
        """Replace the complete checkpoint of ``step`` by ``staging``, a rewritten copy of it (e.g.
        without its optimizer state), sealed with ``marker`` (its ``files`` listed anew). Unlike
        :meth:`publish`, ``latest``, ``best`` and retention are left as they are.

        Raises:
            CheckpointError: there is no complete checkpoint of ``step`` to replace.
        """
        final = self.root / step_dir_name(step)
        self.verify(final)
        self._seal_and_swap(final, staging, {**marker, "step": step})
        return CheckpointInfo(final, step)

    def _seal_and_swap(self, final: Path, staging: Path, marker: dict) -> None:
        """Write ``staging``'s marker (``marker`` + its files), then rename it to ``final``. An existing
        ``final`` is first renamed to ``.old-<name>`` and deleted after: the new one is complete
        before the old one is removed."""
        _atomic_write_text(staging / COMPLETE_MARKER, json.dumps({**marker, "files": _list_files(staging)}, indent=1))
        if final.exists():
            old = self.root / f".old-{final.name}"
            if old.exists():
                self._delete([old])
            os.replace(final, old)
            os.replace(staging, final)
            self._delete([old])
        else:
            os.replace(staging, final)
        _fsync_dir(self.root)

    def mark_best(self, step: int) -> None:
        """Record ``step`` as the best checkpoint (kept by retention)."""
        _atomic_write_text(self.root / BEST_FILE, step_dir_name(step) + "\n")

    def best(self) -> CheckpointInfo | None:
        """The checkpoint recorded as best, if it is complete."""
        path = self.root / BEST_FILE
        if not path.exists():
            return None
        name = path.read_text().strip()
        match = _STEP_DIR.match(name)
        if not match or not self.is_complete(self.root / name):
            return None
        return CheckpointInfo(self.root / name, int(match.group(1)))

    # ---- reading ---------------------------------------------------------------------------

    @staticmethod
    def is_complete(path: Path) -> bool:
        """True when ``path`` holds a marker whose listed files all exist with their sizes."""
        try:
            CheckpointManager.verify(path)
        except CheckpointError:
            return False
        return True

    @staticmethod
    def verify(path: str | os.PathLike) -> dict:
        """Check a checkpoint directory against its marker; return the marker.

        Raises:
            CheckpointError: no marker (incomplete), unreadable marker, or a listed file that is
                missing or has another size (truncated or corrupted copy).
        """
        path = Path(path)
        marker_path = path / COMPLETE_MARKER
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
        if not marker_path.exists():
            raise CheckpointError(
                f"checkpoint {path} has no {COMPLETE_MARKER} marker: it was never completely written "
                f"(a save interrupted by a kill or preemption) and cannot be loaded; checkpoint.resume=auto "
                f"skips incomplete checkpoints and resumes from the newest complete one"
            )
        try:
            marker = json.loads(marker_path.read_text())
            files = marker["files"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"checkpoint {path}: unreadable {COMPLETE_MARKER} marker ({err})") from None
        for rel, size in files.items():
            f = path / rel
            if not f.exists():
                raise CheckpointError(f"checkpoint {path}: file {rel} listed in the marker is missing")
            if f.stat().st_size != size:
                raise CheckpointError(
                    f"checkpoint {path}: file {rel} has {f.stat().st_size} bytes, the marker says {size} "
                    f"(truncated or corrupted copy)"
                )
        return marker

    def complete_checkpoints(self) -> list[CheckpointInfo]:
        """Every complete checkpoint, oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            match = _STEP_DIR.match(p.name)
            if match and p.is_dir() and self.is_complete(p):
                out.append(CheckpointInfo(p, int(match.group(1))))
        return sorted(out, key=lambda c: c.step)

    def damaged_after(self, step: int) -> list[tuple[Path, str]]:
        """The step directories newer than ``step`` that are not complete (truncated, cut-short copies,
        a save killed after its rename), oldest first, each with the reason
        (:meth:`verify`'s message). Staging (``.tmp-``) directories are not listed."""
        if not self.root.is_dir():
            return []
        out = []
        for p in sorted(self.root.iterdir()):
            match = _STEP_DIR.match(p.name)
            if match and int(match.group(1)) > step:
                try:
                    self.verify(p)
                except CheckpointError as err:
                    out.append((p, str(err)))
        return out

    def kept_for_good(self) -> list[CheckpointInfo]:
        """The complete checkpoints published with ``keep=True``, oldest first."""
        return [c for c in self.complete_checkpoints() if self.verify(c.path).get("keep") is True]

    def find_latest(self) -> CheckpointInfo | None:
        """The newest complete checkpoint (``latest`` if it names a complete one and nothing newer exists)."""
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def checkpoint_bytes(self, info: CheckpointInfo) -> int:
        """Bytes of a complete checkpoint's files, as its ``COMPLETE`` marker lists them."""
        marker = json.loads((info.path / COMPLETE_MARKER).read_text())
        return sum(int(size) for size in marker.get("files", {}).values())

    def free_bytes(self) -> int:
        """Bytes free on the filesystem of the checkpoint root, as ``shutil.disk_usage`` (statvfs)
        reports them: a user or project quota (Lustre, GPFS) can allow less."""
        self.root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.root).free

    def make_room(self) -> None:
        """Finish the background deletions, apply retention now (``keep_last``, the checkpoints
        kept for good and the best stay; stale ``.tmp-`` / ``.old-`` / ``.del-`` folders go) and
        wait for it: what the next save's publication would delete, deleted before the save."""
        self.wait_for_deletions()
        self._retain()
        self.wait_for_deletions()

    # ---- retention -------------------------------------------------------------------------

    def _retain(self) -> None:
        complete = self.complete_checkpoints()
        best = self.best()
        keep = {c.path for c in complete[-self.keep_last :]} | {c.path for c in self.kept_for_good()}
        if best is not None:
            keep.add(best.path)
        self._delete([c.path for c in complete if c.path not in keep] + list(self._stale_temporaries()))

    def _stale_temporaries(self) -> Iterable[Path]:
        for p in self.root.iterdir():
            if p.name.startswith((".tmp-", ".old-", ".del-")) and p.is_dir():
                yield p

    def _delete(self, paths: list[Path]) -> None:
        """Remove directories: each renamed to a ``.del-`` name first, then removed, here or in a
        background thread (``background_delete``)."""
        doomed = []
        for p in paths:
            target = p if p.name.startswith(".del-") else self.root / f".del-{p.name.lstrip('.')}-{time.time_ns()}"
            try:
                if target != p:
                    os.replace(p, target)
            except FileNotFoundError:
                continue
            doomed.append(target)
        if not doomed:
            return
        if self.background_delete:
            self._deleters = [t for t in self._deleters if t.is_alive()]
            thread = threading.Thread(target=_remove_all, args=(doomed,), name="checkpoint-delete", daemon=False)
            thread.start()
            self._deleters.append(thread)
        else:
            _remove_all(doomed)

    def wait_for_deletions(self) -> None:
        """Block until the background deletions started so far are done."""
        for thread in self._deleters:
            thread.join()
        self._deleters = []
