"""DAPO steps that collect fewer informative rollouts than dp_size x micro_batch_size train on them
(padded with zero-weight rows) instead of crashing (issue 19, item 3); DAPO's generated and kept
views, extra-round counts, the prompt sampler's wrap past trainer.epochs and the save phase's
timing (item 7)."""

import pytest

from tests.functional.conftest import read_jsonl, run_train

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_dapo_cpu"
#: the issue's reproduction (8 prompts x 4, one micro-batch of 32, no extra round), on the tiny
#: model with a reward that makes about 41% of the groups informative (so about 13 rows are left),
#: in the mini-batch geometry (whole micro-batches of 32: the free geometry never pads on one rank)
REPRO = [
    "rollout.n=4", "rollout.prompts_per_step=8", "trainer.mini_batch_prompts=8", "parallel.micro_batch_size=32",
    "pruning.refill_to=mini_batch",
    "trainer.max_steps=2", "trainer.val_before_train=false", "reward.name=tests/functional/coin_rewards.py:one_in_eight",
]
PHASES = ("gen", "reward", "prune", "old", "ref", "update", "refit")


def _train(tmp_path):
    return [r for r in read_jsonl(tmp_path / RECIPE / "metrics.jsonl") if r["kind"] == "train"]


def test_short_dapo_batch_is_padded_not_fatal(tmp_path):
    proc = run_train(tmp_path, *REPRO, "algorithm.max_dynamic_sampling_rounds=0", "checkpoint.save_every=1", recipe=RECIPE)
    log = proc.stdout + proc.stderr
    train = _train(tmp_path)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        kept = r["prune/num_kept"]
        assert 0 < kept < 32 and kept == r["dapo/informative_group_fraction"] * 32  # whole groups of 4
        assert r["prune/num_padding"] == 32 - kept and r["prune/kept_rows_this_rank"] == 32
        assert f"only {int(kept)} rollouts are left" in log
        assert r["actor/updates"] == 1.0 and r["actor/loss"] == r["actor/loss"]  # trained, finite
        # generated view (every row before the filter) vs kept view (the informative groups)
        assert r["rollout/generated_rows"] == 32 and r["reward/num_scored"] == 32
        assert r["accuracy/generated_mean"] * 32 >= r["accuracy/mean"] * kept - 1e-9
        assert 0 < r["accuracy/mean"] < 1  # informative groups only
        # the step's time is its phases; the checkpoint saved after it is charged to it, outside time/step
        assert r["time/step"] == pytest.approx(sum(r.get(f"time/{p}", 0.0) for p in PHASES), abs=1e-9)
    assert train[0]["time/save"] > 0  # saved at step 1 (save_every=1) and logged with step 1
    assert "time/save" not in train[1]  # step 2's checkpoint is the final one, after the loop
    assert "training on what was collected" in log and "padded with" in log


def test_dapo_rounds_count_every_round_and_warn_on_wrap(tmp_path):
    # 16 prompts: one epoch = 2 steps of 8; the extra rounds draw more, so the sampler wraps.
    # With KL in the reward, the old/reference log-probs run on the filtered full batch (not a
    # multiple of the micro-batch of 32) before the advantages.
    run = run_train(
        tmp_path, *REPRO, "algorithm.max_dynamic_sampling_rounds=1", "data.max_train_samples=16",
        "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1", recipe=RECIPE,
    )
    train = _train(tmp_path)
    assert [r["step"] for r in train] == [1, 2]
    assert train[0]["kl_penalty/mean"] == 0.0 and train[1]["kl_penalty/mean"] > 0  # policy = reference at step 1
    for r in train:
        rounds = 1 + r["dapo/extra_rounds"]
        assert r["rollout/generated_rows"] == 32 * rounds and r["reward/num_scored"] == 32 * rounds
        assert r["prune/num_kept"] + r["prune/num_padding"] == 32
    assert any(r["prune/num_padding"] > 0 for r in train)
    drawn = 8 * sum(1 + r["dapo/extra_rounds"] for r in train) / 16
    assert drawn > 1
    assert train[1]["data/epochs_drawn"] == drawn and "data/epochs_drawn" not in train[0]
    assert "the prompt sampler wrapped past trainer.epochs=1" in run.stdout + run.stderr
