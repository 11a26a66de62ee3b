"""``python -m fastrl.train`` without paying its imports in every test.

A fresh trainer process spends about half of a tiny two-step run importing torch, megatron-core,
megatron-bridge, transformers and torch.distributed.checkpoint. :func:`run_trainer` instead forks
the trainer from a multiprocessing forkserver that imported them once (per pytest worker): each run
still gets its own process (its own state, environment, working directory, file descriptors 1 and 2
and exit code), started from a process that has imported modules and run nothing else.

Only for runs that need nothing but an exit code and the output: tests that signal the trainer,
start it under torchrun or Slurm, or time its start-up use ``subprocess`` as before.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

#: What the forkserver imports before it forks anything (the trainer's own imports, by
#: ``fastrl.training.run`` and what the trainer pulls in at start-up).
PRELOAD = [
    "torch", "torch.distributed.checkpoint", "transformers", "megatron.core", "megatron.bridge",
    "fastrl.train", "fastrl.training.run", "fastrl.training.trainer",
]

_context: multiprocessing.context.ForkServerContext | None = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _child(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked trainer: its own cwd, environment and fds 1/2; exits with ``main``'s code."""
    code = 1
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.argv = ["fastrl.train", *argv]
        from fastrl.train import main

        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse, or an explicit sys.exit in the trainer
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import atexit

        atexit._run_exitfuncs()  # what interpreter shutdown would run (log handlers, temp dirs)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def run_trainer(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess:
    """``python -m fastrl.train *argv`` in a forked child; returns its exit code and output.

    Raises:
        subprocess.TimeoutExpired: the child ran past ``timeout`` seconds (it is killed first).
    """
    ctx = _forkserver()
    with tempfile.TemporaryDirectory(prefix="fastrl-fork-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = ctx.Process(target=_child, args=(list(argv), dict(env), str(cwd), str(out), str(err)))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["fastrl.train", *argv], timeout, out.read_bytes(), err.read_bytes())
        stdout = out.read_text(encoding="utf-8", errors="replace") if out.exists() else ""
        stderr = err.read_text(encoding="utf-8", errors="replace") if err.exists() else ""
    return subprocess.CompletedProcess(["fastrl.train", *argv], proc.exitcode, stdout, stderr)
