"""An exclusive lock on a cache entry, shared by the processes that may build it at once."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created, with its folder, if missing) for the
    block: parallel test workers or ranks that need the same cache entry build it once, the others
    wait and then reuse it. The lock file is left in place (removing it would race a waiter)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
