"""Save-and-exit signal handling: the flag is set by USR1/TERM, the step in flight still finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fastrl.checkpoint.signals import StopRequest, parse_signal, trainer_signals

# A stand-in trainer loop: each "step" blocks until the parent writes a line, so the parent decides
# when a signal lands (mid-step) without any sleeps. After each step it polls the flag.
CHILD = textwrap.dedent(
    """
    import json, sys
    from fastrl.checkpoint.signals import StopRequest

    stop = StopRequest(sys.argv[1].split(",")).install()
    done = []
    for step in range(100):
        print(f"start {step}", flush=True)
        line = sys.stdin.readline()          # the step's work; a signal interrupts it, PEP 475 resumes
        done.append((step, line.strip()))
        if stop.requested:
            break
    with open(sys.argv[2], "w") as f:        # the "checkpoint"
        json.dump({"steps": done, "reason": stop.reason, "signals": stop.signal_count}, f)
    sys.exit(0)
    """
)


def _run_child(tmp_path, signals: str, send: signal.Signals, steps_before: int) -> tuple[int, dict]:
    out = tmp_path / "record.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, signals, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        for step in range(steps_before):
            assert proc.stdout.readline().strip() == f"start {step}"
            proc.stdin.write(f"work {step}\n")
            proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"start {steps_before}"
        proc.send_signal(send)  # lands while the step blocks in readline
        proc.stdin.write(f"work {steps_before}\n")
        proc.stdin.flush()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, json.loads(out.read_text())


@pytest.mark.parametrize(("signals", "send"), [
    ("USR1,TERM", signal.SIGUSR1), ("USR1,TERM", signal.SIGTERM), ("TERM", signal.SIGTERM), ("USR1,TERM,INT", signal.SIGINT),
])
def test_signal_mid_step_finishes_step_records_and_exits_zero(tmp_path, signals, send):
    rc, record = _run_child(tmp_path, signals, send, steps_before=2)
    assert rc == 0
    assert record == {
        "steps": [[0, "work 0"], [1, "work 1"], [2, "work 2"]],
        "reason": send.name,
        "signals": 1,
    }


def test_signal_not_in_the_list_keeps_its_default_action(tmp_path):
    out = tmp_path / "record.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "TERM", str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout.readline().strip() == "start 0"
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == -signal.SIGUSR1
    assert not out.exists()


def test_in_process_flag_reason_and_uninstall():
    previous = signal.getsignal(signal.SIGUSR1)
    with StopRequest(["USR1"]) as stop:
        assert not stop.requested and stop.reason is None and stop.as_int() == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.reason == "SIGUSR1" and stop.as_int() == 1
        assert stop.received_at is not None and stop.signal_count == 1
        os.kill(os.getpid(), signal.SIGUSR1)  # a second one: counted only
        assert stop.reason == "SIGUSR1" and stop.signal_count == 2
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_request_without_signal_keeps_first_reason():
    stop = StopRequest()
    stop.request("stage time budget")
    stop.request("other")
    assert stop.requested and stop.reason == "stage time budget" and stop.signal_count == 0


@pytest.mark.parametrize(("name", "expected"), [("USR1", signal.SIGUSR1), ("sigterm", signal.SIGTERM), (10, signal.SIGUSR1)])
def test_parse_signal(name, expected):
    assert parse_signal(name) is expected


def test_parse_signal_unknown_name():
    with pytest.raises(ValueError, match="unknown signal 'USR9'"):
        parse_signal("USR9")


def test_the_trainer_stops_on_ctrl_c():
    """catches: the trainer's stop signals without INT (Ctrl-C killed the run with a KeyboardInterrupt
    traceback, no checkpoint)."""
    assert {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT} <= set(StopRequest(trainer_signals("USR1")).signals)


def test_first_int_is_a_stop_request_and_a_second_exits_at_once(capfd):
    """catches: a second Ctrl-C only counted (no way to stop a run at once), or the first one raising."""
    previous = signal.getsignal(signal.SIGINT)
    with StopRequest(["USR1", "TERM", "INT"], notify=True) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.reason == "SIGINT"
        assert "stop requested (SIGINT)" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):  # the handler runs between bytecodes of this thread
                pass
    assert signal.getsignal(signal.SIGINT) == previous
