"""Training with vLLM in the loop on CPU: recipe qwen2_tiny_text_fastrl_grpo_vllm_cpu (issue 17, item 4).

The trainer (main environment, megatron-core actor) drives a vLLM engine process in .venv-vllm,
refitted through shared memory after every step. (a) 10 steps: engine/trainer log-probs agree to
1e-4 on every sampled token and on the refit probe after every refit, and the reward rises; (b) the
Hugging Face engine on the same steps gives rewards of the same level (the engines draw different
samples: vLLM seeds each request, the HF engine one torch generator; so per-step rewards differ and
only the 10-step means are compared); (c) an engine killed mid-run stops the run within
``rollout.engine_timeout_s`` with one line naming the engine and its exit status (that an engine
never outlives its killed parent: tests/vllm/test_engine_process.py); (d) a refit that never
reaches the engine (the test double tests/vllm/lost_refit_train.py) is caught by the verification;
(e) the default recipe's tiny Qwen2.5-VL (images in every prompt) trains with the engine process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.long(150)]

REPO = Path(__file__).resolve().parents[2]
RECIPE = "qwen2_tiny_text_fastrl_grpo_vllm_cpu"
COMMON = ["logging.progress_bar=false", "logging.tensorboard=false", "logging.plots=false", "reward.num_workers=1", "trainer.torch_threads=1",
          "checkpoint.save_every=0"]
BOUND_S = 30
LONG = ("trainer.max_steps=500", "trainer.epochs=100")  # still training when the engine is killed


@pytest.fixture(scope="module", autouse=True)
def vllm_env():
    subprocess.run(["bash", str(REPO / "tools" / "setup_vllm_cpu.sh")], check=True, cwd=REPO)


def _cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, f"logging.output_dir={out}", *COMMON, *overrides]


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)


def _train(out: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(out, *overrides), cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=600)


def _train_records(out: Path) -> list[dict]:
    path = out / RECIPE / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_run")
    proc = _train(out, "trainer.max_steps=10", "rollout.verify_refit_every=1", "rollout.verify_refit_tolerance=1e-4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return _train_records(out)


def test_a_ten_steps_with_the_engine_process(vllm_run):
    assert [r["step"] for r in vllm_run] == list(range(1, 11))
    for r in vllm_run:
        assert r["mismatch/abs_diff_mean"] <= 1e-4, r["step"]  # sampled tokens, fp32
        assert r["refit_verify/abs_diff_mean"] <= 1e-4, r["step"]  # the probe, after every refit
        assert r["refit/bytes"] > 0 and r["refit/mb_per_s"] > 0
    rewards = [r["reward/mean"] for r in vllm_run]
    assert rewards[-1] > rewards[0], rewards
    assert sum(rewards[-3:]) > sum(rewards[:3]), rewards


def test_b_hf_engine_gives_rewards_of_the_same_level(vllm_run, tmp_path):
    proc = _train(tmp_path, "trainer.max_steps=10", "rollout.engine=hf")
    assert proc.returncode == 0, proc.stderr[-5000:]
    hf = [r["reward/mean"] for r in _train_records(tmp_path)]
    vllm = [r["reward/mean"] for r in vllm_run]
    assert abs(sum(hf) / 10 - sum(vllm) / 10) <= 0.05, (hf, vllm)


def _engine_pid(proc: subprocess.Popen, lines: list[str], until: str) -> int:
    pid = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"vllm engine process of rank pid \d+: pid (\d+)", line)
        if m:
            pid = int(m.group(1))
        if pid is not None and until in line:
            return pid
    raise AssertionError("".join(lines[-50:]))


def test_c_killed_engine_is_reported_and_never_orphaned(tmp_path):
    # the engine dies mid-run: one line, within the bound
    proc = subprocess.Popen(_cmd(tmp_path / "a", *LONG, f"rollout.engine_timeout_s={BOUND_S}"),
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        pid = _engine_pid(proc, lines, "validation @ step 0")
        time.sleep(2.0)  # some training steps
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        rest, _ = proc.communicate(timeout=BOUND_S + 30)
        assert time.monotonic() - killed <= BOUND_S
    finally:
        proc.kill()
    assert proc.returncode != 0
    errors = [ln for ln in rest.splitlines() if ln.startswith("fastrl.train: error:")]
    assert len(errors) == 1, rest[-3000:]
    assert "EngineError" in errors[0] and f"pid {pid}" in errors[0] and "killed by signal 9" in errors[0]


def test_d_stale_engine_is_caught_by_the_refit_verification(tmp_path):
    cmd = _cmd(tmp_path, "trainer.max_steps=3", "rollout.verify_refit_every=1", "rollout.verify_refit_tolerance=1e-4")
    cmd[1:3] = [str(REPO / "tests" / "vllm" / "lost_refit_train.py")]  # the trainer with refits that never arrive
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stderr[-3000:]
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("fastrl.train: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    # the engine's own weight version names the lost refit, before the probe (issue 45, item 7)
    assert "RefitVerificationError: refit verification after refit 1: refit 1 did not reach the engine: it holds weight version 0" in errors[0]


def test_e_tiny_vision_language_policy_trains_with_the_engine_process(tmp_path):
    # The default recipe's policy, a tiny Qwen2.5-VL, with rollout.engine=vllm: prompts carry their
    # images to the engine process, which samples, and is refitted and verified after every step.
    # The coin reward gives the untrained policy non-zero advantages, so the update changes the
    # weights the refit must carry. Breakage caught: images dropped or resized differently on the
    # engine side (its log-probs then differ from the trainer's, which sees the images: mismatch),
    # a refit that misses the vision tower or the language model (refit_verify after step 1).
    recipe = "easyvqa_tiny_fastrl_grpo_cpu"
    cmd = [sys.executable, "-m", "fastrl.train", "--recipe", recipe, f"logging.output_dir={tmp_path}", *COMMON,
           "rollout.engine=vllm", "warm_start.enabled=false", "reward.name=tests/functional/coin_rewards.py:one_in_two",
           "trainer.max_steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "trainer.mini_batch_prompts=2",
           "parallel.micro_batch_size=4", "rollout.max_response_length=16", "data.val_size=8",
           "data.max_train_samples=64", "trainer.val_before_train=false", "trainer.val_every=0",
           "rollout.verify_refit_every=1", "rollout.verify_refit_tolerance=1e-4"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert re.search(r"vllm engine process of rank pid \d+: pid \d+, vLLM", proc.stdout + proc.stderr)
    records = [r for r in map(json.loads, (tmp_path / recipe / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["advantage/abs_mean"] > 0.1, r["step"]  # a live policy-gradient term
        assert r["mismatch/abs_diff_max"] <= 1e-4, r["step"]  # every sampled token, fp32
        assert r["refit_verify/abs_diff_max"] <= 1e-4, r["step"]
        assert r["refit/tensors"] > 0 and r["refit/bytes"] > 0
