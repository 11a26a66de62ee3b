"""Resume a trainer checkpoint at another parallel layout: TP=1 -> TP=2 and TP=1 -> PP=2.

Three steps are trained at TP=1, saving after each; step 3 is then trained again from the step-2
checkpoint two ways: resumed with tensor parallelism 2 and with pipeline parallelism 2 (two gloo
processes), and compared with the straight run's step 3.
megatron dist-checkpointing reshards the weights and the DistributedOptimizer state
(``checkpoint.optimizer_format=fully_reshardable``), so step 3 draws the same rollouts and ends in
the same weights and Adam moments up to float rounding (TP/PP change the order of reductions).
A fresh Adam after the resume would leave the first moments at a tenth of the straight run's.

The runs use the deterministic coin reward (``tests/functional/coin_rewards.py``): under the
recipe's strict reward the untrained policy's advantages are all 0, no policy-gradient step is
taken, and a resume that lost or scrambled the optimizer state would still match. The test asserts
non-zero advantages and gradients at step 3. Breakage checked: skipping ``optimizer.load_state_dict``
on resume (``fastrl/checkpoint/io.py``, Adam restarts from zero moments) fails it at step 3.
"""

import os
import subprocess
import sys

import pytest
import torch

from tests.functional.conftest import COIN_REWARD, REPO, TINY, read_jsonl, run_train

pytestmark = [pytest.mark.functional, pytest.mark.distributed, pytest.mark.long(160)]

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
COMMON = ["trainer.max_steps=3", COIN_REWARD]


def _torchrun(out_dir, *overrides):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "fastrl.train", "--recipe", RECIPE, *TINY, *COMMON, f"logging.output_dir={out_dir}", *overrides,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def _checkpoint(run_root, step):
    return run_root / RECIPE / "checkpoints" / f"step_{step:08d}"


def _tensors(ckpt, tmp_path, name):
    """Every tensor of an actor checkpoint in model space (global shapes), read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{name}.pt"
    dcp_to_torch_save(str(ckpt / "actor"), str(out))
    return {k: v for k, v in torch.load(out, weights_only=False).items() if isinstance(v, torch.Tensor)}


def _step(run_root, step):
    return next(r for r in read_jsonl(run_root / RECIPE / "metrics.jsonl") if r["kind"] == "train" and r["step"] == step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    # the straight run also saves after each step (keep_last=2 keeps steps 2 and 3): its step-2
    # checkpoint is where the other layouts resume (saving does not change the trajectory, and a
    # resume restores the RNG and data state saved with it)
    straight = root / "straight"
    run_train(straight, *COMMON, "checkpoint.save_every=1", "checkpoint.keep_last=2")
    saved = _checkpoint(straight, 2)
    layouts = {}
    for name, override in (("tp2", "parallel.tensor_model_parallel_size=2"), ("pp2", "parallel.pipeline_model_parallel_size=2")):
        proc = _torchrun(root / name, override, f"checkpoint.resume={saved}")
        layouts[name] = (root / name, proc.stdout + proc.stderr)
    return root, straight, layouts


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_resume_at_another_layout_continues_the_run(runs, layout, tmp_path):
    root, straight, layouts = runs
    run_root, log = layouts[layout]
    assert "resharded from TP=1 PP=1 DP=1" in log

    a, b = _step(straight, 3), _step(run_root, 3)
    assert a["advantage/abs_mean"] > 0.1 and a["actor/grad_norm"] > 0  # step 3 takes a policy-gradient step
    # the same weights generate the same rollouts and rewards at step 3
    for key in ("reward/mean", "accuracy/mean", "rollout/generated_tokens", "prune/num_kept", "prune/kept_tokens"):
        assert a[key] == b[key], key
    for key in ("actor/loss", "actor/grad_norm", "advantage/abs_mean"):
        assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key

    wa = _tensors(_checkpoint(straight, 3), tmp_path, "straight")
    wb = _tensors(_checkpoint(run_root, 3), tmp_path, layout)
    assert sorted(wa) == sorted(wb)
    model = [k for k in wa if not k.startswith("optimizer")]
    moments = [k for k in wa if k.startswith(("optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."))]
    assert len(model) > 10 and len(moments) == 2 * len(model)
    for k in model:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    for k in moments:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-8, msg=lambda m, k=k: f"{k}: {m}")


def test_dp_reshardable_checkpoint_refuses_a_tp_change(tmp_path):
    run_train(tmp_path / "dp", *COMMON, "stage.max_steps=1", "checkpoint.optimizer_format=dp_reshardable")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "fastrl.train", "--recipe", RECIPE, *TINY, *COMMON, f"logging.output_dir={tmp_path / 'dp'}",
        "parallel.tensor_model_parallel_size=2", "checkpoint.optimizer_format=dp_reshardable",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "stores its optimizer state as 'dp_reshardable', written at TP=1 PP=1" in out
    assert "checkpoint.optimizer_format=fully_reshardable" in out
    # nothing already saved is lost
    assert (_checkpoint(tmp_path / "dp", 1) / "train_state.pt").exists()
