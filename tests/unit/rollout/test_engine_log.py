"""The engine's death is reported with the error its log names, not its last line (issue 33, item 8)."""

from __future__ import annotations

import os

from fastrl.rollout.engine_log import error_excerpt, log_error_excerpt
from fastrl.rollout.refit_transport import owned_temp_dir, owner_tag, remove_stale_dirs

TRACEBACK_THEN_WARNING = """\
INFO 12-03 loading weights
Traceback (most recent call last):
  File "/x/engine_server.py", line 210, in load_weights_ipc
    args[6] = device
IndexError: tuple assignment index out of range
WARNING 12-03 [weight_utils.py] Some weights were not initialized from the checkpoint: lm_head.bias
"""


def test_the_exception_is_quoted_not_the_warning_after_it():
    # Breakage caught: quoting the last lines, whose final one is a harmless weight-loading warning
    # that reads like the cause.
    assert error_excerpt(TRACEBACK_THEN_WARNING) == "error: IndexError: tuple assignment index out of range"


def test_chained_tracebacks_give_the_last_exception():
    text = "Traceback (most recent call last):\n  f()\nKeyError: 'a'\n\nDuring handling...\n" \
           "Traceback (most recent call last):\n  g()\nRuntimeError: engine failed\n"
    assert error_excerpt(text) == "error: RuntimeError: engine failed"


def test_without_a_traceback_error_lines_then_last_lines():
    assert error_excerpt("ok\nCUDA error: out of memory\nbye\n") == "error lines: CUDA error: out of memory"
    assert error_excerpt("a\nb\nc\n") == "last lines (none names an error): a | b | c"
    assert error_excerpt("\n\n") == "<empty log>"
    assert error_excerpt("x" * 50 + "\nValueError: " + "y" * 1000, chars=40).endswith("y" * 10)
    assert len(error_excerpt("ValueError: " + "y" * 1000, chars=40)) == 40


def test_log_file_excerpt(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("x\n" * 20000 + TRACEBACK_THEN_WARNING)  # longer than the tail read
    assert log_error_excerpt(log).startswith("error: IndexError")
    assert log_error_excerpt(tmp_path / "missing.log") == f"<no log at {tmp_path / 'missing.log'}>"


def test_work_dirs_of_dead_trainers_are_removed(tmp_path):
    # Breakage caught: an engine work directory named without the trainer's pid (fastrl-engine-XXXX)
    # or never swept: each SIGKILLed trainer left one behind for good.
    machine = owner_tag().split("@")[1]
    for prefix in ("fastrl-refit", "fastrl-engine"):
        dead = tmp_path / f"{prefix}-999999999@{machine}-abc"
        dead.mkdir()
        (dead / "engine.log").write_text("x")
        alive = owned_temp_dir(prefix, tmp_path)
        assert alive.name.startswith(f"{prefix}-{os.getpid()}@{machine}-")
        # Breakage caught: a sweep by pid alone deleted a live engine's directory of another node
        # sharing TMPDIR, or of a container whose processes /proc here does not show
        other_host = tmp_path / f"{prefix}-999999999@0123456789-abc"
        other_host.mkdir()
        unowned = tmp_path / f"{prefix}-999999999-abc"  # an older version's name: nothing says whose
        unowned.mkdir()
        assert remove_stale_dirs(tmp_path, prefix) == [dead]
        assert not dead.exists() and alive.exists() and other_host.exists() and unowned.exists()
