"""Stop signals sent to a launcher (mpirun, srun, torchrun, slurm/graceful_launch.sh): every row of
the table "Stop signals by launcher" in docs/slurm.md is run and its outcome checked.

The launcher-behaviour rows use tests/slurm/stop_worker.py (the trainer's StopRequest, 0.2 s steps,
seconds per row); ``test_graceful_launch_term_saves_trained_steps`` runs the real trainer (DP=2,
tiny CPU recipe) under the wrapper and mpirun/srun.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def _default_stop_signals() -> None:
    """In the launcher's process before exec: INT, HUP and TERM back to their default actions, as a
    terminal or a scheduler delivers them. A job started in the background of a non-interactive
    shell (``make test &``) inherits SIGINT ignored, and bash cannot trap a signal ignored on entry:
    graceful_launch.sh then never saw the INT of the table (seen: both INT rows timed out)."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "slurm.md"
WRAPPER = REPO / "slurm" / "graceful_launch.sh"
WORKER = Path(__file__).parent / "stop_worker.py"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
OUTCOMES = ("saves", "torn down", "ignored")
#: The row of the trainer run without a launcher (Ctrl-C on a terminal): one process.
DIRECT = "python -m fastrl.train"


def table_rows() -> list[tuple[str, str, str]]:
    """(signal, launcher command, outcome keyword) for every row of the docs table."""
    text = DOC.read_text()
    head = "| signal | sent to | outcome |"
    assert head in text, f"docs/slurm.md has no table starting with {head!r}"
    rows = []
    for line in text[text.index(head):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        sig, sent_to, outcome = (cell.strip() for cell in line.strip("|").split("|", 2))
        keyword = next((k for k in OUTCOMES if outcome.startswith(k)), None)
        assert keyword, f"outcome of row {line!r} does not start with one of {OUTCOMES}"
        rows.append((sig, sent_to.strip("`"), keyword))
    return rows


def test_table_covers_every_signal_and_launcher():
    # Catches a table that drops a row (the table is the source of the parametrized cases below).
    rows = table_rows()
    launchers = {"mpirun -n 2", "srun --mpi=pmix -n 2", "torchrun --nproc-per-node=2"}
    launchers |= {f"slurm/graceful_launch.sh {name}" for name in launchers if not name.startswith("torchrun")}
    expected = {(s, name) for s in ("USR1", "TERM", "INT") for name in launchers} | {("INT", DIRECT)}
    assert {(s, name) for s, name, _ in rows} == expected
    # the promise of the wrapper: TERM and INT do what USR1 does
    for sig, launcher, outcome in rows:
        if launcher.startswith("slurm/graceful_launch.sh"):
            assert outcome == "saves", (sig, launcher)


def _command(launcher: str, out: Path) -> list[str]:
    if launcher == DIRECT:  # no launcher: the stand-in rank itself, as `python -m fastrl.train` runs
        return [sys.executable, str(WORKER), str(out)]
    words = launcher.split()
    if words[0] == "slurm/graceful_launch.sh":
        words[0] = str(WRAPPER)
    if "torchrun" in words:
        i = words.index("torchrun")
        words[i:i + 1] = [str(Path(sys.executable).parent / "torchrun"), "--no-python"]
    return [*words, sys.executable, str(WORKER), str(out)]


def _wait_steps(out: Path, proc: subprocess.Popen, world: int, steps: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [int(p.read_text() or 0) for p in out.glob("progress.rank*")]
        if len(done) == world and min(done) >= steps:
            return
        assert proc.poll() is None, f"launcher exited early (rc={proc.returncode})"
        time.sleep(0.1)
    raise AssertionError(f"ranks did not reach step {steps} within {timeout} s")


@pytest.mark.parametrize("sig,launcher,outcome", table_rows(), ids=lambda v: str(v).replace(" ", "_"))
def test_signal_to_launcher_matches_table(slurm, tmp_path, sig, launcher, outcome):
    # Catches: the launcher behaving differently from what docs/slurm.md says (e.g. the trainer's
    # "TERM like USR1" read as covering a TERM to mpirun/srun, which tears the job down on main), and
    # a slurm/graceful_launch.sh that is missing or does not turn TERM/INT into a save on every rank.
    if "mpirun" in launcher and shutil.which("mpirun") is None:
        pytest.fail("mpirun missing: run `bash tools/setup_system.sh` (openmpi-bin)")
    log = tmp_path / "launcher.log"
    with log.open("w") as log_file:  # a file, not a pipe: torchrun's orphaned workers would hold a pipe open
        proc = subprocess.Popen(
            _command(launcher, tmp_path), cwd=REPO, env={**slurm.env, **MPI_ENV},
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_stop_signals,
        )
    world = 1 if launcher == DIRECT else 2
    try:
        _wait_steps(tmp_path, proc, world, 2)
        os.kill(proc.pid, getattr(signal, f"SIG{sig}"))
        if outcome == "ignored":
            time.sleep(3)
            assert proc.poll() is None, "the launcher ended on a signal the table says it ignores"
            os.kill(proc.pid, signal.SIGUSR1)  # end it the documented way
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_workers(tmp_path)  # torchrun dies on USR1 and leaves its workers running
    output = log.read_text()
    saved = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("saved.rank*.json")}
    if outcome == "saves":
        assert sorted(saved) == [f"saved.rank{r}.json" for r in range(world)], output
        if launcher.startswith("torchrun"):
            assert proc.returncode == 1, output  # torchrun fails although its workers saved (table)
        else:
            assert proc.returncode == 0, output
    elif outcome == "torn down":
        assert proc.returncode != 0 and not saved, output
    else:  # ignored, then stopped by USR1: it saved only because of the USR1
        assert proc.returncode == 0 and {r["reason"] for r in saved.values()} == {"SIGUSR1"}, output
    if launcher.startswith("slurm/graceful_launch.sh") and sig != "USR1":
        assert f"{sig} received" in output and "forwarding USR1" in output, output


@pytest.mark.parametrize("sig", ["USR1", "TERM"])
def test_torchrun_task_passes_the_stop_signal_to_torchruns_workers(tmp_path, sig):
    # slurm/torchrun_task.sh, the step's task in train.sbatch's torchrun launch. The signal goes to
    # the task process alone, as Slurm's proctrack/cgroup delivers `scancel --signal` (only to
    # slurmstepd's children). Breakage caught: a task that execs torchrun (USR1 kills torchrun,
    # no save; or never reaches the workers, which torchrun starts in their own sessions).
    task = REPO / "slurm" / "torchrun_task.sh"
    cmd = [str(task), *_command("torchrun --nproc-per-node=2", tmp_path)]
    log = tmp_path / "task.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_stop_signals)
    try:
        _wait_steps(tmp_path, proc, 2, 2)
        os.kill(proc.pid, getattr(signal, f"SIG{sig}"))  # the task only, not its process group
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_workers(tmp_path)
    output = log.read_text()
    saved = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("saved.rank*.json")}
    assert sorted(saved) == ["saved.rank0.json", "saved.rank1.json"], output
    assert {r["reason"] for r in saved.values()} == {"SIGUSR1"}, output
    assert proc.returncode == 0, output  # torchrun's workers exited 0, and so did torchrun
    assert f"torchrun_task: {sig} received" in output and "forwarding USR1 to the workers of torchrun" in output


