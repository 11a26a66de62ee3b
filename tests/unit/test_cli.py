"""Command line: dotted overrides are type-checked; unknown keys name the closest key."""

import subprocess
import sys

import pytest

from fastrl.cli import apply_overrides
from fastrl.config import ConfigError, RunConfig
from fastrl.train import main


def test_overrides_are_typed():
    config = apply_overrides(
        RunConfig(),
        ["rollout.n=4", "optimizer.lr=3e-5", "pruning.method=cppo", "checkpoint.dir=/tmp/x",
         "trainer.max_steps=none", "logging.tensorboard=false", "algorithm.dual_clip_c=null"],
    )
    assert config.rollout.n == 4 and isinstance(config.rollout.n, int)
    assert config.optimizer.lr == pytest.approx(3e-5)
    assert config.pruning.method == "cppo"
    assert config.checkpoint.dir == "/tmp/x"
    assert config.trainer.max_steps is None
    assert config.logging.tensorboard is False
    assert config.algorithm.dual_clip_c is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.clip_hihg=0.3", "did you mean 'algorithm.clip_high'"),
        ("rollout.n=four", "rollout.n='four' is not an integer"),
        ("rollout.n=2.5", "is not an integer"),
        ("pruning.method=magic", "pruning.method='magic' is not one of"),
        ("logging.tensorboard=maybe", "is not a boolean"),
        ("rollout.temperature", "not of the form key.path=value"),
        ("rollout.n=1", "needs at least 2 responses"),
        # a validation question past easy-vqa's 2,000 would be one of the held-out test questions
        ("data.val_size=2001", "easy_vqa's validation split holds 2000 questions"),
        ("data.test_size=-1", "data.test_size must be >= 0"),
        ("trainer.test_every=10", "trainer.test_every=10 evaluates the held-out test split, but data.test_size is 0"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        apply_overrides(RunConfig(), [override])


def test_test_split_of_a_file_dataset_needs_its_path():
    base = apply_overrides(RunConfig(), ["data.dataset=math", "data.train_path=t.jsonl", "data.val_path=v.jsonl"])
    with pytest.raises(ConfigError, match=r"data\.test_size=8 needs data\.test_path \(dataset 'math'\)"):
        apply_overrides(base, ["data.test_size=8"])
    assert apply_overrides(base, ["data.test_size=8", "data.test_path=h.jsonl"]).data.test_size == 8


def test_main_dry_run_prints_resolved_config(capsys):
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "rollout.n=6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"recipe": "easyvqa_tiny_fastrl_grpo_cpu"' in out
    assert '"n": 6' in out


def test_cli_wrong_override_exits_nonzero_with_closest_key():
    proc = subprocess.run(
        [sys.executable, "-m", "fastrl.train", "--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "algorithm.clip_hihg=0.3"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "algorithm.clip_high" in proc.stderr


def test_describe_lists_every_key(capsys):
    assert main(["--describe"]) == 0
    out = capsys.readouterr().out
    assert "pruning.similarity_threshold = 0.2" in out
    assert "Jaccard similarity threshold" in out


def test_dry_run_refuses_config_holes(capsys):
    # parallel.world_size=0 was a ZeroDivisionError; a micro-batch that divides the mini-batch at no
    # world size passed --dry-run when parallel.world_size was not set.
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "parallel.world_size=0", "--dry-run"]) == 2
    assert "fastrl.train: config error: parallel.world_size must be >= 1" in capsys.readouterr().err
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "parallel.micro_batch_size=48", "--dry-run"]) == 2
    assert "parallel.micro_batch_size (48)" in capsys.readouterr().err
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "reward.name=no_such_reward", "--dry-run"]) == 2
    assert "reward.name='no_such_reward': unknown reward" in capsys.readouterr().err


def test_fp8_recipe_plans_anywhere_and_trains_only_with_transformer_engine(capsys, monkeypatch):
    # The memory timeline of an FP8 GPU recipe is printed on a machine without Transformer Engine
    # (with a line saying training here is refused); training it here stops before anything starts.
    # Breakage caught: the check back in the config (no --dry-run plan for 28 shipped recipes), or
    # no check at all (FP8 accepted, failing only when the first TE layer is built).
    import fastrl.config.model as config_model

    monkeypatch.setattr(config_model, "transformer_engine_available", lambda: False)
    recipe = "qwen25vl_7b_fastrl_grpo_geo3k_h100_fp8"
    assert main(["--recipe", recipe, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"mode": "fp8"' in out and "# memory plan" in out and "fits" in out
    assert "# not trainable on this machine: precision.mode='fp8' needs NVIDIA Transformer Engine" in out

    def no_training(config):  # pragma: no cover - reached only when the check is missing
        raise AssertionError("training started")

    monkeypatch.setattr("fastrl.training.run.run", no_training)
    assert main(["--recipe", recipe]) == 2
    assert "fastrl.train: config error: precision.mode='fp8' needs NVIDIA Transformer Engine" in capsys.readouterr().err


@pytest.mark.parametrize("debug", [False, True])
def test_error_after_start_up_is_one_line_and_names_the_log(tmp_path, monkeypatch, capsys, debug):
    import fastrl.training.run as training_run

    def failing_run(config):
        raise RuntimeError("grader exploded\n  while grading step 3")

    monkeypatch.setattr(training_run, "run", failing_run)
    argv = ["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", f"logging.output_dir={tmp_path}", "logging.run_name=r"]
    assert main(argv + (["--debug"] if debug else [])) == 1
    err = capsys.readouterr().err
    log = tmp_path / "r" / "train.log"
    assert "fastrl.train: error: RuntimeError: grader exploded while grading step 3\n" in err
    assert f"fastrl.train: the full log with the traceback: {log}" in err
    assert ("Traceback (most recent call last)" in err) == debug
    assert ("--debug prints the traceback here" in err) == (not debug)
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: grader exploded" in text


class _LibraryAbort(BaseException):
    """Like torch.distributed.checkpoint's CheckpointException: a BaseException, not an Exception."""


def test_a_library_base_exception_after_start_up_is_one_line_too(tmp_path, monkeypatch, capsys):
    """catches: the one-line handler catching Exception only (a full disk during a save printed
    torch's CheckpointException as a 60-line traceback per rank, and train.log lacked it)."""
    import fastrl.training.run as training_run

    def failing_run(config):
        raise _LibraryAbort("CheckpointException ranks:dict_keys([0])\nOSError: [Errno 28] No space left on device")

    monkeypatch.setattr(training_run, "run", failing_run)
    argv = ["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", f"logging.output_dir={tmp_path}", "logging.run_name=r"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "fastrl.train: error: _LibraryAbort: CheckpointException ranks:dict_keys([0]) OSError: [Errno 28] No space left on device"
    )
    assert "Traceback" not in err and len(err.splitlines()) == 2
    assert "_LibraryAbort: CheckpointException" in (tmp_path / "r" / "train.log").read_text()


def test_an_interrupt_is_one_line_exit_130_and_system_exit_passes(tmp_path, monkeypatch, capsys):
    """catches: a second Ctrl-C's KeyboardInterrupt reported as an error (exit 1), or SystemExit swallowed."""
    import fastrl.training.run as training_run

    argv = ["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", f"logging.output_dir={tmp_path}", "logging.run_name=r"]
    monkeypatch.setattr(training_run, "run", lambda config: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "fastrl.train: interrupted (Ctrl-C): exited at once, without saving a checkpoint" in err and "Traceback" not in err
    monkeypatch.setattr(training_run, "run", lambda config: (_ for _ in ()).throw(SystemExit(3)))
    with pytest.raises(SystemExit):
        main(argv)
