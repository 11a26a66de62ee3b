"""slurm/train.sbatch and slurm/submit.sh on the local Slurm cluster, with the real entry point.

These cover the scripts' own behaviour (variables to overrides, FINISHED marker, stage chaining
and cancellation of later stages when one fails, no double submission); training across chained
stages and preemption are covered by the trainer's tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "slurm" / "train.sbatch")
SUBMIT = str(REPO / "slurm" / "submit.sh")
RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"


# submit.sh runs the recipe's --dry-run with `python` (FASTRL_VENV unset): this interpreter's
DRY_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
DRY_ENV.pop("FASTRL_VENV", None)


def _submitted(out) -> list[tuple[str, str]]:
    """(job id, log path) per stage line printed by submit.sh."""
    return re.findall(r"^stage \d+/\d+: job (\d+).*?log (\S+)$", out.stdout, flags=re.M)


def test_train_sbatch_runs_entry_point_on_every_task_with_overrides(slurm, tmp_path):
    run_dir = tmp_path / "runs" / "demo"
    env = {"FASTRL_RECIPE": RECIPE, "FASTRL_RUN_DIR": str(run_dir), "FASTRL_STAGE_STEPS": "7",
           "FASTRL_OVERRIDES": "rollout.n=4 optimizer.lr=3e-05"}
    log = tmp_path / "stage.out"
    out = slurm.run(["sbatch", "--parsable", "-n", "2", f"--output={log}", TRAIN, "--dry-run", "trainer.seed=5"], env=env)
    assert out.returncode == 0, out.stderr
    info = slurm.wait_job(out.stdout.strip().split(";")[0])
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text
    # Two tasks (srun --mpi=pmix), each printed the resolved config with every override applied.
    assert text.count(f"# recipe: {RECIPE}") == 2, text
    for line in ('"n": 4,', '"lr": 3e-05,', '"max_steps": 7,', '"seed": 5,', '"run_name": "demo",', f'"output_dir": "{run_dir.parent}",'):
        assert text.count(line) == 2, f"{line!r} not printed by both tasks:\n{text}"
    assert "step finished with exit code 0" in text
    # NCCL's NVLS buffers (not in the memory plan's reserve) are off unless asked for; catches: the
    # job starting NCCL with NVLS on by default (its buffers unmeasured beside the plan's margins)
    assert "NCCL_NVLS_ENABLE=0 (1: NVLS buffers" in text


def test_train_sbatch_torchrun_mode_starts_one_agent_per_node(slurm, tmp_path):
    # One task on the node runs torchrun, which starts FASTRL_NPROC_PER_NODE=2 trainer processes.
    log = tmp_path / "stage.out"
    env = {"FASTRL_RECIPE": RECIPE, "FASTRL_RUN_DIR": str(tmp_path / "tr"), "FASTRL_LAUNCH": "torchrun",
           "FASTRL_NPROC_PER_NODE": "2", "FASTRL_RDZV_PORT": str(_free_port())}
    out = slurm.run(["sbatch", "--parsable", "-N", "1", "--ntasks-per-node=1", "-c", "2", f"--output={log}", TRAIN, "--dry-run"], env=env)
    info = slurm.wait_job(out.stdout.strip().split(";")[0], timeout=120)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED", text
    assert text.count(f"# recipe: {RECIPE}") == 2, text


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_train_sbatch_exits_at_once_when_run_is_finished(slurm, tmp_path):
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "FINISHED").write_text('{"step": 120}\n')
    log = tmp_path / "stage.out"
    env = {"FASTRL_RECIPE": RECIPE, "FASTRL_RUN_DIR": str(run_dir)}
    out = slurm.run(["sbatch", "--parsable", "-n", "2", f"--output={log}", TRAIN, "--dry-run"], env=env)
    info = slurm.wait_job(out.stdout.strip().split(";")[0])
    text = log.read_text()
    assert info["JobState"] == "COMPLETED", text
    assert "training is complete; nothing to do" in text
    assert "# recipe:" not in text  # the trainer was not started


def test_train_sbatch_refuses_missing_recipe(slurm, tmp_path):
    log = tmp_path / "stage.out"
    out = slurm.run(["sbatch", "--parsable", "-n", "1", f"--output={log}", TRAIN], env={"FASTRL_RUN_DIR": str(tmp_path)})
    info = slurm.wait_job(out.stdout.strip().split(";")[0])
    assert info["JobState"] == "FAILED"
    assert "set FASTRL_RECIPE to a recipe name" in log.read_text()


def test_submit_chains_stages_and_cancels_the_rest_when_one_fails(slurm, tmp_path):
    # A checkpoint to resume from that does not exist passes the config (and submit.sh's dry run)
    # and fails at start-up: stage 1 fails, stages 2 and 3 must be cancelled by Slurm
    # (--kill-on-invalid-dep=yes) instead of pending forever.
    run_dir = tmp_path / "chain"
    out = slurm.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(run_dir), "--stages", "3", "--grace", "60",
                     f"checkpoint.resume={tmp_path / 'no-such-checkpoint'}", "--", "-n", "2"])
    assert out.returncode == 0, out.stderr
    jobs = _submitted(out)
    assert len(jobs) == 3, out.stdout
    (first, first_log), (second, _), (third, _) = jobs
    assert slurm.job(second)["Dependency"] in (f"afterok:{first}(unfulfilled)", f"afterok:{first}(failed)", "(null)")
    assert slurm.job(third)["Dependency"] in (f"afterok:{second}(unfulfilled)", f"afterok:{second}(failed)", "(null)")
    assert slurm.wait_job(first)["JobState"] == "FAILED"
    for job in (second, third):
        info = slurm.wait_job(job)
        assert info["JobState"] == "CANCELLED" and info["Reason"] == "DependencyNeverSatisfied", info
    assert first_log == str(run_dir / "logs" / f"stage1-{first}.out")
    assert "CheckpointError" in Path(first_log).read_text()
    assert (run_dir / "logs" / "jobs.txt").read_text().count(" submitted ") == 3
    assert "watch: squeue --name=fastrl-chain" in out.stdout


def test_submit_options_reach_the_jobs(slurm, tmp_path):
    run_dir = tmp_path / "held"
    out = slurm.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(run_dir), "--stages", "2", "--grace", "90",
                     "--", "-n", "2", "--hold", "--time=00:10:00"])
    assert out.returncode == 0, out.stderr
    (first, _), (second, _) = _submitted(out)
    try:
        info = slurm.job(first)
        assert info["JobName"] == "fastrl-held" and info["NumTasks"] == "2" and info["TimeLimit"] == "00:10:00"
        assert info["Comment"] == f"fastrl-run:{run_dir}"
        assert info["KillOInInvalidDependent"] == "Yes"  # Slurm 22.05 spells it this way
        assert info["StdOut"] == str(run_dir / "logs" / f"stage1-{first}.out")
        assert slurm.job(second)["Dependency"].startswith(f"afterok:{first}")
        # The run still has jobs in the queue: submitting again submits nothing.
        again = slurm.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(run_dir), "--stages", "2", "--", "-n", "2"])
        assert again.returncode == 0
        assert f"already has jobs in the queue ({first},{second})" in again.stdout
        assert _submitted(again) == []
    finally:
        slurm.run(["scancel", first, second])


def test_submit_finished_run_is_a_no_op(slurm, tmp_path):
    run_dir = tmp_path / "finished"
    run_dir.mkdir()
    (run_dir / "FINISHED").write_text('{"step": 300}')
    out = slurm.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(run_dir), "--stages", "3"])
    assert out.returncode == 0
    assert f"run {run_dir} is already finished" in out.stdout and "nothing submitted" in out.stdout
    assert _submitted(out) == []
    assert not (run_dir / "logs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-dir", "x"], "--recipe is required"),
        (["--recipe", RECIPE], "--run-dir is required"),
        (["--recipe", RECIPE, "--run-dir", "x", "--stages", "0"], "--stages must be a positive integer, got '0'"),
        (["--recipe", RECIPE, "--run-dir", "x", "--launch", "ssh"], "--launch must be mpi or torchrun, got 'ssh'"),
        (["--recipe", RECIPE, "--run-dir", "x", "stray"], "unknown argument 'stray'"),
        (["--recipe", RECIPE, "--run-dir", "x", "--nodes=2"], "unknown option '--nodes=2' (sbatch options go after --)"),
    ],
)
def test_submit_refuses_bad_arguments(slurm, args, message, tmp_path):
    out = slurm.run([SUBMIT, *args], cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr


def test_submit_dry_run_prints_the_chain(tmp_path):
    out = subprocess.run(
        [SUBMIT, "--recipe", RECIPE, "--run-dir", str(tmp_path / "r"), "--stages", "3", "--stage-steps", "5",
         "--grace", "120", "--dry-run", "rollout.n=8", "--", "--nodes=2", "--time=01:00:00"],
        capture_output=True, text=True, timeout=60, env=DRY_ENV,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    run_dir = tmp_path / "r"
    for k, line in enumerate(lines, start=1):
        assert line.startswith(f"FASTRL_RECIPE={RECIPE} FASTRL_RUN_DIR={run_dir} FASTRL_LAUNCH=mpi FASTRL_STAGE_STEPS=5 ")
        assert f"FASTRL_STAGE={k} sbatch --parsable --job-name=fastrl-r " in line
        assert f"--output={run_dir}/logs/stage{k}-%j.out --signal=B:USR1@120 --kill-on-invalid-dep=yes" in line
        assert line.endswith(f"--nodes=2 --time=01:00:00 {TRAIN} rollout.n=8")
        assert ("--dependency=afterok:<stage%d>" % (k - 1) in line) == (k > 1)
    assert not run_dir.exists()  # nothing created, nothing submitted


def test_submit_derives_the_grace_from_the_recipe_and_refuses_a_shorter_one(tmp_path):
    """The 7B recipe's stop needs 900 s (its --dry-run: one step, a validation, a 116 GB save):
    submit.sh asks Slurm for the stop signal 900 s before the time limit when --grace is not given,
    refuses --grace 300 naming the estimate, and keeps 300 s for a recipe without a memory plan.

    catches: the old fixed default (--signal=B:USR1@300 for 7B: a stage killed mid-save), or a
    --grace below the estimate accepted."""
    r7b = "qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"
    args = [SUBMIT, "--recipe", r7b, "--run-dir", str(tmp_path / "r"), "--dry-run"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=DRY_ENV)
    assert out.returncode == 0, out.stderr
    assert "--signal=B:USR1@900 " in out.stdout and "stop grace: >= 900 s" in out.stderr
    short = subprocess.run([*args, "--grace", "300"], capture_output=True, text=True, timeout=120, env=DRY_ENV)
    assert short.returncode == 2
    assert "--grace 300 s is shorter than a stop of this recipe needs: stop grace: >= 900 s" in short.stderr
    assert "pass --grace 900 or more" in short.stderr
    cpu = subprocess.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(tmp_path / "c"), "--dry-run"],
                         capture_output=True, text=True, timeout=120, env=DRY_ENV)
    assert cpu.returncode == 0 and "--signal=B:USR1@300 " in cpu.stdout and "no estimate" in cpu.stderr


def test_convert_sbatch_refuses_a_cluster_without_pmix_before_any_task(tmp_path):
    """slurm/convert.sbatch checks, as train.sbatch does, that srun offers PMIx before it starts
    its tasks, and says so in one line (a fake `srun` whose plugin list has no pmix).

    catches: the conversion launched with `srun --mpi=pmix` on such a cluster (the earlier script:
    each task then fails in mpi4py's bootstrap with no word on the cause)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text("#!/bin/bash\nif [ \"$1\" = --mpi=list ]; then printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'; fi\nexit 0\n")
    fake.chmod(0o755)
    env = {**DRY_ENV, "PATH": f"{bin_dir}{os.pathsep}{DRY_ENV['PATH']}", "FASTRL_REPO": str(REPO),
           "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1"}
    out = subprocess.run(["bash", str(REPO / "slurm" / "convert.sbatch"), "export", "--ckpt", "x", "--out", "y"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert "fastrl convert: srun --mpi=list offers no pmix here" in out.stderr


def test_submit_refuses_a_config_that_does_not_resolve_before_submitting(tmp_path):
    """submit.sh runs the recipe's --dry-run first: a config error stops it before any job is
    queued, with the error's line (rollout.n=0 used to fail only when stage 1 started).

    catches: a submit that queues a chain whose every stage would fail at start-up."""
    out = subprocess.run([SUBMIT, "--recipe", RECIPE, "--run-dir", str(tmp_path / "r"), "--dry-run", "rollout.n=0"],
                         capture_output=True, text=True, timeout=120, env=DRY_ENV)
    assert out.returncode == 2 and out.stdout == ""
    assert "--dry-run failed: fastrl.train: config error: rollout.n must be >= 1, got 0" in out.stderr