def _kill_workers(out: Path) -> list[int]:
    """KILL the stand-in ranks of this test still running (our own processes, by pid); their pids."""
    pids = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(WORKER).encode() in cmdline and str(out).encode() in cmdline:
            pids.append(int(pid_dir.name))
            os.kill(pids[-1], signal.SIGKILL)
    return pids


@pytest.mark.parametrize("args,message", [
    ([], "no launcher given"),
    (["torchrun", "--nproc-per-node=2", "x.py"], "torchrun is not supported"),
    (["python", "-m", "fastrl.train"], "'python' is not a launcher"),
    (["/nonexistent/mpirun", "-n", "2"], "launcher '/nonexistent/mpirun' not found"),
])
def test_graceful_launch_rejects_bad_input(args, message):
    # Catches a wrapper that silently runs something it cannot stop cleanly (or nothing at all).
    out = subprocess.run([str(WRAPPER), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and message in out.stderr, out.stderr


@pytest.mark.long(120)
@pytest.mark.parametrize("launcher", [["mpirun", "-n", "2"], ["srun", "--mpi=pmix", "-n", "2"]], ids=["mpirun", "srun"])
def test_graceful_launch_term_saves_trained_steps(slurm, tmp_path, launcher):
    # The issue: TERM to `mpirun -n 2` running a DP=2 job ended it with rc 1 in 2.5 s, no log line and
    # no checkpoint although two steps were trained (srun: KILL at once). Catches a wrapper (or a
    # trainer) with which a TERM to the launcher does not end in every rank saving the last trained
    # step, exit 0, and a next run resuming after it.
    from test_slurm_training import RECIPE, TINY  # the tiny CPU recipe's overrides (this folder is on sys.path)

    out_dir = tmp_path / "runs"
    run_dir = out_dir / RECIPE
    cmd = [str(WRAPPER), *launcher, sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, *TINY,
           "parallel.world_size=2", "trainer.max_steps=200", f"logging.output_dir={out_dir}"]
    log = tmp_path / "launcher.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**slurm.env, **MPI_ENV}, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_stop_signals)
    try:
        deadline = time.monotonic() + 300
        while not _train_steps(run_dir) or max(_train_steps(run_dir)) < 2:
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no second training step within 300 s"
            time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert rc == 0, text[-4000:]
    assert "TERM received" in text and "stop requested" in text, text[-4000:]
    last = max(_train_steps(run_dir))
    assert last >= 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{last:08d}", text[-4000:]
    # every rank saved that step: one RNG state per rank, and each rank wrote its own files of the
    # distributed checkpoint (megatron-core names them __<rank>_<writer thread>.distcp)
    ckpt = run_dir / "checkpoints" / f"step_{last:08d}"
    assert (ckpt / "COMPLETE").exists()
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    writers = {p.name.split("_")[2] for p in (ckpt / "actor").glob("*.distcp")}
    assert writers == {"0", "1"}, sorted(p.name for p in (ckpt / "actor").glob("*.distcp"))
    # and a rerun resumes after it instead of starting from step 1
    again = slurm.run([*launcher, sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, *TINY,
                       "parallel.world_size=2", "trainer.max_steps=200", "stage.max_steps=1",
                       f"logging.output_dir={out_dir}"], env=MPI_ENV, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _train_steps(run_dir)[-1] == last + 1


def _train_steps(run_dir: Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["step"] for r in records if r.get("kind") == "train"]
