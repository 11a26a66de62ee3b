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


#: The start of a healthy tiny engine's log (vLLM 0.32 on CPU; abridged): two ERROR lines it recovers from.
_PARSE = "Error parsing config for /m/tokenizer: Unrecognized model in /m/tokenizer. Should have a `model_type` key in its config.json."
VLLM_START_UP = (
    "(MainProcess pid=26692) INFO 12-07 08:29:54 [model.py:733] Resolved architecture: Qwen2ForCausalLM\n"
    f"(MainProcess pid=26692) ERROR 12-07 08:29:54 [repo_utils.py:126] {_PARSE}, retrying 1 of 2\n"
    f"(MainProcess pid=26692) ERROR 12-07 08:29:56 [repo_utils.py:124] {_PARSE}\n"
    "(MainProcess pid=26692) INFO 12-07 08:30:03 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.14 s\n"
)
AFTER_READY = ("(MainProcess pid=26692) WARNING 12-07 08:30:05 [cpu_worker.py:140] CPU backend doesn't allow to use "
               "`torch.set_num_threads` after the thread binding, skip it.\n")


def test_benign_vllm_error_lines_are_not_quoted_as_the_cause():
    """Issue 45, item 7. catches: vLLM's recovered tokenizer-config ERROR lines quoted as a killed
    engine's cause ("error lines: ... [repo_utils.py:126] Error parsing config ...")."""
    excerpt = error_excerpt(VLLM_START_UP + AFTER_READY)
    assert excerpt.startswith("last lines (none names an error): ") and "Error parsing config" not in excerpt
    real = VLLM_START_UP + "(MainProcess pid=26692) ERROR 12-07 08:31:00 [core.py:9] EngineCore encountered a fatal error\n"
    assert error_excerpt(real) == "error lines: (MainProcess pid=26692) ERROR 12-07 08:31:00 [core.py:9] EngineCore encountered a fatal error"


def test_lines_before_the_engine_was_ready_are_not_the_cause_of_a_later_death(tmp_path):
    """Issue 45, item 7. catches: the excerpt of an engine killed after start-up (SIGKILL: nothing of
    its own in the log) reading its start-up lines, whose errors did not stop it from starting."""
    log = tmp_path / "engine.log"
    log.write_text(VLLM_START_UP.replace("[repo_utils.py", "[other.py").replace("Error parsing", "Failure parsing"))
    ready = log.stat().st_size
    assert log_error_excerpt(log).startswith("error lines: ")  # without the offset: the start-up errors
    assert log_error_excerpt(log, start=ready) == "<nothing logged since start-up>"
    with open(log, "a") as fh:
        fh.write(AFTER_READY + "Traceback (most recent call last):\n  f()\nRuntimeError: reload failed\n")
    assert log_error_excerpt(log, start=ready) == "error: RuntimeError: reload failed"
