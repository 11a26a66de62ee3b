"""The grading worker loop, run in a thread or in a child process.

Child process entry point: ``python -m fastrl.rewards.worker FD SPEC`` where ``FD`` is an inherited
socket (a :class:`multiprocessing.connection.Connection`) and ``SPEC`` the reward name. A plain
child interpreter is used instead of ``multiprocessing``'s spawn so that the trainer's main module
(torch, megatron-core, ...) is not re-imported in every grading worker.

Protocol (pickled messages): worker -> parent ``("ready",)`` or ``("init_error", text)`` once, then
``("result", index, RewardResult)`` per response; parent -> worker a list of
``(index, response, ground_truth)`` per chunk, or ``None`` to stop.
"""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection

from fastrl.rewards.registry import RewardFn, is_custom_spec, load_reward
from fastrl.rewards.result import RewardResult


def grade_one(fn: RewardFn, response: str, ground_truth: str) -> RewardResult:
    """``fn(response, ground_truth)``; an exception becomes an invalid result naming it."""
    try:
        result = fn(response, ground_truth)
    except Exception as exc:  # noqa: BLE001 - any grader failure is reported, not raised
        return RewardResult.invalid(f"{type(exc).__name__}: {exc}")
    if not isinstance(result, RewardResult):
        return RewardResult.invalid(f"TypeError: reward returned {type(result).__name__}, not RewardResult")
    return result


def serve(conn: Connection, spec: str) -> None:
    """Load the reward, say ready, grade chunks until ``None`` or a closed connection."""
    try:
        fn = load_reward(spec)
        if not is_custom_spec(spec):
            # Import the grader's heavy dependencies (sympy, math-verify) before the first timed
            # response. Custom rewards are not called with made-up input.
            grade_one(fn, "<thinking>x</thinking> \\boxed{1}", "1")
        conn.send(("ready",))
    except Exception as exc:  # noqa: BLE001
        try:
            conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        return
    try:
        while True:
            chunk = conn.recv()
            if chunk is None:
                return
            for index, response, ground_truth in chunk:
                conn.send(("result", index, grade_one(fn, response, ground_truth)))
    except (EOFError, OSError):
        return  # the scorer closed or abandoned this worker


def main(argv: list[str] | None = None) -> None:
    """Child process entry point (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m fastrl.rewards.worker FD SPEC")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the trainer, not by graders
    conn = Connection(int(args[0]))
    try:
        serve(conn, args[1])
    finally:
        conn.close()


if __name__ == "__main__":
    main()
