"""Batch grading in worker processes (or threads) with a per-response time limit.

    with RewardScorer("geo3k", num_workers=4, timeout_s=10.0) as scorer:
        results = scorer.score(responses, ground_truths)    # list[RewardResult], input order
        metrics = scorer.last_stats.as_metrics()             # reward/num_invalid, ...

A response whose grader raises, exceeds ``timeout_s`` or kills its worker gets
``RewardResult.invalid(...)`` (``valid=False``, ``nan`` scores) and is counted in the stats; it is
never scored as wrong. The first error of each kind (:attr:`RewardResult.error_kind`) is logged
once per scorer as a warning (logger ``fastrl.rewards``), with its text; later ones are counted.
Timeouts are measured per response from the moment its worker starts on it.

Backends:
- ``"process"`` (default): worker processes, each a fresh interpreter running
  :mod:`fastrl.rewards.worker` (the trainer's main module is not re-imported there). A response
  past its time limit has its worker killed and replaced; no signals are used, so ``score`` works
  from any thread of the caller and a hung sympy call cannot block training.
- ``"thread"``: worker threads in this process, cheaper to start. A timed-out thread cannot be
  stopped: it is abandoned (daemon thread, keeps its CPU until the grader returns) and replaced.
  Use it for graders that cannot hang (``easy_vqa``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Literal

from fastrl.rewards.registry import is_custom_spec, load_reward
from fastrl.rewards.result import RewardResult

# The directory holding the ``fastrl`` package, so that worker interpreters import this copy.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

Backend = Literal["process", "thread"]
_MAX_CONSECUTIVE_START_FAILURES = 3
_MAX_LOGGED_ERROR_CHARS = 300

logger = logging.getLogger("fastrl.rewards")


@dataclass
class ScoreStats:
    """Counts of one :meth:`RewardScorer.score` call (or, summed, of the scorer's lifetime)."""

    num_scored: int = 0
    num_invalid: int = 0
    num_timeouts: int = 0
    num_errors: int = 0
    """Grader exceptions and worker crashes (invalid results that are not timeouts)."""
    num_worker_restarts: int = 0

    def add(self, other: "ScoreStats") -> None:
        """Add ``other``'s counts to this one in place."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """``{prefix + field: value}`` for logging."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in fields(self)}


class _Worker:
    """One grading worker: a child interpreter (``process``) or a daemon thread (``thread``)."""

    def __init__(self, backend: Backend, spec: str) -> None:
        self.started_at = time.monotonic()
        self.state = "starting"  # starting -> idle <-> busy
        self.items: deque[tuple[int, str, str]] = deque()
        self.deadline = math.inf
        self.process: subprocess.Popen | None = None
        parent_sock, child_sock = socket.socketpair()
        if backend == "process":
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fastrl.rewards.worker", str(child_sock.fileno()), spec],
                pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env,
            )
            child_sock.close()
        else:
            # Imported here, not at module level: ``python -m fastrl.rewards.worker`` imports the
            # package (and so this module) before it runs the worker as ``__main__``, and runpy
            # warns when the worker module is already in sys.modules by then.
            from fastrl.rewards.worker import serve

            child = Connection(child_sock.detach())
            threading.Thread(target=serve, args=(child, spec), daemon=True, name="reward-grader").start()
        self.conn = Connection(parent_sock.detach())

    def describe_exit(self) -> str:
        if self.process is not None:
            try:
                code = self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            return f"grading worker process exited (exit code {code})"
        return "grading worker thread exited"

    def kill(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=2.0)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        if self.process is not None:
            try:
                self.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class RewardScorer:
    """Grade batches of responses with a reward in ``num_workers`` workers.

    Args:
        name: reward name or ``path.py:function`` (see :func:`fastrl.rewards.get_reward`); resolved
            once here so that a bad spec fails at construction.
        num_workers: worker processes (or threads); started lazily on the first :meth:`score`.
        timeout_s: time limit per response, seconds.
        backend: ``"process"`` or ``"thread"`` (module docstring).
        startup_timeout_s: time a new worker may take to import the grader.
        chunk_size: responses sent to a worker at once (default: a batch split into about four
            chunks per worker, at most 16 responses).

    Raises:
        RewardSpecError: from :func:`~fastrl.rewards.registry.load_reward`.
        ValueError: non-positive ``num_workers``, a non-positive or non-finite ``timeout_s``, or an
            unknown backend.
    """

    def __init__(
        self,
        name: str,
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        backend: Backend = "process",
        startup_timeout_s: float = 120.0,
        chunk_size: int | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers ({num_workers}) must be >= 1")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s ({timeout_s}) must be a finite number > 0")
        if backend not in ("process", "thread"):
            raise ValueError(f"backend {backend!r} must be 'process' or 'thread'")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size ({chunk_size}) must be >= 1")
        load_reward(name)
        self.name = name
        if is_custom_spec(name):  # workers get an absolute path, whatever their working directory
            path, _, function = name.rpartition(":")
            self._worker_spec = f"{Path(path).expanduser().resolve()}:{function}"
        else:
            self._worker_spec = name
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.backend: Backend = backend
        self.startup_timeout_s = float(startup_timeout_s)
        self.chunk_size = chunk_size
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.last_stats = ScoreStats()
        self.total_stats = ScoreStats()
        self.first_errors: dict[str, str] = {}
        """Error kind -> the first error text of that kind (each logged once when first seen)."""

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers (idempotent)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _new_worker(self) -> _Worker:
        return _Worker(self.backend, self._worker_spec)

    def score(self, responses: Sequence[str], ground_truths: Sequence[str]) -> list[RewardResult]:
        """Grade ``responses[i]`` against ``ground_truths[i]``; results in input order.

        Safe to call from any thread (calls are serialized). Updates :attr:`last_stats` and
        :attr:`total_stats`.

        Raises:
            ValueError: the two sequences differ in length.
            TypeError: an element is not a ``str`` (naming its index).
            RuntimeError: workers cannot start (an import error in a custom reward, or
                ``startup_timeout_s`` exceeded).
        """
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        for kind, seq in (("response", responses), ("ground truth", ground_truths)):
            for i, value in enumerate(seq):
                if not isinstance(value, str):
                    raise TypeError(f"{kind} {i} is a {type(value).__name__}, not str")
        with self._lock:
            stats = ScoreStats()
            try:
                results = self._run(list(responses), list(ground_truths), stats) if responses else []
            except BaseException:
                self.close()  # workers may hold half-graded chunks: never reuse them
                raise
            stats.num_scored = len(results)
            stats.num_invalid = sum(not r.valid for r in results)
            stats.num_timeouts = sum(r.timed_out for r in results)
            stats.num_errors = stats.num_invalid - stats.num_timeouts
            self.last_stats = stats
            self.total_stats.add(stats)
            self._log_new_errors(results)
            return results

    def _log_new_errors(self, results: Sequence[RewardResult]) -> None:
        for r in results:
            kind = r.error_kind
            if kind is None or kind in self.first_errors:
                continue
            text = " ".join((r.error or "unknown error").split())
            if len(text) > _MAX_LOGGED_ERROR_CHARS:
                text = text[: _MAX_LOGGED_ERROR_CHARS - 3] + "..."
            self.first_errors[kind] = text
            logger.warning(
                "reward %r: invalid result (%s): %s  [the first of this kind; later ones are only counted]",
                self.name, kind, text,
            )

    def _run(self, responses: list[str], ground_truths: list[str], stats: ScoreStats) -> list[RewardResult]:
        n = len(responses)
        size = self.chunk_size or max(1, min(16, math.ceil(n / (4 * self.num_workers))))
        items = [(i, responses[i], ground_truths[i]) for i in range(n)]
        queue: deque[list[tuple[int, str, str]]] = deque(items[s : s + size] for s in range(0, n, size))
        results: list[RewardResult | None] = [None] * n
        remaining = n
        start_failures = 0
        while len(self._workers) < self.num_workers:
            self._workers.append(self._new_worker())

        def replace(worker: _Worker) -> None:
            worker.kill()
            self._workers[self._workers.index(worker)] = self._new_worker()
            stats.num_worker_restarts += 1

        def requeue(worker: _Worker) -> None:
            if worker.items:
                queue.appendleft(list(worker.items))
                worker.items.clear()

        while remaining:
            for worker in self._workers:
                if worker.state == "idle" and queue:
                    chunk = queue.popleft()
                    worker.items.extend(chunk)
                    worker.state = "busy"
                    worker.deadline = time.monotonic() + self.timeout_s
                    try:
                        worker.conn.send(chunk)
                    except OSError:  # died while idle: hand the chunk to a fresh worker
                        requeue(worker)
                        replace(worker)
            active = {w.conn: w for w in self._workers if w.state in ("starting", "busy")}
            now = time.monotonic()
            next_deadline = min(
                (w.deadline if w.state == "busy" else w.started_at + self.startup_timeout_s)
                for w in active.values()
            )
            ready = wait(list(active), timeout=max(0.0, next_deadline - now))
            for conn in ready:
                worker = active[conn]
                try:
                    while True:
                        message = conn.recv()
                        kind = message[0]
                        if kind == "ready":
                            worker.state = "idle"
                            start_failures = 0
                        elif kind == "init_error":
                            self.close()
                            raise RuntimeError(f"reward {self.name!r} failed to load in a grading worker: {message[1]}")
                        else:
                            _, index, result = message
                            head = worker.items.popleft()
                            if head[0] != index:
                                raise RuntimeError(f"grading worker answered for response {index}, expected {head[0]}")
                            results[index] = result
                            remaining -= 1
                            worker.deadline = time.monotonic() + self.timeout_s
                            if not worker.items:
                                worker.state = "idle"
                        if not conn.poll():
                            break
                except (EOFError, OSError):
                    reason = worker.describe_exit()
                    if worker.state == "starting":
                        start_failures += 1
                        if start_failures >= _MAX_CONSECUTIVE_START_FAILURES:
                            self.close()
                            raise RuntimeError(f"reward {self.name!r}: grading workers keep dying at start ({reason})")
                    elif worker.items:
                        index = worker.items.popleft()[0]
                        results[index] = RewardResult.invalid(reason)
                        remaining -= 1
                        requeue(worker)
                    replace(worker)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.state == "busy" and now > worker.deadline:
                    index = worker.items.popleft()[0]
                    results[index] = RewardResult.invalid(f"timeout after {self.timeout_s:g}s", timed_out=True)
                    remaining -= 1
                    requeue(worker)
                    replace(worker)
                elif worker.state == "starting" and now > worker.started_at + self.startup_timeout_s:
                    self.close()
                    raise RuntimeError(
                        f"reward {self.name!r}: a grading worker did not start within {self.startup_timeout_s:g}s"
                    )
        return results  # type: ignore[return-value]
